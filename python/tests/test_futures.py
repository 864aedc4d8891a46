"""submit_mpi: one Dask future per rank, left on its worker; run_mpi is its gather; both with an
asynchronous client; cancelling the futures ends the job and gives the members back. And every
wait of run_mpi is bounded: a timeout is reported as a timeout."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from distributed import Client, get_worker, wait

from dask_pmix import MPIJobError, SidecarError, run_mpi, submit_mpi

from .conftest import IMPL


def rank_info(comm, offset=0):
    return {"rank": comm.rank, "size": comm.size, "sum": comm.allreduce(comm.rank + offset), "pid": os.getpid()}


def workers_of(client, n: int = 4):
    """The workers now (an in-process rank that times out restarts its worker, under a new address)."""
    client.wait_for_workers(n, timeout=60)
    return client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.workers))


def wait_until(predicate, timeout: float, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what() if callable(what) else what}: not within {timeout} s"
        time.sleep(0.05)


def job_state(sidecar, job_id: str) -> str:
    try:
        return sidecar.job(job_id)["state"]
    except SidecarError as e:
        if e.status == 404:  # deleted: aborted and forgotten
            return "gone"
        raise


def test_one_future_per_rank_left_on_its_worker(dask_cluster):
    _, client, sidecar = dask_cluster
    members = workers_of(client)[1:4]
    futures = submit_mpi(client, rank_info, 10, workers=members, impl=IMPL)
    assert len(futures) == 3
    wait(futures, timeout=60)
    assert [f.result()["rank"] for f in futures] == [0, 1, 2]
    assert {f.result()["sum"] for f in futures} == {3 + 30}
    # Each result stays where its rank ran, and a task that takes it runs there too.
    assert {k: sorted(v) for k, v in client.who_has(futures).items()} == {f.key: [w] for f, w in zip(futures, members)}
    where = [client.submit(lambda r: (r["rank"], get_worker().address), f) for f in futures]
    assert [w.result(timeout=30) for w in where] == [(r, members[r]) for r in range(3)]
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 10, "members released")


# Names of the workers this module killed. A LocalCluster closes for good a worker killed again
# within distributed.deploy.lost-worker-timeout (15 s) of its last loss, so each kill takes a
# worker of another name.
KILLED: set[str] = set()


def kill(client, worker: str) -> None:
    KILLED.add(client.scheduler_info()["workers"][worker]["name"])
    os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)


def not_killed(client, workers: list[str]) -> str:
    names = client.scheduler_info()["workers"]
    return next(w for w in workers if names[w]["name"] not in KILLED)


def test_a_result_lost_with_its_worker_raises_member_lost(dask_cluster):
    # A rank that returned, whose worker then died before its result was gathered: Dask would run
    # the task again on that worker, which is gone, and the future would wait for good.
    _, client, _ = dask_cluster
    workers = workers_of(client)
    victim = not_killed(client, workers)
    members = [next(w for w in workers if w != victim), victim]
    futures = submit_mpi(client, rank_info, workers=members, impl=IMPL)
    wait(futures, timeout=60)
    kill(client, members[1])
    t0 = time.monotonic()
    with pytest.raises(MPIJobError) as info:
        futures[1].result(timeout=30)
    assert info.value.kind == "member-lost" and list(info.value.lost_workers) == [members[1]], info.value
    assert "result was lost with its worker" in str(info.value) and info.value.rank == 1
    assert time.monotonic() - t0 < 15
    assert futures[0].result(timeout=10)["rank"] == 0  # the other rank's result is where it was
    workers_of(client)  # its nanny restarted it


def barrier_after(comm, victim, flag):
    # The victim waits (in Python) to be killed; the others wait for it in MPI.
    if comm.rank == victim:
        open(flag, "w").close()
        time.sleep(120)
    comm.Barrier()


def test_a_rank_whose_worker_dies_while_it_runs_raises_member_lost(dask_cluster, tmp_path):
    # Its task has nowhere to run again (it is pinned to the gone worker): without an answer, its
    # future would wait for good, and so would wait(futures) or as_completed over the job.
    _, client, _ = dask_cluster
    workers = workers_of(client)
    victim = not_killed(client, workers)
    others = [w for w in workers if w != victim]
    members = [others[0], victim, others[1]]
    flag = str(tmp_path / "victim-running")
    futures = submit_mpi(client, barrier_after, 1, flag, workers=members, impl=IMPL, timeout=60)
    wait_until(lambda: os.path.exists(flag), 60, "the victim's rank running")
    kill(client, members[1])
    t0 = time.monotonic()
    wait(futures, timeout=30)
    took = time.monotonic() - t0
    assert [f.status for f in futures] == ["error"] * 3
    lost = futures[1].exception()
    assert isinstance(lost, MPIJobError) and lost.kind == "member-lost", lost
    assert list(lost.lost_workers) == [members[1]] and lost.rank == 1, lost
    assert "left while the rank ran" in str(lost)
    assert all(isinstance(f.exception(), MPIJobError) for f in futures), [f.exception() for f in futures]
    print(f"every future of the job finished {took:.2f} s after the kill")
    assert took < 15
    workers_of(client)  # its nanny restarted it


def returns_a_lock(comm):
    import threading

    return threading.Lock()


def test_a_result_that_cannot_come_back_is_named(dask_cluster):
    # run_mpi gathers the results; submit_mpi's futures of an in-process job leave them where they
    # are, while a fork-mode rank (MPICH here) sends its result to its worker, pickled.
    _, client, _ = dask_cluster
    workers_of(client)
    with pytest.raises(MPIJobError, match="a rank's result could not be sent back to the client") as info:
        run_mpi(client, returns_a_lock, n=2, impl=IMPL, timeout=60)
    assert info.value.kind == "rank"
    # The error holds the job's futures in its traceback, but not its results: a value that
    # cannot be pickled never moves, so a worker holding one could not be retired or replaced.
    job = info.value.job_id
    wait_until(lambda: not held_keys(client, job), 10, lambda: f"the failed job's results still held: {held_keys(client, job)}")
    futures = submit_mpi(client, returns_a_lock, n=2, impl=IMPL, timeout=60)
    wait(futures, timeout=60)
    if IMPL == "openmpi":
        assert [f.status for f in futures] == ["finished"] * 2
    else:
        assert all("could not be sent back" in str(f.exception()) for f in futures), [f.exception() for f in futures]
    client.cancel(futures)


def held_keys(client, job_id: str) -> list[str]:
    return client.run_on_scheduler(
        lambda dask_scheduler, j=job_id: [k for k in dask_scheduler.tasks if f"-{j}-rank-" in str(k)]
    )


def test_asynchronous_client(dask_cluster):
    cluster, _, sidecar = dask_cluster

    async def use() -> tuple[list, list]:
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            futures = await submit_mpi(client, rank_info, n=2, impl=IMPL)
            submitted = await client.gather(futures)
            gathered = await run_mpi(client, rank_info, 1, n=3, impl=IMPL)
            return submitted, gathered

    submitted, gathered = asyncio.run(use())
    assert [(r["rank"], r["size"], r["sum"]) for r in submitted] == [(0, 2, 1), (1, 2, 1)]
    assert [(r["rank"], r["size"], r["sum"]) for r in gathered] == [(0, 3, 6), (1, 3, 6), (2, 3, 6)]
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 10, "members released")


def job_of(sidecar, ticket: str) -> dict | None:
    return next((j for j in sidecar.jobs() if (j.get("labels") or {}).get("dask-pmix.request") == ticket), None)


def forever(comm):
    while True:  # until the job ends
        comm.Barrier()


def threads_in(name: str) -> int:
    """How many threads of this process have a frame of the function `name` on their stack."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None and frame.f_code.co_name != name:
            frame = frame.f_back
        count += frame is not None
    return count


