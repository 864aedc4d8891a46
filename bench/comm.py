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
5. Whole tasks, what users feel (--only tasks, bench/results/comm-tasks.json): a consumer task on
   worker B reading results made on worker A, timed from the client's submit to its result; one
   dependency of 1 KiB, 1 MiB, 64 MiB and 512 MiB, 8 dependencies of 8 MiB from 3-4 other workers,
   and a rechunk of a 2 GiB array across 4 workers (dask's task rechunk: slices and concatenations,
   no arithmetic). Pair kinds: the consumer in the cohort (workers started together), a late
   joiner (added 20 s after the cohort joined the pool), a worker restarted by its nanny; the
   producers are cohort members. One LocalCluster per scheme, each in its own driver process and
   both alive for the whole run, so the schemes alternate round by round; per row the CPU time
   per task of the consumer, the producers and the scheduler's process, and the fraction of a
   memcpy of the same bytes into fresh memory measured in the consumer in the same run.

    .venv/bin/python bench/comm.py                 # writes bench/results/comm.json
    .venv/bin/python bench/comm.py --quick         # smaller and fewer, for a smoke run
    .venv/bin/python bench/comm.py --only tasks    # writes bench/results/comm-tasks.json

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


# --- 5. whole tasks: a consumer on B reading a result made on A -----------------------------------
# One driver process per scheme (a LocalCluster, its scheduler and its sidecar plugin: one process
# holds one cluster, see bench/cohort.py), both alive for the whole run so that the two schemes'
# rows alternate within minutes of each other. The coordinator (this process) talks to each driver
# over its stdin/stdout, one JSON line per command.
TASK_COHORT = 5          # workers that start together; one of them is restarted by its nanny later
LATE_AFTER = 20.0        # seconds after the cohort joined the pool that the late joiner is added
TASK_ROWS = {            # row -> (dependency bytes, number of dependencies)
    "1 KiB": (KiB, 1), "1 MiB": (MiB, 1), "64 MiB": (64 * MiB, 1), "512 MiB": (512 * MiB, 1),
    "8 x 8 MiB": (8 * MiB, 8),
}
RECHUNK_SHAPE, RECHUNK_IN, RECHUNK_OUT = (16384, 16384), (2048, 16384), (16384, 2048)  # 2 GiB of float64


def _make(nbytes, salt):
    return np.ones(nbytes, dtype="u1")


def _consume(*xs):
    return sum(x.nbytes for x in xs)


def _rechunk_block(i, rows, cols):
    return np.ones((rows, cols), dtype="f8")


def _local_peers_and_rank():
    from dask_pmix.comm.link import current_link

    link = current_link()
    return None if link is None else {"rank": link.rank, "local_peers": sorted(link.local_peers)}


def _copy_times(sizes, repeat):
    """Seconds of numpy's copy of each size into fresh memory (allocation and page faults included),
    median of `repeat`, in this worker."""
    out = {}
    for n in sizes:
        src = np.ones(n, dtype="u1")
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            dst = np.empty(n, dtype="u1")
            dst[:] = src
            ts.append(time.perf_counter() - t0)
            del dst
        out[str(n)] = statistics.median(ts)
    return out


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process's live threads in seconds, to the nanosecond (/proc/PID/task/*/schedstat;
    /proc/PID/stat counts in 10 ms ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


