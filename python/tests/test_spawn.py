"""MPI_Comm_spawn from a job's ranks (Open MPI): the sidecar starts the children on its host, in a
namespace of their own, and ends them with the job."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from dask_pmix import run_mpi

from .conftest import IMPL

pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="MPI_Comm_spawn is served for Open MPI ranks only")

MODES = ["inprocess", "fork"]

REDUCE_CHILD = """\
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
assert parent != MPI.COMM_NULL
parent.reduce(MPI.COMM_WORLD.rank + 10, op=MPI.SUM, root=0)
parent.Disconnect()
"""

# Connects, tells where it is, leaves its parent and would then run for ten minutes.
LINGERING_CHILD = """\
import os, sys, time
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
parent.Barrier()
parent.Disconnect()
with open(os.path.join(sys.argv[1], f"{MPI.COMM_WORLD.rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(600)
"""


def _script(tmp_path, text: str) -> str:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def spawn_and_reduce(comm, script):
    from mpi4py import MPI

    inter = comm.Spawn(sys.executable, [script], maxprocs=2, root=0)
    total = inter.reduce(None, op=MPI.SUM, root=MPI.ROOT if comm.rank == 0 else MPI.PROC_NULL)
    remote = inter.Get_remote_size()
    inter.Disconnect()
    return {"rank": comm.rank, "total": total, "remote": remote, "pid": os.getpid()}


@pytest.mark.parametrize("mode", MODES)
def test_spawned_children_reduce_to_their_parent(dask_cluster, mode, tmp_path):
    _, client, _ = dask_cluster
    script = _script(tmp_path, REDUCE_CHILD)
    for _ in range(2):
        out = run_mpi(client, spawn_and_reduce, script, n=2, mode=mode, timeout=120)
        assert [o["rank"] for o in out] == [0, 1]
        assert [o["total"] for o in out] == [10 + 11, None]
        assert [o["remote"] for o in out] == [2, 2]


def spawn_lingering(comm, script, piddir):
    inter = comm.Spawn(sys.executable, [script, piddir], maxprocs=2, root=0)
    inter.Barrier()
    inter.Disconnect()
    return os.getpid()


def _gone(pid: int) -> bool:
    """Ended and reaped: a zombie would still answer signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("mode", MODES)
def test_children_that_outlive_their_job_are_terminated_and_reaped(dask_cluster, mode, tmp_path):
    _, client, _ = dask_cluster
    piddir = tmp_path / "pids"
    piddir.mkdir()
    script = _script(tmp_path, LINGERING_CHILD)
    run_mpi(client, spawn_lingering, script, str(piddir), n=2, mode=mode, timeout=120)
    deadline = time.monotonic() + 10
    while len(list(piddir.glob("*.pid"))) < 2:
        assert time.monotonic() < deadline, "the children never said where they are"
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in piddir.glob("*.pid")]
    deadline = time.monotonic() + 15
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"spawned processes {pids} outlived their job"
        time.sleep(0.1)


def spawn_too_many(comm, script):
    from mpi4py import MPI

    try:
        comm.Spawn(sys.executable, [script], maxprocs=65, root=0)
    except MPI.Exception as e:
        # Open MPI 5.0.x hands a failed spawn's MPI_ERR_SPAWN to every rank negated (comm_spawn.c
        # passes it in the port string as ':error=14', dpm.c's connect_accept returns -14), which
        # mpi4py reads as MPI_ERR_UNKNOWN; mpirun's ranks see the same.
        spawn_failed = e.Get_error_class() in (MPI.ERR_SPAWN, MPI.ERR_UNKNOWN)
        return {"pid": os.getpid(), "error": "spawn failed" if spawn_failed else str(e)}
    return {"pid": os.getpid(), "error": None}


@pytest.mark.parametrize("mode", MODES)
def test_a_spawn_past_the_limit_raises_and_the_workers_survive(dask_cluster, mode, tmp_path):
    _, client, _ = dask_cluster
    script = _script(tmp_path, REDUCE_CHILD)
    before = client.run(os.getpid)
    out = run_mpi(client, spawn_too_many, script, n=2, mode=mode, timeout=120)
    assert [o["error"] for o in out] == ["spawn failed"] * 2
    assert client.run(os.getpid) == before
    # The same workers go on serving jobs, spawn included.
    after = run_mpi(client, spawn_and_reduce, script, n=2, mode=mode, timeout=120)
    assert [o["total"] for o in after] == [21, None]
    if mode == "inprocess":
        assert {o["pid"] for o in out} <= set(before.values())
