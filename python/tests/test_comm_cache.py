"""The communicator cache of in-process jobs (issue 29, item 1): a job over the same workers as an
earlier one that completed duplicates that job's communicator instead of building its own.

The scheduler decides (dask_pmix.scheduler.comm_cache) and every member takes the same path; a
kept communicator is never used after one of its members left, after a job on it failed, or by
two jobs at once, and the number kept stays within dask-pmix.pool.comm-cache. The first tests
drive the decisions alone; the others run real jobs (Open MPI's pool, or MPICH's worlds with
DASK_PMIX_TEST_IMPL=mpich). DASK_PMIX_COMM_CACHE_JOBS sets the length of the alternating run
(200 by default; the issue's 1,000 with DASK_PMIX_COMM_CACHE_JOBS=1000)."""

from __future__ import annotations

import os
import signal
import time

import dask
import pytest

from dask_pmix import MPIJobError, run_mpi, submit_mpi
from dask_pmix.protocol import SCHEDULER_PLUGIN
from dask_pmix.scheduler.comm_cache import CommCache
from dask_pmix.scheduler.plugin import REUSED_AFTER

from .conftest import IMPL, start_cluster
from .test_inprocess import wait_pool_ready

OPENMPI = IMPL == "openmpi"
JOBS = int(os.environ.get("DASK_PMIX_COMM_CACHE_JOBS", "200"))


# -- the decisions alone ----------------------------------------------------------------------------
def test_a_set_that_ran_before_reuses_its_communicator_once_that_job_completed():
    c = CommCache(bound=4)
    first, made = c.plan("j1", ["a", "b"])
    assert made and first == {"use": None, "keep": "j1", "live": ["j1"]}
    assert c.plan("j1", ["a", "b"]) == (first, False)  # every member hears the same
    busy, _ = c.plan("j2", ["a", "b"])  # j1 has not ended: its communicator is busy
    assert (busy["use"], busy["keep"]) == (None, None)
    c.job_ended("j2", True)
    c.job_ended("j1", True)
    again, _ = c.plan("j3", ["a", "b"])
    assert (again["use"], again["keep"]) == ("j1", None)
    busy_again, _ = c.plan("j4", ["b", "a"])  # the same workers: j3 holds their communicator
    assert (busy_again["use"], busy_again["keep"]) == (None, "j4")
    c.job_ended("j3", True)
    other_order, _ = c.plan("j5", ["b", "a"])  # another rank order: a create_group of j1's ranks
    assert (other_order["use"], other_order["keep"], other_order["ranks"]) == ("j1", None, [1, 0])
    assert "ranks" not in again
    assert c.counts["reused"] == 2 and c.counts["derived"] == 1 and c.counts["busy"] == 1


def test_a_job_over_some_workers_of_a_kept_communicator_derives_its_own_from_the_smallest():
    c = CommCache(bound=8)
    # Planned while each other's runs, so each keeps its own.
    for job, ws in (("all", ["a", "b", "c", "d"]), ("abc", ["a", "b", "c"]), ("cd", ["c", "d"])):
        assert c.plan(job, ws)[0]["keep"] == job
    for job in ("all", "abc", "cd"):
        c.job_ended(job, True)
    plan, _ = c.plan("j1", ["c", "a"])  # in abc and in all: the smaller one, its ranks in job order
    assert (plan["use"], plan["keep"], plan["ranks"]) == ("abc", None, [2, 0])
    plan, _ = c.plan("j2", ["b", "a"])  # abc is busy with j1: all's ranks
    assert (plan["use"], plan["ranks"]) == ("all", [1, 0])
    plan, _ = c.plan("j3", ["c", "d"])  # its own, exactly: a Dup, no ranks
    assert plan["use"] == "cd" and "ranks" not in plan
    plan, _ = c.plan("j4", ["a", "e"])  # no kept communicator holds e: built anew and kept
    assert (plan["use"], plan["keep"]) == (None, "j4")
    for job in ("j1", "j2", "j3", "j4"):
        c.job_ended(job, True)
    c.job_ended("j5", True)  # a job the cache never planned changes nothing
    c.plan("j6", ["d", "b"])
    c.job_ended("j6", False)  # failed on all: all is dropped, the others stay
    assert sorted(e["id"] for e in c.view()["kept"]) == ["abc", "cd", "j4"]
    plan, _ = c.plan("j7", ["d", "b"])
    assert (plan["use"], plan["keep"]) == (None, "j7")
    assert c.counts["derived"] == 3


