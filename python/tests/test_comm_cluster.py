"""tcp+mpi:// in a real LocalCluster whose workers are ranks of the sidecar's in-process MPI pool:
the workers that started together share memory (a cohort) and move worker-to-worker data over MPI,
results are those of tcp://, a worker killed mid-transfer fails the reader within seconds and
nobody else, and a worker added later or restarted by its nanny, which Open MPI cannot reach
through shared memory, has its large frames copied straight out of its peer's memory (each pair's
path, paths.py; cma.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, wait

import dask_pmix
from dask_pmix import SidecarPlugin, wait_for_plugin


IMPL = os.environ.get("DASK_PMIX_TEST_IMPL", "openmpi")
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the in-process pool is Open MPI only")

ARRAY_N, ARRAY_CHUNK = 11_585, 2_048          # (x + x.T).sum() over 1 GiB of float64
SHUFFLE_ROWS, SHUFFLE_PARTS = 4_000_000, 16


def _pool_rank():
    from dask_pmix import pool

    p = pool.current()
    return None if p is None else p.rank


def _wait_in_pool(client, n, timeout=120):
    """Every worker has its pool rank and MPI session (they join in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = client.run(_pool_rank)
        if len(ranks) >= n and all(r is not None for r in ranks.values()):
            return ranks
        assert time.monotonic() < deadline, f"workers not in the pool: {ranks}"
        time.sleep(0.5)


def start(protocol, n=4, pool_plugin=True):
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, protocol=protocol,
                           host="127.0.0.1", dashboard_address=":0", worker_dashboard_address=":0",
                           memory_limit="3GiB",
                           # Other tests on this machine add and remove network interfaces: Open MPI's
                           # TCP transport must not pick one that vanishes (one host here anyway).
                           env={"OMPI_MCA_btl_tcp_if_include": "lo"})
    client = Client(cluster)
    if pool_plugin:
        client.register_plugin(SidecarPlugin())
        wait_for_plugin(client)
        _wait_in_pool(client, n)
    return cluster, client


def _local_peers():
    from dask_pmix.comm.link import current_link

    return sorted(current_link().local_peers)


def cohort_of(client):
    """The workers that share memory with others (the nanny's replacements and workers added
    later do not)."""
    return sorted(w for w, p in client.run(_local_peers).items() if len(p) > 1)


@pytest.fixture(scope="module")
def mpi_cluster():
    # Cohorts (the scheduler's plugin starts the sidecar in this process and reads this setting).
    with dask.config.set({"dask-pmix.pool.cohort": "0.5s"}):
        cluster, client = start("tcp+mpi://")
    # The workers started together: Open MPI put them on one node (they share memory).
    peers = client.run(_local_peers)
    assert all(len(p) == 4 and p == sorted(_wait_in_pool(client, 4).values()) for p in peers.values()), peers
    yield cluster, client
    client.close()
    cluster.close()


def array_sum(client):
    import dask.array as da

    x = da.random.RandomState(7).random((ARRAY_N, ARRAY_N), chunks=(ARRAY_CHUNK, ARRAY_CHUNK))
    return float(client.compute((x + x.T).sum()).result())


def shuffle_sums(client):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    def part(i):
        rng = np.random.default_rng(i)
        m = SHUFFLE_ROWS // SHUFFLE_PARTS
        return pd.DataFrame({"k": rng.integers(0, 1000, m), "v": rng.integers(0, 1 << 20, m)})

    df = dd.from_map(part, range(SHUFFLE_PARTS))
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        out = df.shuffle("k", npartitions=SHUFFLE_PARTS)
        per_part = out.map_partitions(lambda p: pd.DataFrame({"keys": [sorted(set(p.k))], "v": [int(p.v.sum())]}))
        parts = client.compute(per_part).result()
    keys = [set(ks) for ks in parts["keys"]]
    # a shuffle puts every key in exactly one partition
    assert sum(len(k) for k in keys) == len(set().union(*keys)) == 1000
    return sorted(int(v) for v in parts["v"]), int(parts["v"].sum())


def totals(client):
    stats = client.run(dask_pmix.comm_stats)
    return {t: sum(s[t]["bytes_received"] for s in stats.values()) for t in ("tcp", "mpi")}, stats


def test_workloads_match_tcp_and_go_over_mpi(mpi_cluster):
    _, client = mpi_cluster
    before, _ = totals(client)
    got_sum = array_sum(client)
    got_shuffle = shuffle_sums(client)
    after, stats = totals(client)
    moved_mpi = after["mpi"] - before["mpi"]
    moved_tcp = after["tcp"] - before["tcp"]
    print(f"worker-to-worker bytes received: {moved_mpi / 2**20:.0f} MiB over MPI, {moved_tcp / 2**20:.1f} MiB over TCP")
    # the bulk of worker-to-worker bytes went over MPI (the array's 32 MiB chunks: at least four of
    # them move, how many more depends on where Dask runs the tasks: 245-300 MiB seen); the TCP
    # stream carried the frames below comm.sm-threshold (the shuffle's messages of at most 2 MiB)
    assert moved_mpi > 128 << 20, stats
    assert moved_tcp < moved_mpi, stats
    assert all(s["mpi"]["connections"] > 0 for s in stats.values()), stats
    # every pair of these workers shares memory: each connection between them chose sm
    assert all(s["paths"]["sm"] > 0 and s["paths"]["tcp"] == 0 for s in stats.values()), stats

    tcp_cluster, tcp_client = start("tcp://", pool_plugin=False)
    try:
        assert array_sum(tcp_client) == got_sum
        assert shuffle_sums(tcp_client) == got_shuffle
    finally:
        tcp_client.close()
        tcp_cluster.close()


