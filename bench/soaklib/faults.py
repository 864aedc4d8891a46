"""Running one soak job, healthy or faulty, on a cluster, under a watchdog, and what it showed.

Every run_mpi runs in a thread of its own that the soak joins with a bound: a call that neither
returns nor raises within it counts as hung (and is left behind, not waited for)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dask_pmix import MPIJobError, run_mpi, submit_mpi

from . import bodies, hello_forger, pmibind, stranger
from .cluster import DaskCluster
from .flood import Flood
from .plan import Spec
from .shm import fd_targets

# The promised bounds (README, issue 13): a member lost (killed, MPI_Abort) or a sidecar gone
# fails the job within 2 s; a job's timeout ends it (we allow the same 2 s past the timeout).
LOSS_BOUND = 2.0
HANG_TIMEOUT = 4.0
HANG_BOUND = HANG_TIMEOUT + LOSS_BOUND
# The watchdog: a healthy job that takes longer than this has hung (the wiring timeout, 60 s by
# default, bounds a member that never comes; a healthy job takes well under a second).
WATCHDOG = 90.0
SIDECAR_HOLD = 20.0      # how long the ranks of a sidecar-fault job sleep between two Barriers
STALL = 4.0              # how long the "stall" fault stops the sidecar (below dask-pmix.timeouts.sidecar-gone)
MARKERS_WITHIN = 60.0    # every rank of a faulty job is in within this
SILENT_JOBS = 5          # a silent connection stays open over this many jobs
HOLD_WITHIN = 60.0       # the PMI faults hold a member's rank back at most this long
FORGED_BLOCK = 8 << 20   # a block between the tcp+mpi workers: over comm.sm-threshold (4 MiB), so it goes over MPI
# client.restart() ends a running job as a member lost does: within LOSS_BOUND of the call
RESTART_BOUND = LOSS_BOUND
# A job's member tasks end within this of its run_mpi's return, or the member is left frozen (the
# worker's watcher restarts a member still running 3 s after its job failed).
FROZEN_WITHIN = 20.0


@dataclass
class Call:
    """A run_mpi in its own thread."""
    thread: threading.Thread
    box: dict = field(default_factory=dict)

    def join(self, bound: float) -> bool:
        self.thread.join(bound)
        return not self.thread.is_alive()

    def settle(self, rec: dict) -> bool:
        """Waits for the call within WATCHDOG, records its seconds, and marks it hung if it did not
        return; whether it returned."""
        done = self.join(WATCHDOG)
        rec["seconds"] = round(self.box.get("t_end", time.monotonic()) - self.box["t0"], 3)
        if not done:
            rec["outcome"] = "hung"
        return done


def call(cluster: DaskCluster, fn: Callable, args: tuple, *, n: int | None, impl: str, mode: str | None,
         timeout: float | None = None, submit: bool = False, workers: list[str] | None = None) -> Call:
    """run_mpi, or (submit) submit_mpi and a gather of its futures, in a thread of its own; on
    `workers` (addresses, ranks in that order) when given, else on `n` the sidecar chooses."""
    box: dict[str, Any] = {}

    def target() -> None:
        box["t0"] = time.monotonic()
        box["wall_t0"] = time.time()
        try:
            if submit:
                futures = submit_mpi(cluster.client, fn, *args, n=n, workers=workers, impl=impl, mode=mode,
                                     timeout=timeout)
                box["result"] = cluster.client.gather(futures)
            else:
                box["result"] = run_mpi(cluster.client, fn, *args, n=n, workers=workers, impl=impl, mode=mode,
                                        timeout=timeout)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e
        box["t_end"] = time.monotonic()
        box["wall_end"] = time.time()

    t = threading.Thread(target=target, name="soak-job", daemon=True)
    c = Call(t, box)
    t.start()
    return c


def _timeline(cluster: DaskCluster, job_id: str, box: dict) -> dict:
    """When the job was created, started (every member in: its timeout runs from there), ended
    and released, and when the call returned, in seconds from the call's start (the sidecar's
    clock is this machine's): says whether a late failure came before or after the timeout."""
    from datetime import datetime

    try:
        job = cluster.rest.job(job_id)
    except Exception as e:  # noqa: BLE001 - forgotten already, or the sidecar restarting
        return {"error": str(e)[:200]}
    out = {}
    for key in ("createdAt", "startedAt", "endedAt", "releasedAt"):
        if job.get(key):
            out[key] = round(datetime.fromisoformat(job[key].replace("Z", "+00:00")).timestamp() - box["wall_t0"], 3)
    out["returned"] = round(box["wall_end"] - box["wall_t0"], 3)
    return out