def test_a_failed_job_or_a_member_leaving_drops_the_communicator():
    c = CommCache(bound=4)
    c.plan("j1", ["a", "b"])
    c.job_ended("j1", True)
    assert c.plan("j2", ["a", "b"])[0]["use"] == "j1"
    c.job_ended("j2", False)  # failed on the kept one
    plan, _ = c.plan("j3", ["a", "b"])
    assert (plan["use"], plan["keep"]) == (None, "j3") and "j1" not in plan["live"]
    c.job_ended("j3", True)
    c.plan("j4", ["b", "c"])
    c.job_ended("j4", True)
    c.worker_left("b")
    assert c.view()["kept"] == []
    assert [h[1] for h in c.history if h[0] == "drop"] == ["j1", "j3", "j4"]


def test_a_job_that_lost_members_named_dead_leaves_its_communicator_to_shrink_for_the_survivors():
    c = CommCache(bound=4)
    c.plan("j1", ["a", "b", "c", "d"])
    c.job_ended("j1", True)
    c.plan("j2", ["b", "a", "c", "d"])  # the same workers in another order: derived from j1
    c.worker_left("c")  # Dask saw the death first: j2's end decides
    c.job_ended("j2", False, frozenset({"c"}))
    assert c.view()["kept"][0]["dead"] == ["c"]
    # Only a job over exactly the survivors shrinks it (MPI_Comm_shrink needs every living member).
    assert c.plan("j3", ["a", "b"])[0]["use"] is None
    c.job_ended("j3", True)
    plan, _ = c.plan("j4", ["d", "a", "b"])
    assert plan == {"use": "j1", "keep": "j4", "shrink": True, "ranks": [2, 0, 1], "live": ["j1", "j3", "j4"]}
    c.job_ended("j4", True)  # the shrunk one replaces its parent
    assert sorted(e["id"] for e in c.view()["kept"]) == ["j3", "j4"]
    plan, _ = c.plan("j5", ["a", "b", "d"])
    assert (plan["use"], plan.get("shrink"), plan.get("ranks")) == ("j4", None, None)
    # A shrinking job that fails with another death leaves the parent shrinkable with both dead.
    c.job_ended("j5", False, frozenset({"b"}))
    plan, _ = c.plan("j6", ["a", "d"])
    assert (plan["use"], plan["keep"], plan["shrink"]) == ("j4", "j6", True)
    c.job_ended("j6", False, frozenset({"d"}))
    c.worker_left("b")  # Dask saw them go after the jobs' ends: j3 goes, j4 stays shrinkable
    c.worker_left("d")
    assert [(e["id"], e["dead"]) for e in c.view()["kept"]] == [("j4", ["b", "d"])]
    assert c.plan("j7", ["a"])[0]["shrink"] is True
    c.job_ended("j7", True)
    assert c.counts["shrunk"] == 3


def test_a_failure_that_named_no_dead_or_lost_an_unnamed_member_drops_the_communicator():
    c = CommCache(bound=4)
    c.plan("j1", ["a", "b", "c"])
    c.job_ended("j1", False, frozenset())  # a rank's error, a timeout: nobody named dead
    assert c.view()["kept"] == []
    c.plan("j2", ["a", "b", "c"])
    c.worker_left("a")  # left, but not named dead (its process may live: a shrink would wait for it)
    c.job_ended("j2", False, frozenset({"c"}))
    assert c.view()["kept"] == []
    c.plan("j3", ["a", "b", "c"])
    c.job_ended("j3", True)
    c.plan("j4", ["a", "b"])  # derived from j3 over some of its members: j3's other members live
    c.job_ended("j4", False, frozenset({"a"}))
    assert c.view()["kept"] == []
    c.plan("j5", ["a", "b"])
    c.job_ended("j5", False, frozenset({"a", "b"}))  # nobody survives
    assert c.view()["kept"] == []