async def _listen_and_read(dask_worker=None):
    """In worker A: a tcp+mpi listener whose first message is read once it arrives; returns
    how reading ended and how long after the block arrived."""
    from distributed.comm import listen

    outcome = asyncio.get_running_loop().create_future()

    async def handler(comm):
        try:
            await comm.read()          # the handshake-sized first message
            t0 = time.monotonic()
            try:
                msg = await comm.read()
                x = msg["x"]
                outcome.set_result(("read", (len(x), int(x.sum())), time.monotonic() - t0, comm.transport))
            except Exception as exc:
                outcome.set_result((type(exc).__name__, str(exc)[:200], time.monotonic() - t0, comm.transport))
        finally:
            comm.abort()

    listener = await listen("tcp+mpi://127.0.0.1", handler)
    dask_worker._dask_pmix_test = (listener, outcome)
    return listener.contact_address


async def _outcome(dask_worker=None):
    listener, outcome = dask_worker._dask_pmix_test
    try:
        return await asyncio.wait_for(outcome, 60)
    finally:
        listener.stop()


async def _write_big_then_die(addr, nbytes, transport="mpi", linger=0.05, dask_worker=None):
    """In worker B: connect, send a large frame, and die while it is in flight."""
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    comm = await connect(addr)
    assert comm.transport == transport
    await comm.write({"hello": 1})
    # random bytes: Dask would send a compressed copy of ones, a few MiB
    x = np.ones(nbytes, dtype="u1") if transport == "mpi" else np.random.default_rng(1).integers(0, 255, nbytes, "u1")
    await comm.write({"x": to_serialize(x)})
    await asyncio.sleep(linger)
    os._exit(1)


def test_peer_killed_mid_transfer_fails_the_read_within_seconds(mpi_cluster):
    _, client = mpi_cluster
    a, b, c = cohort_of(client)[:3]
    addr = client.run(_listen_and_read, workers=[a])[a]
    fut = client.submit(np.arange, 10_000_000, workers=[c], pure=False)  # data on a third worker
    wait(fut)
    try:
        client.run(_write_big_then_die, addr, 1 << 30, workers=[b])
    except Exception:
        pass  # the worker died answering
    kind, detail, seconds, transport = client.run(_outcome, workers=[a])[a]
    assert transport == "mpi"
    assert kind == "CommClosedError", (kind, detail)
    assert seconds < 10, seconds
    # A and the others carry on: A fetches C's data over MPI
    got = client.submit(lambda x: int(x.sum()), fut, workers=[a]).result(timeout=60)
    assert got == int(np.arange(10_000_000).sum())
    client.wait_for_workers(4, timeout=120)  # the nanny replaced B