class _TaskCluster:
    """The driver's cluster: a cohort of TASK_COHORT workers, one worker added LATE_AFTER seconds
    later, and the cohort's last worker restarted by its nanny; roles by address."""

    def __init__(self, protocol: str, n_cohort: int = TASK_COHORT, late_after: float = LATE_AFTER):
        os.environ.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
        self.protocol = protocol
        self.cluster = LocalCluster(n_workers=n_cohort, threads_per_worker=2, protocol=protocol, host="127.0.0.1",
                                    dashboard_address=":0", memory_limit="6GiB")
        self.client = client = Client(self.cluster)
        client.register_plugin(dask_pmix.SidecarPlugin())
        dask_pmix.wait_for_plugin(client)
        _wait_in_pool(client, n_cohort)
        joined = time.monotonic()
        cohort = sorted(client.scheduler_info()["workers"])
        client.wait_for_workers(n_cohort)
        time.sleep(max(0.0, late_after - (time.monotonic() - joined)))
        self.cluster.scale(n_cohort + 1)
        client.wait_for_workers(n_cohort + 1, timeout=120)
        late = (set(client.scheduler_info()["workers"]) - set(cohort)).pop()
        # The nanny restarts the cohort's last worker; on a loaded host its new process has been seen
        # to register and then go, so a restart that does not settle is tried on the next one.
        for victim in reversed(cohort[1:]):
            restarted = self._restart(victim, {late, *cohort})
            if restarted is not None:
                break
            cohort = [w for w in cohort if w in client.scheduler_info()["workers"]]
        assert restarted is not None, "no nanny restart settled in the pool"
        cohort = [w for w in cohort if w != victim]
        self.roles = {"cohort": cohort, "late": late, "restarted": restarted}
        # consumer and producers of each pair kind: the producers are cohort members
        c = self.roles["cohort"]
        assert len(c) >= 4, self.roles
        self.consumer = {"cohort": c[0], "late": late, "restarted": restarted}
        self.producers = {"cohort": c[1:], "late": c, "restarted": c}
        self.rechunk_workers = {"cohort": c[:4], "mixed": [c[0], c[1], late, restarted]}

    def _restart(self, victim: str, known: set, settle: float = 120.0):
        """Restart victim through its nanny; its replacement's address once every worker is in the
        pool, or None when the replacement does not stay."""
        client = self.client
        try:
            client.restart_workers([victim])
        except Exception as e:  # noqa: BLE001 - told, and the next one is tried
            print(f"restart of {victim} failed: {e!r}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            now = set(client.scheduler_info()["workers"])
            fresh = now - known
            if len(fresh) == 1 and victim not in now:
                try:
                    mpi = client.run(_local_peers_and_rank)
                except OSError:
                    mpi = {}
                if set(mpi) == now and None not in mpi.values():
                    return fresh.pop()
            time.sleep(1)
        print(f"the restart of {victim} did not settle: {sorted(client.scheduler_info()['workers'])}",
              file=sys.stderr, flush=True)
        return None

    def info(self):
        return {"protocol": self.protocol, "roles": self.roles,
                "mpi": self.client.run(_local_peers_and_rank),
                "paths": {w: s.get("paths") for w, s in self.client.run(dask_pmix.comm_stats).items()}}

    def _procs(self, workers):
        if not hasattr(self, "_pids"):
            self._pids = {}
        missing = [w for w in workers if w not in self._pids]
        if missing:
            self._pids.update(self.client.run(os.getpid, workers=missing))
        return {w: self._pids[w] for w in workers}

    @staticmethod
    def _cpu(pids):
        return {w: _cpu_seconds(pid) for w, pid in pids.items()}

    def task(self, kind: str, row: str, iters: int):
        """`iters` whole tasks, one after the other: the consumer on its worker reading its
        dependencies, made beforehand (not timed) on the producers. Seconds per task, and the CPU
        seconds that the batch took in the consumer, the producers and this process (the scheduler,
        the client and the nannies)."""
        nbytes, ndeps = TASK_ROWS[row]
        client, b = self.client, self.consumer[kind]
        producers = self.producers[kind]
        used = sorted({producers[i % len(producers)] for i in range(ndeps)})
        batch = [[client.submit(_make, nbytes, (time.time_ns(), it, i), workers=[producers[i % len(producers)]],
                                allow_other_workers=False, pure=False) for i in range(ndeps)] for it in range(iters)]
        wait([d for deps in batch for d in deps])
        procs = self._procs([b, *used])
        c0, m0 = self._cpu(procs), _cpu_seconds(os.getpid())
        out = []
        for deps in batch:
            t0 = time.perf_counter()
            got = client.submit(_consume, *deps, workers=[b], allow_other_workers=False, pure=False).result()
            out.append(time.perf_counter() - t0)
            assert got == nbytes * ndeps, got
        c1, m1 = self._cpu(procs), _cpu_seconds(os.getpid())
        del batch
        cpu = {"consumer": c1[b] - c0[b], "producers": sum(c1[w] - c0[w] for w in used), "scheduler": m1 - m0}
        return {"seconds": out, "cpu_s": cpu}

    def rechunk(self, kind: str, iters: int):
        import dask
        import dask.array as da

        client, ws = self.client, self.rechunk_workers[kind]
        rows, cols = RECHUNK_IN
        n = RECHUNK_SHAPE[0] // rows
        out = []
        for _ in range(iters):
            blocks = [client.submit(_rechunk_block, (time.time_ns(), i), rows, cols, workers=[ws[i % len(ws)]],
                                    allow_other_workers=False, pure=False) for i in range(n)]
            wait(blocks)
            x = da.concatenate([da.from_delayed(dask.delayed(f), shape=RECHUNK_IN, dtype="f8") for f in blocks])
            y = x.rechunk(RECHUNK_OUT, method="tasks")
            t0 = time.perf_counter()
            y = client.persist(y, workers=ws, allow_other_workers=False)
            wait(y)
            out.append(time.perf_counter() - t0)
            assert float(y[:, :1].sum().compute()) == RECHUNK_SHAPE[0]
            del y, x, blocks
        return {"seconds": out}

    def copy(self, kind: str, sizes, repeat: int):
        b = self.consumer.get(kind) or self.rechunk_workers[kind][0]
        return self.client.run(_copy_times, sizes, repeat, workers=[b])[b]

    def stats(self):
        return self.client.run(dask_pmix.comm_stats)

    def close(self):
        self.client.close()
        self.cluster.close()


def task_driver(protocol: str) -> None:
    """`bench/comm.py --task-driver PROTOCOL`: one JSON command per stdin line, one answer per line."""
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    tc = _TaskCluster(protocol)
    real_stdout.write(json.dumps({"ready": True}) + "\n")
    real_stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            break
        try:
            answer = {"ok": getattr(tc, op)(**cmd)}
        except Exception as e:  # noqa: BLE001 - told to the coordinator
            import traceback

            answer = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        real_stdout.write(json.dumps(answer) + "\n")
        real_stdout.flush()
    tc.close()


class _Driver:
    def __init__(self, protocol: str, log):
        self.protocol = protocol
        self.proc = subprocess.Popen([sys.executable, __file__, "--task-driver", protocol], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)

    def ready(self):
        line = self.proc.stdout.readline()
        assert line and json.loads(line).get("ready"), f"{self.protocol} driver did not start (see its log)"

    def __call__(self, op: str, **kw):
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"{self.protocol} {op}: {answer['error']}\n{answer['traceback']}")
        return answer["ok"]

    def close(self):
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(60)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def _task_plan(args) -> list[tuple[str, str, str, int, int]]:
    """(op, row, kind, rounds, tasks per round) of every row, in the order they run."""
    rows = [r for r in TASK_ROWS if not args.quick or r != "512 MiB"]
    if args.task_rows:
        rows = [r for r in rows if r in args.task_rows.split(",")]
    plan = []
    for row in rows:
        nbytes, ndeps = TASK_ROWS[row]
        total = nbytes * ndeps
        # small rows: many short rounds (the machine's load moves faster than a long batch)
        rounds, iters = (24, 3) if total <= MiB else (8, 3) if total <= 64 * MiB else (5, 2)
        for kind in ("cohort", "late", "restarted"):
            plan.append(("task", row, kind, args.task_rounds or rounds, args.task_iters or iters))
    if not args.quick and (not args.task_rows or "rechunk" in args.task_rows.split(",")):
        for kind in ("cohort", "mixed"):
            plan.append(("rechunk", "rechunk 2 GiB", kind, args.task_rounds or 3, 1))
    return plan


