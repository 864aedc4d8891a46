"""Soak: many run_mpi jobs on real Dask clusters with injected faults, and the invariants after.

    .venv/bin/python bench/soak.py --jobs 1000 --out bench/results/soak.json
    .venv/bin/python bench/soak.py --jobs 100 --check        # the test command's version

Two clusters run as production runs them (`dask scheduler --preload dask_pmix`, whose plugin
starts the embedded sidecar, and `dask worker` processes under nannies): one from .venv (Open
MPI: in-process by default, and fork), one from .venv-mpich (MPICH, fork), each of 4 workers. The
jobs mix clusters, modes and sizes 1-4; about a tenth are faults (soaklib/plan.py): kill -9 of a
member mid-job, MPI_Abort, a rank that hangs (in Python or in MPI) under a run_mpi timeout, a
silent connection to the sidecar held over several jobs, another uid at every port of the sidecar, 300
silent connections kept open on the PMIx gate during a job, SIGTERM and kill -9 of the sidecar,
PMI binds with commands behind a member's credential and binds with it from another uid (each
while that member's rank is held back), a forged tcp+mpi hello (to two workers of a third, small
cluster listening on tcp+mpi://, started only for it), client.restart() mid-job.
After each fault, the next job on that cluster must succeed. Checked (each a violation when it
does not hold; --check exits 1 on any):
  - no run_mpi hangs: each returns or raises within its bound (a watchdog thread per job);
  - each fault fails its job with MPIJobError within the promised bound (2 s for a member or
    the sidecar lost or a client.restart(), timeout + 2 s for a hang), and a hang says it timed
    out, a restart that the cluster was restarted;
  - the PMI binds are refused (rc=-1, closed; another uid's for its uid) and bind nothing, the
    forged hello is answered mpi:false and the real pair keeps its MPI path; their jobs succeed;
  - every healthy job succeeds with the right answer;
  - a killed sidecar is restarted and gets its workers and psets back;
  - no member left running on a worker 20 s after its job's call returned (asked of the workers'
    threads; a worker that does not answer counts, with gdb's native stacks of its threads): the
    soak then restarts that cluster's workers, so that one failure is not counted again;
  - at the end: no frozen worker (sidecar REST and the plugin), the sidecar's workers are Dask's,
    no active job, no PMIx namespace left in the sidecar's tmpdir, no orphaned /dev/shm file of
    the soak's processes, none left once the clusters stop (soaklib/shm.py: a private /dev/shm),
    no process left behind, and the sidecar's memory flat: the C allocator's bytes in use
    (libpmix, the addon, Node) and V8's heap in use, each a least-squares line over each process's
    life after a warm-up that fills its job history (soaklib/rss.py says why not RSS, nor RSS
    minus the heap's size, which are reported beside them).
Prints one JSON document (and writes it to --out): the invariants, the violations, the findings
(what went wrong, by the fault it followed), the faults by kind, the sidecar's RSS, each job's record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from soaklib import shm  # noqa: E402
from soaklib.plan import HEALTHY_FAULTS  # noqa: E402

WORKERS = 4
SAMPLE_EVERY = 10        # RSS and /dev/shm samples every this many jobs (fewer jobs: more often)
# The sidecars keep this many ended jobs (serve --job-history; 1,000 by default): their memory
# grows with that history, by about 6 KB a job, until it is full, which a 1,000-job soak never saw
# with the default, so that a leak of that size hid in it. With 100, it is full after about 200 of
# the soak's jobs (two clusters share them), and the warm-up covers that.
JOB_HISTORY = 100
RSS_WARMUP = 250         # jobs of a sidecar's life before its memory counts as steady
RSS_LIMIT_MB = 10.0      # the fitted growth allowed per 1,000 jobs (stretches of 300 jobs or more)
RSS_SHORT_MARGIN_MB = 16.0  # shorter stretches: the second half's peak over the first half's
SETTLE = 30.0            # the end: how long frozen workers, jobs and namespaces may take to clear
STABLE = {"inprocess": 3.5, "fork": 0.5}  # workers unchanged this long after a fault's next job
ACTIVE = ("pending", "wiring", "running")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--faults", type=float, default=0.1, help="share of the jobs that are faults")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--mpich-share", type=float, default=0.3, help="share of the jobs on the MPICH cluster")
    ap.add_argument("--fork-share", type=float, default=1 / 3,
                    help="share of the Open MPI jobs asking for fork mode (the rest: in-process, asked for or by default)")
    ap.add_argument("--clusters", default="openmpi,mpich")
    ap.add_argument("--sidecar-faults-from", type=float, default=0.75,
                    help="the sidecar faults come after this share of the jobs")
    ap.add_argument("--fork-faults", default="",
                    help="fault kinds (comma-separated) that run in fork mode on the Open MPI cluster too")
    ap.add_argument("--fault-kinds", default="",
                    help="only these fault kinds (comma-separated; default: all, by soaklib.plan.FAULT_WEIGHTS)")
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) even when all holds")
    ap.add_argument("--check", action="store_true", help="exit 1 when an invariant does not hold")
    return ap.parse_args()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(round(q * (len(v) - 1))))], 3)


def wait_stable(cluster, window: float, within: float = 120.0) -> float | None:
    """Waits until the cluster has all its workers, unchanged for `window` s, each registered
    with the sidecar; returns how long that took, None if not within `within`."""
    t0 = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            now = cluster.worker_pids()
            registered = {w["id"] for w in cluster.rest.workers() if w.get("state") != "gone"}
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
            continue
        if now != last:
            last, since = now, time.monotonic()
        if len(now) == cluster.n_workers and set(now) <= registered and time.monotonic() - since >= window:
            return round(time.monotonic() - t0, 2)
        time.sleep(0.1)
    return None


def final_state(cluster) -> dict:
    """The end: frozen workers, the sidecar's workers against Dask's, active jobs, namespaces,
    after waiting up to SETTLE s for them to clear."""
    t0 = time.monotonic()
    while True:
        rest_workers = cluster.rest.workers()
        live = [w for w in rest_workers if w.get("state") != "gone"]
        side = cluster.sidecar()
        jobs = cluster.rest.jobs()
        active = [j["id"] for j in jobs if j.get("state") in ACTIVE]
        dask = set(cluster.worker_pids())
        state = {
            "frozen_rest": sorted(w["id"] for w in live if w.get("state") == "frozen"),
            "frozen_plugin": side["frozen"],
            "sidecar_not_dask": sorted({w["id"] for w in live} - dask),
            "dask_not_sidecar": sorted(dask - {w["id"] for w in live}),
            "active_jobs": active,
            "namespaces_on_disk": cluster.namespaces_on_disk(),
        }
        if not any(state.values()) or time.monotonic() - t0 > SETTLE:
            break
        time.sleep(0.5)
    state["settled_s"] = round(time.monotonic() - t0, 1)
    metrics = cluster.metrics()
    state["metrics"] = {k: v for k, v in metrics.items()
                        if k.startswith(("dask_pmix_jobs{", "dask_pmix_workers{", "dask_pmix_pool_epochs",
                                         "dask_pmix_pool_ranks{", "dask_pmix_jobs_created_total"))}
    state["jobs_in_history"] = len(jobs)
    state["sidecar"] = {"pid": side["pid"], "restarts": side["restarts"]}
    return state


def summarize(records: list[dict]) -> dict:
    out: dict = {}
    by_idx = {r["idx"]: r for r in records}
    healthy = [r for r in records if r["fault"] in (None, *HEALTHY_FAULTS)]
    by_kind: dict[str, dict] = {}
    for r in healthy:
        key = f"{r['cluster']}/{r['mode'] or 'default'}"
        k = by_kind.setdefault(key, {"jobs": 0, "ok": 0, "ran": {}, "seconds": []})
        k["jobs"] += 1
        k["ok"] += r["outcome"] == "ok"
        if r.get("ran"):
            k["ran"][r["ran"]] = k["ran"].get(r["ran"], 0) + 1
        if r["outcome"] == "ok":
            k["seconds"].append(r["seconds"])
    for k in by_kind.values():
        s = k.pop("seconds")
        k["seconds"] = {"median": pct(s, 0.5), "p90": pct(s, 0.9), "max": pct(s, 1.0)}
    out["healthy_jobs"] = by_kind
    out["sizes"] = {str(n): sum(1 for r in records if r["n"] == n) for n in sorted({r["n"] for r in records})}
    faults: dict[str, dict] = {}
    for r in records:
        if r["fault"] is None:
            continue
        key = f"{r['fault']}@{r['cluster']}"
        f = faults.setdefault(key, {"count": 0, "as_promised": 0, "outcomes": {}, "latency_s": [], "next_job_ok": 0,
                                    "modes": {}})
        f["count"] += 1
        f["outcomes"][r["outcome"]] = f["outcomes"].get(r["outcome"], 0) + 1
        f["as_promised"] += r["outcome"] in ("failed-as-promised", "ok")
        f["modes"][r["mode"] or "default"] = f["modes"].get(r["mode"] or "default", 0) + 1
        if "latency" in r:
            f["latency_s"].append(r["latency"])
        nxt = next((x for x in records if x.get("follows") == r["idx"]), None)
        f["next_job_ok"] += nxt is not None and nxt["outcome"] == "ok"
    for f in faults.values():
        lat = f.pop("latency_s")
        if lat:
            f["latency_s"] = {"median": pct(lat, 0.5), "max": pct(lat, 1.0)}
    out["faults"] = dict(sorted(faults.items()))
    # Workers that left Dask during a job (a nanny's restart brings a new worker in its place),
    # by the job they left in: the fault's victim is expected, survivors of it are not.
    restarts: dict[str, int] = {}
    for r in records:
        if r.get("workers_lost"):
            key = r["fault"] or (f"next job after {by_idx[r['follows']]['fault']}" if r.get("follows") is not None
                                 else "healthy job")
            key = f"{key}@{r['cluster']}/{r['mode'] or 'default'}"
            restarts[key] = restarts.get(key, 0) + len(r["workers_lost"])
    out["workers_lost_during_jobs"] = dict(sorted(restarts.items()))
    # What went wrong, by the fault it followed (a fault's own job, or the next job after it).
    findings: dict[str, dict] = {}
    for r in records:
        bad = r["outcome"] not in ("ok", "failed-as-promised") or r.get("members_left_frozen")
        if not bad:
            continue
        cause = r if r["fault"] not in (None, *HEALTHY_FAULTS) else by_idx.get(r.get("follows"), r)
        key = (f"{cause['fault'] or 'healthy job'}@{cause['cluster']}/{cause['mode'] or 'default'}"
               + (" (its next job)" if cause is not r else ""))
        f = findings.setdefault(key, {"jobs": [], "outcomes": {}, "members_left_frozen": 0})
        f["jobs"].append(r["idx"])
        f["outcomes"][r["outcome"]] = f["outcomes"].get(r["outcome"], 0) + 1
        f["members_left_frozen"] += len(r.get("members_left_frozen", []))
        f.setdefault("example_error", (r.get("error") or {}).get("message"))
        frames = next((m.get("frames") for m in r.get("members_left_frozen", []) if m.get("frames")), None)
        if frames and "example_stuck_at" not in f:
            f["example_stuck_at"] = frames[:3]
    out["findings"] = findings
    return out


def _canary_loss_explained(r: dict) -> bool:
    """Whether a job's canary chunks computed again are explained by what the soak did, not by dask-pmix."""
    return r["fault"] in ("kill", "client-restart") or bool(r.get("cluster_restarted_by_the_soak"))


