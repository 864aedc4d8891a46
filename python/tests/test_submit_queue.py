"""submit_mpi returns at once, also when the job's members are busy: the job waits for them as its
futures do (the scheduler holds the ranks' tasks until the sidecar admits the job). Jobs submitted
one after another are admitted in that order; a job that cannot be admitted within its timeout, or
that the cluster cannot serve, makes its futures raise MPIJobError with the reason; cancelling a
waiting job's futures takes it out of the line."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
from distributed import wait

from dask_pmix import MPIJobError, submit_mpi
from dask_pmix.protocol import SCHEDULER_PLUGIN

from .conftest import IMPL


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def until_flag(comm, path):
    """Keeps its member busy until `path` exists."""
    while not os.path.exists(path):
        time.sleep(0.05)
    comm.Barrier()
    return comm.rank


def probe(comm, i):
    return {"i": i, "rank": comm.rank, "size": comm.size, "sum": comm.allreduce(comm.rank), "at": time.time()}


def ticket(futures) -> str:
    return futures[0].key.split("dask-pmix-", 1)[1].rsplit("-rank-", 1)[0]


def jobs_of(sidecar, futures) -> list[dict]:
    t = ticket(futures)
    return [j for j in sidecar.jobs() if (j.get("labels") or {}).get("dask-pmix.request") == t]


def queued_at_scheduler(client) -> tuple[int, int]:
    """(jobs held at the scheduler plugin, requests of it in the sidecar's line)."""
    return client.run_on_scheduler(
        lambda dask_scheduler: (
            len(dask_scheduler.plugins[SCHEDULER_PLUGIN]._queued),
            len(dask_scheduler.plugins[SCHEDULER_PLUGIN]._waiting),
        )
    )


@pytest.fixture
def busy(dask_cluster):
    """Every worker a member of a running job, until the test lets it end."""
    _, client, sidecar = dask_cluster
    client.wait_for_workers(4, timeout=60)
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 60, "workers available")
    flag = os.path.join(tempfile.mkdtemp(prefix="dask-pmix-busy-"), "go")
    futures = submit_mpi(client, until_flag, flag, n=4, impl=IMPL)
    wait_until(lambda: [j["state"] for j in jobs_of(sidecar, futures)] == ["running"], 60, "the busy job running")

    def release():
        open(flag, "w").close()
        assert sorted(client.gather(futures)) == [0, 1, 2, 3]

    yield release
    if not os.path.exists(flag):
        open(flag, "w").close()
    # Every rank's future finishes, also that of a member the test retired (it raises member-lost).
    wait(futures, timeout=30)


def test_32_jobs_on_busy_workers_are_submitted_at_once_and_run_in_order(dask_cluster, busy):
    _, client, sidecar = dask_cluster
    t0 = time.monotonic()
    jobs = [submit_mpi(client, probe, i, n=4, impl=IMPL, timeout=120) for i in range(32)]
    took = time.monotonic() - t0
    print(f"32 submit_mpi(n=4) calls on 4 busy workers returned in {took:.3f} s")
    assert took < 1.0
    assert all(len(f) == 4 for f in jobs) and not any(f.done() for fs in jobs for f in fs)
    busy()
    results = [client.gather(fs) for fs in jobs]
    for i, rs in enumerate(results):
        assert [(r["i"], r["rank"], r["size"], r["sum"]) for r in rs] == [(i, r, 4, 6) for r in range(4)]
    starts = [min(r["at"] for r in rs) for rs in results]
    assert starts == sorted(starts), "the jobs did not start in the order they were submitted"
    wait_until(lambda: {w["state"] for w in sidecar.workers()} == {"available"}, 15, "members released")
    assert queued_at_scheduler(client) == (0, 0)


def test_a_waiting_job_that_times_out_raises_within_its_timeout(dask_cluster, busy):
    _, client, _ = dask_cluster
    t0 = time.monotonic()
    futures = submit_mpi(client, probe, 0, n=4, impl=IMPL, timeout=2)
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(MPIJobError, match="after waiting") as err:
        client.gather(futures)
    took = time.monotonic() - t0
    print(f"a job that waited past its 2 s timeout raised after {took:.2f} s: {err.value}")
    assert took < 2 + 3
    assert {f.status for f in futures} == {"error"}
    assert queued_at_scheduler(client) == (0, 0)
    busy()


