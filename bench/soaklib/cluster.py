"""A Dask cluster as production runs it: `dask scheduler --preload dask_pmix` (whose plugin starts
the embedded sidecar) and `dask worker` processes under their nannies, from one virtual
environment (mpi4py loads one MPI library per environment), plus what the soak reads of it."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from distributed import Client

from dask_pmix import wait_for_plugin
from dask_pmix.rest import SidecarClient

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the soak dies, so that a killed soak leaves nothing."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class DaskCluster:
    """One scheduler (with the dask-pmix plugin and its sidecar) and `n_workers` nanny workers."""

    def __init__(self, name: str, venv: Path, workdir: Path, n_workers: int, nthreads: int = 2,
                 protocol: str | None = None, sidecar_args: list[str] | None = None):
        self.name = name
        self.sidecar_args = list(sidecar_args or ())  # dask-pmix.sidecar.args of its scheduler
        self.protocol = protocol  # the workers' (`dask worker --protocol`); None: Dask's default, tcp
        self.venv = venv
        self.workdir = workdir / name
        self.n_workers = n_workers
        self.nthreads = nthreads
        self.pmix_tmpdir = self.workdir / "pmix-tmp"   # the sidecar's libpmix rendezvous directory
        self.sidecar_log = self.workdir / "sidecar.log"
        self.scheduler_file = self.workdir / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.client: Client | None = None
        self.rest: SidecarClient | None = None
        self.url = ""
        self.token = ""

    def _spawn(self, args: list[str], log: str, env: dict[str, str]) -> subprocess.Popen:
        out = open(self.workdir / log, "ab")
        try:
            p = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_die_with_parent, cwd=self.workdir)
        finally:
            out.close()
        self.procs.append(p)
        return p

    # Processes are started from the main thread only: the SIGKILL a child gets when its parent
    # dies (PR_SET_PDEATHSIG) is tied to the thread that started it.
    def launch_scheduler(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pmix_tmpdir.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "PMI_", "OMPI_", "DASK_PMIX_"))}
        env.update(PATH=f"{self.venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(self.venv),
                   DASK_PMIX_TMPDIR=str(self.pmix_tmpdir), DASK_DASK_PMIX__SIDECAR__LOG=str(self.sidecar_log),
                   PYTHONUNBUFFERED="1",
                   **({"DASK_DASK_PMIX__SIDECAR__ARGS": repr(self.sidecar_args)} if self.sidecar_args else {}),
                   # The jobs' functions (soaklib.bodies) are imported by reference where they run.
                   PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                            env.get("PYTHONPATH")])))
        self._env = env
        self._spawn([str(self.venv / "bin" / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--dashboard-address", ":0", "--scheduler-file", str(self.scheduler_file), "--preload",
                     "dask_pmix"], "scheduler.log", env)

    def launch_workers(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.scheduler_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the scheduler did not start within {timeout:.0f} s")
            time.sleep(0.2)
        self._spawn([str(self.venv / "bin" / "dask"), "worker", "--scheduler-file", str(self.scheduler_file),
                     "--nworkers", str(self.n_workers), "--nthreads", str(self.nthreads), "--host", "127.0.0.1",
                     "--no-dashboard", "--memory-limit", "0",
                     *(["--protocol", self.protocol] if self.protocol else [])], "workers.log", self._env)

    def connect(self, timeout: float = 180.0) -> None:
        """Waits for the workers and the plugin (any thread)."""
        self.client = Client(scheduler_file=str(self.scheduler_file), timeout=60, set_as_default=False)
        self.client.wait_for_workers(self.n_workers, timeout=timeout)
        info = wait_for_plugin(self.client, timeout=timeout)
        self.url, self.token = info["url"], info.get("token") or ""
        self.rest = SidecarClient(self.url, self.token, timeout=10)
        self.canary_log = self.workdir / "canary.log"
        self.make_canary()
        self.canary_seen = self.canary_computations()

    def make_canary(self) -> None:
        """Data kept for the whole soak, three chunks per worker: dask-pmix must never be why a
        chunk is computed again (a worker it replaces has its data moved first). Made again after
        a client.restart(), which drops all of it."""
        from soaklib import bodies

        self.canary = [self.client.submit(bodies.canary, i, str(self.canary_log), pure=False)
                       for i in range(3 * self.n_workers)]
        self.client.gather(self.canary)

    def canary_computations(self) -> int:
        """How many times the canary's chunks have been computed so far."""
        try:
            return len(self.canary_log.read_text().split())
        except OSError:
            return 0

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.name}: {p.args[:3]} exited with {p.returncode} (see {self.workdir})")

    # -- what the soak reads ------------------------------------------------------------------------
    def worker_pids(self) -> dict[str, int]:
        """Dask's workers: address -> the worker process's pid (as the scheduler knows it)."""
        return self.client.run_on_scheduler(
            lambda dask_scheduler: {a: int(ws.pid or 0) for a, ws in dask_scheduler.workers.items()})

    def sidecar(self) -> dict:
        """The embedded sidecar's pid and how often the plugin restarted it; the plugin's frozen set."""
        def probe(dask_scheduler):
            plugin = dask_scheduler.plugins["dask-pmix"]
            proc = plugin.embedded.proc if plugin.embedded is not None else None
            return {"pid": proc.pid if proc is not None else 0,
                    "alive": proc is not None and proc.poll() is None,
                    "restarts": plugin.embedded.restarts if plugin.embedded is not None else 0,
                    "frozen": sorted(plugin.frozen_workers())}

        return self.client.run_on_scheduler(probe)

    def gate_port(self) -> int | None:
        """The PMIx gate's port (where ranks connect), from the sidecar's start-up log line."""
        try:
            ports = re.findall(r'"pmix":"tcp4://[^"]*:(\d+)"', self.sidecar_log.read_text(errors="replace"))
        except OSError:
            return None
        return int(ports[-1]) if ports else None

    def libpmix_socket(self) -> str | None:
        """libpmix's own listener behind the gate (a UNIX socket only the sidecar's uid reaches),
        from the sidecar's start-up log line."""
        path = None
        try:
            for line in self.sidecar_log.read_text(errors="replace").splitlines():
                m = re.search(r'"libpmixSocket":"([^"]+)"', line)
                if m:
                    path = m.group(1)
        except OSError:
            pass
        return path

    def metrics(self) -> dict[str, float]:
        """GET /metrics, the dask_pmix_* samples: 'name{labels}' -> value."""
        import httpx

        text = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.token}"}, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("dask_pmix_") and " " in line:
                key, value = line.rsplit(" ", 1)
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out

    def namespaces_on_disk(self) -> list[str]:
        """The per-job PMIx namespace directories the sidecar keeps in its tmpdir while a job lives."""
        jobs = self.pmix_tmpdir / "jobs"
        return sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []

    def stop(self, timeout: float = 60.0) -> dict:
        """Closes the client, then SIGTERM to the workers' nannies and the scheduler (whose plugin
        stops the sidecar); what did not end in time is killed and reported."""
        if self.client is not None:
            try:
                self.client.close(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if self.rest is not None:
            self.rest.close()
        unclean = []
        for p in reversed(self.procs):  # workers first, then the scheduler
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    unclean.append(" ".join(map(str, p.args[:2])))
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return {"killed_after_timeout": unclean, "exit_codes": [p.returncode for p in self.procs]}


def sidecar_heap_kb(url: str, token: str) -> dict:
    """The sidecar's V8 heap, its size and what is in use, and the C allocator's bytes in use (kB),
    from its /metrics; {} when it does not answer."""
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=5).text
    except httpx.HTTPError:
        return {}
    out = {}
    for key, metric in (("heap_total_kb", "nodejs_heap_size_total_bytes"), ("heap_used_kb", "nodejs_heap_size_used_bytes"),
                        ("malloc_in_use_kb", 'dask_pmix_native_heap_bytes{kind="in_use"}')):
        m = re.search(rf"^{re.escape(metric)} ([0-9.e+]+)$", text, re.M)
        if m:
            out[key] = int(float(m.group(1)) / 1024)
    return out


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
