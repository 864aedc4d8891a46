"""The MPI world a job's function sees, as real mpi4py code uses it: the first lines of most
programs (COMM_WORLD, COMM_SELF, Is_thread_main, Reduce_local, windows), Init and Finalize,
Abort, and a rank that raises while the others build mpi4py's first pickle collective. Each of
these crashed or wedged the members in process before the world model (a Session-only process of
Open MPI 5.0.x); none may cost a worker its data: the workers keep their pids and their chunks."""

from __future__ import annotations

import os
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import wait

from dask_pmix import MPIJobError, run_mpi

from .conftest import IMPL, held_keys, start_cluster
from .test_inprocess import wait_pool_ready

OPENMPI = IMPL == "openmpi"
pytestmark = pytest.mark.skipif(IMPL not in ("openmpi", "mpich"), reason=f"no in-process jobs for {IMPL}")


@pytest.fixture(scope="module")
def cluster():
    with dask.config.set({"dask-pmix.pool.mpich": not OPENMPI}):
        cluster, client, sidecar = start_cluster(3)
        wait_pool_ready(sidecar, 3)
        x = da.random.random((400, 400), chunks=(100, 100)).persist()  # 16 chunks held by the members
        wait(x)
        yield client, x
        client.close()
        cluster.close()


def _unharmed(client, x, pids: dict) -> None:
    """Every worker is the same process and still holds its chunks."""
    assert client.run(os.getpid) == pids, "a worker process was replaced"
    held = held_keys(client, x.name)
    assert sum(len(k) for k in held.values()) == 16, held


def world_calls(comm):
    from mpi4py import MPI

    a, b = np.ones(3), np.ones(3)
    MPI.SUM.Reduce_local(a, b)
    MPI.COMM_WORLD.Barrier()
    self_dup = MPI.COMM_SELF.Dup()
    window = MPI.Win.Create(np.zeros(4), comm=MPI.COMM_SELF)
    group = MPI.COMM_WORLD.Get_group()
    out = {
        "size": MPI.COMM_WORLD.Get_size(),
        "rank": MPI.COMM_WORLD.Get_rank(),
        "is_job": MPI.COMM_WORLD == comm,
        "sum": MPI.COMM_WORLD.allreduce(comm.rank),
        "self": self_dup.Get_size(),
        "reduce_local": b.tolist(),
        "group": group.Get_size(),
        "initialized": MPI.Is_initialized(),
        "thread": MPI.Query_thread(),
        "thread_main": MPI.Is_thread_main(),
        "error_string": str(MPI.Exception(MPI.SUCCESS)),
    }
    group.Free()
    window.Free()
    self_dup.Free()
    return out


def test_the_first_lines_of_mpi_programs_work_and_cost_no_worker(cluster):
    client, x = cluster
    pids = client.run(os.getpid)
    results = run_mpi(client, world_calls, n=3, impl=IMPL, timeout=60)
    for rank, r in enumerate(results):
        assert r["size"] == 3 and r["rank"] == rank and r["is_job"], r
        assert r["sum"] == 3 and r["self"] == 1 and r["group"] == 3, r
        assert r["reduce_local"] == [2.0, 2.0, 2.0] and r["initialized"], r
        assert r["thread"] == 3 and r["thread_main"] is False  # fn runs in a task thread, not MPI's main one
        assert "error code" not in r["error_string"], r  # mpi4py's text for an uninitialised MPI
    _unharmed(client, x, pids)


def init_and_finalize(comm):
    from mpi4py import MPI

    try:
        MPI.Init()
        init = "returned"
    except MPI.Exception as e:
        init = e.Get_error_class()
    t0 = time.monotonic()
    MPI.Finalize()
    return {"init": init, "finalize_s": time.monotonic() - t0, "finalized": MPI.Is_finalized()}


