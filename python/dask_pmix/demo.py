"""`dask-pmix demo`: a local Dask cluster, the sidecar, and MPI jobs on its workers.

Four worker processes hold the chunks of a dask array. An MPI job over three of them sums their
chunks with an Allreduce where the chunks already are, while the fourth worker keeps running Dask
tasks; a second job runs on a different subset. Prints the results, the timings and the tables
of process sets and jobs read from the sidecar's REST API.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def _allreduce_local_chunks(comm, *, local):
    """Each rank sums the chunks its own worker holds, then the ranks Allreduce the sums."""
    import numpy as np

    mine = np.array([sum(float(np.asarray(c).sum()) for c in local)], dtype="f8")
    total = np.zeros(1, dtype="f8")
    comm.Allreduce(mine, total)
    return {
        "rank": comm.rank,
        "size": comm.size,
        "pid": os.getpid(),
        "chunks": len(local),
        "local_sum": float(mine[0]),
        "total": float(total[0]),
    }


def _ring(comm):
    """A second kind of job: pass a token around the ring and gather host names."""
    import socket

    token = comm.sendrecv(comm.rank, dest=(comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
    hosts = comm.allgather(socket.gethostname())
    return {"rank": comm.rank, "size": comm.size, "got_from": token, "hosts": sorted(set(hosts))}


def _busy(i):
    import numpy as np

    return float(np.random.default_rng(i).standard_normal(200_000).sum())


def _table(rows, columns):
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dask-pmix demo")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--impl", default="openmpi")
    args = parser.parse_args(argv)

    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster, futures_of, wait

    from .client.plugin_check import wait_for_plugin
    from .client.run import run_mpi
    from .rest import SidecarClient
    from .scheduler.plugin import SidecarPlugin

    t_start = time.perf_counter()
    print(f"starting a local Dask cluster with {args.workers} worker processes ...", flush=True)
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=2,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(SidecarPlugin())
        info = wait_for_plugin(client)
        sidecar = SidecarClient(info["url"], info.get("token"))
        health = sidecar.health()
        print(
            f"sidecar {info['url']}: dask-pmix {health.get('version')} with PMIx {health.get('pmixVersion')}"
            f" ({'embedded' if info['embedded'] else 'external'})",
            flush=True,
        )

        workers = sorted(client.scheduler_info()["workers"])
        x = da.arange(4_000_000, chunks=500_000, dtype="f8").persist()
        wait(x)
        chunks = list(futures_of(x))
        expected = float(np.arange(4_000_000, dtype="f8").sum())
        who_has = client.who_has(chunks)
        holders = sorted({w for ws in who_has.values() for w in ws})
        members = holders[:3] if len(holders) >= 3 else workers[:3]
        bystander = next(w for w in workers if w not in members)
        member_chunks = [f for f in chunks if set(who_has[f.key]) & set(members)]
        print(
            f"array of {len(chunks)} chunks on {len(holders)} workers; job 1 on {len(members)} of them, "
            f"{bystander} keeps computing",
            flush=True,
        )

        # The bystander runs ordinary Dask tasks while the MPI job runs.
        busy_done = []

        def keep_busy():
            futures = [client.submit(_busy, i, workers=[bystander], pure=False) for i in range(40)]
            busy_done.extend(client.gather(futures))

        busy = threading.Thread(target=keep_busy)
        busy.start()
        t0 = time.perf_counter()
        results1 = run_mpi(client, _allreduce_local_chunks, workers=members, local=member_chunks, impl=args.impl)
        t1 = time.perf_counter()
        busy.join()
        moved = {f.key for f in member_chunks if set(client.who_has([f])[f.key]) - set(who_has[f.key])}
        expected_part = float(sum(np.asarray(c).sum() for c in client.gather(member_chunks)))
        print(f"\njob 1: Allreduce of the chunks where they are ({t1 - t0:.3f} s):")
        for r in results1:
            print(
                f"  rank {r['rank']}/{r['size']} pid {r['pid']}: {r['chunks']} local chunks, "
                f"local sum {r['local_sum']:.0f}, allreduced {r['total']:.0f}"
            )
        ok1 = all(abs(r["total"] - expected_part) < 1e-6 * max(1.0, expected_part) for r in results1)
        print(
            f"  expected {expected_part:.0f} (array total {expected:.0f}); chunks moved: {len(moved)}; "
            f"bystander finished {len(busy_done)} tasks during the job -> {'OK' if ok1 and not moved else 'FAIL'}"
        )

        # The second job comes from a process set defined over REST.
        second = [w for w in workers if w != members[0]][:3]
        sidecar.define_pset("demo-ring", members=second)
        t2 = time.perf_counter()
        results2 = run_mpi(client, _ring, pset="demo-ring", impl=args.impl)
        t3 = time.perf_counter()
        ok2 = all(r["got_from"] == (r["rank"] - 1) % r["size"] for r in results2)
        print(
            f"\njob 2: a ring over pset demo-ring, a different subset {second} ({t3 - t2:.3f} s): "
            f"{[r['got_from'] for r in results2]} -> {'OK' if ok2 else 'FAIL'}"
        )

        print("\nprocess sets (GET /v1/psets):")
        print(_table(sidecar.psets(), ["name", "members", "jobId"]) or "  (none)")
        print("\njobs (GET /v1/jobs):")
        jobs = sidecar.jobs()
        for j in jobs:
            j["size"] = len(j.get("members", []))
        print(_table(jobs, ["id", "impl", "state", "size", "namespace", "createdAt", "endedAt"]))
        print("\nworkers (GET /v1/workers):")
        print(_table(sidecar.workers(), ["id", "host", "pid", "state"]))
        print(f"\ntotal {time.perf_counter() - t_start:.1f} s; job 1 {t1 - t0:.3f} s, job 2 {t3 - t2:.3f} s")
        return 0 if ok1 and ok2 and not moved else 1


if __name__ == "__main__":
    sys.exit(main())
