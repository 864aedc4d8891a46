"""Cohorts against no cohorts (Open MPI's in-process pool), side by side in one run.

A cohort: the workers of one host that join the pool together, whose ranks the sidecar declares
on one node, so that Open MPI moves data between them through shared memory (the sm BTL); without
one, every rank sits alone on its own virtual node and every pair talks TCP. One LocalCluster of
--workers workers per setting (dask-pmix.pool.cohort = 1s, or 0: none), one after the other and
then again (--phases; the machine is shared and its load changes by the minute; one process holds
one cluster at a time: two sidecar plugins in one process hung a job here):

- later jobs: run_mpi over M = 2, 4, 8 workers (one warm-up job per M first), from the call to
  every rank's result (total) and to every rank past one Allreduce of 8 bytes;
- point to point: two members, rank 0 Sends --mbytes MiB to rank 1 and back (one warm-up round,
  then --rounds timed, in --p2p-jobs jobs), timed inside the ranks: one-way seconds and GB/s;
- what Open MPI made of it: the size of each rank's COMM_TYPE_SHARED communicator (the members it
  sees on its own node: 2 in a cohort, 1 alone). python/tests/test_cohort.py shows the transport
  itself: with only the self and sm BTLs allowed, a cohort's job still moves its data.

    .venv/bin/python bench/cohort.py                      # writes bench/results/cohort.json
    .venv/bin/python bench/cohort.py --repeat 3 --p2p-jobs 1   # a smoke run
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

    from headline import start_cluster

    # The scheduler (and its plugin, which starts the sidecar) runs in this process.
    dask.config.set({"dask-pmix.pool.cohort": "1s" if cohort else 0})
    return start_cluster(n, pool=True)


def _say(*what) -> None:
    print(time.strftime("%H:%M:%S"), *what, file=sys.stderr, flush=True)


def measure(name: str, args, samples: dict) -> None:
    """One phase: a fresh cluster for the setting, its later jobs and point-to-point transfers
    appended to `samples`."""
    from dask_pmix import run_mpi

    limit = args.job_timeout
    _say("starting", name)
    cluster, client, sidecar = start(args.workers, name == "cohort")
    try:
        seats = {w["id"]: w["pool"] for w in sidecar.workers()}
        order = sorted(seats, key=lambda w: seats[w]["rank"])
        samples.setdefault("local_peers", set()).update(tuple(s.get("localPeers") or ()) for s in seats.values())
        for m in args.sizes:
            _say(name, "M =", m)
            run_mpi(client, body_allreduce, workers=order[:m], timeout=limit)  # warm-up: first contact
            for _ in range(args.repeat):
                t0 = time.time()
                stamps = run_mpi(client, body_allreduce, workers=order[:m], timeout=limit)
                samples.setdefault(f"total{m}", []).append(time.time() - t0)
                samples.setdefault(f"allreduce{m}", []).append(max(stamps) - t0)
            job = max(sidecar.jobs(), key=lambda j: j["createdAt"])
            samples.setdefault(f"modes{m}", set()).add(job["mode"])
        _say(name, "point to point")
        for _ in range(args.p2p_jobs):
            res = run_mpi(client, body_pingpong, args.mbytes * MiB, args.rounds, workers=order[:2], timeout=limit)
            samples.setdefault("one_way", []).extend(res[0]["one_way_s"])
            samples["shared_size"] = [r["shared_size"] for r in res]
    finally:
        client.close()
        cluster.close()


def summary(samples: dict, args) -> dict:
    nbytes = args.mbytes * MiB
    med = _median(samples["one_way"])
    return {"local_peers": sorted(samples["local_peers"]),
            "later_jobs": {str(m): {"total_median_s": _median(samples[f"total{m}"]),
                                    "allreduce_median_s": _median(samples[f"allreduce{m}"]),
                                    "modes": sorted(samples[f"modes{m}"]), "jobs": len(samples[f"total{m}"])}
                           for m in args.sizes},
            "p2p": {"bytes": nbytes, "samples": len(samples["one_way"]), "one_way_median_s": med,
                    "GBps": nbytes / med / 1e9, "shared_size": samples["shared_size"]}}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--mbytes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5, help="timed round trips per point-to-point job")
    p.add_argument("--p2p-jobs", type=int, default=4, help="point-to-point jobs per setting, alternating")
    p.add_argument("--phases", type=int, default=2, help="cohort then no cohort, this many times (the load changes)")
    p.add_argument("--job-timeout", type=float, default=300, help="run_mpi's timeout for each job")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "cohort.json"))
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if int(s) <= args.workers]
    result = {"benchmark": "cohort", "host": platform.node(), "cpus": os.cpu_count(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_avg_at_start": os.getloadavg()}
    samples: dict = {"cohort": {}, "no_cohort": {}}
    for phase in range(args.phases):
        for name in samples:
            measure(name, args, samples[name])
    for name in samples:
        result[name] = summary(samples[name], args)
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