def test_init_raises_as_under_mpirun_and_finalize_leaves_the_workers_session(cluster):
    client, x = cluster
    pids = client.run(os.getpid)
    t0 = time.monotonic()
    for r in run_mpi(client, init_and_finalize, n=3, impl=IMPL, timeout=30):
        assert r["init"] != "returned" and r["finalize_s"] < 1 and not r["finalized"], r
    assert time.monotonic() - t0 < 20
    assert run_mpi(client, lambda c: c.allreduce(1), n=3, impl=IMPL, timeout=30) == [3, 3, 3]
    _unharmed(client, x, pids)


def outside_a_job():
    from mpi4py import MPI

    try:
        MPI.COMM_WORLD.Barrier()
    except MPI.Exception as e:
        return e.Get_error_class() == MPI.ERR_COMM
    return "the barrier returned"


@pytest.mark.skipif(not OPENMPI, reason="an MPICH worker's world outside jobs is its own world of one")
def test_outside_a_job_comm_world_raises_instead_of_waiting_for_the_pool(cluster):
    client, x = cluster
    assert set(client.run(outside_a_job).values()) == {True}


def abort_on_world(comm):
    from mpi4py import MPI

    if comm.rank == 1:
        MPI.COMM_WORLD.Abort(7)
    if OPENMPI:  # the others wait for it, until the revoke ends their barrier
        MPI.COMM_WORLD.Barrier()


def self_abort_outside():
    from mpi4py import MPI

    try:
        MPI.COMM_SELF.Abort(3)
    except RuntimeError as e:
        return "outside an MPI job" in str(e)
    return False


def test_abort_on_comm_world_or_outside_a_job_ends_no_worker(cluster):
    client, x = cluster
    pids = client.run(os.getpid)
    with pytest.raises(MPIJobError, match="status 7") as e:
        run_mpi(client, abort_on_world, n=3, impl=IMPL, timeout=30)
    assert e.value.rank == 1
    assert set(client.run(self_abort_outside).values()) == {True}
    assert run_mpi(client, lambda c: c.allreduce(1), n=3, impl=IMPL, timeout=30) == [3, 3, 3]
    _unharmed(client, x, pids)


def raise_in_first_pickle_collective(comm):
    if comm.rank == 2:
        time.sleep(1)
        raise ValueError("rank 2 gives up")
    return comm.allreduce(1)


def raise_while_others_wait_on_communicators_fn_made(comm):
    from mpi4py import MPI

    sub = MPI.COMM_WORLD.Split(0, comm.rank)
    dup = comm.Dup()
    if comm.rank == 2:
        time.sleep(1)
        raise ValueError("rank 2 gives up")
    if comm.rank == 1:
        sub.Barrier()
    return dup.allreduce(1)


@pytest.mark.skipif(not OPENMPI, reason="MPICH cannot revoke: its members left in MPI are replaced")
@pytest.mark.parametrize("fn", [raise_in_first_pickle_collective, raise_while_others_wait_on_communicators_fn_made])
def test_a_rank_that_raises_while_the_others_wait_for_it_wedges_nobody(cluster, fn):
    """The others wait in mpi4py's first pickle collective (its duplicate of the communicator),
    or in a barrier and a pickle collective on communicators the function made: the failed job
    revokes them all."""
    client, x = cluster
    pids = client.run(os.getpid)
    t0 = time.monotonic()
    with pytest.raises(MPIJobError, match="rank 2 gives up"):
        run_mpi(client, fn, n=3, impl=IMPL, timeout=30)
    assert time.monotonic() - t0 < 15
    assert run_mpi(client, lambda c: c.allreduce(1), n=3, impl=IMPL, timeout=30) == [3, 3, 3]
    _unharmed(client, x, pids)


def world_of_a_fork_rank(comm):
    from mpi4py import MPI

    a, b = np.ones(2), np.ones(2)
    MPI.SUM.Reduce_local(a, b)
    return {
        "size": MPI.COMM_WORLD.Get_size(),
        "sum": MPI.COMM_WORLD.allreduce(1),
        "self": MPI.COMM_SELF.Get_size(),
        "thread_main": MPI.Is_thread_main(),
        "pid": os.getpid(),
    }