def violations_of(result: dict, records: list[dict]) -> list[str]:
    from soaklib.faults import FROZEN_WITHIN

    v = []
    for r in records:
        where = f"job {r['idx']} ({r['cluster']}, mode {r['mode']}, n={r['n']}, fault {r['fault']})"
        if r["outcome"] == "hung":
            v.append(f"{where}: run_mpi hung (no return within the watchdog's bound)")
        if r.get("stranger", {}).get("harmful"):
            v.append(f"{where}: another uid got in: {r['stranger']['harmful'][:3]}")
        for key, what in (("pmi", "a bind that must be refused was not"), ("forged_hello", "a forged hello got in")):
            if r.get(key, {}).get("harmful"):
                v.append(f"{where}: {what}: {r[key]['harmful'][:3]}")
            if r.get(key, {}).get("error"):
                v.append(f"{where}: the fault could not be done: {r[key]['error']}")
        if r.get("restart", {}).get("error") or str(r.get("restart", {}).get("remade_canary", "ok")) != "ok":
            v.append(f"{where}: client.restart() or the canary after it failed: {json.dumps(r['restart'])[:300]}")
        if r["outcome"] == "hung":
            pass
        elif r["fault"] in (None, *HEALTHY_FAULTS) and r["outcome"] != "ok":
            what = "the next job after a fault" if r.get("follows") is not None else "a healthy job"
            v.append(f"{where}: {what} did not succeed: {r['outcome']} {json.dumps(r.get('error') or r.get('result'))}")
        elif r["fault"] not in (None, *HEALTHY_FAULTS) and r["outcome"] != "failed-as-promised":
            timeline = f", timeline {json.dumps(r['timeline'])}" if r.get("timeline") else ""
            v.append(f"{where}: {r['outcome']} (latency {r.get('latency')} s, bound {r.get('bound')} s{timeline}): "
                     f"{json.dumps(r.get('error'))}")
        rec = r.get("recovery")
        if rec is not None:
            if not rec.get("restarted"):
                v.append(f"{where}: the sidecar was not restarted")
            elif not rec.get("workers_back_s"):
                v.append(f"{where}: the workers were not registered again")
            elif rec.get("psets_back") is False:
                v.append(f"{where}: the psets did not come back")
        for m in r.get("members_left_frozen", []):
            who = (f"rank {m['rank']} of job {m['job']}" if m.get("job") else
                   f"a member (the worker gave no answer: {m.get('answer')})")
            v.append(f"{where}: {who} on {m['worker']} still running {FROZEN_WITHIN:.0f} s after its call returned "
                     f"(left frozen; the soak restarted the cluster's workers), at "
                     f"{json.dumps((m.get('frames') or [])[:2])[:700]}")
        if r.get("recovered_s", 0) is None or r.get("restart_recovered_s", 0) is None:
            v.append(f"{where}: the cluster did not get all its workers back within 120 s")
        if rec is not None and rec.get("pool_back_s", 0) is None:
            v.append(f"{where}: the workers' pool seats were not all ready again within 120 s")
        # A chunk of the canary computed again: its worker's data was lost. A member killed by the
        # soak, a client.restart() (Dask drops all data: the soak makes the canary again), or the
        # soak's own restart after a hang, may cause that; nothing dask-pmix does may.
        if r.get("canary_recomputed") and not _canary_loss_explained(r):
            v.append(f"{where}: {r['canary_recomputed']} chunk(s) of data held since the start were computed again")
    for name, st in result["final"].items():
        for key in ("frozen_rest", "frozen_plugin", "sidecar_not_dask", "dask_not_sidecar", "active_jobs",
                    "namespaces_on_disk"):
            if st.get(key):
                v.append(f"{name}: {key} at the end after {st['settled_s']} s: {st[key][:8]}")
    if result["shm"]["orphaned_at_end"]:
        v.append(f"/dev/shm: {len(result['shm']['orphaned_at_end'])} orphaned files at the end: "
                 f"{result['shm']['orphaned_at_end'][:6]}")
    if result["shm"]["left_after_stop"]:
        v.append(f"/dev/shm: {len(result['shm']['left_after_stop'])} files left after the clusters stopped: "
                 f"{result['shm']['left_after_stop'][:6]}")
    if result.get("client_loaded_mpi_at"):
        v.append(f"the client process loaded mpi4py.MPI (an MPI library) at {result['client_loaded_mpi_at']}")
    if result["processes_left"]:
        v.append(f"processes left after the clusters stopped: {result['processes_left'][:6]}")
    for name, segs in result["rss"].items():
        for seg in segs:
            if seg.get("flat") is False:
                grew = {k: g for k, g in seg["checked"].items() if not g["flat"]}
                v.append(f"{name}: sidecar pid {seg['pid']} memory not flat over jobs {seg['jobs']}: {grew} "
                         f"(RSS {seg['rss_mb']}, fitted {seg.get('growth_mb_per_1000_jobs')} MB per 1,000 jobs)")
    return v