def bench_tasks(args) -> dict:
    """Both clusters live through the whole run. The plan of rows runs twice (two alternations, the
    second in the other scheme order); in each, every row is `rounds` rounds (24 of 3 tasks up to
    1 MiB, 8 of 3 up to 64 MiB, 5 of 2 above, 3 rechunks), each running the same batch on the tcp://
    cluster and on the tcp+mpi:// cluster back to back, the order swapped every round. Per scheme
    and alternation: the median of every task of the row; a row's figure is the better (lower) of
    its two alternations, its ratio tcp:// over tcp+mpi:// seconds of those (above 1: tcp+mpi:// is
    faster); the median of the rounds' paired ratios is kept beside it."""
    schemes = ("tcp://", "tcp+mpi://")
    log = open(args.out + ".log", "w")  # noqa: SIM115
    drivers = {s: _Driver(s, log) for s in schemes}
    out: dict = {"rows": [], "rechunk": []}
    try:
        for d in drivers.values():
            d.ready()
        out["clusters"] = {s: d("info") for s, d in drivers.items()}
        kinds = ("cohort", "late", "restarted")
        copy_sizes = sorted({n for n, _ in TASK_ROWS.values()} | {64 * MiB})
        out["copy_before"] = {s: {k: d("copy", kind=k, sizes=copy_sizes, repeat=7) for k in kinds}
                              for s, d in drivers.items()}
        plan = _task_plan(args)
        passes: list[list[dict]] = []
        for alternation in range(2):
            first = schemes if alternation == 0 else tuple(reversed(schemes))
            got = []
            for op, row, kind, rounds, iters in plan:
                kw = {"kind": kind, "iters": iters} if op == "rechunk" else {"kind": kind, "row": row, "iters": iters}
                got.append(_paired(drivers, first, rounds, op, kw, alternation))
            passes.append(got)
        for i, (op, row, kind, rounds, iters) in enumerate(plan):
            nbytes, ndeps = TASK_ROWS.get(row, (2 * GiB, 1))
            entry = {"row": row, "kind": kind, "bytes": nbytes * ndeps, "deps": ndeps, "rounds": rounds,
                     "tasks_per_round": iters}
            if op == "rechunk":
                entry.update(workers=4, method="tasks", chunks={"from": RECHUNK_IN, "to": RECHUNK_OUT})
            entry["alternations"] = [p[i] for p in passes]
            for s in schemes:
                meds = [a[s]["median_s"] for a in entry["alternations"]]
                entry[s] = {"better_s": min(meds), "alternation_medians_s": meds}
                if all("cpu_ms_per_task" in a[s] for a in entry["alternations"]):
                    entry[s]["cpu_ms_per_task"] = {
                        k: statistics.mean(a[s]["cpu_ms_per_task"][k] for a in entry["alternations"])
                        for k in entry["alternations"][0][s]["cpu_ms_per_task"]}
            entry["ratio"] = entry["tcp://"]["better_s"] / entry["tcp+mpi://"]["better_s"]
            entry["ratio_paired_median"] = statistics.median(
                r for a in entry["alternations"] for r in a["paired_ratios"])
            (out["rechunk"] if op == "rechunk" else out["rows"]).append(entry)
        out["copy_after"] = {s: {k: d("copy", kind=k, sizes=copy_sizes, repeat=7) for k in kinds}
                             for s, d in drivers.items()}
        out["comm_stats"] = {s: d("stats") for s, d in drivers.items()}
    finally:
        for d in drivers.values():
            d.close()
        log.close()
    _task_summary(out)
    return out