def test_the_cache_is_bounded_and_evicts_the_least_recently_used_idle_entry():
    c = CommCache(bound=2)
    for job, ws in (("j1", ["a", "b"]), ("j2", ["b", "c"])):
        c.plan(job, ws)
        c.job_ended(job, True)
    c.plan("j3", ["a", "b"])  # uses j1: j2 is now the least recently used
    c.job_ended("j3", True)
    plan, _ = c.plan("j4", ["c", "d"])
    assert plan["keep"] == "j4" and sorted(plan["live"]) == ["j1", "j4"]
    # Every entry busy: a new set builds its own and keeps nothing.
    c.plan("j5", ["a", "b"])
    full, _ = c.plan("j6", ["x", "y"])
    assert (full["use"], full["keep"]) == (None, None) and len(full["live"]) == 2
    assert CommCache(bound=0).plan("j", ["a"])[0] == {"use": None, "keep": None, "live": []}
    assert CommCache().plan("j", None)[0]["keep"] is None  # members unknown: nothing kept


# -- real jobs ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with dask.config.set({"dask-pmix.pool.mpich": not OPENMPI}):
        cluster, client, sidecar = start_cluster(4)
        try:
            wait_pool_ready(sidecar, 4)
            yield cluster, client, sidecar
        finally:
            client.close()
            cluster.close()


def rank_sum(comm, offset=0):
    return comm.allreduce(comm.rank + offset)


def sleep_then_sum(comm, seconds):
    time.sleep(seconds)
    return comm.allreduce(comm.rank)


def fail_on_rank_1(comm):
    if comm.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return comm.rank


def cache(client) -> dict:
    def view(dask_scheduler):
        return dask_scheduler.plugins[SCHEDULER_PLUGIN].comm_cache.view()

    return client.run_on_scheduler(view)


def set_cache(client, **attrs) -> None:
    def apply(dask_scheduler):
        c = dask_scheduler.plugins[SCHEDULER_PLUGIN].comm_cache
        if attrs.get("clear"):
            c.clear("the test cleared it")
        if "bound" in attrs:
            c.bound = attrs["bound"]
        if "busy" in attrs:
            for e in c._kept.values():
                if e.id == attrs["busy"][0]:
                    e.busy = attrs["busy"][1]

    client.run_on_scheduler(apply)


def held(client) -> dict:
    def stats():
        from dask_pmix.member import comm_cache

        return comm_cache.stats()

    return client.run(stats)


def last_plan(client) -> tuple:
    """(job, use, keep) of the latest job."""
    return tuple(next(h for h in reversed(cache(client)["history"]) if h[0] == "plan")[1:])


def run(client, workers, fn=rank_sum, *args):
    return run_mpi(client, fn, *args, workers=workers, impl=IMPL, mode="inprocess")


def check_history(history: list, state: dict | None = None) -> dict:
    """Replays the cache's history: a communicator is used only once kept by a job that completed,
    never after it was dropped, and by one job at a time. ``state`` carries on from an earlier call."""
    st = state if state is not None else {"ready": set(), "busy": {}, "dropped": set(), "uses": 0}
    for event in history:
        if event[0] == "plan":
            _, job, use, keep = event
            if use is not None:
                assert use in st["ready"], f"{job} used {use} before a job on it completed"
                assert use not in st["dropped"], f"{job} used {use} after it was dropped"
                assert use not in st["busy"], f"{job} used {use} while {st['busy'].get(use)} used it"
                st["busy"][use] = job
                st["uses"] += 1
            if keep is not None:
                st["busy"][keep] = job
        elif event[0] == "end":
            _, job, completed = event
            for entry in [e for e, j in st["busy"].items() if j == job]:
                del st["busy"][entry]
                if completed:
                    st["ready"].add(entry)
        elif event[0] == "drop":
            st["dropped"].add(event[1])
            st["busy"].pop(event[1], None)
            st["ready"].discard(event[1])
    return st