def _healthy_result(c: Call, rec: dict, token: str, n: int) -> list | None:
    """The ranks' results of a bodies.healthy job when they are right; otherwise None, with the
    record's outcome saying what went wrong (hung, error, wrong)."""
    if not c.settle(rec):
        return None
    err = c.box.get("error")
    if err is not None:
        rec.update(outcome="error", error=_error_record(err))
        return None
    result = c.box["result"]
    expect = [{"token": token, "size": n, "rank": r, "sum": n * (n + 1) // 2} for r in range(n)]
    got = [{k: v for k, v in x.items() if k != "pid"} for x in result]
    if got != expect:
        rec.update(outcome="wrong", result=got[:4])
        return None
    return result


def _until(f: Callable[[], Any], within: float, every: float = 0.05) -> Any:
    """f()'s first true value within `within` s, else None (False)."""
    deadline = time.monotonic() + within
    while True:
        v = f()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(every)


def _error_record(e: BaseException | None) -> dict | None:
    if e is None:
        return None
    out = {"type": type(e).__name__, "message": str(e)[:400]}
    if isinstance(e, MPIJobError):
        out.update(job_id=e.job_id, rank=e.rank, worker=e.worker)
    return out


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """fn() in a thread of its own: its value, its exception as text, or "no answer within ..."."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["value"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return box.get("value", f"no answer within {seconds:.0f} s")


def running_members(cluster: DaskCluster, within: float = 20.0) -> dict[str, dict]:
    """Worker address -> its threads still running a job's member (soaklib.bodies.member_stacks),
    each worker asked on its own; one that does not answer within `within` s (its event loop
    blocked: a thread holding the interpreter in native code) counts, with its native stacks."""
    pids = cluster.worker_pids()
    answers: dict[str, Any] = {}

    def ask(address: str) -> None:
        answers[address] = bounded(lambda: cluster.client.run(bodies.member_stacks, workers=[address],
                                                              on_error="return").get(address), within)

    threads = [threading.Thread(target=ask, args=(a,), daemon=True) for a in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(within + 5)
    out = {}
    still = None
    for address, answer in answers.items():
        if isinstance(answer, dict):
            if answer:
                out[address] = answer
        elif answer is not None:
            # A worker replaced while it was asked (dask-pmix retires and restarts one whose member
            # is stuck past its job's timeout) does not answer either: Dask's connect retries the
            # gone address for its whole timeout. Its process has exited: no member is left there.
            if still is None:
                still = cluster.worker_pids()
            if address not in still and not _alive(pids[address]):
                continue
            out[address] = {"-": {"job": None, "rank": None, "answer": str(answer)[:300],
                                  "frames": native_stacks(pids[address])}}
    return out


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (the soak's workers are on this machine); a zombie has
    exited."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def native_stacks(pid: int, keep: int = 12) -> list[str]:
    """The native backtraces of a process's threads (gdb, when it is there): the frames of the
    threads inside MPI, PMIx or the interpreter's lock, innermost first, at most `keep` each."""
    import shutil
    import subprocess

    gdb = shutil.which("gdb")
    if gdb is None or not pid:
        return [f"pid {pid}: no gdb"]
    try:
        text = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                              capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"pid {pid}: gdb: {e}"]
    out, current, waiting = [], [], 0
    for line in text.splitlines() + ["Thread end"]:
        if line.startswith("Thread "):
            if any(re.search(r"(MPI|ompi|opal|mca_)", f) and "libpmix" not in f for f in current):
                out.append(" | ".join(current[:keep]))
            elif any("take_gil" in f for f in current):
                waiting += 1
            current = []
        elif line.startswith("#"):
            m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)(?: \(.*?\))?(?: (?:from|at) (\S+))?", line)
            if m:
                current.append(m.group(1) + (f"@{m.group(2).rsplit('/', 1)[-1]}" if m.group(2) else ""))
    return [f"pid {pid}: {len(out)} threads in MPI, {waiting} waiting for the interpreter lock"] + out[:8]


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (from /proc/net/tcp and its socket inodes)."""
    inodes = {t[8:-1] for t in fd_targets(pid) if t.startswith("socket:[")}
    if not inodes:
        return []
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:
                    ports.append(int(f[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return sorted(ports)


class Runner:
    def __init__(self, clusters: dict[str, DaskCluster], workdir: Path, comm: DaskCluster | None = None):
        self.clusters = clusters
        self.comm = comm  # the tcp+mpi cluster the forged hellos go to (soak.py), if the plan has any
        self.markers = workdir / "markers"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.silent: list[dict] = []  # open silent connections: {"sock", "left", "record"}
        self._silent_openmpi = 0

    # -- one job ---------------------------------------------------------------------------------
    def run(self, spec: Spec) -> dict:
        t0 = time.monotonic()
        cluster = self.clusters[spec.cluster]
        before = cluster.worker_pids()
        n = min(spec.n, len(before))  # right after a fault the cluster may be a worker short
        rec: dict[str, Any] = {"idx": spec.idx, "cluster": spec.cluster, "mode": spec.mode, "n": n,
                               "fault": spec.fault, "follows": spec.follows}
        if spec.fault in (None, "silent"):
            if spec.fault == "silent":
                rec["silent"] = self._open_silent(cluster)
            self._healthy(cluster, spec, n, before, rec)
        elif spec.fault == "stranger":
            self._stranger(cluster, spec, n, before, rec)
        elif spec.fault == "flood":
            self._flood(cluster, spec, n, before, rec)
        elif spec.fault == "stall":
            self._stall(cluster, spec, n, before, rec)
        elif spec.fault in ("pmi-injection", "foreign-pmi-binder"):
            self._pmi_fault(cluster, spec, n, before, rec)
        elif spec.fault == "forged-hello":
            self._forged_hello(cluster, spec, n, before, rec)
        elif spec.fault == "client-restart":
            self._client_restart(cluster, spec, n, rec)
        elif spec.fault in ("kill", "abort", "hang-sleep", "hang-mpi"):
            self._member_fault(cluster, spec, n, rec)
        else:
            self._sidecar_fault(cluster, spec, n, rec)
        self._tick_silent(rec)
        frozen = self._frozen_members(cluster)
        if frozen:
            rec["members_left_frozen"] = frozen
        if frozen or rec["outcome"] == "hung":
            rec["cluster_restarted_by_the_soak"] = self._restart_workers(cluster)
        after = cluster.worker_pids()
        rec["workers_lost"] = sorted(set(before) - set(after))
        rec["workers_new"] = sorted(set(after) - set(before))
        # The canary's chunks held in memory all along: computed again only when a worker holding
        # one died (a member killed, or the soak's own restart after a hang).
        seen = cluster.canary_computations()
        rec["canary_recomputed"] = seen - cluster.canary_seen
        cluster.canary_seen = seen
        rec["run_s"] = round(time.monotonic() - t0, 2)  # the whole of it: the fault's own work and the checks after
        return rec

    # -- members left frozen -----------------------------------------------------------------------
    def _frozen_members(self, cluster: DaskCluster) -> list[dict]:
        """The members still running on the workers FROZEN_WITHIN s after their job's call returned
        (the soak runs one job at a time: none should be left), each with where it is stuck. Asked
        of the workers' threads, not of the scheduler: a member whose task was given up (released)
        may run on."""
        deadline = time.monotonic() + FROZEN_WITHIN
        while True:
            left = running_members(cluster)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        return [{"worker": addr, **m} for addr, threads in sorted(left.items()) for m in threads.values()]

    def _restart_workers(self, cluster: DaskCluster) -> str:
        """After a member left frozen or a hung call: every worker of the cluster restarted (the
        others of that job may hold its broken MPI state too), so that the soak goes on measuring
        the next jobs rather than this one failure again (a violation all the same)."""
        t0 = time.monotonic()
        answer = bounded(lambda: cluster.client.restart(timeout=120, wait_for_workers=False), 150.0)
        # The restart dropped the canary's data: made again (once the workers are back), so that
        # later jobs are still held to it.
        canary = bounded(lambda: (cluster.client.wait_for_workers(cluster.n_workers, timeout=120),
                                  cluster.make_canary(), "made again")[-1], 150.0)
        return f"{str(answer)[:200]} in {time.monotonic() - t0:.1f} s; canary {canary}"

    def _impl(self, spec: Spec) -> str:
        return "mpich" if spec.cluster == "mpich" else "openmpi"

    def _healthy(self, cluster: DaskCluster, spec: Spec, n: int, worker_pids: dict[str, int], rec: dict) -> None:
        token = f"j{spec.idx}"
        c = call(cluster, bodies.healthy, (token,), n=n, impl=self._impl(spec), mode=spec.mode, submit=spec.submit)
        rec["api"] = "submit_mpi" if spec.submit else "run_mpi"
        result = _healthy_result(c, rec, token, n)
        if result is None:
            return
        pids = {x["pid"] for x in result}
        ran = "inprocess" if pids <= set(worker_pids.values()) else "fork" if not pids & set(worker_pids.values()) else "mixed"
        rec.update(outcome="ok", ran=ran)
        if spec.cluster == "openmpi" and spec.mode != "fork" and ran != "inprocess":
            rec["fallback_reason"] = self._last_mode_reason(cluster)

    def _last_mode_reason(self, cluster: DaskCluster) -> str | None:
        """Why the last job ran in fork mode (the sidecar records it)."""
        try:
            last = max(cluster.rest.jobs(), key=lambda j: j.get("createdAt", ""))
            return last.get("modeReason")
        except Exception as e:  # noqa: BLE001
            return f"unknown: {e}"

    # -- a member fails ---------------------------------------------------------------------------
    def _wait_markers(self, token: str, n: int, c: Call, what: str = "in") -> list[tuple[int, float]] | None:
        deadline = time.monotonic() + MARKERS_WITHIN
        paths = [self.markers / f"{token}.{r}.{what}" for r in range(n)]
        while time.monotonic() < deadline:
            if all(p.exists() for p in paths):
                out = []
                for p in paths:
                    pid, wall = p.read_text().split()
                    out.append((int(pid), float(wall)))
                return out
            if not c.thread.is_alive():
                return None
            time.sleep(0.02)
        return None

    def _member_fault(self, cluster: DaskCluster, spec: Spec, n: int, rec: dict) -> None:
        import random

        token = f"j{spec.idx}"
        victim = random.Random(spec.idx).randrange(n)
        how = spec.fault
        timeout = HANG_TIMEOUT if how.startswith("hang") else None
        c = call(cluster, bodies.faulty, (str(self.markers), token, victim, how), n=n, impl=self._impl(spec),
                 mode=spec.mode, timeout=timeout)
        rec["victim"] = victim
        marks = self._wait_markers(token, n, c)
        rec["ranks_in"] = marks is not None
        t_fault = None
        if how == "kill" and marks is not None:
            pid = marks[victim][0]
            rec["victim_pid"] = pid
            rec["victim_was_worker"] = pid in cluster.worker_pids().values()
            t_fault = time.monotonic()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                rec["victim_gone_already"] = True
        if not c.settle(rec):
            return
        err = c.box.get("error")
        rec["error"] = _error_record(err)
        if how == "kill" and t_fault is not None:
            rec["latency"] = round(c.box["t_end"] - t_fault, 3)
            rec["bound"] = LOSS_BOUND
        elif how == "abort":
            abort = self.markers / f"{token}.{victim}.abort"
            if abort.exists():
                rec["latency"] = round(c.box["wall_end"] - float(abort.read_text().split()[1]), 3)
                rec["victim_pid"] = int(abort.read_text().split()[0])
            rec["bound"] = LOSS_BOUND
        elif how.startswith("hang"):
            rec["latency"] = rec["seconds"]
            rec["bound"] = HANG_BOUND
            if isinstance(err, MPIJobError) and err.job_id:
                rec["timeline"] = _timeline(cluster, err.job_id, c.box)
            rec["says_timeout"] = err is not None and bool(re.search(r"time(d)? ?out", str(err), re.I))
        ok = isinstance(err, MPIJobError) and "latency" in rec and rec["latency"] <= rec["bound"]
        if how.startswith("hang"):
            ok = ok and rec["says_timeout"]
        rec["outcome"] = "failed-as-promised" if ok else ("failed-late" if isinstance(err, MPIJobError) else
                                                           "not-failed" if err is None else "wrong-error")

    # -- the sidecar fails ------------------------------------------------------------------------
    def _sidecar_fault(self, cluster: DaskCluster, spec: Spec, n: int, rec: dict) -> None:
        token = f"j{spec.idx}"
        sig = signal.SIGTERM if spec.fault == "sidecar-term" else signal.SIGKILL
        before = cluster.sidecar()
        try:
            psets_before = sorted(p["name"] for p in cluster.rest.psets())
            history_before = len(cluster.rest.jobs())
        except Exception as e:  # noqa: BLE001
            psets_before, history_before = [f"error: {e}"], -1
        c = call(cluster, bodies.faulty, (str(self.markers), token, 0, "hold", SIDECAR_HOLD), n=n,
                 impl=self._impl(spec), mode=spec.mode)
        marks = self._wait_markers(token, n, c)
        rec["ranks_in"] = marks is not None
        t_fault = time.monotonic()
        os.kill(before["pid"], sig)
        if c.settle(rec):
            err = c.box.get("error")
            rec["error"] = _error_record(err)
            rec["latency"] = round(c.box["t_end"] - t_fault, 3)
            rec["bound"] = LOSS_BOUND
            rec["outcome"] = ("failed-as-promised" if isinstance(err, MPIJobError) and rec["latency"] <= LOSS_BOUND
                              else "failed-late" if isinstance(err, MPIJobError) else
                              "not-failed" if err is None else "wrong-error")
        rec["recovery"] = self._recovery(cluster, before, psets_before, history_before, t_fault)

    def _recovery(self, cluster: DaskCluster, before: dict, psets_before: list, history_before: int,
                  t_fault: float, within: float = 120.0) -> dict:
        """What comes back after the sidecar died: the process (restarted by the plugin), the
        workers (registered again), the psets and the job history (from its state directory), the
        in-process pool (the workers' seats)."""
        out: dict[str, Any] = {"restarted": False}
        deadline = t_fault + within
        while time.monotonic() < deadline:
            try:
                now = cluster.sidecar()
                if now["alive"] and now["restarts"] > before["restarts"]:
                    cluster.rest.health(timeout=2)
                    out.update(restarted=True, restart_s=round(time.monotonic() - t_fault, 2), pid=now["pid"])
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
        if not out["restarted"]:
            return out
        while time.monotonic() < deadline:
            try:
                registered = {w["id"] for w in cluster.rest.workers() if w.get("state") != "gone"}
                # All of them: the plugin may restart the workers after the sidecar came back, and
                # an empty Dask is not "every worker registered again".
                dask = set(cluster.worker_pids())
                if len(dask) == cluster.n_workers and registered == dask:
                    out["workers_back_s"] = round(time.monotonic() - t_fault, 2)
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
        else:
            out["workers_back_s"] = None
        try:
            out["psets_back"] = sorted(p["name"] for p in cluster.rest.psets()) == psets_before
            jobs = cluster.rest.jobs()
            out["history"] = {"before": history_before, "after": len(jobs)}
        except Exception as e:  # noqa: BLE001
            out["read_error"] = str(e)
        # The workers' pool sessions were made with the sidecar that died: each is replaced (its
        # data moved first) and the new process joins the new pool. Back when every worker's seat
        # is ready again (or, on a cluster without the pool, at once).
        while time.monotonic() < deadline:
            try:
                seats = [w.get("pool") or {} for w in cluster.rest.workers() if w.get("state") != "gone"]
                pooled = [s for s in seats if s.get("state") in ("assigned", "joining", "ready")]
                if len(seats) == cluster.n_workers and all(s.get("state") == "ready" for s in pooled) \
                        and (not pooled or len(pooled) == cluster.n_workers):
                    out["pool_back_s"] = round(time.monotonic() - t_fault, 2)
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.5)
        else:
            out["pool_back_s"] = None
        out["pool_seats"] = sorted(f"{s.get('namespace')}#{s.get('rank')} {s.get('state')}" for s in seats)
        return out

    # -- another uid, and a flood of silent connections ---------------------------------------------
    def _stranger(self, cluster: DaskCluster, spec: Spec, n: int, before: dict, rec: dict) -> None:
        """Another local uid (nobody) connects to every TCP port the sidecar's process listens on
        and to libpmix's UNIX socket, and sends each port PMIx handshakes naming a job's and the
        pool's ranks (its own uid and a lie), a tool's, PMI, HTTP and junk; a job runs meanwhile.
        Refused or harmless (stranger.harmful), and the job succeeds."""
        out: dict[str, Any] = {}
        rec["stranger"] = out
        if os.getuid() != 0:
            out["skipped"] = "running as another uid needs root"
            return self._healthy(cluster, spec, n, before, rec)
        pid = cluster.sidecar()["pid"]
        ports = listening_ports(pid)
        jobs = cluster.rest.jobs()
        namespace = next((j.get("namespace") for j in reversed(jobs) if j.get("namespace")), "dask-pmix-job-0")
        pools = [w.get("pool", {}).get("namespace") for w in cluster.rest.workers() if w.get("pool")]
        plan = {"ports": ports, "paths": [p for p in [cluster.libpmix_socket()] if p], "silent": 20, "wait": 2.0,
                "payloads": {k: v.hex() for k, v in stranger.payloads(namespace, next(iter(pools), None)).items()}}
        proc = subprocess.Popen(["/usr/bin/python3", stranger.__file__, json.dumps(plan)], user=stranger.NOBODY,
                                group=stranger.NOBODY, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._healthy(cluster, spec, n, before, rec)
        try:
            sout, serr = proc.communicate(timeout=120)
            report = json.loads(sout.strip().splitlines()[-1])
        except Exception as e:  # noqa: BLE001
            proc.kill()
            out["error"] = f"the stranger gave no report: {e!r}"
            return
        out.update(ports=ports, uid=report["uid"], held=report["held"], harmful=stranger.harmful(report),
                   answers={port: {k: a.get("status") if a.get("status") is not None else a.get("error") or a.get("text", "")[:40]
                                   for k, a in answers.items()} for port, answers in report["ports"].items()},
                   paths={p: a.get("error") for p, a in report["paths"].items()})

    def _flood(self, cluster: DaskCluster, spec: Spec, n: int, before: dict, rec: dict) -> None:
        """300 connections that send nothing kept open on the PMIx gate (each one it closes opened
        again), from the soak's own uid, while a job runs: the job succeeds."""
        port = cluster.gate_port()
        if port is None or cluster.name == "mpich":
            rec["flood"] = {"skipped": "no PMIx gate" if port is None else "an MPICH cluster: no PMIx gate"}
            return self._healthy(cluster, spec, n, before, rec)
        flood = Flood(port, 300).start()
        try:
            self._healthy(cluster, spec, n, before, rec)
        finally:
            rec["flood"] = {"port": port, **flood.stop()}

    def _stall(self, cluster: DaskCluster, spec: Spec, n: int, before: dict, rec: dict) -> None:
        """The sidecar stopped (SIGSTOP) for STALL s while a job's members wait between two
        Barriers, then continued: the job succeeds and no worker is replaced."""
        token = f"j{spec.idx}"
        pid = cluster.sidecar()["pid"]
        c = call(cluster, bodies.stalled, (str(self.markers), token, STALL + 2.0), n=n, impl=self._impl(spec),
                 mode=spec.mode)
        marks = self._wait_markers(token, n, c)
        rec["stall"] = {"seconds": STALL, "ranks_in": marks is not None}
        if marks is not None:
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(STALL)
            finally:
                os.kill(pid, signal.SIGCONT)
        if _healthy_result(c, rec, token, n) is not None:
            rec["outcome"] = "ok"

    # -- binds that must be refused, a forged hello ------------------------------------------------
    def _pmi_fault(self, cluster: DaskCluster, spec: Spec, n: int, before: dict, rec: dict) -> None:
        """A healthy MPICH job whose member on one worker W is held back: every thread of W runs a
        bodies.hold_thread, so W's rank cannot start, and its PMI credential stays unbound. Then,
        with W's real PMI environment (GET /v1/jobs/{id}/env/{worker}):
        - pmi-injection: the soak's own uid (the workers') sends binds with commands behind the
          credential, PMI-1 and PMI-2 (pmibind.injections);
        - foreign-pmi-binder: another uid (nobody) binds with it, PMI-1 and PMI-2 (pmibind.binds).
        Each must be answered rc=-1 and closed (the foreign one naming its uid) and W's member must
        still be unbound after them (pmi.harmful); W's rank is then let go and the job succeeds (a
        bind that took W's seat would have the real rank refused, and the job fail)."""
        import random

        out: dict[str, Any] = {}
        rec["pmi"] = out
        token = f"j{spec.idx}"
        if cluster.name != "mpich":
            out["skipped"] = "an Open MPI cluster: its ranks speak PMIx, not PMI"
            return self._healthy(cluster, spec, n, before, rec)
        if spec.fault == "foreign-pmi-binder" and os.getuid() != 0:
            out["skipped"] = "running as another uid needs root"
            return self._healthy(cluster, spec, n, before, rec)
        addresses = sorted(before)
        held = random.Random(spec.idx).choice(addresses)
        members = [held] + [a for a in addresses if a != held][: n - 1]
        out["held"], harmful = held, []
        out["harmful"] = harmful
        release = self.markers / f"{token}.release"
        holds = [cluster.client.submit(bodies.hold_thread, str(self.markers), token, i, HOLD_WITHIN, workers=[held],
                                       allow_other_workers=False, pure=False) for i in range(cluster.nthreads)]
        c: Call | None = None
        try:
            if _until(lambda: all((self.markers / f"{token}.hold{i}.in").exists() for i in range(cluster.nthreads)),
                      MARKERS_WITHIN):
                known = {j["id"] for j in cluster.rest.jobs()}
                c = call(cluster, bodies.healthy, (token,), n=None, workers=members, impl="mpich", mode=spec.mode)
                self._bind_held(cluster, spec, known, held, out)
            else:
                out["error"] = f"the tasks holding {held}'s threads did not start within {MARKERS_WITHIN:.0f} s"
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {e}"[:400]
        finally:
            release.touch()
            bounded(lambda: cluster.client.gather(holds), 30.0)
        if c is None:
            return self._healthy(cluster, spec, n, before, rec)
        if _healthy_result(c, rec, token, len(members)) is not None:
            rec["outcome"] = "ok"

    def _bind_held(self, cluster: DaskCluster, spec: Spec, known: set, held: str, out: dict) -> None:
        """The binds of a PMI fault, while `held`'s rank of the job not in `known` is held back."""
        harmful = out["harmful"]
        job = _until(lambda: next((j for j in cluster.rest.jobs() if j["id"] not in known), None), 20.0)
        if job is None:
            out["error"] = "the job did not appear in the sidecar's REST within 20 s"
            return
        env = cluster.rest.member_env(job["id"], held)["env"]
        out.update(job=job["id"], port=env.get("PMI_PORT"), member_before=self._member_state(cluster, job["id"], held))
        if not env.get("PMI_PORT") or not env.get("PMI_ID"):
            out["error"] = f"no PMI_PORT / PMI_ID in the member's environment: {sorted(env)}"
            return
        if out["member_before"] != "assigned":
            out["error"] = f"the held member was {out['member_before']} before the binds: not held back"
            return
        if spec.fault == "pmi-injection":
            report = pmibind.main({"port": env["PMI_PORT"], "payloads": pmibind.injections(env["PMI_ID"])})
        else:
            plan = {"port": env["PMI_PORT"], "payloads": pmibind.binds(env["PMI_ID"])}
            proc = subprocess.run(["/usr/bin/python3", pmibind.__file__, json.dumps(plan)], user=stranger.NOBODY,
                                  group=stranger.NOBODY, cwd="/tmp", capture_output=True, text=True, timeout=60)
            try:
                report = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                out["error"] = f"the binder as uid {stranger.NOBODY} gave no report: {proc.stderr[-300:]}"
                return
            for name, a in report["answers"].items():
                # The refusal names the uid (src/pmi/peer-uid.ts; PMI-1 writes its spaces as _).
                if "may not bind this rank" not in a.get("text", "").replace("_", " "):
                    harmful.append(f"{name}: not refused for its uid: {a.get('text', a.get('error'))!r:.160}")
        out.update(uid=report["uid"], answers={k: a.get("text", a.get("error", ""))[:160]
                                               + ("" if a.get("closed") else " (not closed)")
                                               for k, a in report["answers"].items()})
        harmful.extend(pmibind.harmful(report["answers"]))
        out["member_after"] = self._member_state(cluster, job["id"], held)
        if out["member_after"] != "assigned":
            harmful.append(f"the held member was {out['member_after']} after the binds, before its rank started")

    def _member_state(self, cluster: DaskCluster, job_id: str, worker: str) -> str | None:
        try:
            return next((m.get("state") for m in cluster.rest.job(job_id).get("members", [])
                         if m.get("workerId") == worker), None)
        except Exception as e:  # noqa: BLE001
            return f"unknown: {e}"

    def _forged_hello(self, cluster: DaskCluster, spec: Spec, n: int, before: dict, rec: dict) -> None:
        """A local process (the soak's) connects to the listener of one worker A of the tcp+mpi
        cluster and sends the transport hello of the other, B: B's description as B itself gives
        it (dask_pmix.comm.paths.describe: its pool epoch, rank, local peers, pid). Hellos being
        authenticated (a per-pool secret), the forgery must be answered mpi:false (or not at all);
        mpi:true is a violation, as is the real pair of A and B no longer moving a block over MPI
        afterwards, either way (comm_stats). A healthy job runs on the spec's cluster after it."""
        out: dict[str, Any] = {}
        rec["forged_hello"] = out
        comm = self.comm
        if comm is None:
            out["skipped"] = "no tcp+mpi cluster (soak.py starts it with the Open MPI one)"
            return self._healthy(cluster, spec, n, before, rec)
        try:
            self._forge(comm, spec.idx, out)
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {e}"[:400]
        self._healthy(cluster, spec, n, before, rec)

    def _forge(self, comm: DaskCluster, idx: int, out: dict) -> None:
        harmful: list[str] = []
        out["harmful"] = harmful
        descs = comm.client.run(bodies.comm_description)
        a, b = sorted(descs)[:2]
        desc_b = descs[b]["description"]
        out.update(listener=a, impersonated=b, description={k: desc_b.get(k) for k in ("epoch", "rank", "local")})
        # The real pair has its MPI path first (the first connections of a new pool may go TCP
        # while the pair's communicator is built: tcp+mpi revisits them).
        moved = _until(lambda: self._pair_moves_over_mpi(comm, a, b, idx) or None, 30.0)
        if not moved:
            out["error"] = f"the real pair {a} / {b} moved no block over MPI before the forgery"
            return
        host, port = a.split("://", 1)[1].rsplit(":", 1)
        answers = [hello_forger.forge(host, int(port), desc_b)]
        # Its own pid, as a process replaying the description would have.
        answers.append(hello_forger.forge(host, int(port), {**desc_b, "pid": os.getpid()}))
        out["answers"] = answers
        for i, ans in enumerate(answers):
            if ans.get("answer", {}).get("mpi"):
                harmful.append(f"forged hello {i} (as {b}'s pool rank {desc_b.get('rank')}) answered mpi:true: "
                               f"{json.dumps(ans['answer'], default=str)[:200]}")
        if not self._pair_moves_over_mpi(comm, a, b, idx + 1):
            # Once more: a transfer that raced the forgery's own pair reservation may go TCP once.
            if not _until(lambda: self._pair_moves_over_mpi(comm, a, b, idx + 2) or None, 10.0):
                harmful.append(f"after the forgery the real pair {a} / {b} moves its blocks over TCP")

    def _pair_moves_over_mpi(self, comm: DaskCluster, a: str, b: str, seed: int) -> bool:
        """A block from a to b and one from b to a: whether both arrived over MPI (each
        receiver's comm_stats mpi bytes_received grew by a block)."""
        def received() -> dict[str, int]:
            return {w: s["stats"]["mpi"]["bytes_received"] for w, s in comm.client.run(bodies.comm_description).items()}

        r0 = received()
        for src, dst in ((a, b), (b, a)):
            x = comm.client.submit(bodies.block, FORGED_BLOCK, seed, workers=[src], allow_other_workers=False, pure=False)
            y = comm.client.submit(bodies.total, x, workers=[dst], allow_other_workers=False, pure=False)
            y.result(timeout=60)
            del x, y
        r1 = received()
        return all(r1.get(w, 0) - r0.get(w, 0) >= FORGED_BLOCK for w in (a, b))

    # -- client.restart() mid-job -----------------------------------------------------------------
    def _client_restart(self, cluster: DaskCluster, spec: Spec, n: int, rec: dict) -> None:
        """client.restart() while a job's members wait between two Barriers: the job fails with
        MPIJobError saying the cluster was restarted (client.restart()) within RESTART_BOUND s of the
        call. Dask drops all data on a restart by design: the canary is made again, its chunks
        counted apart (canary_recomputed_by_client_restart), not as lost to dask-pmix."""
        token = f"j{spec.idx}"
        c = call(cluster, bodies.faulty, (str(self.markers), token, 0, "hold", SIDECAR_HOLD), n=n,
                 impl=self._impl(spec), mode=spec.mode)
        marks = self._wait_markers(token, n, c)
        rec["ranks_in"] = marks is not None
        restart: dict[str, Any] = {}
        rec["restart"] = restart
        t_fault = time.monotonic()
        if marks is not None:
            def target() -> None:
                try:
                    cluster.client.restart(timeout=120)
                except BaseException as e:  # noqa: BLE001
                    restart["error"] = f"{type(e).__name__}: {e}"[:300]
                restart["seconds"] = round(time.monotonic() - t_fault, 2)

            rt = threading.Thread(target=target, name="soak-restart", daemon=True)
            rt.start()
        if c.settle(rec):
            err = c.box.get("error")
            rec["error"] = _error_record(err)
            rec["latency"] = round(c.box["t_end"] - t_fault, 3)
            rec["bound"] = RESTART_BOUND
            rec["says_restart"] = err is not None and "the cluster was restarted (client.restart())" in str(err)
            rec["outcome"] = ("failed-as-promised" if isinstance(err, MPIJobError) and rec["says_restart"]
                              and rec["latency"] <= RESTART_BOUND and marks is not None
                              else "failed-late" if isinstance(err, MPIJobError) and rec["says_restart"]
                              else "not-failed" if err is None else "wrong-error")
        if marks is not None:
            rt.join(150)
            restart["remade_canary"] = bounded(lambda: cluster.make_canary() or "ok", 120.0)

    # -- silent connections -----------------------------------------------------------------------
    def _open_silent(self, cluster: DaskCluster) -> dict:
        """A connection that sends nothing, to the port a member's environment names
        (PMIX_SERVER_URI*), or to libpmix's own listener behind the gate (a UNIX socket this uid
        reaches), or (MPICH) to the PMI listener; it stays open over the next SILENT_JOBS jobs."""
        record: dict[str, Any] = {}
        if cluster.name == "mpich":
            text = cluster.sidecar_log.read_text(errors="replace")
            ports = re.findall(r'"pmiPort":"[^"]*:(\d+)"', text)
            record.update(target="pmi", port=int(ports[-1]) if ports else None)
        else:
            # Alternately the gate's port (what ranks are given) and libpmix's own listener behind it.
            self._silent_openmpi += 1
            if self._silent_openmpi % 2 == 1 or cluster.libpmix_socket() is None:
                uris = self._member_uris(cluster)
                m = next((re.search(r"tcp4?://[^;]*:(\d+)", v) for v in uris.values()), None)
                record.update(target="pmix-gate", port=int(m.group(1)) if m else None, env=sorted(uris))
            else:
                record.update(target="libpmix-unix", port=0, path=cluster.libpmix_socket())
        if record.get("port") is None:
            record["error"] = "no port found"
            return record
        try:
            if record.get("path"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect(record["path"])
            else:
                s = socket.create_connection(("127.0.0.1", record["port"]), timeout=5)
        except OSError as e:
            record["error"] = f"connecting to port {record['port']}: {e}"
            record["sidecar_listening"] = listening_ports(cluster.sidecar()["pid"])
            return record
        s.setblocking(False)
        self.silent.append({"sock": s, "left": SILENT_JOBS, "record": record, "opened": time.monotonic()})
        return record

    def _member_uris(self, cluster: DaskCluster) -> dict[str, str]:
        def env():
            return {k: v for k, v in os.environ.items() if k.startswith("PMIX_SERVER_URI")}

        for address in sorted(cluster.worker_pids()):
            try:
                uris = cluster.client.run(env, workers=[address]).get(address) or {}
            except Exception:  # noqa: BLE001
                continue
            if uris:
                return uris
        return {}

    def _tick_silent(self, rec: dict) -> None:
        for s in list(self.silent):
            sock = s["sock"]
            if "closed_by_peer_after" not in s["record"]:
                try:
                    if sock.recv(1) == b"":
                        s["record"]["closed_by_peer_after"] = round(time.monotonic() - s["opened"], 1)
                except BlockingIOError:
                    pass
                except OSError as e:
                    s["record"]["closed_by_peer_after"] = round(time.monotonic() - s["opened"], 1)
                    s["record"]["peer_error"] = str(e)
            s["left"] -= 1
            rec.setdefault("silent_open", []).append(s["record"].get("target"))
            if s["left"] <= 0:
                sock.close()
                self.silent.remove(s)

    def close_silent(self) -> None:
        for s in self.silent:
            s["sock"].close()
        self.silent.clear()
