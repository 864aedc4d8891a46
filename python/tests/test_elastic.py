"""Elastic jobs (run_elastic): a job that gives a worker back when Dask retires it, takes idle
workers up to its maximum, and goes on after a member is killed, in the same worker processes, with
the result of a run without changes.

The workload is deterministic whatever the membership: every rank steps the same counter and the
ranks check, over the communicator of the moment, that they all hold the same step. Open MPI's
pool, or with DASK_PMIX_TEST_IMPL=mpich MPICH's in-process worlds (opt-in: dask-pmix.pool.mpich)."""

from __future__ import annotations

import os
import signal
import threading
import time

import dask
import pytest

from dask_pmix import MPIJobError, run_elastic
from dask_pmix.client.elastic import TOPIC
from dask_pmix.protocol import ELASTIC_LABEL

from .conftest import IMPL, start_cluster
from .test_inprocess import wait_pool_ready


def elastic(client, fn, *args, **kwargs):
    """run_elastic with the MPI library under test."""
    return run_elastic(client, fn, *args, impl=IMPL, **kwargs)


STEPS = 40
EXPECTED = sum(i * i for i in range(STEPS))


def counter(ctx, steps, pause, flag=None):
    """Steps a counter to ``steps``, committing after each step; sleeps ``pause`` per step (and
    while ``flag`` names a file that exists, so that a test can hold the job mid-way)."""
    from distributed import get_worker
    from mpi4py import MPI

    state = ctx.state or {"step": 0, "acc": 0}
    while state["step"] < steps:
        lo = ctx.comm.allreduce(state["step"], op=MPI.MIN)
        hi = ctx.comm.allreduce(state["step"], op=MPI.MAX)
        if lo != hi:
            raise RuntimeError(f"the members disagree on the step: {lo} against {hi}")
        state["acc"] += state["step"] * state["step"]
        state["step"] += 1
        time.sleep(pause)
        while flag and os.path.exists(flag) and state["step"] == steps // 2:
            time.sleep(0.02)
        ctx.commit(state)
    return {
        "acc": state["acc"],
        "rank": ctx.rank,
        "size": ctx.size,
        "generation": ctx.generation,
        "worker": get_worker().address,
        "pid": os.getpid(),
    }


@pytest.fixture
def cluster():
    with dask.config.set({"dask-pmix.pool.mpich": IMPL != "openmpi"}):
        cluster, client, sidecar = start_cluster(4)
        try:
            wait_pool_ready(sidecar, 4)
            yield cluster, client, sidecar
        finally:
            client.close()
            cluster.close()


def pids(client) -> dict:
    return client.run(os.getpid)


def workers_now(client) -> list[str]:
    """The scheduler's workers now (client.run would ask closing ones too)."""
    return client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.workers))


def generations(client) -> list[dict]:
    return [msg for _, msg in client.get_events(TOPIC)]


