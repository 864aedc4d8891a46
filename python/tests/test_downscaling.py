"""Downscaling while job requests wait in the sidecar's admission line (SidecarPlugin.
valid_workers_downscaling): Dask may retire a worker that no waiting request could use, but not
the members of a running job, not a worker a waiting request names, and not so many that the
largest waiting request for a number of workers could no longer run; a request on a process set
names its members. A real cluster, with
Dask's own retire_workers() choosing which worker to close."""

from __future__ import annotations

import time

from distributed import wait

from dask_pmix import run_mpi

from .conftest import IMPL, start_cluster
from .test_inprocess import in_background, workers_of


def _hold(comm, flag):
    """Runs (progressing MPI) until `flag` exists, for at most 120 s."""
    import os

    deadline = time.monotonic() + 120
    while not os.path.exists(flag) and time.monotonic() < deadline:
        comm.Barrier()
        time.sleep(0.05)
    return comm.allreduce(1)


def _size(comm):
    return comm.allreduce(1)


def _wait_for(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _running(sidecar, members: list[str]) -> bool:
    return any(
        j["state"] == "running" and sorted(m["workerId"] for m in j["members"]) == sorted(members)
        for j in sidecar.jobs()
    )


def test_downscaling_spares_what_waiting_job_requests_need(tmp_path):
    cluster, client, sidecar = start_cluster(4)
    plugin = cluster.scheduler.plugins["dask-pmix"]
    try:
        w0, w1, w2, w3 = workers_of(client)
        # w3 holds data and w2 none: left to itself, Dask retires w2 first (the idlest, least data).
        data = client.submit(lambda: bytes(8 << 20), workers=[w3], pure=False)
        wait(data)

        # A job holds w0 and w1; a request naming w0 and w2 waits for w0.
        flag_a = tmp_path / "a"
        job_a, out_a = in_background(lambda: run_mpi(client, _hold, str(flag_a), workers=[w0, w1], impl=IMPL))
        _wait_for(lambda: _running(sidecar, [w0, w1]))
        job_b, out_b = in_background(lambda: run_mpi(client, _size, workers=[w0, w2], impl=IMPL))
        _wait_for(lambda: any(r.get("members") == [w0, w2] for r in plugin._waiting))

        retired = client.retire_workers(n=1)
        assert sorted(retired) == [w3], retired  # not w2, which the waiting request names
        assert workers_of(client) == [w0, w1, w2]
        assert len(data.result()) == 8 << 20  # its data moved first

        flag_a.touch()
        job_a.join(60)
        job_b.join(60)
        assert out_a.get("results") == [2, 2], out_a
        assert out_b.get("results") == [2, 2], out_b

        # A job holds w0; a request for 3 workers waits for it: none of the 3 may go.
        flag_c = tmp_path / "c"
        job_c, out_c = in_background(lambda: run_mpi(client, _hold, str(flag_c), workers=[w0], impl=IMPL))
        _wait_for(lambda: _running(sidecar, [w0]))
        job_d, out_d = in_background(lambda: run_mpi(client, _size, n=3, impl=IMPL))
        _wait_for(lambda: any((r.get("selector") or {}).get("count") == 3 for r in plugin._waiting))
        assert client.retire_workers(n=1) == {}
        assert workers_of(client) == [w0, w1, w2]

        flag_c.touch()
        job_c.join(60)
        job_d.join(60)
        assert out_c.get("results") == [1], out_c
        assert out_d.get("results") == [3, 3, 3], out_d

        # A request on a pset of w0 and w2 waits for w0: w2 stays, w1 (holding data) may go.
        sidecar.define_pset("pair", members=[w0, w2])
        more = client.submit(lambda: bytes(8 << 20), workers=[w1], pure=False)
        wait(more)
        flag_e = tmp_path / "e"
        job_e, out_e = in_background(lambda: run_mpi(client, _hold, str(flag_e), workers=[w0], impl=IMPL))
        _wait_for(lambda: _running(sidecar, [w0]))
        job_f, out_f = in_background(lambda: run_mpi(client, _size, pset="pair", impl=IMPL))
        _wait_for(lambda: any(r.get("pset") == "pair" for r in plugin._waiting))
        retired = client.retire_workers(n=1)
        assert sorted(retired) == [w1], retired
        assert len(more.result()) == 8 << 20

        flag_e.touch()
        job_e.join(60)
        job_f.join(60)
        assert out_e.get("results") == [1], out_e
        assert out_f.get("results") == [2, 2], out_f
    finally:
        for flag in "ace":
            (tmp_path / flag).touch()
        client.close()
        cluster.close()


def test_downscaling_spares_a_cohort_while_its_sessions_start():
    """The workers that start together initialise their MPI sessions together: Dask's
    retire_workers() during that leaves them all alone (one that exited would fail the others'
    sessions, and they would be replaced); once the sessions are up it retires as usual."""
    import pytest

    if IMPL != "openmpi":
        pytest.skip("cohorts are Open MPI's in-process pool")
    cluster, client, sidecar = start_cluster(4)
    try:

        def joining():
            return sorted(
                client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dask-pmix"].joining.held())
            )

        def ready():
            return sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers())

        async def retire_while_held(dask_scheduler):
            # Dask chooses whom to retire in the same turn of the scheduler's loop as `held` is read.
            held = sorted(dask_scheduler.plugins["dask-pmix"].joining.held())
            return held, sorted(await dask_scheduler.retire_workers(stimulus_id="test-cohort")) if held else []

        held: list = []
        deadline = time.monotonic() + 60
        while not held and ready() < 4 and time.monotonic() < deadline:
            held, retired = client.run_on_scheduler(retire_while_held)
        if not held:
            pytest.skip("the sessions were up before the test could retire (nothing to hold)")
        pids = client.run(lambda: __import__("os").getpid())
        assert not set(retired) & set(held), (retired, held)
        _wait_for(lambda: ready() == 4)
        # Every session came up: nobody was replaced, and a job runs in-process on all four.
        assert client.run(lambda: __import__("os").getpid()) == pids
        assert run_mpi(client, _size, workers=workers_of(client), mode="inprocess") == [4] * 4
        _wait_for(lambda: not joining())
        assert len(client.retire_workers(n=1)) == 1
    finally:
        client.close()
        cluster.close()
