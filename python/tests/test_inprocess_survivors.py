"""Open MPI in-process jobs after a member was killed mid-job: the survivors run later jobs.

With fault tolerance on, a survivor whose TCP link to the dead member breaks relays that to every
pool process through the PMIx server (PROC_TERM_WO_SYNC, itself as the source). The sidecar once
took that source for a process gone; the next failed job's notice then named the living survivor
dead to the others, who marked it failed for good: a later job on the survivors failed with
MPI_ERR_PROC_FAILED naming it, while it waited in MPI_Comm_dup (mpi4py's first lowercase
collective dups the communicator) holding the interpreter lock, its worker frozen."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dask_pmix import MPIJobError, run_mpi
from dask_pmix.member.watcher import GRACE

from .conftest import IMPL, held_keys, start_cluster
from .test_inprocess import in_background, last_job, running_inprocess_job, wait_pool_ready, workers_of
from .test_run_mpi import seconds_until_failed

pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="fault tolerance (ULFM) is Open MPI's")


def long_barriers(comm):
    for _ in range(1000):
        comm.Barrier()
        time.sleep(0.01)
    return comm.rank


def ranks_and_sum(comm):
    # Lowercase: mpi4py dups the communicator first (MPI_Comm_dup, a collective over it).
    return comm.rank, comm.allreduce(comm.rank)


def four_available(client, sidecar) -> list[str]:
    """The workers, once all four are back, in the pool, and held by no job."""
    wait_pool_ready(sidecar, 4)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(workers_of(client)) < 4 or any(
            w["state"] != "available" for w in sidecar.workers())):
        time.sleep(0.1)
    return workers_of(client)


def test_survivors_of_members_killed_mid_job_run_later_jobs():
    cluster, client, sidecar = start_cluster(4)
    try:
        for round_ in range(3):
            workers = four_available(client, sidecar)
            assert len(workers) == 4
            pids = client.run(os.getpid)
            victim = workers[round_ % 3 + 1]
            survivors = [w for w in workers if w != victim]
            t, outcome = in_background(lambda: run_mpi(client, long_barriers, workers=workers, timeout=60))
            job = running_inprocess_job(sidecar, settle=0.3)
            os.kill(pids[victim], signal.SIGKILL)
            assert seconds_until_failed(sidecar, job["id"]) < 2.0
            t.join(60)
            assert "error" in outcome, outcome
            # Later jobs on the survivors, in changing order and membership: every one succeeds
            # and no survivor is restarted (their MPI state is intact).
            for members in (survivors, survivors[::-1], survivors[:2], survivors[1:], survivors):
                try:
                    results = run_mpi(client, ranks_and_sum, workers=members, timeout=20)
                except MPIJobError as e:
                    pytest.fail(f"round {round_}: a later job on the survivors {members} failed: {e}")
                n = len(members)
                assert results == [(r, n * (n - 1) // 2) for r in range(n)]
                assert last_job(sidecar)["mode"] == "inprocess"
            assert all(w in workers_of(client) for w in survivors)
    finally:
        client.close()
        cluster.close()


# Longer than the watcher's grace (a member still running that long after its job failed is
# looked at), during which the worker answers nobody.
LOCK_HELD = int(3 * GRACE)  # libc's sleep() takes whole seconds


def fails_while_another_holds_the_lock(comm):
    if comm.rank == 0:
        raise RuntimeError("rank 0 fails")
    # A C call that holds the interpreter lock for a while (PyDLL calls do not release it), as a
    # long sum(range(...)) does: the worker runs no Python meanwhile, answering nobody.
    import ctypes

    ctypes.PyDLL(None).sleep(LOCK_HELD)
    return "done"


def test_a_busy_member_of_a_failed_job_holding_the_interpreter_lock_is_not_restarted():
    # Silence is not evidence: its worker keeps its data and serves the next job once it is back.
    cluster, client, sidecar = start_cluster(4)
    try:
        import dask.array as da
        import numpy as np
        from distributed import wait

        wait_pool_ready(sidecar, 4)
        workers = workers_of(client)
        pids = client.run(os.getpid)
        x = da.random.random((4000, 4000), chunks=(1000, 1000)).persist()
        wait(x)
        held = held_keys(client, x.name)
        total = float(x.sum().compute())
        with pytest.raises(MPIJobError, match="rank 0 fails"):
            run_mpi(client, fails_while_another_holds_the_lock, workers=workers[:2])
        # Its worker answers once the lock is back (the member then returns and leaves); one more
        # grace after that, in which a restart decided on its silence would show.
        t0 = time.monotonic()
        assert client.run(os.getpid, workers=[workers[1]]) == {workers[1]: pids[workers[1]]}
        assert time.monotonic() - t0 > LOCK_HELD / 2, "the lock was not held"
        time.sleep(GRACE + 1)
        assert workers_of(client) == workers, "a worker was replaced"
        assert client.run(os.getpid) == pids, "a worker process was restarted"
        assert held_keys(client, x.name) == held
        assert np.isclose(float(x.sum().compute()), total)
        results = run_mpi(client, ranks_and_sum, workers=workers, timeout=30)
        assert results == [(r, 6) for r in range(4)]
        assert last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        cluster.close()


def rank_one_hangs_in_python(comm):
    if comm.rank == 1:
        time.sleep(3600)  # calls no MPI: its process does not progress MPI by itself
    for _ in range(1000):
        comm.Barrier()
        time.sleep(0.01)
    return comm.rank


def test_survivors_of_a_member_hung_in_python_are_not_restarted_with_it():
    # The hung member never talked to the others before (a fresh worker each round): their first
    # Barrier messages to it wait for the TCP connection, which needs its process's progress.
    cluster, client, sidecar = start_cluster(4)
    try:
        before: list[str] = []
        for round_ in range(2):
            workers = four_available(client, sidecar)
            hung = workers[1] if round_ == 0 else next(w for w in workers if w not in before)
            others = [w for w in workers if w != hung]
            members = [others[0], hung, others[1]]
            survivors = [members[0], members[2]]
            with pytest.raises(MPIJobError, match="timeout"):
                run_mpi(client, rank_one_hangs_in_python, workers=members, timeout=4)
            # The hung member's worker is restarted 3 s after the job failed; the survivors left.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and hung in workers_of(client):
                time.sleep(0.2)
            assert hung not in workers_of(client)
            time.sleep(1.0)
            now = workers_of(client)
            assert all(w in now for w in survivors), f"round {round_}: a survivor was restarted with the hung member"
            assert run_mpi(client, ranks_and_sum, workers=survivors, timeout=20) == [(0, 1), (1, 1)]
            before = workers  # the next round's hung member is the one that replaced this one
    finally:
        client.close()
        cluster.close()