def in_background(call) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["results"] = call()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def running_generation(sidecar, at_least: int = 0, timeout: float = 60) -> dict:
    """The running job (its communicator built) of an elastic job's generation ``at_least`` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for j in sidecar.jobs():
            labels = j.get("labels") or {}
            if labels.get(ELASTIC_LABEL) and j["state"] == "running":
                if int(labels.get("dask-pmix.generation", 0)) >= at_least:
                    return j
        time.sleep(0.05)
    raise AssertionError(f"no running generation {at_least} within {timeout} s: {sidecar.jobs()}")


def kill_mid_job(client, sidecar, tmp_path, members: int, victim: int) -> tuple:
    """An elastic job over the first ``members`` workers (min 2) held at its middle step, its
    commit behind it; kill -9 of its rank ``victim``'s worker, then the job goes on. (the workers,
    their pids before, the job's thread and outcome, the kill's time)."""
    w = sorted(client.scheduler_info()["workers"])
    before = pids(client)
    flag = tmp_path / "hold"
    flag.touch()
    t, out = in_background(lambda: elastic(client, counter, STEPS, 0.01, str(flag), workers=w[:members], min=2))
    running_generation(sidecar)
    time.sleep(0.3)  # every member waits at the middle step
    t0 = time.monotonic()
    os.kill(before[w[victim]], signal.SIGKILL)
    flag.unlink()
    return w, before, t, out, t0


def hung(sidecar) -> str:
    """What the sidecar says of the elastic jobs, for a job that did not end in time."""
    try:
        return f"the job did not end: {sidecar.elastic_jobs()}"
    except Exception as e:  # noqa: BLE001 - only a message
        return f"the job did not end (the sidecar: {e!r})"


def check_done(results, size: int) -> None:
    assert [r["acc"] for r in results] == [EXPECTED] * size, results
    assert [r["rank"] for r in results] == list(range(size))
    assert {r["size"] for r in results} == {size}


def test_a_job_below_its_maximum_takes_idle_workers_at_a_commit(cluster):
    _, client, _ = cluster
    before = pids(client)
    results = elastic(client, counter, STEPS, 0.01, n=2, max=4)
    check_done(results, 4)
    assert results[0]["generation"] >= 1
    gens = generations(client)
    assert len(gens[0]["workers"]) == 2 and len(gens[-1]["workers"]) == 4, gens
    assert sum(g["change"].count("+") for g in gens) == 2, gens
    # The same processes: no worker was started or restarted.
    assert pids(client) == before
    assert {r["pid"] for r in results} == {before[r["worker"]] for r in results}


def test_a_member_retired_by_dask_leaves_at_the_next_commit_and_its_data_moves(cluster, tmp_path):
    _, client, sidecar = cluster
    w = sorted(client.scheduler_info()["workers"])
    before = pids(client)
    held = client.scatter(list(range(1000)), workers=[w[1]])
    flag = tmp_path / "hold"
    flag.touch()
    t, out = in_background(lambda: elastic(client, counter, STEPS, 0.01, str(flag), workers=w[:3], min=2))
    family = running_generation(sidecar)["labels"][ELASTIC_LABEL]
    # Dask's retirement waits for the job to give the worker back, then moves its data.
    retiring, retired = in_background(lambda: client.retire_workers(workers=[w[1]]))
    time.sleep(0.5)
    assert retiring.is_alive()  # the job holds it until its next commit
    t0 = time.monotonic()
    flag.unlink()  # the job goes on, and commits
    retiring.join(60)
    retired_in = time.monotonic() - t0
    assert not retiring.is_alive() and w[1] in retired.get("results", {}), retired
    t.join(120)
    assert not t.is_alive(), hung(sidecar)
    assert "error" not in out, out.get("error")
    results = out["results"]
    # It left, and the idle worker took its place (the job was below its maximum, 3, again).
    check_done(results, 3)
    assert [r["worker"] for r in results] == [w[0], w[2], w[3]]
    assert w[1] not in client.scheduler_info()["workers"]
    assert retired_in < 20, retired_in  # the next commit, not the drain bound (30 s)
    assert client.gather(held) == list(range(1000))  # moved before the worker closed
    now = pids(client)
    assert all(now[x] == before[x] for x in w if x != w[1])
    gens = generations(client)
    assert any(f"-{w[1]}" in g["change"] and f"+{w[3]}" in g["change"] for g in gens), gens
    # The sidecar shows the job's members over time and the drain, honoured at that generation.
    view = drained(sidecar, family, 1)
    assert [g["workers"] for g in view["generations"]] == [w[:3], [w[0], w[2], w[3]]], view
    assert view["generations"][1]["change"] == f"-{w[1]}; +{w[3]}"
    assert [g["state"] for g in view["generations"]] == ["completed", "completed"]
    [d] = view["drains"]
    assert (d["workerId"], d["reason"], d["generation"]) == (w[1], "retired by Dask", 1), d


def commits_until(ctx, flag):
    """Commits every 50 ms until ``flag`` exists; returns the size of the last generation."""
    state = ctx.state or {"n": 0}
    while not os.path.exists(flag):
        time.sleep(0.05)
        state["n"] += 1
        ctx.commit(state)
    return ctx.size


def test_members_retired_one_after_another_each_leave_at_the_next_commit(cluster, tmp_path):
    # The retirement waits until the sidecar has unfrozen the member, which it does just after the
    # generation's end: a retirement woken only by that end waited out the drain bound (30 s). Three
    # members over four workers: the first retirement swaps in the idle worker, the others shrink.
    _, client, sidecar = cluster
    flag = str(tmp_path / "stop")
    t, out = in_background(lambda: elastic(client, commits_until, flag, n=3, min=1))
    took = []
    for gen in range(3):
        job = running_generation(sidecar, at_least=gen)
        victim = job["members"][-1]["workerId"]
        t0 = time.monotonic()
        client.retire_workers(workers=[victim])
        took.append(time.monotonic() - t0)
        assert victim not in workers_now(client)
    open(flag, "w").close()
    t.join(60)
    assert not t.is_alive(), hung(sidecar)
    assert out.get("results") == [1], out
    print(f"three members retired, each in {', '.join(f'{x:.2f}' for x in took)} s")
    assert max(took) < 5, took  # a commit is every 50 ms; the drain bound is 30 s


def drained(sidecar, family: str, count: int, timeout: float = 10) -> dict:
    """The sidecar's view of elastic job ``family`` once ``count`` drains are recorded honoured
    (the scheduler records them without waiting)."""
    deadline = time.monotonic() + timeout
    while True:
        view = sidecar.elastic_job(family)
        if sum(d["state"] == "honoured" for d in view["drains"]) >= count or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def test_cluster_scale_down_during_a_job_shrinks_it(cluster, tmp_path):
    # Dask's ordinary call: the workers it closes leave the job at its next commit.
    lc, client, sidecar = cluster
    w = sorted(client.scheduler_info()["workers"])
    flag = tmp_path / "hold"
    flag.touch()
    t, out = in_background(lambda: elastic(client, counter, STEPS, 0.01, str(flag), workers=w, min=1))
    running_generation(sidecar)
    time.sleep(0.3)  # every member waits at the middle step
    lc.scale(2)
    time.sleep(0.5)
    t0 = time.monotonic()
    flag.unlink()
    deadline = time.monotonic() + 60
    while len(workers_now(client)) != 2:
        assert time.monotonic() < deadline, workers_now(client)
        time.sleep(0.05)
    scaled_in = time.monotonic() - t0
    t.join(120)
    assert not t.is_alive(), hung(sidecar)
    assert "error" not in out, out.get("error")
    results = out["results"]
    check_done(results, 2)
    assert {r["worker"] for r in results} == set(workers_now(client))
    assert scaled_in < 20, scaled_in  # the next commit, not the drain bound (30 s)


def test_adaptive_scaling_down_drains_members_at_their_commits(cluster):
    # Adaptive counts each member's rank task as work (its target stays at 4 here), so it scales
    # down when its maximum says so. Dask never offers it a worker running a long-running task
    # (every rank task): the job gives workers back at its commits instead, down to its minimum,
    # and Adaptive retires them in its next rounds.
    lc, client, sidecar = cluster
    before = pids(client)
    t, out = in_background(lambda: elastic(client, counter, 400, 0.01, n=4, min=2))
    time.sleep(0.5)
    adaptive = lc.adapt(minimum=2, maximum=2, interval="200ms", wait_count=2)
    try:
        t.join(120)
        assert not t.is_alive(), hung(sidecar)
        assert "error" not in out, out.get("error")
        results = out["results"]
        assert [r["acc"] for r in results] == [sum(i * i for i in range(400))] * len(results)
        assert len(results) == 2, [r["worker"] for r in results]
        deadline = time.monotonic() + 30
        while len(workers_now(client)) != 2:
            assert time.monotonic() < deadline, workers_now(client)
            time.sleep(0.1)
        now = pids(client)
        assert all(now[x] == before[x] for x in now)  # the workers left are the same processes
        assert {r["worker"] for r in results} == set(now)
        [family] = [e["id"] for e in sidecar.elastic_jobs()]
        view = drained(sidecar, family, 2)
        honoured = [d for d in view["drains"] if d["state"] == "honoured"]
        assert {d["reason"] for d in honoured} == {"Adaptive scaling down"}, view["drains"]
        assert {d["workerId"] for d in honoured} == set(before) - set(now), view["drains"]
        assert [len(g["workers"]) for g in view["generations"]][-1] == 2, view["generations"]
    finally:
        adaptive.stop()


def test_a_killed_member_is_survived_from_the_last_commit(cluster, tmp_path):
    _, client, sidecar = cluster
    w, before, t, out, t0 = kill_mid_job(client, sidecar, tmp_path, members=3, victim=2)
    victim = w[2]
    if IMPL != "openmpi":
        # MPICH cannot take the survivors out of the MPI call that waits for the lost member: the
        # job fails at once, saying so (their workers are replaced, as after any such failure).
        t.join(60)
        assert not t.is_alive(), hung(sidecar)
        err = out.get("error")
        assert isinstance(err, MPIJobError) and err.kind == "member-lost", out
        assert "cannot survive a lost member" in str(err) and victim in err.lost_workers, err
        assert time.monotonic() - t0 < 10
        return
    resumed = running_generation(sidecar, at_least=1, timeout=30)
    resumed_in = time.monotonic() - t0
    t.join(120)
    assert not t.is_alive(), hung(sidecar)
    assert "error" not in out, out.get("error")
    results = out["results"]
    check_done(results, len(results))
    assert victim not in {r["worker"] for r in results}
    assert victim not in {m["workerId"] for m in resumed["members"]}
    assert all(pids(client).get(x) == before[x] for x in w[:2])  # the survivors' own processes
    gens = generations(client)
    assert any(g["change"].startswith("lost ") and victim in g["change"] for g in gens), gens
    print(f"a killed member: the next generation was running {resumed_in:.2f} s after the kill")
    assert resumed_in < 10, resumed_in  # the failure is seen in about 1 s; the rest is the next start


def test_a_member_lost_below_min_fails_the_job(cluster, tmp_path):
    _, client, sidecar = cluster
    _, _, t, out, _ = kill_mid_job(client, sidecar, tmp_path, members=2, victim=1)
    t.join(120)
    assert not t.is_alive(), hung(sidecar)
    err = out.get("error")
    assert isinstance(err, MPIJobError) and err.kind == "member-lost", out
    assert ("fewer than min=2" if IMPL == "openmpi" else "cannot survive a lost member") in str(err)


def test_a_result_that_cannot_come_back_is_named(cluster):
    _, client, _ = cluster

    def returns_a_lock(ctx):
        ctx.commit({})
        return threading.Lock()

    with pytest.raises(MPIJobError, match="a rank's result could not be sent back to the client") as info:
        elastic(client, returns_a_lock, n=2)
    assert info.value.kind == "rank"


def test_a_rank_that_raises_fails_the_job_as_run_mpi_does(cluster):
    _, client, _ = cluster

    def fails(ctx):
        ctx.commit({"x": 1})
        if ctx.rank == 1:
            raise ValueError("rank 1 fails on purpose")
        return ctx.rank

    with pytest.raises(MPIJobError, match="rank 1 fails on purpose") as info:
        elastic(client, fails, n=2)
    assert info.value.kind == "rank"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, "exactly one of n"),
        ({"n": 2, "workers": ["a"]}, "exactly one of n"),
        ({"n": 0}, "n must be a whole number"),
        ({"n": 2, "min": 3}, "within min=3 and max="),
        ({"n": 3, "max": 2}, "within min=1 and max=2"),
        ({"n": 2, "min": True}, "min must be a whole number"),
        ({"n": 2, "max": 2.5}, "max must be a whole number"),
    ],
)
def test_bad_bounds_are_refused_before_the_cluster_is_asked(kwargs, error):
    with pytest.raises(ValueError, match=error):
        run_elastic(None, counter, 1, 0, **kwargs)
    with pytest.raises(TypeError, match="fn must be callable"):
        run_elastic(None, "counter", n=1)
