"""map_blocks_mpi end to end: dask arrays in (blocks with their positions from their keys, the
layout the same on every rank), dask arrays out (blocks left on the workers of the ranks that made
them), and the one-sentence errors. A real LocalCluster of 3 workers; the Blocks helpers are also
tested alone."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import dask
import numpy as np
import pytest
from distributed import futures_of, wait

from dask_pmix import MPIJobError, map_blocks_mpi
from dask_pmix.blocks import Block, Blocks, Layout

from .conftest import IMPL, start_cluster
from .test_inprocess import wait_pool_ready


@pytest.fixture(scope="module")
def cluster3():
    # In process under both libraries: MPICH's pool is opt-in (dask-pmix.pool.mpich).
    with dask.config.set({"dask-pmix.pool.mpich": IMPL == "mpich"}):
        cluster, client, sidecar = start_cluster(3)
    wait_pool_ready(sidecar, 3)
    yield cluster, client, sidecar
    client.close()
    cluster.close()


def workers_of(client):
    return sorted(client.scheduler_info()["workers"])


def transfers(client) -> list:
    """The worker-to-worker transfers of keys the workers have logged (incoming: each transfer
    is logged at both ends)."""
    logs = client.run(
        lambda dask_worker: [sorted(map(str, e.get("keys", ()))) for e in dask_worker.transfer_incoming_log]
    )
    return sorted(k for keys in logs.values() for k in keys)


def check_positions_and_multiply(comm, x, *, layout_file):
    """Each block's data against its index and offset (the array is arange(size) reshaped, so an
    element's value is its flat global index), the layout against the other ranks'; then the
    blocks times (rank + 1)."""
    for b in x:
        assert x.layout.rank_of(b.index) == comm.rank
        want = np.ravel_multi_index(tuple(np.ix_(*(np.arange(o, o + s) for o, s in zip(b.offset, b.shape)))), x.shape)
        assert np.array_equal(b.data, want), (b.index, b.offset)
        assert b.shape == tuple(c[i] for c, i in zip(x.chunks, b.index))
        assert x.get(b.index) is b
    layouts = comm.allgather(pickle.dumps(x.layout))
    assert len(set(layouts)) == 1, "the layout differs between ranks"
    assert x.layout.size == comm.size
    if comm.rank == 0:
        with open(layout_file, "wb") as f:
            f.write(layouts[0])
    return {b.index: b.data * (comm.rank + 1) for b in x}


@pytest.mark.parametrize(
    "shape,chunks",
    [
        ((23,), ((3, 5, 2, 6, 7),)),
        ((9, 7), ((2, 4, 3), (5, 2))),
        ((5, 6, 4), ((1, 4), (3, 1, 2), (4,))),
    ],
    ids=["1d", "2d", "3d"],
)
def test_blocks_arrive_with_their_positions_and_come_back_where_they_were_made(cluster3, impl, tmp_path, shape, chunks):
    import dask.array as da

    _, client, _ = cluster3
    whole = np.arange(int(np.prod(shape)), dtype="i8").reshape(shape)
    x = da.from_array(whole, chunks=chunks).persist()
    wait(x)
    before = transfers(client)
    layout_file = str(tmp_path / "layout")
    y = map_blocks_mpi(check_positions_and_multiply, x, impl=impl, layout_file=layout_file)
    wait(y)
    # Nothing moved between the hand-off and the result: the rank tasks ran where the blocks
    # were, and each output block is a future on its rank's worker.
    assert transfers(client) == before
    layout: Layout = pickle.loads(open(layout_file, "rb").read())
    assert y.chunks == x.chunks and y.dtype == x.dtype
    out_where = client.who_has(futures_of(y))
    in_where = client.who_has(futures_of(x))
    expected = whole.copy()
    for index in np.ndindex(*x.numblocks):
        rank = layout.rank_of(index)
        assert list(out_where[(y.name, *index)]) == [layout.workers[rank]]
        assert layout.workers[rank] in in_where[(x.name, *index)]
        sl = tuple(slice(sum(c[:i]), sum(c[: i + 1])) for c, i in zip(x.chunks, index))
        expected[sl] *= rank + 1
    np.testing.assert_array_equal(y.compute(), expected)


def test_a_global_sum_over_the_ranks_equals_dasks(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    x = da.random.default_rng(7).random((400, 30), chunks=((90, 110, 100, 100), (10, 20)))

    def global_sum(comm, x):
        total = comm.allreduce(sum(float(b.data.sum()) for b in x))
        return {b.index: np.full((1, 1), total) for b in x}

    sums = map_blocks_mpi(global_sum, x, chunks=(1, 1), impl=impl)  # not persisted: it is, first
    assert sums.shape == (4, 2)
    np.testing.assert_allclose(sums.compute(), float(x.sum().compute()))


def test_aligned_inputs_meet_on_one_rank_and_the_slab_helper_joins_them(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    X = client.persist(da.ones((12, 3), chunks=(4, 3)), workers=[w[1]])
    y = client.persist(da.arange(12, chunks=4, dtype="f8"), workers=[w[1]])
    wait([X, y])

    def fit(comm, X, y):
        slab = X.contiguous(axis=0)
        ys = y.contiguous(axis=0)
        assert slab.offset == (0, 0) and ys.offset == (0,)
        return {(0,): np.array([float(slab.data.T @ ys.data @ np.ones(3))])}

    out = map_blocks_mpi(fit, X, y, chunks=((1,),), impl=impl)
    assert out.compute().tolist() == [3 * float(np.arange(12).sum())]


def test_misaligned_inputs_are_refused_in_one_sentence_or_moved(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    X = client.persist(da.ones((8, 2), chunks=(4, 2)), workers=[w[0]])
    y = client.persist(da.arange(8, chunks=4, dtype="f8"), workers=[w[2]])
    wait([X, y])

    def pairs(comm, X, y):
        return {b.index: b.data * y.get(b.index[0]).data[:, None] for b in X}

    with pytest.raises(
        ValueError,
        match=r"^the inputs are not aligned: block \(0, 0\) of input 0 is on .* but block \(0,\) of input 1 on .*; .*align='move'",
    ) as err:
        map_blocks_mpi(pairs, X, y, impl=impl)
    assert err.value.args[0].count(". ") == 0  # one sentence
    # Chunked differently along their common axis: said so, before any lookup.
    with pytest.raises(ValueError, match=r"inputs 0 and 1 are not chunked alike along axis 0"):
        map_blocks_mpi(pairs, X, y.rechunk(2), impl=impl)
    # align="move": Dask copies y's blocks to X's worker first.
    out = map_blocks_mpi(pairs, X, y, align="move", impl=impl)
    np.testing.assert_array_equal(out.compute(), np.ones((8, 2)) * np.arange(8)[:, None])


@pytest.mark.parametrize("empty,size", [("include", 3), ("exclude", 1), ("error", None)])
def test_members_without_blocks(cluster3, impl, empty, size):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    x = client.persist(da.arange(6, chunks=2), workers=[w[2]])
    wait(x)

    def sizes(comm, x):
        return {b.index: np.array([comm.size]) for b in x}

    if size is None:
        with pytest.raises(
            ValueError, match=r"^worker tcp://\S+ holds nothing of the inputs \(empty='error'\), nor do 1 more$"
        ):
            map_blocks_mpi(sizes, x, chunks=(1,), workers=w, empty=empty, impl=impl)
        return
    out = map_blocks_mpi(sizes, x, chunks=(1,), workers=w, empty=empty, impl=impl)
    assert out.compute().tolist() == [size] * 3
    # By default the members are the holders: nobody is empty.
    assert map_blocks_mpi(sizes, x, chunks=(1,), impl=impl).compute().tolist() == [1] * 3


def test_an_empty_rank_gets_the_metadata_and_an_empty_slab(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    x = client.persist(da.ones((6, 4), chunks=(3, 4)), workers=[w[0]])
    wait(x)

    def seen(comm, x):
        slab = x.contiguous(axis=0)
        rows = comm.allreduce(slab.data.shape[0])
        if len(x) == 0:
            assert x.shape == (6, 4) and x.chunks == ((3, 3), (4,)) and slab.data.shape == (0, 4)
        return {b.index: np.full((1, 1), rows) for b in x}

    out = map_blocks_mpi(seen, x, chunks=(1, 1), workers=w[:2], impl=impl)
    assert out.compute().ravel().tolist() == [6, 6]


@pytest.mark.parametrize(
    "returns,chunks,match",
    [
        ("short", None, r"rank 0 returned output block \(1,\) of shape \(2,\), not \(3,\) as the output's chunks say"),
        ("float32", None, None),
        ("missing", None, r"rank 0 did not return output block \(1,\): the output follows the first input"),
        ("dtype", None, r"returned output block \(\d,\) of dtype float32, but block \(0,\) is float64"),
        ("none", ((1, 1, 1),), r"no rank returned output blocks \(1,\), \(2,\) of the output's \(3,\) blocks"),
        ("string", None, r"rank 0's function returned a str; map_blocks_mpi's function returns its output blocks"),
    ],
)
def test_a_wrong_output_block_fails_the_call_naming_the_rank_and_the_block(cluster3, impl, returns, chunks, match):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    x = client.persist(da.ones(12, chunks=3), workers=[w[0]])
    wait(x)

    def wrong(comm, x, *, returns):
        blocks = {b.index: b.data for b in x}
        if returns == "short":
            blocks[(1,)] = blocks[(1,)][:2]
        elif returns in ("float32", "dtype"):
            blocks[(2,)] = blocks[(2,)].astype("f4")
        elif returns == "missing":
            del blocks[(1,)]
        elif returns == "none":
            return {(0,): np.ones(1)}
        elif returns == "string":
            return "done"
        return blocks

    if match is None:  # dtype= given: a block of another dtype is refused on its rank
        with pytest.raises(
            MPIJobError, match=r"rank 0 returned output block \(2,\) of dtype float32, not float64"
        ) as err:
            map_blocks_mpi(wrong, x, dtype="f8", returns=returns, impl=impl)
    else:
        with pytest.raises(MPIJobError, match=match) as err:
            map_blocks_mpi(wrong, x, chunks=chunks, returns=returns, impl=impl)
    if returns != "none":
        assert err.value.rank == 0 and err.value.worker == w[0]
    # The input is still there and right.
    assert float(x.sum().compute()) == 12.0


def test_a_rank_may_return_blocks_of_unknown_size(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    x = da.arange(20, chunks=5).persist()

    def evens(comm, x):
        return {b.index: b.data[b.data % 2 == 0] for b in x}

    out = map_blocks_mpi(evens, x, chunks=((np.nan,) * 4,), impl=impl)
    assert out.chunks == ((3, 2, 3, 2),)
    np.testing.assert_array_equal(out.compute(), np.arange(0, 20, 2))


def test_replicated_blocks_spread_over_their_holders(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    x = client.persist(da.arange(12, chunks=2), workers=[workers_of(client)[0]])
    wait(x)
    client.replicate(futures_of(x), n=3)

    def count(comm, x):
        return {b.index: np.array([comm.size * 100 + len(x)]) for b in x}

    out = map_blocks_mpi(count, x, chunks=(1,), impl=impl).compute().tolist()
    assert out == [302] * 6  # 3 ranks of 2 blocks each, not 1 rank of 6


def slab_and_transfers_seen(comm, x, y):
    """Each rank's blocks of x and y as one contiguous slab each (both inputs balanced alike),
    doubled; the rank's block counts and slab offsets come back in block 0's output."""
    sx, sy = x.contiguous(axis=0), y.contiguous(axis=0)
    assert sx.offset == sy.offset and len(x) == len(y)
    for b, c in zip(x, y):  # every block where its index says, whichever rank sent it
        assert np.array_equal(b.data, np.arange(b.offset[0], b.offset[0] + b.shape[0]))
        assert np.array_equal(c.data, -b.data)
    counts = comm.allgather(len(x))
    return {b.index: b.data * 2 + (1000 * max(counts) + min(counts) if b.index == (0,) else 0) for b in x}


@pytest.mark.parametrize("how", ["dask", "mpi"])
def test_skewed_blocks_are_rebalanced_by_dask_or_over_mpi(cluster3, impl, how):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    # 7 aligned blocks of two inputs, all on one worker; 3 ranks (n=3): runs of 3, 2 and 2 blocks.
    x = client.persist(da.arange(14, chunks=2), workers=[w[0]])
    y = client.persist(-da.arange(14, chunks=2), workers=[w[0]])
    wait([x, y])
    out = map_blocks_mpi(slab_and_transfers_seen, x, y, n=3, rebalance=how, impl=impl)
    got = out.compute()
    assert got[0] == 3002, got[:2]  # counts 3, 2, 2: balanced
    np.testing.assert_array_equal(got[2:], np.arange(2, 14) * 2)
    holders = {tuple(ws) for ws in client.who_has(futures_of(out)).values()}
    assert len({h for hs in holders for h in hs}) == 3, holders  # the output is on all three ranks
    if how == "mpi":  # nothing moved through Dask (the ranks sent the blocks to each other)
        holding = {w for ws in client.who_has(futures_of(x) + futures_of(y)).values() for w in ws}
        assert holding == {w[0]}, holding


def per_input_counts(comm, x, y):
    return {(0,): np.array([len(x), len(y)])} if comm.rank == 0 else {}


def test_inputs_not_aligned_are_each_spread(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    w = workers_of(client)
    x = client.persist(da.arange(8, chunks=2), workers=[w[1]])
    y = client.persist(da.arange(12, chunks=3), workers=[w[1]])
    wait([x, y])
    out = map_blocks_mpi(per_input_counts, x, y, n=2, align="none", rebalance="mpi", chunks=((2,),), impl=impl)
    assert out.compute().tolist() == [2, 2]  # rank 0 holds half of each input, not all of one


def test_fewer_blocks_than_ranks_spread_one_each_and_bad_rebalance_is_refused(cluster3, impl):
    import dask.array as da

    _, client, _ = cluster3
    x = client.persist(da.arange(4, chunks=2), workers=[workers_of(client)[1]])
    wait(x)

    def sizes(comm, x):
        return {b.index: np.full(b.shape, comm.allreduce(len(x))) for b in x}

    assert map_blocks_mpi(sizes, x, n=3, rebalance="mpi", empty="exclude", impl=impl).compute().tolist() == [2] * 4
    with pytest.raises(ValueError, match="rebalance must be None, 'dask' or 'mpi'"):
        map_blocks_mpi(sizes, x, rebalance="yes")


def test_an_asynchronous_client_awaits_it(cluster3, impl):
    import asyncio

    import dask.array as da
    from distributed import Client

    cluster, _, _ = cluster3

    def times_rank(comm, x):
        return {b.index: b.data * (comm.rank + 1) for b in x}

    async def use():
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            x = da.ones(20, chunks=5)  # persisted by map_blocks_mpi, not awaited by the caller
            y = await map_blocks_mpi(times_rank, x, client=client, impl=impl)
            return y.chunks, float(await client.compute(y.sum())), len(futures_of(y))

    chunks, total, blocks = asyncio.run(use())
    assert chunks == ((5, 5, 5, 5),) and blocks == 4 and 20.0 <= total <= 20.0 * 3


def test_blocks_contiguous_says_why_not():
    a = np.arange(24).reshape(6, 4)
    chunks = ((2, 2, 2), (2, 2))
    layout = Layout([[[(0, 0), (0, 1), (2, 0), (2, 1)]], [[(1, 0), (1, 1)]]], ["w0", "w1"])

    def blocks_of(rank):
        out = []
        for ix in layout.blocks(rank):
            off = (2 * ix[0], 2 * ix[1])
            out.append(Block(ix, off, a[off[0] : off[0] + 2, off[1] : off[1] + 2]))
        return Blocks(out, name="a", shape=a.shape, chunks=chunks, dtype=a.dtype, input=0, rank=rank, layout=layout)

    slab = blocks_of(1).contiguous(axis=0)
    assert slab.offset == (2, 0)
    np.testing.assert_array_equal(slab.data, a[2:4])
    with pytest.raises(
        ValueError,
        match=r"^the blocks of input 0 on rank 0 are not contiguous: \(0, 0\) and \(2, 1\) are here, but \(1, 0\) between them is on rank 1$",
    ):
        blocks_of(0).contiguous()
    with pytest.raises(ValueError, match=r"not a slab along axis 1: along axis 0 they cover blocks 1 to 1 of 3"):
        blocks_of(1).contiguous(axis=1)
    one = Blocks(
        [Block((0, 1), (0, 2), a[0:2, 2:4])],
        name="a",
        shape=a.shape,
        chunks=chunks,
        dtype=a.dtype,
        input=0,
        rank=0,
        layout=layout,
    )
    assert one.contiguous().offset == (0, 2)


def test_bad_arguments_are_refused_before_the_cluster_is_asked(cluster3):
    import dask.array as da

    _, client, _ = cluster3
    x = da.ones(4, chunks=2)
    with pytest.raises(TypeError, match="argument 2 of map_blocks_mpi is a int, not a dask array"):
        map_blocks_mpi(lambda comm, x: {}, x, 3)
    with pytest.raises(ValueError, match="empty must be"):
        map_blocks_mpi(lambda comm, x: {}, x, empty="skip")
    with pytest.raises(TypeError, match="no keyword 'local'"):
        map_blocks_mpi(lambda comm, x, local: {}, x, local=1)
    with pytest.raises(ValueError, match=r"unknown chunk sizes \(NaN\)"):
        map_blocks_mpi(lambda comm, x: {}, x[x > 0])


def tag_partitions(comm, df, *, known):
    """Each partition against its number and division; then tagged with the rank that had it."""
    import pandas as pd

    whole = pd.DataFrame({"v": np.arange(40.0)}, index=np.arange(40) * 10)
    for p in df:
        assert df.layout.rank_of(p.number) == comm.rank
        if known:
            lo, hi = p.division
            assert lo == p.data.index.min() and (p.data.index.max() < hi or p.number == df.npartitions - 1)
            pd.testing.assert_frame_equal(p.data, whole.loc[lo:hi].iloc[: len(p.data)])
        else:
            assert p.division == (None, None) and not df.known_divisions
    rows = comm.allreduce(sum(len(p.data) for p in df))
    return {p.number: p.data.assign(rank=comm.rank, rows=rows) for p in df}


@pytest.mark.parametrize("known", [True, False], ids=["known-divisions", "unknown-divisions"])
def test_dataframe_partitions_arrive_with_number_and_division_and_stay(cluster3, impl, known):
    pd = pytest.importorskip("pandas")  # not in every test environment (the MPICH one)
    import dask.dataframe as dd

    from dask_pmix import map_partitions_mpi

    _, client, _ = cluster3
    pdf = pd.DataFrame({"v": np.arange(40.0)}, index=np.arange(40) * 10)
    df = dd.from_pandas(pdf, npartitions=4, sort=True)
    if not known:
        df = df.clear_divisions()
    df = df.persist()
    wait(df)
    before = transfers(client)
    out = map_partitions_mpi(tag_partitions, df, impl=impl, known=known)
    wait(out)
    assert transfers(client) == before
    assert out.npartitions == 4 and tuple(out.divisions) == tuple(df.divisions)
    got = out.compute()
    assert (got["rows"] == 40).all()
    pd.testing.assert_frame_equal(got[["v"]], pdf)
    # Each partition's rank is the one holding it: its worker is where the output partition is.
    out_where = client.who_has(futures_of(out))
    in_where = client.who_has(futures_of(df))
    for (_, i), holders in in_where.items():
        assert set(out_where[next(k for k in out_where if k[1] == i)]) <= set(holders)


def test_a_wrong_output_partition_names_the_rank_and_the_partition(cluster3, impl):
    pd = pytest.importorskip("pandas")
    import dask.dataframe as dd

    from dask_pmix import map_partitions_mpi

    _, client, _ = cluster3
    w = workers_of(client)
    df = client.persist(dd.from_pandas(pd.DataFrame({"v": np.arange(12.0)}), npartitions=3), workers=[w[0]])
    wait(df)

    def renames_one(comm, df):
        return {p.number: p.data.rename(columns={"v": "w"}) if p.number == 2 else p.data for p in df}

    with pytest.raises(
        MPIJobError, match=r"rank 0 returned output partition 2 with other columns or dtypes than partition 0"
    ):
        map_partitions_mpi(renames_one, df, impl=impl)

    def drops_one(comm, df):
        return {p.number: p.data for p in df if p.number != 1}

    with pytest.raises(MPIJobError, match=r"rank 0 did not return output partition 1"):
        map_partitions_mpi(drops_one, df, impl=impl)

    # Divisions given: any rank may return any partition, but each exactly once.
    def all_on_rank_0(comm, df):
        return {0: df.concat()} if comm.rank == 0 else {}

    one = map_partitions_mpi(all_on_rank_0, df, divisions=(0, 11), impl=impl)
    assert one.npartitions == 1 and one.compute()["v"].tolist() == list(np.arange(12.0))
    unknown = map_partitions_mpi(lambda comm, df: {p.number: p.data * 2 for p in df}, df, divisions=None, impl=impl)
    assert not unknown.known_divisions and unknown.compute()["v"].sum() == 132.0


# Tests that lose workers come last, on a cluster of their own.


def test_a_holder_gone_before_the_job_starts_is_named_and_a_member_lost_mid_job_leaves_the_inputs(
    impl, tmp_path, monkeypatch
):
    import dask.array as da

    from dask_pmix.client import collections

    cluster, client, _ = start_cluster(3)
    try:
        x = da.arange(30, chunks=5, dtype="f8").persist()
        wait(x)
        holders = sorted({h for hs in client.who_has(futures_of(x)).values() for h in hs})
        victim = holders[-1]
        lookup = collections._holders

        async def then_retire(client_, held):
            who_has = await lookup(client_, held)
            # Retired gracefully: Dask moves its blocks to the others first.
            await client_.scheduler.retire_workers(workers=[victim], close_workers=True)
            return who_has

        monkeypatch.setattr(collections, "_holders", then_retire)

        def total(comm, x):
            whole = comm.allreduce(float(sum(b.data.sum() for b in x)))  # once on every rank
            return {b.index: np.full(1, whole) for b in x}

        with pytest.raises(
            MPIJobError,
            match=rf"^MPI job .*failed \(worker {victim}\): worker {victim}, which held block \(\d,\).* of input 0, left the cluster before the job started[^;]*; the inputs are still in the cluster \(Dask keeps or recomputes what it held\): call again$",
        ):
            map_blocks_mpi(total, x, chunks=(1,), impl=impl)
        monkeypatch.setattr(collections, "_holders", lookup)
        assert map_blocks_mpi(total, x, chunks=(1,), impl=impl).compute().tolist() == [435.0] * 6

        # A member lost mid-job: the job fails as run_mpi's do; the inputs are still there.
        pid_dir = str(tmp_path)

        def slow(comm, x):
            open(os.path.join(pid_dir, f"rank{comm.rank}"), "w").close()
            for _ in range(200):
                comm.Barrier()
                time.sleep(0.05)
            return {b.index: b.data for b in x}

        members = sorted({h for hs in client.who_has(futures_of(x)).values() for h in hs})
        assert len(members) >= 2, members
        outcome = {}

        def run():
            try:
                outcome["out"] = map_blocks_mpi(slow, x, impl=impl)
            except MPIJobError as e:
                outcome["error"] = e

        job = threading.Thread(target=run)
        job.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(os.listdir(pid_dir)) < len(members):
            time.sleep(0.1)
        pid = client.run(os.getpid, workers=[members[-1]])[members[-1]]
        os.kill(pid, signal.SIGKILL)
        job.join(60)
        assert "error" in outcome, outcome
        assert outcome["error"].worker == members[-1]
        # The blocks the killed worker held are computed again by Dask: the retry gets them all.
        np.testing.assert_array_equal(map_blocks_mpi(slow, x, impl=impl, timeout=120).compute(), np.arange(30.0))
    finally:
        client.close()
        cluster.close()