def _paired(drivers, first, rounds, op, kw, alternation):
    """One alternation of one row: `rounds` rounds, each the same batch on both clusters, the order
    swapped every round (`first` leads the even rounds)."""
    per: dict = {s: [] for s in first}
    cpu: dict = {s: {} for s in first}
    for rnd in range(rounds):
        for s in (first if rnd % 2 == 0 else tuple(reversed(first))):
            got = drivers[s](op, **kw)
            per[s].append(got["seconds"])
            for k, v in got.get("cpu_s", {}).items():
                cpu[s][k] = cpu[s].get(k, 0.0) + v
    res: dict = {"alternation": alternation, "load_avg_1m": os.getloadavg()[0]}
    for s, rs in per.items():
        samples = [x for r in rs for x in r]
        res[s] = {"median_s": statistics.median(samples), "samples_s": rs}
        if cpu[s]:
            res[s]["cpu_ms_per_task"] = {k: v / len(samples) * 1e3 for k, v in cpu[s].items()}
    res["paired_ratios"] = [statistics.median(a) / statistics.median(b)
                            for a, b in zip(per["tcp://"], per["tcp+mpi://"])]
    print(json.dumps({"op": op, **kw, "alternation": alternation, "load": res["load_avg_1m"],
                      **{s: round(res[s]["median_s"] * 1e3, 2) for s in per}}), flush=True)
    return res