def rank_info_and_lingering(comm):
    return {**rank_info(comm), "lingering": threads_in("forever")}


def test_cancelling_the_futures_ends_the_job_and_releases_its_members(dask_cluster):
    # A cancelled job's rank threads cannot be killed: they stay in MPI until the revoke reaches
    # them. The next job on the same workers must not build its communicator meanwhile (Open MPI
    # 5.0.11's ob1 can lose the activation's first message to the other thread's progress, and the
    # communicator never completes): its ranks see no thread of the cancelled job left.
    _, client, sidecar = dask_cluster
    for _ in range(3):
        futures = submit_mpi(client, forever, n=3, impl=IMPL)
        # The rank keys name the request's ticket (they are made before the job is admitted).
        ticket = futures[0].key.split("dask-pmix-", 1)[1].rsplit("-rank-", 1)[0]
        wait_until(lambda: job_of(sidecar, ticket) is not None, 30, "the job admitted")
        job_id = job_of(sidecar, ticket)["id"]
        wait_until(lambda: sidecar.job(job_id)["state"] == "running", 30, "the job running")
        job = sidecar.job(job_id)
        t0 = time.monotonic()
        client.cancel(futures)
        wait_until(lambda: job_state(sidecar, job_id) in ("aborted", "failed", "gone"), 10, "the job ended")
        wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 10, "members released")
        print(f"cancel -> job ended and members released in {time.monotonic() - t0:.2f} s")
        if IMPL == "mpich" and job["mode"] == "inprocess":
            # MPICH cannot revoke: the members' threads stay in their Barrier, and each member's
            # watcher restarts its worker (after its grace); the next job runs on the new ones.
            members = {m["workerId"] for m in job["members"]}
            wait_until(lambda: not members & {w["id"] for w in sidecar.workers()}, 60, "stuck members restarted")
            wait_until(lambda: len([w for w in sidecar.workers() if (w.get("pool") or {}).get("state") == "ready"])
                       >= 4, 120, lambda: f"the restarted workers back in the pool: {[(w['id'], w['state'], w.get('pool')) for w in sidecar.workers()]}")
            print(f"cancel -> stuck members restarted and back in {time.monotonic() - t0:.2f} s")
        # The same workers serve the next job at once (bounded: a hang fails the test, not the suite).
        results = run_mpi(client, rank_info_and_lingering, n=4, impl=IMPL, timeout=60)
        assert [(r["sum"], r["lingering"]) for r in results] == [(6, 0)] * 4