def _copied_between(client, late, src, nbytes=64 << 20):
    """A large dependency each way between a worker outside the cohort and a cohort member, right
    bytes each way; returns the comm counters before and after."""
    before = client.run(dask_pmix.comm_stats)
    fut = client.submit(np.arange, nbytes // 8, dtype="i8", workers=[src], pure=False)
    total = client.submit(lambda x: int(x.sum()), fut, workers=[late], pure=False).result(timeout=120)
    assert total == (nbytes // 8) * (nbytes // 8 - 1) // 2
    back = client.submit(lambda n: np.arange(n, dtype="i8")[::-1].copy(), nbytes // 16, workers=[late], pure=False)
    first = client.submit(lambda x: int(x[0]), back, workers=[src], pure=False).result(timeout=120)
    assert first == nbytes // 16 - 1
    return before, client.run(dask_pmix.comm_stats)


def _gained(before, after, w, transport):
    return after[w][transport]["bytes_received"] - before[w][transport]["bytes_received"]


def test_a_worker_added_later_copies_frames_out_of_its_peers_memory(mpi_cluster):
    """Open MPI 5.0.x shares memory only between ranks declared on one node when they initialised
    together; a worker that joins later is remote to the cohort, where MPI would run over its TCP
    transport (slower than the TCP stream itself). Its pairs on this host take the single-copy
    path instead: no pair communicator, no MPI bytes, each large frame copied once out of the
    sender's memory; the cohort's own pairs go on choosing sm."""
    cluster, client = mpi_cluster
    old = set(client.scheduler_info()["workers"])
    cluster.scale(len(old) + 1)
    client.wait_for_workers(len(old) + 1, timeout=120)
    new = (set(client.scheduler_info()["workers"]) - old).pop()
    ranks = _wait_in_pool(client, len(old) + 1)
    assert ranks[new] not in {ranks[w] for w in old}
    assert client.run(_local_peers, workers=[new])[new] == [ranks[new]]
    src, other = cohort_of(client)[:2]
    before, after = _copied_between(client, new, src)
    # and between two cohort members, over MPI (data of its own)
    mine = client.submit(np.ones, 64 << 20, dtype="u1", workers=[src], pure=False)
    there = client.submit(lambda x: int(x.sum()), mine, workers=[other], pure=False).result(timeout=120)
    assert there == 64 << 20
    after = client.run(dask_pmix.comm_stats)
    s = after[new]
    assert s["paths"]["cma"] > 0 and s["paths"]["sm"] == 0 and s["mpi"]["connections"] == 0, s
    assert _gained(before, after, new, "cma") >= 64 << 20 and s["mpi"]["bytes_received"] == 0, s
    assert _gained(before, after, src, "cma") >= 32 << 20, after[src]
    assert "pair_comms" not in s["events"], s
    assert _gained(before, after, other, "mpi") >= 64 << 20, after[other]


def test_a_late_joiner_killed_mid_copy_fails_the_read_and_its_restart_copies_again(mpi_cluster):
    """The sender dies as its peer copies its frame: the read either has every byte or raises
    CommClosedError at once, and nobody else is touched. Its nanny restarts it, outside the cohort
    again, and the restarted worker's pairs take the single-copy path too."""
    _, client = mpi_cluster
    cohort = cohort_of(client)
    late = sorted(set(client.scheduler_info()["workers"]) - set(cohort))
    assert late, "the test before adds a worker"
    a, b = cohort[0], late[0]
    addr = client.run(_listen_and_read, workers=[a])[a]
    try:
        client.run(_write_big_then_die, addr, 256 << 20, "cma", 0, workers=[b])
    except Exception:
        pass  # the worker died answering
    kind, detail, seconds, transport = client.run(_outcome, workers=[a])[a]
    assert transport == "cma"
    # The copy either began before the sender's end (the kernel keeps the sender's memory for
    # it: every byte right) or fails at once: never other bytes, never a wait.
    if kind == "read":
        x = np.random.default_rng(1).integers(0, 255, 256 << 20, "u1")
        assert detail == (x.nbytes, int(x.sum())), detail
    else:
        assert kind == "CommClosedError" and "single copy" in detail, (kind, detail)
    assert seconds < 10, seconds
    n = len(cohort) + len(late)
    client.wait_for_workers(n, timeout=120)  # the nanny replaced b
    ranks = _wait_in_pool(client, n)
    restarted = sorted(set(ranks) - set(cohort) - (set(late) - {b}))
    assert restarted and restarted[0] != b, ranks
    before, after = _copied_between(client, restarted[0], cohort[1])
    assert _gained(before, after, restarted[0], "cma") >= 64 << 20, after[restarted[0]]
    assert after[restarted[0]]["mpi"]["bytes_received"] == 0, after[restarted[0]]


def _job_body(comm):
    comm.Barrier()
    x = np.full(1 << 16, comm.rank, dtype="f8")
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    return float(y[0])


def test_mpi_jobs_on_workers_whose_dask_data_moves_over_mpi_meanwhile(mpi_cluster):
    # The engine progresses MPI in every worker while jobs build their communicators there: before
    # the activation gate, 2 runs of this loop hung a job's MPI_Comm_create_from_group (at the 14th
    # and 18th job), where with it 300 jobs beside 1,100 transfers ran clean.
    from dask_pmix import run_mpi

    _, client = mpi_cluster
    workers = cohort_of(client)
    assert len(workers) >= 3, workers
    stop, moved, errors = threading.Event(), [], []

    def traffic(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            a, b = rng.choice(workers, 2, replace=False)
            try:
                x = client.submit(np.ones, 4 << 20, dtype="u1", workers=[a], pure=False)
                moved.append(client.submit(lambda v: int(v[:8].sum()), x, workers=[b], pure=False).result(timeout=60))
            except Exception as exc:  # noqa: BLE001 - counted below
                errors.append(repr(exc))
                return

    def mpi_bytes():
        return sum(client.run(lambda: dask_pmix.comm_stats()["mpi"]["bytes_received"]).values())

    before = mpi_bytes()
    threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        rng = np.random.default_rng(7)
        for i in range(30):
            members = sorted(rng.choice(workers, int(rng.integers(2, min(4, len(workers)) + 1)), replace=False))
            assert run_mpi(client, _job_body, workers=members, timeout=40) == [float(sum(range(len(members))))] * len(members), i
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    assert errors == [] and len(moved) >= 10, (errors, len(moved))
    assert mpi_bytes() - before >= 10 * (4 << 20)  # the data did move over MPI meanwhile
