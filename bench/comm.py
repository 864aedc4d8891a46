"""The tcp+mpi:// comm backend against tcp://, side by side in one run, on one host.

0. The physical limit: numpy's copy of a 64 MiB array in the receiving worker (into fresh memory
   and into memory already touched), so that each scheme's get_data throughput can be read as a
   fraction of one memory copy.

1. get_data between two workers: the SAME two worker processes, each listening on tcp+mpi://
   (its identity) and on an extra tcp:// listener; worker A fetches numpy arrays of 1 KiB, 1 MiB,
   64 MiB and 512 MiB held by worker B with distributed's own get_data_from_worker, through
   either address, alternating, 1 and 8 transfers at a time: latency (median per call),
   throughput and messages per second.
2. Workloads end to end on 4 workers, one cluster per protocol with the same settings:
   dask.array (x + x.T).sum() of ~1 GiB, and a P2P dataframe shuffle; their results are checked
   equal across the protocols, and comm_stats() says how many worker-to-worker bytes went over MPI.
3. Idle CPU of each worker over a quiet period, per protocol.
4. Communicator design: building one pair communicator (the first time two workers meet, and
   again) against building one communicator over every worker (what a per-pool-generation
   communicator costs each time the pool changes).

    .venv/bin/python bench/comm.py                 # writes bench/results/comm.json
    .venv/bin/python bench/comm.py --quick         # smaller and fewer, for a smoke run

Workers join MPI through the in-process pool when dask_pmix.pool is there (--cluster pool), or
are started by Open MPI's launcher and join its world (--cluster launcher).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from distributed import Client, LocalCluster, wait  # noqa: E402

import dask_pmix  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


# --- clusters ---------------------------------------------------------------------------------
def _have_pool() -> bool:
    try:
        from dask_pmix import pool  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def cluster(kind: str, protocol: str, n: int, threads: int = 2):
    """A scheduler on tcp:// and n workers listening on protocol, as a user would start them."""
    proc = None
    if kind == "pool":  # workers of a LocalCluster, every one a rank of the sidecar's pool
        os.environ.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")  # one host; ignore transient interfaces
        sched = LocalCluster(n_workers=n, threads_per_worker=threads, protocol=protocol, host="127.0.0.1",
                             dashboard_address=":0", memory_limit="5GiB")
        client = Client(sched)
    else:
        sched = LocalCluster(n_workers=0, protocol="tcp://", host="127.0.0.1", dashboard_address=":0")
        client = Client(sched)
    try:
        if kind == "pool":
            client.register_plugin(dask_pmix.SidecarPlugin())
            dask_pmix.wait_for_plugin(client)
            _wait_in_pool(client, n)
        elif kind == "launcher":
            bindir = Path(sys.executable).parent
            env = {**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_pml": "ob1"}
            cmd = [str(bindir / "mpirun"), "--allow-run-as-root", "--oversubscribe", "-n", str(n), str(bindir / "dask"), "worker",
                   sched.scheduler_address, "--no-nanny", "--protocol", protocol, "--host", "127.0.0.1",
                   "--nthreads", str(threads), "--no-dashboard", "--memory-limit", "8GiB"]
            if protocol.startswith("tcp+mpi"):
                cmd += ["--preload", "dask_pmix.comm.launcher"]
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            raise SystemExit(f"unknown cluster kind {kind}")
        client.wait_for_workers(n, timeout=120)
        yield client
    finally:
        client.close()
        sched.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _pool_rank(timeout):
    """The worker's pool rank once it has joined (it joins in the background, on this loop)."""
    from dask_pmix.comm.link import current_link

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        link = current_link()
        if link is not None:
            return link.rank
        await asyncio.sleep(0.2)
    return None


def _wait_in_pool(client, n, timeout=120):
    ranks = client.run(_pool_rank, timeout)
    assert len(ranks) == n and None not in ranks.values(), ranks


# --- 1. get_data between two workers ------------------------------------------------------------
async def _add_tcp_listener(dask_worker):
    """A second, plain tcp:// listener in the same worker (same handlers, same data)."""
    await dask_worker.listen("tcp://127.0.0.1:0")
    return dask_worker.listeners[-1].contact_address


async def _fetch(addr: str, key: str, nbytes: int, concurrency: int, iters: int, dask_worker=None):
    from distributed.worker import get_data_from_worker

    async def one():
        t0 = time.perf_counter()
        resp = await get_data_from_worker(dask_worker.rpc, [key], addr, who=dask_worker.address)
        dt = time.perf_counter() - t0
        assert resp["status"] == "OK", resp["status"]
        assert resp["data"][key].nbytes == nbytes
        return dt

    await asyncio.gather(*(one() for _ in range(concurrency)))  # connections and communicators exist
    lat = []
    t0 = time.perf_counter()
    for _ in range(iters):
        lat.extend(await asyncio.gather(*(one() for _ in range(concurrency))))
    wall = time.perf_counter() - t0
    calls = iters * concurrency
    return {"latency_median_s": statistics.median(lat), "throughput_GiB_s": calls * nbytes / wall / GiB,
            "messages_per_s": calls / wall, "calls": calls, "wall_s": wall}


ROUNDS = 5  # paired rounds per row: the machine is shared and its load moves within seconds
SMALL_ROUNDS, SMALL_ROW = 21, 8 * MiB   # rows moving at most SMALL_ROW per call: more, shorter rounds


def _copy_bandwidth(nbytes: int = 64 * MiB, repeat: int = 15):
    """numpy's copy of nbytes, median GiB/s: into a fresh array (what a receiver allocates, page
    faults included) and into one already touched."""
    src = np.ones(nbytes, dtype="u1")
    fresh, touched = [], []
    dst = np.empty(nbytes, dtype="u1")
    dst[:] = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = np.empty(nbytes, dtype="u1")
        out[:] = src
        fresh.append(time.perf_counter() - t0)
        del out
        t0 = time.perf_counter()
        dst[:] = src
        touched.append(time.perf_counter() - t0)
    return {"bytes": nbytes, "fresh_GiB_s": nbytes / statistics.median(fresh) / GiB,
            "touched_GiB_s": nbytes / statistics.median(touched) / GiB}


def bench_get_data(client, sizes, concurrencies, budget_bytes, rounds=ROUNDS):
    """Each row: `rounds` rounds, each timing the same batch of get_data calls through tcp:// and
    through tcp+mpi:// back to back (the order swapped every round). A row's ratio is the median
    of the rounds' paired ratios (one round's two batches see about the same load), its
    throughputs and latencies the medians over the rounds."""
    a, b = sorted(client.scheduler_info()["workers"])
    tcp_addr = client.run(_add_tcp_listener, workers=[b])[b]
    addrs = {"tcp": tcp_addr, "tcp+mpi": b}
    out = []
    for nbytes in sizes:
        fut = client.submit(np.ones, nbytes, dtype="u1", workers=[b], key=f"payload-{nbytes}", pure=False)
        wait(fut)
        for conc in concurrencies:
            iters = int(max(1, min(400, budget_bytes // (nbytes * conc))))
            # Small rows: many short rounds (the machine's load moves faster than a long batch).
            n_rounds = SMALL_ROUNDS if nbytes * conc <= SMALL_ROW else rounds
            per_round = max(3, iters // n_rounds)
            row = {"bytes": nbytes, "concurrency": conc, "iters": per_round * n_rounds, "rounds": n_rounds}
            runs: dict = {name: [] for name in addrs}
            ratios = []
            for rnd in range(n_rounds):
                order = list(addrs.items()) if rnd % 2 == 0 else list(reversed(addrs.items()))
                got = {}
                for name, addr in order:
                    got[name] = client.run(_fetch, addr, fut.key, nbytes, conc, per_round, workers=[a])[a]
                    runs[name].append(got[name])
                ratios.append(got["tcp+mpi"]["throughput_GiB_s"] / got["tcp"]["throughput_GiB_s"])
            for name, rs in runs.items():
                row[name] = {"latency_median_s": statistics.median(r["latency_median_s"] for r in rs),
                             "throughput_GiB_s": statistics.median(r["throughput_GiB_s"] for r in rs),
                             "messages_per_s": statistics.median(r["messages_per_s"] for r in rs),
                             "calls": sum(r["calls"] for r in rs), "wall_s": sum(r["wall_s"] for r in rs)}
            row["throughput_ratio"] = statistics.median(ratios)
            row["throughput_ratios"] = ratios
            row["latency_ratio"] = row["tcp+mpi"]["latency_median_s"] / row["tcp"]["latency_median_s"]
            print(json.dumps(row), flush=True)
            out.append(row)
        del fut
    return out


# --- 2. workloads -------------------------------------------------------------------------------
def workload_array(client, n: int, chunk: int):
    import dask.array as da

    x = da.random.RandomState(42).random((n, n), chunks=(chunk, chunk))
    t0 = time.perf_counter()
    value = float((x + x.T).sum().compute())
    return {"seconds": time.perf_counter() - t0, "result": value, "bytes": n * n * 8}


def workload_shuffle(client, rows: int, partitions: int):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    def part(i):
        rng = np.random.default_rng(i)
        m = rows // partitions
        return pd.DataFrame({"k": rng.integers(0, 10_000, m), "v": rng.random(m), "w": rng.random(m)})

    df = dd.from_map(part, range(partitions))
    t0 = time.perf_counter()
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        out = df.shuffle("k", npartitions=partitions)
        agg = out.map_partitions(lambda p: p.groupby("k").v.sum()).compute()
    secs = time.perf_counter() - t0
    return {"seconds": secs, "result": float(agg.sort_index().sum()), "checksum": float((agg.index * agg).sum()),
            "bytes": rows * 24}


def _worker_pids(client):
    return client.run(os.getpid)


def idle_cpu(client, seconds: float):
    import psutil

    procs = {w: psutil.Process(pid) for w, pid in _worker_pids(client).items()}
    before = {w: sum(p.cpu_times()[:2]) for w, p in procs.items()}
    time.sleep(seconds)
    return {w: (sum(p.cpu_times()[:2]) - before[w]) / seconds * 100 for w, p in procs.items()}


def _mpi_share(client):
    stats = client.run(dask_pmix.comm_stats)
    mpi = sum(s["mpi"]["bytes_received"] for s in stats.values())
    tcp = sum(s["tcp"]["bytes_received"] for s in stats.values())
    return {"mpi_bytes_received": mpi, "tcp_bytes_received": tcp,
            "mpi_connections": sum(s["mpi"]["connections"] for s in stats.values())}


def _paths(client):
    """Connections between the workers by the path they chose, and each worker's shared-memory
    peers as Open MPI sees them."""
    from dask_pmix.comm.link import current_link

    def mine():
        link = current_link()
        return {"local_peers": sorted(link.local_peers) if link else None, "rank": link.rank if link else None}

    stats = client.run(dask_pmix.comm_stats)
    return {"paths": {w: s.get("paths") for w, s in stats.items()}, "workers": client.run(mine)}


def bench_workloads(kind, args):
    """args.rounds rounds, each: one 4-worker cluster per protocol (the order swapped every round),
    each running a small untimed array workload (every pair of workers meets), then the timed array
    workload, then the shuffle. Ratios are the medians of the rounds'
    paired ratios; results are checked equal across protocols."""
    out = {"rounds": []}
    for rnd in range(args.rounds):
        got = {}
        for protocol in (("tcp", "tcp+mpi") if rnd % 2 == 0 else ("tcp+mpi", "tcp")):
            with cluster(kind, protocol, 4) as client:
                row = {"idle_cpu_percent_per_worker": idle_cpu(client, args.idle_seconds)} if rnd == 0 else {}
                # Not timed: every pair of workers meets once (connections, pair communicators).
                workload_array(client, 4 * args.array_chunk, args.array_chunk // 4)
                row["array"] = workload_array(client, args.array_n, args.array_chunk)
                row["shuffle"] = workload_shuffle(client, args.shuffle_rows, args.shuffle_partitions)
                row["traffic"] = _mpi_share(client)
                if protocol == "tcp+mpi":
                    row["paths"] = _paths(client)
                got[protocol] = row
                print(json.dumps({"round": rnd, protocol: {w: row[w]["seconds"] for w in ("array", "shuffle")}}), flush=True)
        for w in ("array", "shuffle"):
            assert abs(got["tcp"][w]["result"] - got["tcp+mpi"][w]["result"]) <= 1e-9 * abs(got["tcp"][w]["result"]), w
        out["rounds"].append(got)
    for protocol in ("tcp", "tcp+mpi"):
        first = out["rounds"][0][protocol]
        out[protocol] = {
            "idle_cpu_percent_per_worker": first["idle_cpu_percent_per_worker"],
            "traffic": first["traffic"],
            **{w: {**first[w], "seconds": statistics.median(r[protocol][w]["seconds"] for r in out["rounds"])}
               for w in ("array", "shuffle")},
        }
    for w in ("array", "shuffle"):
        out[f"{w}_speedups"] = [r["tcp"][w]["seconds"] / r["tcp+mpi"][w]["seconds"] for r in out["rounds"]]
        out[f"{w}_speedup"] = statistics.median(out[f"{w}_speedups"])
    return out


# --- 4. one communicator per pair or per generation ----------------------------------------------
def _create_times(ranks_sets, tag):
    from dask_pmix.comm.link import current_link

    link = current_link()
    out = []
    for i, ranks in enumerate(ranks_sets):
        if link.rank not in ranks:
            continue
        t0 = time.perf_counter()
        comm = link.create_comm(sorted(ranks), f"{tag}-{i}")
        out.append({"size": len(ranks), "seconds": time.perf_counter() - t0})
        comm.Free()
    return out


def bench_communicators(kind, n: int, repeat: int):
    from dask_pmix.comm.link import current_link

    with cluster(kind, "tcp+mpi", n) as client:
        ranks = client.run(lambda: current_link().rank)
        workers = sorted(ranks)
        all_ranks = sorted(ranks.values())
        pair = sorted([ranks[workers[0]], ranks[workers[1]]])
        sets = [pair] * repeat + [all_ranks] * repeat
        res = client.run(_create_times, sets, f"bench-comm-{time.time_ns()}")
        times = [r for rs in res.values() for r in rs]
        pair_t = [r["seconds"] for r in times if r["size"] == 2]
        gen_t = [r["seconds"] for r in times if r["size"] == n]
        return {"workers": n, "pair_first_s": pair_t[0], "pair_median_s": statistics.median(pair_t[1:] or pair_t),
                "generation_first_s": gen_t[0], "generation_median_s": statistics.median(gen_t[1:] or gen_t)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="pool" if _have_pool() else "launcher")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "comm.json"))
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--only", default="get_data,workloads,communicators")
    ap.add_argument("--sizes", help="get_data sizes in bytes, comma-separated (e.g. 65536,1MiB)")
    ap.add_argument("--rounds", type=int, help="workload rounds (each: one cluster per protocol)")
    args = ap.parse_args()
    if args.quick:
        sizes, budget = [KiB, MiB, 64 * MiB], 256 * MiB
        args.array_n, args.array_chunk = 4096, 1024
        args.shuffle_rows, args.shuffle_partitions = 2_000_000, 16
        args.idle_seconds = 3
        args.rounds = args.rounds or 2
    else:
        args.rounds = args.rounds or 3
        sizes, budget = [KiB, MiB, 64 * MiB, 512 * MiB], 1 * GiB
        args.array_n, args.array_chunk = 11_585, 2_048        # 1 GiB of float64
        args.shuffle_rows, args.shuffle_partitions = 40_000_000, 32   # ~1 GiB of rows
    if args.sizes:
        from dask.utils import parse_bytes
        sizes = [parse_bytes(x) for x in args.sizes.split(",")]
    only = set(args.only.split(","))
    import dask

    import dask_pmix.config  # noqa: F401 - dask-pmix's defaults into dask.config

    result = {"benchmark": "comm", "cluster": args.cluster, "host": platform.node(), "cpus": os.cpu_count(),
              "settings": {k: dask.config.get(k, None) for k in ("dask-pmix.pool.cohort", "dask-pmix.comm.sm-threshold",
                                                                   "dask-pmix.comm.fabric", "dask-pmix.comm.chunk")},
              "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "load_avg_at_start": os.getloadavg()}
    if "get_data" in only:
        with cluster(args.cluster, "tcp+mpi", 2) as client:
            receiver = sorted(client.scheduler_info()["workers"])[0]
            result["copy_before"] = client.run(_copy_bandwidth, workers=[receiver])[receiver]
            result["get_data"] = bench_get_data(client, sizes, [1, 8], budget)
            result["copy_after"] = client.run(_copy_bandwidth, workers=[receiver])[receiver]
            copy = statistics.median([result["copy_before"]["fresh_GiB_s"], result["copy_after"]["fresh_GiB_s"]])
            for row in result["get_data"]:
                row["fraction_of_copy"] = {k: row[k]["throughput_GiB_s"] / copy for k in ("tcp", "tcp+mpi")}
            result["get_data_traffic"] = _mpi_share(client)
            result["get_data_paths"] = _paths(client)
    if "workloads" in only:
        result["workloads"] = bench_workloads(args.cluster, args)
    if "communicators" in only:
        result["communicators"] = bench_communicators(args.cluster, 4, 5)
    result["load_avg_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