def test_in_fork_mode_comm_world_is_the_job_as_under_mpirun(cluster):
    client, x = cluster
    workers = set(client.run(os.getpid).values())
    for r in run_mpi(client, world_of_a_fork_rank, n=3, impl=IMPL, mode="fork", timeout=60):
        assert r["size"] == 3 and r["sum"] == 3 and r["self"] == 1 and r["thread_main"], r
        assert r["pid"] not in workers


def partitioned(comm):
    import numpy as np
    from mpi4py import MPI

    try:
        MPI.COMM_WORLD.Psend_init(np.zeros(4), 2, dest=(comm.rank + 1) % comm.size)
    except NotImplementedError as e:
        return "mode='fork'" in str(e)
    return "Psend_init returned"


@pytest.mark.skipif(not OPENMPI, reason="Open MPI's partitioned component needs a world of the job")
def test_partitioned_point_to_point_raises_in_process_and_says_what_to_use(cluster):
    client, x = cluster
    assert run_mpi(client, partitioned, n=3, impl=IMPL, timeout=30) == [True, True, True]


def create_from_groups(comm):
    from mpi4py import MPI

    out: dict = {}
    group = comm.Get_group()
    alone = group.Incl([comm.rank])
    low, high = group.Range_incl([(0, 0, 1)]), group.Range_incl([(1, comm.size - 1, 1)])
    local, remote = (low, high) if comm.rank == 0 else (high, low)
    try:
        for name, call in (
            ("intra", lambda: MPI.Intracomm.Create_from_group(group)),
            ("inter", lambda: MPI.Intercomm.Create_from_groups(local, 0, remote, 0)),
            ("graph", lambda: comm.Create_dist_graph([comm.rank], [1], [(comm.rank + 1) % comm.size])),
        ):
            try:
                call().Free()
                out[name] = "returned"
            except NotImplementedError as e:
                out[name] = "mode='fork'" in str(e)
        # A group of the worker alone is within its world: MPICH serves it.
        mine = MPI.Intracomm.Create_from_group(alone, "dask-pmix.alone")
        out["alone"] = mine.Get_size()
        mine.Free()
        adjacent = comm.Create_dist_graph_adjacent([(comm.rank - 1) % comm.size], [(comm.rank + 1) % comm.size])
        out["adjacent"] = adjacent.Get_dist_neighbors_count()
        adjacent.Free()
    finally:
        for g in (group, alone, low, high):
            g.Free()
    out["after"] = comm.allreduce(1)
    return out


@pytest.mark.skipif(OPENMPI, reason="MPICH's worlds of one: these constructors need a world of the job")
def test_communicators_mpich_cannot_build_across_worlds_raise_in_process(cluster):
    """MPICH builds the from-group ones over its MPI_COMM_WORLD, a world of the worker alone:
    mpi4py's test_comm_inter.testCreateFromGroups ended all three workers (an MPIR_Assert in
    allreduce_group.c); Create_dist_graph waited for good (test_comm_topo). The adjacent graph
    and a group of the worker alone work."""
    client, x = cluster
    pids = client.run(os.getpid)
    results = run_mpi(client, create_from_groups, n=3, impl=IMPL, timeout=60)
    expected = {"intra": True, "inter": True, "graph": True, "alone": 1, "adjacent": (1, 1, False), "after": 3}
    assert results == [expected] * 3
    _unharmed(client, x, pids)


def c_library(comm, path):
    import ctypes

    from mpi4py import MPI

    lib = ctypes.CDLL(path)
    handle = ctypes.c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_void_p) else ctypes.c_int
    lib.lib_compare.argtypes = [handle, ctypes.c_int]
    size = ctypes.c_int(0)
    total = lib.lib_sum_of_ranks_f(comm.py2f(), ctypes.byref(size))
    world = lib.lib_sum_of_ranks_f(MPI.COMM_WORLD.py2f(), ctypes.byref(size))
    return {
        "size": size.value,
        "sum": total,
        "world_sum": world,
        "same": lib.lib_compare(MPI._handleof(comm), MPI.COMM_WORLD.py2f()),
    }