def start_replay(client) -> tuple[dict, int]:
    """(a replay state seeded with what is kept now, the number of the next history entry)."""
    view = cache(client)
    st = {"ready": set(), "busy": {}, "dropped": set(), "uses": 0}
    for e in view["kept"]:
        if e["ready"]:
            st["ready"].add(e["id"])
        if e["busy"]:
            st["busy"][e["id"]] = e["busy"]
    return st, view["history_from"] + len(view["history"])


def replay_since(client, state: dict, seen: int) -> tuple[dict, int]:
    """check_history over the entries from number ``seen`` on."""
    view = cache(client)
    assert view["history_from"] <= seen, "history lost between checks"
    return check_history(view["history"][seen - view["history_from"] :], state), view["history_from"] + len(
        view["history"]
    )


def test_a_later_job_over_the_same_workers_duplicates_the_kept_communicator(cluster):
    _, client, sidecar = cluster
    ws = sorted(client.scheduler_info()["workers"])[:2]
    before = held(client)
    assert run(client, ws) == [1, 1]
    first, use, keep = last_plan(client)
    assert use is None and keep == first
    assert run(client, ws, rank_sum, 10) == [21, 21]
    second, use, keep = last_plan(client)
    assert (use, keep) == (first, None)
    after = held(client)
    for w in ws:
        assert after[w]["reused"] == before[w]["reused"] + 1
        assert after[w]["built"] == before[w]["built"] + 1
        assert first in after[w]["held"]
    job = sidecar.job(second)
    assert job["state"] == "completed"
    # No group construct reaches the sidecar: the plugin tells it that a job on a kept communicator
    # runs, once it has run for REUSED_AFTER s (a shorter one goes from pending to completed).
    assert run(client, ws, sleep_then_sum, REUSED_AFTER + 0.5) == [1, 1]
    longer, use, _ = last_plan(client)
    assert use == first
    job = sidecar.job(longer)
    assert job["state"] == "completed"
    if OPENMPI:
        assert job.get("startedAt"), job  # the MPICH job runs once its members joined with their ports


def test_a_job_that_fails_on_a_kept_communicator_drops_it(cluster):
    _, client, _ = cluster
    ws = sorted(client.scheduler_info()["workers"])[1:3]
    run(client, ws)
    kept = last_plan(client)[0]
    with pytest.raises(MPIJobError, match="rank 1 fails on purpose"):
        run(client, ws, fail_on_rank_1)
    failed, use, _ = last_plan(client)
    assert use == kept
    deadline = time.monotonic() + 10
    while ["drop", kept, "failed"] not in cache(client)["history"]:
        assert time.monotonic() < deadline, cache(client)
        time.sleep(0.05)
    assert run(client, ws) == [1, 1]
    job, use, keep = last_plan(client)
    assert use is None and keep == job  # built anew, never the failed job's
    stats = held(client)
    assert all(kept not in stats[w]["held"] for w in ws), stats


def dies_on_rank_2(comm):
    comm.Barrier()
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Barrier()