def test_a_timeout_is_reported_as_a_timeout(dask_cluster):
    _, client, sidecar = dask_cluster
    workers_of(client)

    def sleeps(comm):
        time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(MPIJobError, match="time(d)? ?out") as err:
        run_mpi(client, sleeps, n=2, impl=IMPL, timeout=2)
    assert time.monotonic() - t0 < 2 + 8
    assert "PMIx server dropped" not in str(err.value)
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 15, "members released")


def test_a_rank_that_cannot_start_is_bounded_by_the_timeout(dask_cluster):
    # The member's only... every thread of one member is busy with a long task, so its rank
    # cannot start: run_mpi must give up at its timeout, not wait for the wiring timeout (60 s).
    _, client, sidecar = dask_cluster
    # Named members: once a worker the last test's stuck member had replaced is back (a worker
    # being replaced comes back under another address, and a job naming the old one fails).
    wait_until(
        lambda: workers_of(client) == sorted(w["id"] for w in sidecar.workers() if w["state"] == "available"),
        60,
        "the cluster's workers all registered and available",
    )
    members = workers_of(client)[:2]
    nthreads = client.run_on_scheduler(lambda dask_scheduler, w=members[1]: dask_scheduler.workers[w].nthreads)
    busy = [client.submit(time.sleep, 30, workers=[members[1]], pure=False) for _ in range(nthreads)]
    wait_until(lambda: len(client.processing(workers=[members[1]])[members[1]]) == nthreads, 10, "busy")
    try:
        t0 = time.monotonic()
        with pytest.raises(MPIJobError, match="time(d)? ?out"):
            run_mpi(client, rank_info, workers=members, impl=IMPL, timeout=3)
        assert time.monotonic() - t0 < 3 + 8
    finally:
        client.cancel(busy)
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 15, "members released")