def test_a_c_library_sees_the_jobs_communicator_through_handle_conversion(cluster, tmp_path):
    import subprocess
    import sys

    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    src = os.path.join(os.path.dirname(__file__), "programs", "comm_lib.c")
    lib = str(tmp_path / "libcomm.so")
    subprocess.run([mpicc, "-shared", "-fPIC", "-o", lib, src], check=True, capture_output=True)
    client, x = cluster
    for r in run_mpi(client, c_library, lib, n=3, impl=IMPL, timeout=60):
        assert r == {"size": 3, "sum": 3, "world_sum": 3, "same": 1}, r


def rma_patterns(comm):
    from mpi4py import MPI

    refused = None
    if not OPENMPI:
        # MPICH's worlds of one: a window over other workers raises (world_model); COMM_SELF's works.
        try:
            MPI.Win.Allocate(8, disp_unit=8, comm=comm).Free()
        except NotImplementedError as e:
            refused = "mode='fork'" in str(e)
        comm = MPI.COMM_SELF
    # A counter on rank 0, bumped by everyone under passive-target exclusive locks.
    win = MPI.Win.Allocate(8, disp_unit=8, comm=comm)
    if comm.rank == 0:
        np.frombuffer(win.tomemory(), dtype="i8")[:] = 0
    comm.Barrier()
    one = np.ones(1, dtype="i8")
    for _ in range(5):
        win.Lock(0, MPI.LOCK_EXCLUSIVE)
        win.Accumulate(one, 0, op=MPI.SUM)
        win.Unlock(0)
    comm.Barrier()
    got = np.zeros(1, dtype="i8")
    win.Lock(0, MPI.LOCK_SHARED)
    win.Get(got, 0)
    win.Unlock(0)
    win.Free()
    # A shared-memory window over the ranks that share a node (the shared-memory split). MPICH's
    # worlds of one share no memory domain: their split of a host is refused at the window.
    node = comm.Split_type(MPI.COMM_TYPE_SHARED) if OPENMPI else MPI.COMM_SELF.Dup()
    shared = MPI.Win.Allocate_shared(8 * 4, disp_unit=8, comm=node)
    buf, _ = shared.Shared_query(0)
    shared.Fence()
    np.frombuffer(buf, dtype="i8")[node.rank] = 10 + node.rank
    shared.Fence()
    seen = np.frombuffer(buf, dtype="i8")[: node.size].tolist()
    shared.Free()
    node_size = node.size
    node.Free()
    return {"counter": int(got[0]), "node_size": node_size, "seen": seen, "refused": refused}


def test_rma_passive_target_locks_and_a_shared_memory_window(cluster):
    """MPICH: windows over other workers raise (in mpi4py's test_rma they aborted the worker or
    waited for good); the same patterns on COMM_SELF work."""
    client, x = cluster
    pids = client.run(os.getpid)
    for r in run_mpi(client, rma_patterns, n=3, impl=IMPL, timeout=60):
        assert r["counter"] == (15 if OPENMPI else 5), r
        assert r["seen"] == [10 + i for i in range(r["node_size"])], r
        assert r["refused"] is (None if OPENMPI else True), r
    _unharmed(client, x, pids)


def mpi_io(comm, path):
    from mpi4py import MPI

    f = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
    f.Write_at_all(comm.rank * 8 * 4, np.full(4, comm.rank, dtype="i8"))
    f.Sync()
    comm.Barrier()
    back = np.empty(4 * comm.size, dtype="i8")
    f.Read_at_all(0, back)
    f.Close()
    return back.tolist()


def test_mpi_io_on_a_file_the_members_share(cluster, tmp_path):
    client, x = cluster
    path = str(tmp_path / "shared.bin")
    expected = [r for r in range(3) for _ in range(4)]
    assert run_mpi(client, mpi_io, path, n=3, impl=IMPL, timeout=60) == [expected] * 3
    assert np.fromfile(path, dtype="i8").tolist() == expected