def _task_summary(out):
    """Transfer-only times (minus the same kind's 1 KiB task) and each row as a fraction of a copy of
    its bytes into fresh memory (numpy, allocation and page faults included), measured in the
    consumer worker of the same cluster in the same run (median of before and after): 1.0 would be a
    task that costs no more than copying its dependencies once."""
    small = {(r["kind"]): r for r in out["rows"] if r["row"] == "1 KiB"}
    for r in out["rows"] + out["rechunk"]:
        kind = r["kind"] if r["kind"] in ("cohort", "late", "restarted") else "cohort"
        for s in ("tcp://", "tcp+mpi://"):
            copies = [out[w][s][kind] for w in ("copy_before", "copy_after")]
            per_byte = statistics.median(c[str(64 * MiB)] for c in copies) / (64 * MiB)
            one = str(r["bytes"] // r.get("deps", 1))
            if one in copies[0]:  # the copy of one dependency's size, once per dependency
                copy_s = statistics.median(c[one] for c in copies) * r.get("deps", 1)
            else:  # the rechunk: at the 64 MiB copy's rate
                copy_s = per_byte * r["bytes"]
            r[s]["copy_s"] = copy_s
            r[s]["fraction_of_copy"] = copy_s / r[s]["better_s"]
            if r["kind"] in small and r["row"] != "1 KiB":
                transfer = r[s]["better_s"] - small[r["kind"]][s]["better_s"]
                r[s]["transfer_s"] = transfer
                r[s]["transfer_fraction_of_copy"] = copy_s / transfer if transfer > 0 else None
        if "transfer_s" in r["tcp://"] and r["tcp+mpi://"]["transfer_s"] > 0:
            r["transfer_ratio"] = r["tcp://"]["transfer_s"] / r["tcp+mpi://"]["transfer_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="pool" if _have_pool() else "launcher")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "comm.json"))
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--only", default="get_data,workloads,communicators", help="sections, comma-separated; "
                    "also: tasks (whole tasks, written to bench/results/comm-tasks.json)")
    ap.add_argument("--sizes", help="get_data sizes in bytes, comma-separated (e.g. 65536,1MiB)")
    ap.add_argument("--rounds", type=int, help="workload rounds (each: one cluster per protocol)")
    ap.add_argument("--task-rounds", type=int, help="whole-task rows: alternations per row (default by size)")
    ap.add_argument("--task-iters", type=int, help="whole-task rows: tasks per batch (default by size)")
    ap.add_argument("--task-rows", help="whole-task rows to run, comma-separated (e.g. '1 KiB,1 MiB,rechunk')")
    ap.add_argument("--task-driver", help=argparse.SUPPRESS)
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded with the results)")
    args = ap.parse_args()
    if args.task_driver:
        return task_driver(args.task_driver)
    if args.only == "tasks" and args.out == str(ROOT / "bench" / "results" / "comm.json"):
        args.out = str(ROOT / "bench" / "results" / "comm-tasks.json")
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
              "settings": {k: dask.config.get(k, None) for k in ("dask-pmix.pool.cohort", "dask-pmix.comm.sm-threshold", "dask-pmix.comm.cma", "dask-pmix.comm.cma-threshold",
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
    if "tasks" in only:
        result["machine"] = args.note or "shared 2-core machine (4 other engineers' builds and tests beside it)"
        result["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip()
        result["tasks"] = bench_tasks(args)
    result["load_avg_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
