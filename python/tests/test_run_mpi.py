"""run_mpi end to end: a real LocalCluster, the embedded sidecar, MPI ranks forked from the
worker processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from distributed import futures_of, wait

from dask_pmix import MPIJobError, run_mpi

from .conftest import start_cluster


def allreduce_ranks(comm, offset=0):
    mine = np.array([comm.rank + offset], dtype="i8")
    total = np.zeros(1, dtype="i8")
    comm.Allreduce(mine, total)
    return {"rank": comm.rank, "size": comm.size, "total": int(total[0]), "pid": os.getpid()}


def workers_of(client):
    return sorted(client.scheduler_info()["workers"])


def seconds_until_failed(sidecar, job_id: str, timeout: float = 30.0) -> float:
    """How long until the sidecar shows the job ended (watched from now)."""
    from dask_pmix import SidecarError

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if sidecar.job(job_id)["state"] in ("failed", "aborted"):
                return time.monotonic() - t0
        except SidecarError as e:
            if e.status == 404:  # it ended and was released and forgotten already
                return time.monotonic() - t0
            raise
        time.sleep(0.02)
    return float("inf")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_run_mpi_over_n_workers(dask_cluster, impl, n):
    _, client, _ = dask_cluster
    results = run_mpi(client, allreduce_ranks, n=n, impl=impl)
    assert [r["rank"] for r in results] == list(range(n))
    assert all(r["size"] == n for r in results)
    assert all(r["total"] == n * (n - 1) // 2 for r in results)
    assert len({r["pid"] for r in results}) == n


def test_ten_consecutive_jobs_on_the_same_workers(dask_cluster, impl):
    _, client, sidecar = dask_cluster
    workers = workers_of(client)
    times = []
    for i in range(10):
        members = [workers[(i + k) % len(workers)] for k in range(2 + i % 3)]
        t0 = time.perf_counter()
        results = run_mpi(client, allreduce_ranks, i, workers=members, impl=impl)
        times.append(time.perf_counter() - t0)
        n = len(members)
        assert [r["total"] for r in results] == [n * (n - 1) // 2 + n * i] * n
    print(f"10 jobs: median {sorted(times)[5]:.3f} s per job")
    assert {w["state"] for w in sidecar.workers()} == {"available"}


def test_rank_uses_data_already_on_its_worker(dask_cluster, impl):
    import dask.array as da

    _, client, _ = dask_cluster
    x = da.arange(100_000, chunks=10_000, dtype="f8").persist()
    wait(x)
    chunks = list(futures_of(x))
    before = client.who_has(chunks)

    def local_sum(comm, *, local):
        mine = np.array([sum(float(c.sum()) for c in local)])
        total = np.zeros(1)
        comm.Allreduce(mine, total)
        return float(total[0])

    results = run_mpi(client, local_sum, local=chunks, impl=impl)
    assert results == [float(np.arange(100_000).sum())] * len(results)
    assert client.who_has(chunks) == before  # nothing moved


def test_local_data_still_being_computed_is_waited_for(dask_cluster, impl):
    import dask.array as da

    _, client, _ = dask_cluster
    x = da.random.random(400_000, chunks=50_000).persist()  # not waited for: run_mpi does
    chunks = list(futures_of(x))

    def local_count(comm, *, local):
        return comm.allreduce(sum(len(c) for c in local))

    results = run_mpi(client, local_count, local=chunks, impl=impl)
    assert results and results == [400_000] * len(results)


def test_dask_keeps_computing_on_non_members(dask_cluster, impl, tmp_path):
    """The ranks wait inside the job until a task on the bystander has run: the job can only
    succeed if Dask computed on a non-member while the members were frozen in MPI."""
    _, client, _ = dask_cluster
    workers = workers_of(client)
    members, bystander = workers[:3], workers[3]
    inside, computed = str(tmp_path / "inside"), str(tmp_path / "computed")

    def waits_for_bystander(comm):
        comm.Barrier()
        if comm.rank == 0:
            open(inside, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(computed) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = os.path.exists(computed)
        comm.Barrier()
        return seen

    result = []
    job = threading.Thread(target=lambda: result.append(run_mpi(client, waits_for_bystander, workers=members, impl=impl)))
    job.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(inside) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(inside), "the job never started"

    def mark(path):
        open(path, "w").close()
        return 42

    assert client.submit(mark, computed, workers=[bystander], pure=False).result(timeout=60) == 42
    job.join(timeout=120)
    assert not job.is_alive()
    assert result == [[True, True, True]]


def test_rank_exception_names_the_rank_and_releases_the_others(dask_cluster, impl):
    _, client, sidecar = dask_cluster

    def fails_on_one(comm):
        if comm.rank == 1:
            raise ValueError("bad input on rank 1")
        comm.Barrier()
        return comm.rank

    t0 = time.monotonic()
    with pytest.raises(MPIJobError) as err:
        run_mpi(client, fails_on_one, n=3, impl=impl)
    assert time.monotonic() - t0 < 10
    assert err.value.rank == 1
    assert "ValueError: bad input on rank 1" in str(err.value)
    assert run_mpi(client, allreduce_ranks, n=3, impl=impl)[0]["total"] == 3
    assert {w["state"] for w in sidecar.workers()} == {"available"}


def test_frozen_workers_are_not_downscaled(dask_cluster, impl):
    _, client, sidecar = dask_cluster
    workers = workers_of(client)
    created = client.sync(client.scheduler.dask_pmix_create_job, workers=workers[:2], impl=impl, owner=client.id)
    job_id = created["job"]["id"]
    try:
        to_close = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=4))
        assert not set(to_close) & set(workers[:2])
        assert set(to_close) == set(workers[2:])
        frozen = {w["id"] for w in sidecar.workers() if w["state"] == "frozen"}
        assert frozen == set(workers[:2])
    finally:
        client.sync(client.scheduler.dask_pmix_release_job, job_id=job_id)
    assert {w["state"] for w in sidecar.workers()} == {"available"}


def test_retire_and_adaptive_keep_members_and_a_killed_member_fails_the_job(impl, tmp_path):
    cluster, client, sidecar = start_cluster(4)
    try:
        workers = workers_of(client)
        members = workers[:3]
        pid_dir = str(tmp_path)

        def long_job(comm):
            with open(os.path.join(pid_dir, f"rank{comm.rank}.pid"), "w") as f:
                f.write(str(os.getpid()))
            for _ in range(300):
                comm.Barrier()
                time.sleep(0.05)
            return comm.rank

        outcome = {}

        def run():
            t0 = time.monotonic()
            try:
                outcome["results"] = run_mpi(client, long_job, workers=members, impl=impl)
            except MPIJobError as e:
                outcome["error"] = e
            outcome["seconds"] = time.monotonic() - t0

        job = threading.Thread(target=run)
        job.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([w for w in sidecar.workers() if w["state"] == "frozen"]) < 3:
            time.sleep(0.1)
        # A retire without a list, and adaptive scaling down to one worker, must spare the members.
        retired = client.retire_workers()
        assert not set(retired) & set(members)
        cluster.adapt(minimum=1, maximum=4, interval="200ms", wait_count=1)
        time.sleep(2.0)
        assert set(members) <= set(client.scheduler_info()["workers"])
        cluster.adapt(minimum=3, maximum=3)
        # Kill one member's worker process outright, once every rank runs the job (not while a
        # slow MPI_Init on a loaded machine is still under way): the job fails promptly, naming it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(os.listdir(pid_dir)) < len(members):
            time.sleep(0.1)
        victim = members[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        running = [j["id"] for j in sidecar.jobs() if j["state"] in ("pending", "wiring", "running")]
        assert len(running) == 1, running
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        failed_after = seconds_until_failed(sidecar, running[0])
        job.join(30)
        assert "error" in outcome, outcome
        print(f"killed member -> job failed after {failed_after:.2f} s, MPIJobError in {time.monotonic() - t_kill:.2f} s")
        # The sidecar fails the job within 2 s; the client hears of it through Dask (a generous
        # bound: a loaded CI machine).
        assert failed_after < 2.0
        assert time.monotonic() - t_kill < 10.0
        assert outcome["error"].worker == victim
        # The killed worker's rank process goes with it instead of spinning on as an orphan.
        victim_rank = members.index(victim)
        rank_pid = int(open(os.path.join(pid_dir, f"rank{victim_rank}.pid")).read())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and os.path.exists(f"/proc/{rank_pid}") and \
                open(f"/proc/{rank_pid}/stat").read().split()[2] != "Z":
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{rank_pid}") or open(f"/proc/{rank_pid}/stat").read().split()[2] == "Z"
        # The others serve the next job.
        alive = [w for w in members if w != victim]
        assert run_mpi(client, allreduce_ranks, workers=alive, impl=impl)[0]["total"] == 1
    finally:
        client.close()
        cluster.close()


def _wait_for_file(path: str):
    def fn(comm):
        while not os.path.exists(path):
            comm.Barrier()
            time.sleep(0.05)
        return comm.rank

    return fn


def running_job_until(client, sidecar, flag: str, impl: str, **where):
    """A job whose ranks run until ``flag`` exists, started in a thread; returns once it runs,
    with the thread and the dict that gets its results or its MPIJobError."""
    outcome: dict = {}

    def run():
        try:
            outcome["results"] = run_mpi(client, _wait_for_file(flag), impl=impl, timeout=60, **where)
        except MPIJobError as e:
            outcome["error"] = e

    job = threading.Thread(target=run)
    job.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(j["state"] == "running" for j in sidecar.jobs()):
        time.sleep(0.1)
    assert any(j["state"] == "running" for j in sidecar.jobs()), sidecar.jobs()
    return job, outcome


def failed(job: threading.Thread, outcome: dict) -> MPIJobError:
    job.join(60)
    assert not job.is_alive(), "run_mpi did not return"
    assert "error" in outcome, outcome
    assert "deleted over REST" not in str(outcome["error"])
    return outcome["error"]


def test_a_member_whose_nanny_reports_it_gone_fails_the_job_naming_it(impl, tmp_path):
    """Dask hears of a dead worker from its nanny or from its stream closing, whichever comes
    first; either way the job fails naming that member, not as a job deleted by someone."""
    cluster, client, sidecar = start_cluster(3)
    flag = str(tmp_path / "go")
    try:
        members = workers_of(client)
        job, outcome = running_job_until(client, sidecar, flag, impl, workers=members)
        victim = members[1]

        async def nanny_says_gone(dask_scheduler, address=victim):
            # What Nanny._on_worker_exit makes the scheduler do when the worker process dies.
            return await dask_scheduler.remove_worker(address, stimulus_id=f"nanny-close-{time.time()}")

        client.run_on_scheduler(nanny_says_gone)
        err = failed(job, outcome)
        assert err.worker == victim, err
    finally:
        open(flag, "w").close()
        client.close()
        cluster.close()


def test_client_restart_during_a_job_fails_it_saying_so(tmp_path, impl):
    # client.restart() releases every task, the ranks' too: the job's error names the restart
    # (it read "deleted over REST"), and the restarted cluster runs the next job.
    cluster, client, sidecar = start_cluster(2)
    flag = str(tmp_path / "go")
    try:
        job, outcome = running_job_until(client, sidecar, flag, impl, n=2)
        client.restart()
        assert "client.restart()" in str(failed(job, outcome))
        open(flag, "w").close()
        assert run_mpi(client, lambda comm: comm.allreduce(1), n=2, impl=impl, timeout=60) == [2, 2]
    finally:
        open(flag, "w").close()
        client.close()
        cluster.close()


def test_a_member_retired_by_dask_during_a_job_fails_it_saying_so(tmp_path, impl):
    # retire_workers (what cluster.scale(n) does to the workers it drops) closes the worker once
    # its data moved: the job fails naming the retirement (it read "its worker left (removed over
    # REST)"), the other members go back to work, and the retired worker is gone.
    cluster, client, sidecar = start_cluster(3)
    flag = str(tmp_path / "go")
    try:
        members = workers_of(client)[:2]
        job, outcome = running_job_until(client, sidecar, flag, impl, workers=members)
        client.retire_workers(workers=[members[1]])
        err = failed(job, outcome)
        assert "being retired by Dask" in str(err) and err.worker == members[1], str(err)
        assert members[1] not in workers_of(client)
        open(flag, "w").close()
        assert run_mpi(client, lambda comm: comm.allreduce(1), n=2, impl=impl, timeout=60) == [2, 2]
    finally:
        open(flag, "w").close()
        client.close()
        cluster.close()


def test_a_job_for_another_mpi_than_the_workers_fails_clearly(dask_cluster, impl):
    _, client, sidecar = dask_cluster
    other = "mpich" if impl == "openmpi" else "openmpi"
    with pytest.raises(MPIJobError, match=f"the job is for {other}"):
        run_mpi(client, allreduce_ranks, n=2, impl=other)
    assert {w["state"] for w in sidecar.workers()} == {"available"}


def test_jobs_created_over_rest_by_others_also_freeze_their_members(dask_cluster, impl):
    # The plugin follows the sidecar's event stream: a job it did not create still keeps Dask from
    # retiring its members.
    _, client, sidecar = dask_cluster
    workers = workers_of(client)
    job = sidecar.create_job({"impl": impl, "members": workers[1:3]})
    try:
        deadline = time.monotonic() + 10
        while True:
            to_close = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=4))
            if not set(to_close) & set(workers[1:3]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert set(to_close) == {workers[0], workers[3]}
    finally:
        sidecar.delete_job(job["id"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=4))) == 4:
            break
        time.sleep(0.1)
    assert len(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=4))) == 4


def test_pickle_based_collectives_work(dask_cluster, impl):
    # mpi4py's lower-case collectives (any picklable object); under MPICH they need the world
    # model, which is what dask-pmix gives MPICH ranks.
    _, client, _ = dask_cluster

    def objects(comm):
        data = comm.bcast({"from": "root", "n": comm.size} if comm.rank == 0 else None, root=0)
        everyone = comm.allgather(("rank", comm.rank))
        return data["n"], comm.allreduce(comm.rank), everyone

    results = run_mpi(client, objects, n=3, impl=impl)
    assert results == [(3, 3, [("rank", 0), ("rank", 1), ("rank", 2)])] * 3


def test_jobs_of_a_client_that_goes_away_are_released(dask_cluster, impl):
    from distributed import Client

    cluster, client, sidecar = dask_cluster
    workers = workers_of(client)
    other = Client(cluster.scheduler_address)
    created = other.sync(other.scheduler.dask_pmix_create_job, workers=workers[:2], impl=impl, owner=other.id)
    assert {w["id"] for w in sidecar.workers() if w["state"] == "frozen"} == set(workers[:2])
    other.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(w["state"] == "frozen" for w in sidecar.workers()):
        time.sleep(0.1)
    assert {w["state"] for w in sidecar.workers()} == {"available"}
    # An active job is deleted (aborted and forgotten), so it is no longer listed as active.
    assert not [j for j in sidecar.jobs() if j["id"] == created["job"]["id"] and j["state"] in ("pending", "wiring", "running")]


def _maps_shm_then_dies(comm, how, listing):
    """Writes the /dev/shm files this rank's MPI library mapped (not its worker's), meets the
    others, then dies without finalizing: killed, or MPI_Abort."""
    def shm(pid):
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f
                    if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/dev/shm/")}

    if comm.rank == comm.size - 1:
        with open(listing, "w") as f:
            f.write("\n".join(sorted(shm("self") - shm(os.getppid()))))
    comm.Barrier()
    if comm.rank == comm.size - 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Abort(3)
    comm.Barrier()


@pytest.mark.parametrize("how", ["kill", "abort"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_fork_rank_that_dies_leaves_no_shm_segment(dask_cluster, impl, tmp_path, n, how):
    """A rank killed or aborted never unlinks its MPI library's shared-memory segments (MPICH's
    mpich_shm_*, named after the job): its worker removes them. Only the files this
    test's rank mapped are looked at."""
    _, client, sidecar = dask_cluster
    listing = tmp_path / "shm.txt"
    with pytest.raises(MPIJobError):
        run_mpi(client, _maps_shm_then_dies, how, str(listing), n=n, impl=impl, mode="fork", timeout=60)
    mapped = [p for p in listing.read_text().split("\n") if p]
    if impl == "mpich":
        assert any(os.path.basename(p).startswith("mpich_shm_") for p in mapped), mapped
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(p) for p in mapped):
        time.sleep(0.1)
    assert [p for p in mapped if os.path.exists(p)] == []
    assert run_mpi(client, allreduce_ranks, n=2, impl=impl, mode="fork")[0]["total"] == 1
