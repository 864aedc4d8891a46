"""The headline benchmark: an MPI job over M workers of an existing Dask cluster, in-process (the
worker processes themselves, each with one long-lived MPI session in the sidecar's pool), in fork
mode (a child per worker and job), and the MPI library's own launcher starting the same Python
body from scratch (Open MPI: mpirun; MPICH: mpiexec/hydra), side by side in one run.

Each mode is timed on fresh workers (a new cluster: the first job, whose members have never met,
pays the first TCP connections between them; in-process, the workers' sessions were initialised
at worker start, in the background, and that is reported separately) and then on later jobs over
the same workers. Times, from the call to:
- comm_ready: every rank holding its communicator;
- first_allreduce: every rank past one Allreduce;
- total: run_mpi returning every rank's result (the launcher: mpirun exiting).
Also: a 16-worker cluster (in-process, M = 16 and M = 8), and the first contact between two
workers (Comm_create_from_group and the first Allreduce of a pair that never met, then again;
MPICH, whose workers are worlds of their own: a 2-member in-process job of a pair that never
met, then again, from run_mpi's call to both holding the communicator).
Prints one JSON document (medians; fraction_* = ours / launcher, below 1: ours is faster).

    .venv/bin/python bench/headline.py --impl openmpi --sizes 2,4,8 --repeat 10
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

# The same body for every path: time stamps when the communicator exists and after one Allreduce.
BODY = r'''
import os, sys, time, json
def body(comm):
    import numpy as np
    t_comm = time.time()
    x = np.ones(1, dtype="f8"); y = np.zeros(1, dtype="f8")
    comm.Allreduce(x, y)
    t_red = time.time()
    assert int(y[0]) == comm.size
    return {"rank": comm.rank, "size": comm.size, "t_comm": t_comm, "t_allreduce": t_red, "pid": os.getpid()}

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


def _body():
    # A module name, as a user's function has ('__main__', a notebook's, a module's): without one,
    # cloudpickle looks for the function in every loaded module at each job (about 3 ms with
    # distributed's 800 modules loaded), which no user's function costs.
    namespace: dict = {"__name__": "dask_pmix_bench_body"}
    exec(compile(BODY, "<body>", "exec"), namespace)
    return namespace["body"]


def one_job(client, impl: str, members: list[str], mode: str, sidecar) -> dict:
    from dask_pmix import run_mpi

    t0 = time.time()
    results = run_mpi(client, _body(), workers=members, impl=impl, mode=mode)
    t_end = time.time()
    job = max(sidecar.jobs(), key=lambda j: j["createdAt"])
    return {"comm_ready": max(r["t_comm"] for r in results) - t0,
            "first_allreduce": max(r["t_allreduce"] for r in results) - t0,
            "total": t_end - t0, "mode": job["mode"]}


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    out: dict = {"runs": len(runs), "ok": len(ok)}
    for k in ("comm_ready", "first_allreduce", "total"):
        out[f"{k}_median_s"] = _median([r[k] for r in ok])
    modes = sorted({r["mode"] for r in ok if "mode" in r})
    if modes:
        out["modes"] = modes
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["first_error"] = errors[0][-500:]
    return out


def start_cluster(n: int, pool: bool):
    from distributed import Client, LocalCluster

    from dask_pmix import SidecarPlugin, wait_for_plugin
    from dask_pmix.rest import SidecarClient

    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    client.register_plugin(SidecarPlugin(pool=pool))
    info = wait_for_plugin(client)
    sidecar = SidecarClient(info["url"], info.get("token"))
    client.wait_for_workers(n, timeout=120)
    if pool:
        deadline = time.monotonic() + 180
        while sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool is not ready: {[w.get('pool') for w in sidecar.workers()]}")
            time.sleep(0.1)
    return cluster, client, sidecar


def session_init_seconds(client) -> list[float]:
    def init_s():
        from dask_pmix import pool

        p = pool.current()
        return getattr(p, "init_seconds", None)

    return [v for v in client.run(init_s).values() if v is not None]


def fresh_and_later(impl: str, size: int, repeat: int, mode: str) -> dict:
    """A new cluster of `size` workers: its first job, then `repeat` later ones over the same workers."""
    cluster, client, sidecar = start_cluster(size, pool=(mode == "inprocess"))
    try:
        workers = sorted(client.scheduler_info()["workers"])
        first = one_job(client, impl, workers, mode, sidecar)
        later = [one_job(client, impl, workers, mode, sidecar) for _ in range(repeat)]
        out = {"first": summarize([first]), "later": summarize(later)}
        if mode == "inprocess":
            out["session_init_median_s"] = _median(session_init_seconds(client))
        return out
    finally:
        client.close()
        cluster.close()


def first_contact(client, sidecar, pairs: int) -> dict:
    """Two workers that never met build a communicator and Allreduce once; then again."""
    ranks = {w["id"]: w["pool"]["rank"] for w in sidecar.workers()}
    workers = sorted(ranks)

    def pair(tag: str, members: list[int]) -> dict:
        from dask_pmix import pool

        p = pool.current(wait=60)
        t0 = time.perf_counter()
        comm = p.comm(members, tag)
        t1 = time.perf_counter()
        comm.allreduce(1)
        t2 = time.perf_counter()
        comm.Free()
        return {"create": t1 - t0, "allreduce": t2 - t1}

    out: dict = {"first": [], "later": []}
    for i in range(pairs):
        a, b = workers[2 * i], workers[2 * i + 1]
        members = [ranks[a], ranks[b]]
        for phase in ("first", "later"):
            futs = [client.submit(pair, f"bench-{phase}-{i}", members, workers=[w], pure=False) for w in (a, b)]
            res = client.gather(futs)
            # The member that arrived last waited least: its time is the pair's cost.
            out[phase].append({"create": min(r["create"] for r in res), "allreduce": max(r["allreduce"] for r in res)})
    return {phase: {"create_median_ms": _median([r["create"] * 1e3 for r in rs]),
                    "first_allreduce_median_ms": _median([r["allreduce"] * 1e3 for r in rs]), "pairs": len(rs)}
            for phase, rs in out.items()}


def first_contact_jobs(client, impl: str, sidecar, pairs: int) -> dict:
    """MPICH / Intel MPI: a pair of workers that never met runs a 2-member in-process job (the
    merge tree's one connect/accept), then again."""
    workers = sorted(client.scheduler_info()["workers"])
    out: dict = {"first": [], "later": []}
    for i in range(pairs):
        for phase in ("first", "later"):
            out[phase].append(one_job(client, impl, workers[2 * i:2 * i + 2], "inprocess", sidecar))
    return {phase: {"comm_ready_median_ms": _median([r["comm_ready"] * 1e3 for r in rs]),
                    "first_allreduce_median_ms": _median([r["first_allreduce"] * 1e3 for r in rs]),
                    "modes": sorted({r["mode"] for r in rs}), "pairs": len(rs)}
            for phase, rs in out.items()}


def big_cluster(impl: str, n: int, repeat: int) -> dict:
    cluster, client, sidecar = start_cluster(n, pool=True)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        contact = (first_contact(client, sidecar, pairs=min(4, n // 2)) if impl == "openmpi"
                   else first_contact_jobs(client, impl, sidecar, pairs=min(4, n // 2)))
        first = one_job(client, impl, workers, "inprocess", sidecar)
        later = [one_job(client, impl, workers, "inprocess", sidecar) for _ in range(repeat)]
        half = [one_job(client, impl, workers[(i % 2)::2], "inprocess", sidecar) for i in range(repeat)]
        return {"workers": n, "session_init_median_s": _median(session_init_seconds(client)),
                "first_contact": contact, f"first_M{n}": summarize([first]), f"later_M{n}": summarize(later),
                f"later_M{n // 2}": summarize(half)}
    finally:
        client.close()
        cluster.close()


def fraction(ours: dict, theirs: dict, key: str) -> float | None:
    a, b = ours.get(key), theirs.get(key)
    return round(a / b, 3) if a and b else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="openmpi", choices=["openmpi", "mpich"])
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--big", type=int, default=16, help="workers of the large cluster (0: skip)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    # Ranks yield when idle: there are more of them than cores. The launcher gets the settings the
    # sidecar hands its members, so that both start the same way.
    mpi_env = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl": "^ofi", "OMPI_MCA_pml": "ob1"} if args.impl == "openmpi" else {}
    launcher = "mpirun" if args.impl == "openmpi" else "mpiexec_hydra"
    modes = ["inprocess", "fork"]
    report: dict = {"benchmark": "headline", "impl": args.impl, "cpus": os.cpu_count(), "repeat": args.repeat,
                    "load_average_at_start": os.getloadavg(), "sizes": {}}
    for size in sizes:
        entry: dict = {launcher: summarize(launcher_runs(args.impl, size, args.repeat, mpi_env))}
        for mode in modes:
            entry[mode] = fresh_and_later(args.impl, size, args.repeat, mode)
            for phase in ("first", "later"):
                for k in ("total_median_s", "comm_ready_median_s"):
                    entry[f"fraction_{mode}_{phase}_{k.replace('_median_s', '')}"] = fraction(entry[mode][phase], entry[launcher], k)
        report["sizes"][str(size)] = entry
        print(json.dumps({"size": size, **entry}), file=sys.stderr, flush=True)
    if args.big:
        report["cluster"] = big_cluster(args.impl, args.big, args.repeat)
        report["cluster"][launcher] = summarize(launcher_runs(args.impl, args.big, max(3, args.repeat // 3), mpi_env))
        print(json.dumps(report["cluster"]), file=sys.stderr, flush=True)
    report["load_average_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