@pytest.mark.skipif(not OPENMPI, reason="MPICH cannot shrink: a failed job's communicator is dropped")
def test_a_member_that_dies_leaves_the_survivors_a_communicator_to_shrink(cluster):
    # No new group construct after a death (issue 28): the survivors' next job shrinks the
    # communicator they kept with the dead member, and keeps what it shrank to.
    _, client, sidecar = cluster
    ws = sorted(client.scheduler_info()["workers"])[:3]
    set_cache(client, clear=True)  # no healthy kept communicator over the survivors to derive from
    assert run(client, ws) == [3, 3, 3]
    kept = last_plan(client)[0]
    with pytest.raises(MPIJobError) as info:
        run(client, ws, dies_on_rank_2)
    assert info.value.kind == "member-lost" and list(info.value.lost_workers) == [ws[2]], info.value
    assert last_plan(client)[1] == kept
    assert ["shrinkable", kept, [ws[2]]] in cache(client)["history"], cache(client)
    before = held(client)
    survivors = [ws[1], ws[0]]
    assert run(client, survivors, rank_sum, 10) == [21, 21]
    shrunk, use, keep = last_plan(client)
    assert (use, keep) == (kept, shrunk)
    after = held(client)
    for w in survivors:
        assert after[w]["shrunk"] == before[w]["shrunk"] + 1
        assert shrunk in after[w]["held"] and after[w]["built"] == before[w]["built"]
    # The shrunk one replaces its parent and serves the next job over the survivors (a Dup).
    assert ["drop", kept, "shrunk"] in cache(client)["history"]
    assert run(client, ws[:2]) == [1, 1]
    assert last_plan(client)[1:] == (shrunk, None)
    client.wait_for_workers(4, timeout=60)  # its nanny restarted the killed one
    wait_pool_ready(sidecar, 4)


def test_a_kept_communicator_in_use_is_not_shared_the_other_job_builds_its_own(cluster):
    _, client, _ = cluster
    ws = sorted(client.scheduler_info()["workers"])[2:4]
    replay = start_replay(client)
    run(client, ws)
    kept = last_plan(client)[0]
    deadline = time.monotonic() + 10
    while not any(e["id"] == kept and e["ready"] for e in cache(client)["kept"]):  # its job's end seen
        assert time.monotonic() < deadline, cache(client)
        time.sleep(0.02)
    # As if another job over these workers still ran on it (the plugin has not seen it end).
    set_cache(client, busy=(kept, "a-job-still-running"))
    before = held(client)
    assert run(client, ws, rank_sum, 1) == [3, 3]
    _, use, keep = last_plan(client)
    assert (use, keep) == (None, None)
    after = held(client)
    assert all(after[w]["built"] == before[w]["built"] + 1 and kept in after[w]["held"] for w in ws)
    set_cache(client, busy=(kept, None))
    run(client, ws)
    assert last_plan(client)[1] == kept, cache(client)
    # Two jobs over the same workers submitted at once, and two over other workers beside them:
    # each gets its own communicator (the sidecar runs the same workers' jobs one after the other).
    all4 = sorted(client.scheduler_info()["workers"])
    futures = [
        submit_mpi(client, rank_sum, i, workers=w, impl=IMPL, mode="inprocess")
        for i, w in enumerate([ws, ws, all4[:2], all4[:2]])
    ]
    assert [client.gather(f) for f in futures] == [[1, 1], [3, 3], [5, 5], [7, 7]]
    replay_since(client, *replay)


def ranks_and_workers(comm, offset):
    from distributed import get_worker

    return comm.rank, comm.size, get_worker().address, comm.allreduce(comm.rank + offset)


