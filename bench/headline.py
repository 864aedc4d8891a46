"""The headline benchmark: time from run_mpi() to every rank holding its communicator, and to the
first Allreduce done, on an existing Dask cluster; side by side with the MPI library's own
launcher starting the same Python body from scratch (Open MPI: mpirun/prterun; MPICH:
mpiexec/hydra). Prints one JSON document with medians and ratios.

    .venv/bin/python bench/headline.py --impl openmpi --sizes 2,4,8 --repeat 5
    .venv-mpich/bin/python bench/headline.py --impl mpich --sizes 2,4,8 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

# The same body for both paths: time stamps when the communicator exists and after one Allreduce.
BODY = r'''
import os, sys, time, json
def body(comm):
    import numpy as np
    t_comm = time.time()
    x = np.ones(1, dtype="f8"); y = np.zeros(1, dtype="f8")
    comm.Allreduce(x, y)
    t_red = time.time()
    assert int(y[0]) == comm.size
    return {"rank": comm.rank, "size": comm.size, "t_comm": t_comm, "t_allreduce": t_red}

if __name__ == "__main__":
    from mpi4py import MPI
    out = body(MPI.COMM_WORLD)
    out["t_start"] = float(os.environ["BENCH_T0"])
    print("RESULT " + json.dumps(out), flush=True)
'''


def _median(xs):
    return statistics.median(xs) if xs else None


def _results(stdout: str) -> list[dict]:
    """RESULT lines of all ranks; a launcher may interleave ranks' output on one line."""
    decoder = json.JSONDecoder()
    out, i = [], stdout.find("RESULT ")
    while i >= 0:
        obj, end = decoder.raw_decode(stdout, i + len("RESULT "))
        out.append(obj)
        i = stdout.find("RESULT ", end)
    return out


def launcher_runs(impl: str, size: int, repeat: int, env_extra: dict) -> list[dict]:
    bindir = Path(sys.executable).parent
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(BODY)
        script = f.name
    if impl == "openmpi":
        root = ["--allow-run-as-root"] if os.getuid() == 0 else []
        cmd = [str(bindir / "mpirun"), *root, "-n", str(size), "--oversubscribe", sys.executable, script]
    else:
        cmd = [str(bindir / "mpiexec"), "-n", str(size), sys.executable, script]
    runs = []
    for _ in range(repeat):
        t0 = time.time()
        env = {**os.environ, **env_extra, "BENCH_T0": repr(t0)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        t_end = time.time()
        results = _results(proc.stdout)
        if proc.returncode != 0 or len(results) != size:
            runs.append({"error": proc.stderr[-2000:] or proc.stdout[-2000:]})
            continue
        runs.append({"comm_ready": max(r["t_comm"] for r in results) - t0,
                     "first_allreduce": max(r["t_allreduce"] for r in results) - t0,
                     "total": t_end - t0})
    os.unlink(script)
    return runs


def sidecar_runs(client, impl: str, size: int, repeat: int, workers: list[str]) -> list[dict]:
    from dask_pmix import run_mpi

    namespace: dict = {}
    exec(compile(BODY, "<body>", "exec"), namespace)
    body = namespace["body"]
    runs = []
    for i in range(repeat):
        members = [workers[(i + k) % len(workers)] for k in range(size)]
        t0 = time.time()
        results = run_mpi(client, body, workers=members, impl=impl)
        t_end = time.time()
        runs.append({"comm_ready": max(r["t_comm"] for r in results) - t0,
                     "first_allreduce": max(r["t_allreduce"] for r in results) - t0,
                     "total": t_end - t0})
    return runs


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    out = {"runs": len(runs), "ok": len(ok)}
    for k in ("comm_ready", "first_allreduce", "total"):
        out[f"{k}_median_s"] = _median([r[k] for r in ok])
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["first_error"] = errors[0][-500:]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="openmpi", choices=["openmpi", "mpich"])
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from distributed import Client, LocalCluster

    from dask_pmix import SidecarPlugin, run_mpi, wait_for_plugin

    # Ranks yield when idle: there are more of them than cores.
    # The launcher gets the settings the sidecar hands its members, so that both start the same way.
    mpi_env = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl": "^ofi", "OMPI_MCA_pml": "ob1"} if args.impl == "openmpi" else {}
    # Medians of `repeat` runs each; ratio_* = launcher median / sidecar median (above 1: ours is faster).
    report: dict = {"benchmark": "headline", "impl": args.impl, "cpus": os.cpu_count(), "repeat": args.repeat,
                    "sizes": {}}
    with LocalCluster(n_workers=max(sizes), threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.register_plugin(SidecarPlugin())
        wait_for_plugin(client)
        workers = sorted(client.scheduler_info()["workers"])
        run_mpi(client, lambda comm: comm.rank, workers=workers[:2], impl=args.impl)  # warm-up
        for size in sizes:
            ours = summarize(sidecar_runs(client, args.impl, size, args.repeat, workers))
            theirs = summarize(launcher_runs(args.impl, size, args.repeat, mpi_env))
            entry = {"sidecar_run_mpi": ours, ("mpirun" if args.impl == "openmpi" else "mpiexec_hydra"): theirs}
            for k in ("comm_ready_median_s", "first_allreduce_median_s"):
                if ours.get(k) and theirs.get(k):
                    entry[f"ratio_{k.replace('_median_s', '')}"] = round(theirs[k] / ours[k], 2)
            report["sizes"][str(size)] = entry
            print(json.dumps({"size": size, **entry}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