def test_a_job_the_cluster_cannot_serve_raises_at_once(dask_cluster, busy):
    _, client, _ = dask_cluster
    t0 = time.monotonic()
    futures = submit_mpi(client, probe, 0, n=5, impl=IMPL)
    assert len(futures) == 5
    with pytest.raises(MPIJobError, match="asks for 5 members but the cluster has 4 workers"):
        client.gather(futures)
    assert time.monotonic() - t0 < 3
    # A task that takes a rank's future errs as well.
    later = client.submit(lambda r: r, futures[0])
    with pytest.raises(MPIJobError):
        later.result(timeout=10)
    busy()


def test_cancelling_a_waiting_job_takes_it_out_of_the_line(dask_cluster, busy):
    _, client, sidecar = dask_cluster
    withdrawn = submit_mpi(client, probe, 0, n=4, impl=IMPL)
    after = submit_mpi(client, probe, 1, n=4, impl=IMPL)
    wait_until(lambda: queued_at_scheduler(client) == (2, 2), 10, "both jobs waiting in the sidecar's line")
    client.cancel(withdrawn)
    wait_until(lambda: queued_at_scheduler(client) == (1, 1), 10, "the cancelled job out of the line")
    busy()
    assert [r["i"] for r in client.gather(after, errors="raise")] == [1] * 4
    # Never admitted: the sidecar made no job for it, and its members went to the next job at once.
    assert jobs_of(sidecar, withdrawn) == []
    assert {f.status for f in withdrawn} == {"cancelled"}


def test_a_fallback_to_fork_mode_is_warned_about(dask_cluster):
    # The mode is known only once the job is admitted: the scheduler tells the client then.
    import warnings

    from dask_pmix import MPIFallbackWarning

    _, client, sidecar = dask_cluster
    client.wait_for_workers(4, timeout=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        futures = submit_mpi(client, probe, 0, n=2, impl=IMPL)
        assert [r["sum"] for r in client.gather(futures)] == [1, 1]
        time.sleep(0.2)
    job = jobs_of(sidecar, futures)[0]
    fell_back = job["mode"] == "fork" and bool(job.get("modeReason"))
    warned = [w for w in caught if issubclass(w.category, MPIFallbackWarning)]
    print(f"mode {job['mode']} ({job.get('modeReason') or 'asked'}): {len(warned)} warning(s)")
    assert len(warned) == fell_back
    if fell_back:
        assert job["modeReason"] in str(warned[0].message)


def test_a_pset_job_is_submitted_at_once_too(dask_cluster):
    _, client, sidecar = dask_cluster
    client.wait_for_workers(3, timeout=60)
    wait_until(lambda: all(w["state"] == "available" for w in sidecar.workers()), 60, "workers available")
    members = sorted(w["id"] for w in sidecar.workers())[:2]
    sidecar.define_pset("queue-pair", members=members)
    try:
        futures = submit_mpi(client, probe, 3, pset="queue-pair", impl=IMPL)
        assert len(futures) == 2
        assert [(r["rank"], r["size"], r["sum"]) for r in client.gather(futures)] == [(0, 2, 1), (1, 2, 1)]
        assert jobs_of(sidecar, futures)[0]["members"][0]["workerId"] in members
        with pytest.raises(MPIJobError, match="no process set named 'no-such-set'"):
            submit_mpi(client, probe, 0, pset="no-such-set", impl=IMPL)
    finally:
        sidecar.delete_pset("queue-pair")


def test_a_waiting_job_the_shrunk_cluster_cannot_serve_raises(dask_cluster, busy):
    # The last test here: it leaves the cluster one worker short. A worker retired while the job
    # waits (here: one of the busy job's members, which fails that job) leaves 3 workers for a job
    # of 4: the sidecar refuses it when it tries again, and its futures raise at once, not at the
    # end of their 60 s.
    _, client, _ = dask_cluster
    futures = submit_mpi(client, probe, 0, n=4, impl=IMPL, timeout=60)
    wait_until(lambda: queued_at_scheduler(client) == (1, 1), 10, "the job waiting in the sidecar's line")
    victim = sorted(client.scheduler_info()["workers"])[0]
    t0 = time.monotonic()
    client.retire_workers([victim])
    # Refused by the sidecar; or, when the busy job's members were freed before Dask removed the
    # retiring worker, admitted with it and failed as it left.
    with pytest.raises(MPIJobError, match="needs 4 available workers|retired by Dask") as err:
        client.gather(futures)
    took = time.monotonic() - t0
    print(f"a waiting job of 4 on 3 workers raised {took:.2f} s after the retirement: {err.value}")
    assert took < 15
    assert queued_at_scheduler(client) == (0, 0)