def test_a_job_over_some_workers_of_a_kept_communicator_derives_its_own(cluster):
    _, client, sidecar = cluster
    w = sorted(client.scheduler_info()["workers"])
    set_cache(client, bound=16, clear=True)  # none kept over fewer of them, from earlier tests
    run(client, w)  # keeps a communicator over all four
    kept, use, keep = last_plan(client)
    assert (use, keep) == (None, kept)
    before = held(client)
    # Some of them, in another order: each rank is the job's rank on the worker asked for it.
    for i, ws in enumerate(([w[2], w[0]], [w[3], w[1], w[2]], list(reversed(w)))):
        n = len(ws)
        got = run(client, ws, ranks_and_workers, 100 * i)
        assert got == [(r, n, ws[r], 100 * i * n + n * (n - 1) // 2) for r in range(n)], got
        job, use, keep = last_plan(client)
        assert (use, keep) == (kept, None)
    after = held(client)
    for x in w:
        assert after[x]["built"] == before[x]["built"], (before[x], after[x])  # no group construct
    assert sum(after[x]["derived"] - before[x]["derived"] for x in w) == 2 + 3 + 4
    # The sidecar still sees the job run.
    assert run(client, [w[1], w[3]], sleep_then_sum, REUSED_AFTER + 0.5) == [1, 1]
    job, use, _ = last_plan(client)
    assert use == kept
    view = sidecar.job(job)
    assert view["state"] == "completed"
    if OPENMPI:
        assert view.get("startedAt"), view
    # A job that fails on a derived communicator drops the kept one; the next builds anew.
    with pytest.raises(MPIJobError, match="rank 1 fails on purpose"):
        run(client, [w[0], w[3]], fail_on_rank_1)
    assert last_plan(client)[1] == kept
    deadline = time.monotonic() + 10
    while ["drop", kept, "failed"] not in cache(client)["history"]:
        assert time.monotonic() < deadline, cache(client)
        time.sleep(0.05)
    assert run(client, [w[0], w[3]], rank_sum, 1) == [3, 3]
    assert last_plan(client)[1] is None


def test_alternating_jobs_over_overlapping_sets_keep_the_cache_bounded(cluster):
    _, client, _ = cluster
    w = sorted(client.scheduler_info()["workers"])
    sets = [w[0:2], w[1:3], w[2:4], w[0:3], w[1:4], w, [w[3], w[0]], [w[0], w[2]]]
    bound = 3
    set_cache(client, bound=bound)
    replay, seen = start_replay(client)
    try:
        t0 = time.monotonic()
        for i in range(JOBS):
            if i % 25 == 24:
                # Two jobs at once over disjoint sets.
                a = submit_mpi(client, rank_sum, i, workers=w[0:2], impl=IMPL, mode="inprocess")
                b = submit_mpi(client, rank_sum, i, workers=w[2:4], impl=IMPL, mode="inprocess")
                assert client.gather(a) == client.gather(b) == [2 * i + 1] * 2
            else:
                # Three sets most of the time, every fourth job one of all eight: reuses and evictions.
                ws = sets[(i // 4) % len(sets)] if i % 4 == 3 else sets[i % 3]
                n = len(ws)
                assert run(client, ws, rank_sum, i) == [n * i + n * (n - 1) // 2] * n
            if i % 20 == 19 or i == JOBS - 1:
                assert len(cache(client)["kept"]) <= bound, cache(client)["kept"]
                replay, seen = replay_since(client, replay, seen)
                stats = held(client)
                assert all(len(s["held"]) <= bound for s in stats.values()), stats
        elapsed = time.monotonic() - t0
        counts = cache(client)["counts"]
        assert replay["uses"] > JOBS // 2, counts
        assert counts.get("dropped: evicted", 0) > 0, counts
        print(f"{JOBS} jobs in {elapsed:.1f} s; cache counts {counts}")
    finally:
        set_cache(client, bound=16)


def test_a_worker_that_leaves_takes_its_communicators_with_it(cluster):
    _, client, _ = cluster
    w = sorted(client.scheduler_info()["workers"])
    set_cache(client, clear=True)
    replay = start_replay(client)
    run(client, w[0:2])
    without = last_plan(client)
    assert without[1:] == (None, without[0])
    run(client, w[0:3])  # holds w[0:2]: it keeps its own all the same
    with_leaver, use, keep = last_plan(client)
    assert (use, keep) == (None, with_leaver)
    client.retire_workers([w[2]])
    deadline = time.monotonic() + 30
    while any(w[2] in e["workers"] for e in cache(client)["kept"]):
        assert time.monotonic() < deadline, cache(client)
        time.sleep(0.1)
    assert ["drop", with_leaver, "member left"] in cache(client)["history"]
    # The others go on with what does not include it, and free the rest at their next job.
    run(client, w[0:2])
    _, use, _ = last_plan(client)
    assert use == without[0]
    stats = held(client)
    assert all(with_leaver not in stats[x]["held"] for x in w[0:2]), stats
    replay_since(client, *replay)
