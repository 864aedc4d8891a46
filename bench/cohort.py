"""Cohorts against no cohorts (Open MPI's in-process pool), side by side in one run.

A cohort: the workers of one host that join the pool together, whose ranks the sidecar declares
on one node, so that Open MPI moves data between them through shared memory (the sm BTL); without
one, every rank sits alone on its own virtual node and every pair talks TCP. For each setting a
fresh LocalCluster of --workers workers (dask-pmix.pool.cohort = 1s, or 0: none):

- later jobs: run_mpi over M = 2, 4, 8 workers (one warm-up job per M first), from the call to
  every rank's result (total) and to every rank past one Allreduce of 8 bytes;
- point to point: two members, rank 0 Sends --mbytes MiB to rank 1 and back (one warm-up round,
  then --rounds timed), timed inside the ranks: one-way seconds and GB/s;
- what Open MPI made of it: the size of each rank's COMM_TYPE_SHARED communicator (the members it
  sees on its own node: 2 in a cohort, 1 alone). python/tests/test_cohort.py shows the transport
  itself: with only the self and sm BTLs allowed, a cohort's job still moves its data.

    .venv/bin/python bench/cohort.py                      # writes bench/results/cohort.json
    .venv/bin/python bench/cohort.py --repeat 3 --rounds 3   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

MiB = 1 << 20


def _median(xs):
    return statistics.median(xs) if xs else None


def body_allreduce(comm):
    import numpy as np

    x = np.ones(1, dtype="f8")
    y = np.zeros(1, dtype="f8")
    comm.Allreduce(x, y)
    assert int(y[0]) == comm.size
    return time.time()


def body_pingpong(comm, nbytes: int, rounds: int):
    """Rank 0 and 1 send nbytes back and forth; one warm-up round, then `rounds` timed ones."""
    import numpy as np
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    shared_size = shared.Get_size()
    shared.Free()
    buf = np.full(nbytes, comm.rank + 1, dtype=np.uint8)
    times = []
    for i in range(rounds + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, dest=1, tag=i)
            comm.Recv(buf, source=1, tag=i)
        elif comm.rank == 1:
            comm.Recv(buf, source=0, tag=i)
            comm.Send(buf, dest=0, tag=i)
        if i:
            times.append((time.perf_counter() - t0) / 2)  # one way
    assert int(buf[0]) == 1 and int(buf[-1]) == 1
    return {"rank": comm.rank, "shared_size": shared_size, "one_way_s": times}


def start(n: int, cohort: bool):
    import dask

    from distributed import Client, LocalCluster

    from dask_pmix import SidecarPlugin, wait_for_plugin
    from dask_pmix.rest import SidecarClient

    # The scheduler (and its plugin, which starts the sidecar) runs in this process.
    dask.config.set({"dask-pmix.pool.cohort": "1s" if cohort else 0})
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    client.register_plugin(SidecarPlugin())
    info = wait_for_plugin(client)
    sidecar = SidecarClient(info["url"], info.get("token"))
    client.wait_for_workers(n, timeout=120)
    deadline = time.monotonic() + 180
    while sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool is not ready: {[w.get('pool') for w in sidecar.workers()]}")
        time.sleep(0.1)
    return cluster, client, sidecar


def one_setting(cohort: bool, args) -> dict:
    from dask_pmix import run_mpi

    cluster, client, sidecar = start(args.workers, cohort)
    try:
        seats = {w["id"]: w["pool"] for w in sidecar.workers()}
        workers = sorted(seats, key=lambda w: seats[w]["rank"])
        out: dict = {"cohort_setting": "default" if cohort else "0",
                     "local_peers": sorted({tuple(s.get("localPeers") or ()) for s in seats.values()})}
        jobs: dict = {}
        for m in args.sizes:
            members = workers[:m]
            run_mpi(client, body_allreduce, workers=members)  # warm-up: first contact between them
            totals, reduced = [], []
            for _ in range(args.repeat):
                t0 = time.time()
                stamps = run_mpi(client, body_allreduce, workers=members)
                totals.append(time.time() - t0)
                reduced.append(max(stamps) - t0)
            job = max(sidecar.jobs(), key=lambda j: j["createdAt"])
            jobs[str(m)] = {"total_median_s": _median(totals), "allreduce_median_s": _median(reduced),
                            "mode": job["mode"], "repeat": args.repeat}
        out["later_jobs"] = jobs
        nbytes = args.mbytes * MiB
        t0 = time.time()
        res = run_mpi(client, body_pingpong, nbytes, args.rounds, workers=workers[:2])
        one_way = res[0]["one_way_s"]
        out["p2p"] = {"bytes": nbytes, "rounds": args.rounds, "one_way_median_s": _median(one_way),
                      "GBps": nbytes / _median(one_way) / 1e9, "shared_size": [r["shared_size"] for r in res],
                      "job_total_s": time.time() - t0}
        return out
    finally:
        client.close()
        cluster.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--mbytes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "cohort.json"))
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if int(s) <= args.workers]
    result = {"benchmark": "cohort", "host": platform.node(), "cpus": os.cpu_count(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_avg_at_start": os.getloadavg(),
              "cohort": one_setting(True, args), "no_cohort": one_setting(False, args)}
    result["load_avg_at_end"] = os.getloadavg()
    a, b = result["cohort"], result["no_cohort"]
    result["ratios_cohort_over_no_cohort"] = {
        **{f"later_job_M{m}": a["later_jobs"][m]["total_median_s"] / b["later_jobs"][m]["total_median_s"] for m in a["later_jobs"]},
        "p2p_one_way": a["p2p"]["one_way_median_s"] / b["p2p"]["one_way_median_s"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