def main() -> int:
    args = parse()
    shm.enter_private_shm(sys.argv)
    from soaklib.cluster import DaskCluster
    from soaklib.faults import Runner
    from soaklib.plan import make_plan
    from soaklib.rss import segments

    names = tuple(args.clusters.split(","))
    plan = make_plan(args.jobs, args.faults, args.seed, clusters=names, mpich_share=args.mpich_share,
                     kinds=tuple(k for k in args.fault_kinds.split(",") if k) or None,
                     fork_share=args.fork_share, sidecar_faults_from=args.sidecar_faults_from,
                     fork_faults=tuple(filter(None, args.fork_faults.split(","))))
    workdir = Path(tempfile.mkdtemp(prefix="dask-pmix-soak-"))
    ledger = shm.ShmLedger()
    load0 = os.getloadavg()
    t_start = time.monotonic()
    venvs = {"openmpi": ROOT / ".venv", "mpich": ROOT / ".venv-mpich"}
    clusters = {
        n: DaskCluster(n, venvs[n], workdir, WORKERS, sidecar_args=["--job-history", str(JOB_HISTORY)]) for n in names
    }
    # The forged hellos go to workers that listen on tcp+mpi://: two of their own, in one cohort
    # (the sm path between them), since the soak's clusters stay tcp:// (tcp+mpi would put the
    # comm backend under every job and transfer they measure).
    comm = (DaskCluster("comm", venvs["openmpi"], workdir, 2, protocol="tcp+mpi")
            if any(s.fault == "forged-hello" for s in plan) and "openmpi" in names else None)
    every_cluster = [*clusters.values(), *([comm] if comm else [])]
    errors: list[BaseException] = []

    def connect(c):
        try:
            c.connect()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    try:
        for c in every_cluster:
            c.launch_scheduler()
        for c in every_cluster:
            c.launch_workers()
    except BaseException as e:  # noqa: BLE001
        errors.append(e)
    threads = [threading.Thread(target=connect, args=(c,)) for c in every_cluster] if not errors else []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records: list[dict] = []
    rss_samples: dict[str, list[dict]] = {n: [] for n in names}
    shm_samples: list[dict] = []
    result: dict = {"jobs": args.jobs, "seed": args.seed, "fault_share": args.faults, "mpich_share": args.mpich_share,
                    "fork_share": round(args.fork_share, 3),
                    "fork_faults": args.fork_faults or None, "workers_per_cluster": WORKERS,
                    "private_dev_shm": shm.private(), "workdir": str(workdir)}
    try:
        if errors:
            raise errors[0]
        result["startup_s"] = round(time.monotonic() - t_start, 1)
        for c in clusters.values():  # a pset whose definition must survive the sidecar's restarts
            c.rest.define_pset("soak-kept", members=sorted(c.worker_pids())[:2])
        runner = Runner(clusters, workdir, comm)
        t_jobs = time.monotonic()

        def sample(i: int) -> None:
            for n, c in clusters.items():
                side = c.sidecar()
                from soaklib.cluster import rss_kb, sidecar_heap_kb

                heap = sidecar_heap_kb(c.url, c.token)  # then RSS at once, for RSS minus the heap's size
                rss_samples[n].append({"job": i, "pid": side["pid"], "rss_kb": rss_kb(side["pid"]), **heap})
            s = ledger.sample(f"after job {i}")
            shm_samples.append({"job": i, "files": s["files"], "orphaned": len(s["orphaned"])})

        every = max(2, min(SAMPLE_EVERY, len(plan) // 40))
        sample(0)
        for i, spec in enumerate(plan):
            rec = runner.run(spec)
            records.append(rec)
            if "mpi4py.MPI" in sys.modules and "client_loaded_mpi_at" not in result:
                # The README: "the scheduler and clients never import it".
                result["client_loaded_mpi_at"] = {"job": spec.idx, "fault": spec.fault, "mode": spec.mode,
                                                  "cluster": spec.cluster}
            if rec["outcome"] not in ("ok", "failed-as-promised") or rec.get("members_left_frozen"):
                print(f"[soak] job {spec.idx} ({spec.cluster}, {spec.mode}, n={spec.n}, fault {spec.fault}): "
                      f"{rec['outcome']}, {len(rec.get('members_left_frozen', []))} members left frozen "
                      f"{json.dumps(rec.get('error'))[:300]}", file=sys.stderr, flush=True)
            if rec.get("cluster_restarted_by_the_soak"):
                rec["restart_recovered_s"] = wait_stable(clusters[spec.cluster], STABLE["inprocess"])
            if spec.follows is not None:  # the fault and its next job are done: let the cluster heal
                fault = next(r for r in records if r["idx"] == spec.follows)
                mode = "fork" if spec.cluster == "mpich" or fault["mode"] == "fork" else "inprocess"
                rec["recovered_s"] = wait_stable(clusters[spec.cluster], STABLE[mode])
            if (i + 1) % every == 0 or i + 1 == len(plan):
                sample(i + 1)
            if (i + 1) % 50 == 0:
                bad = sum(1 for r in records if r["outcome"] not in ("ok", "failed-as-promised"))
                print(f"[soak] {i + 1}/{len(plan)} jobs, {time.monotonic() - t_jobs:.0f} s, {bad} not as expected",
                      file=sys.stderr, flush=True)
        runner.close_silent()
        result["jobs_s"] = round(time.monotonic() - t_jobs, 1)
        result["final"] = {n: final_state(c) for n, c in clusters.items()}
        if comm is not None:
            result["final"]["comm"] = final_state(comm)
        end = ledger.sample("end")
        result["shm"] = {"before": len(ledger.before), "max_files": ledger.max_files, "orphaned_at_end": end["orphaned"],
                         "samples": shm_samples[:: max(1, len(shm_samples) // 25)]}
    finally:
        stops = {c.name: c.stop() for c in every_cluster}
    time.sleep(1.0)
    result.setdefault("shm", {})["left_after_stop"] = ledger.left_after_stop()
    result["shm"]["leftovers"] = ledger.describe(sorted(set(result["shm"]["left_after_stop"])
                                                        | set(result["shm"].get("orphaned_at_end", []))))
    result["stops"] = stops
    me = os.getpid()
    result["processes_left"] = [f"{p} {Path(f'/proc/{p}/cmdline').read_text().replace(chr(0), ' ')[:100]}"
                                for p in shm.soak_pids() if p != me and Path(f"/proc/{p}").exists()
                                and p not in (os.getppid(),)] if shm.private() else []
    result["load_avg"] = {"start": [round(x, 1) for x in load0], "end": [round(x, 1) for x in os.getloadavg()]}
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["summary"] = summarize(records)
    result["sidecar_faults"] = [{"idx": r["idx"], "fault": r["fault"], "cluster": r["cluster"], "mode": r["mode"],
                                 "latency": r.get("latency"), "outcome": r["outcome"], "recovery": r.get("recovery"),
                                 "next_job": next(({"outcome": x["outcome"], "ran": x.get("ran"), "mode": x["mode"]}
                                                   for x in records if x.get("follows") == r["idx"]), None)}
                                for r in records if r["fault"] in ("sidecar-term", "sidecar-kill")]
    result["silent"] = [r["silent"] for r in records if r.get("silent")]
    result["rss"] = {n: segments(s, RSS_WARMUP, RSS_LIMIT_MB, RSS_SHORT_MARGIN_MB) for n, s in rss_samples.items()}
    result["rss_samples"] = {n: [(s["job"], s["rss_kb"], s.get("heap_total_kb"), s.get("heap_used_kb"),
                                  s.get("malloc_in_use_kb")) for s in ss]
                             for n, ss in rss_samples.items()}
    v = violations_of(result, records)
    result["violations"] = v
    result["ok"] = not v
    result["invariants"] = {
        "hung_jobs": sum(1 for r in records if r["outcome"] == "hung"),
        "faults_not_as_promised": sum(1 for r in records if r["fault"] not in (None, *HEALTHY_FAULTS)
                                      and r["outcome"] != "failed-as-promised"),
        "healthy_jobs_failed": sum(1 for r in records if r["fault"] in (None, *HEALTHY_FAULTS) and r["outcome"] != "ok"),
        "next_jobs_failed": sum(1 for r in records if r.get("follows") is not None and r["outcome"] != "ok"),
        "members_left_frozen": sum(len(r.get("members_left_frozen", [])) for r in records),
        # Chunks of the data held since the start computed again: all of them, and those no member
        # kill (nor the soak's own restart after a hang) explains, which dask-pmix's actions lost.
        "canary_recomputed": sum(r.get("canary_recomputed", 0) for r in records),
        "canary_recomputed_by_dask_pmix": sum(r.get("canary_recomputed", 0) for r in records
                                              if not _canary_loss_explained(r)),
        # Dask's by design: client.restart() drops every key, and the soak makes the canary again.
        "canary_recomputed_by_client_restart": sum(r.get("canary_recomputed", 0) for r in records
                                                   if r["fault"] == "client-restart"),
        "frozen_workers_at_end": sum(len(st["frozen_rest"]) + len(st["frozen_plugin"]) for st in result["final"].values()),
        "leaked_namespaces": sum(len(st["namespaces_on_disk"]) + len(st["active_jobs"]) for st in result["final"].values()),
        "shm_orphaned_at_end": len(result["shm"]["orphaned_at_end"]),
        "shm_left_after_stop": len(result["shm"]["left_after_stop"]),
        "rss_flat": {n: [s.get("flat") for s in segs] for n, segs in result["rss"].items()},
        "rss_growth_mb_per_1000_jobs": {n: [s.get("growth_mb_per_1000_jobs") for s in segs]
                                        for n, segs in result["rss"].items()},
        "native_growth_mb_per_1000_jobs": {n: [s["checked"].get("native", {}).get("growth_mb_per_1000_jobs")
                                               for s in segs] for n, segs in result["rss"].items()},
        "heap_used_growth_mb_per_1000_jobs": {n: [s["checked"].get("heap_used", {}).get("growth_mb_per_1000_jobs")
                                                  for s in segs] for n, segs in result["rss"].items()},
    }
    result["records"] = records
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if result["ok"] and not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if args.check and v else 0


if __name__ == "__main__":
    sys.exit(main())
