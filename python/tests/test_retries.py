"""retries=: a job that lost a member runs again on the workers there are then (issue 28, item 1).

A real LocalCluster of worker processes (nannies restart a killed worker, under a new address).
The classification (errors.classify) is checked on its own first, then end to end: a member's
worker SIGKILLed mid-job, a holder of local= data killed (Dask computes its data again), a rank
that raises (never retried), retries exhausted (every attempt in the error), submit_mpi's futures
and map_blocks_mpi."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dask_pmix import MPIJobError, run_mpi, submit_mpi
from dask_pmix.client import retries as retries_mod
from dask_pmix.errors import PROCESS_GONE, WORKER_GONE, Failure, classify

from .conftest import start_cluster

ROOT = Path(__file__).resolve().parents[2]
FAMILY, ATTEMPT = retries_mod.FAMILY_LABEL, retries_mod.ATTEMPT_LABEL


# -- the classification, on its own ------------------------------------------------------------------
def member(rank, reason="", state="lost", ended=False, worker=None):
    return {"rank": rank, "workerId": worker or f"w{rank}", "state": state, "reason": reason, "endedJob": ended}


def own(reason):
    return MPIJobError(reason, job_id="j", rank=0, worker="w0", origin="rank")


@pytest.mark.parametrize(
    ("view", "kwargs", "kind"),
    [
        # the sidecar's words for a member whose worker is gone
        (
            {
                "state": "failed",
                "members": [member(0, "its worker left (removed by Dask; its nanny restarts it)", ended=True)],
            },
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {
                "state": "failed",
                "members": [
                    member(0, "its worker process died (its connection to the PMIx server dropped)", ended=True)
                ],
            },
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {"state": "failed", "members": [member(0, "its worker finalized its MPI session", ended=True)]},
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {
                "state": "failed",
                "members": [member(0, "its worker is being retired by Dask (cluster.scale(), ...)", ended=True)],
            },
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {
                "state": "failed",
                "members": [member(0, "its worker process ended (its PMI connection closed: x)", ended=True)],
            },
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {
                "state": "failed",
                "members": [member(1, "rank 0 (worker w0) saw its process fail: MPI error: proc failed", ended=True)],
            },
            {},
            Failure.MEMBER_LOST,
        ),
        # ... even when the lost rank's worker said something itself before it went (retired)
        (
            {"state": "failed", "members": [member(0, "its worker is being retired by Dask", ended=True)]},
            {"own": own("MPI error: revoked")},
            Failure.MEMBER_LOST,
        ),
        # a rank's own exception, in process and in fork mode
        (
            {
                "state": "failed",
                "members": [member(0, "ValueError: boom", ended=True), member(1, "MPI error: revoked")],
            },
            {"own": own("ValueError: boom")},
            Failure.RANK,
        ),
        (
            {"state": "failed", "mode": "fork", "members": [member(0, "ValueError: boom", ended=True)]},
            {"own": own("ValueError: boom")},
            Failure.RANK,
        ),
        # MPI_Abort
        (
            {
                "state": "aborted",
                "error": "rank 0 aborted the job with status 3",
                "members": [member(0, ended=True, state="connected")],
            },
            {},
            Failure.RANK,
        ),
        # a process gone: in process that is its worker; in fork mode a child that crashed while its
        # worker lives (which says so) is the rank's own doing, one lost with its worker is not
        (
            {"state": "failed", "mode": "inprocess", "members": [member(0, PROCESS_GONE[0], ended=True)]},
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {"state": "failed", "mode": "fork", "members": [member(0, PROCESS_GONE[0], ended=True)]},
            {"own": own("the rank's process was killed by signal SIGSEGV")},
            Failure.RANK,
        ),
        (
            {"state": "failed", "mode": "fork", "members": [member(0, PROCESS_GONE[1], ended=True)]},
            {},
            Failure.MEMBER_LOST,
        ),
        (
            {"state": "failed", "mode": "fork", "members": [member(0, PROCESS_GONE[0], ended=True)]},
            {"own": own("x"), "gone": {"w0"}},
            Failure.MEMBER_LOST,
        ),
        # an MPI error blamed before the sidecar heard of the member that went
        (
            {
                "state": "failed",
                "members": [member(0, "MPI error: proc failed", ended=True), member(1, state="connected")],
            },
            {"gone": {"w1"}},
            Failure.MEMBER_LOST,
        ),
        (
            {
                "state": "failed",
                "members": [member(0, "MPI error: bad count", ended=True), member(1, state="connected")],
            },
            {},
            Failure.RANK,
        ),
        # the job's own reasons
        (
            {
                "state": "failed",
                "error": "job timeout: still running after 5 s",
                "members": [member(0, state="connected")],
            },
            {},
            Failure.TIMEOUT,
        ),
        (
            {"state": "aborted", "error": "a rank's task was cancelled (its future was released)", "members": []},
            {},
            Failure.CANCELLED,
        ),
        (
            {
                "state": "aborted",
                "error": "the cluster was restarted (client.restart()) while the job ran: ...",
                "members": [],
            },
            {},
            Failure.CANCELLED,
        ),
        (
            {"state": "failed", "error": "the dask-pmix sidecar at http://x has not answered for 10 s", "members": []},
            {},
            Failure.JOB,
        ),
        ({}, {}, Failure.JOB),
    ],
)
def test_classify(view, kwargs, kind):
    assert classify(view, **kwargs)[0] == kind


def test_classify_names_the_lost_workers():
    view = {
        "state": "failed",
        "members": [
            member(0, state="connected"),
            member(1, "its worker left (retired by Dask)", ended=True, worker="tcp://b"),
        ],
    }
    assert classify(view) == (Failure.MEMBER_LOST, ["tcp://b"])


def test_the_sidecar_still_says_each_loss_it_is_classified_by():
    """Each phrase classify reads as 'member lost' is said by dask-pmix's own code (src/, the
    plugin): one reworded there would turn retries off without a word."""
    sources = "".join(
        p.read_text()
        for p in [*ROOT.joinpath("src").rglob("*.ts"), *ROOT.joinpath("python/dask_pmix").rglob("*.py")]
        if "errors.py" not in p.name
    )
    for phrase in (*WORKER_GONE, *PROCESS_GONE):
        assert phrase.rstrip("( ") in sources, phrase
    assert re.search(r"saw its process fail: \$\{reason\}", sources)


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError), (None, TypeError)]
)
def test_bad_retries_are_refused_before_the_cluster_is_asked(value, error):
    class NoClient:  # any use of the client would fail differently
        asynchronous = False

    with pytest.raises(error, match="retries must be"):
        run_mpi(NoClient(), len, retries=value)
    with pytest.raises(error, match="retries must be"):
        submit_mpi(NoClient(), len, retries=value)


def test_an_error_keeps_its_attempts_through_pickle():
    import pickle

    first = MPIJobError(
        "rank 1 (worker w) was lost: its worker left (x)", job_id="a", rank=1, worker="w", kind=Failure.MEMBER_LOST
    )
    last = MPIJobError("ValueError: boom", job_id="b", rank=0, origin="rank", kind=Failure.RANK).with_attempts(
        [first, None]
    )
    back = pickle.loads(pickle.dumps(last))
    assert [e.job_id for e in back.attempts] == ["a", "b"] and [e.kind for e in back.attempts] == [
        "member-lost",
        "rank",
    ]
    assert str(back) == str(last)
    assert "attempt 2, after attempt 1, member-lost: MPI job a failed (rank 1, worker w)" in str(back)
    assert MPIJobError("x").attempts[0].reason == "x"


# -- on a real cluster ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster3():
    cluster, client, sidecar = start_cluster(3)
    yield cluster, client, sidecar
    client.close()
    cluster.close()


def three_workers(cluster3):
    """Three workers again: a killed worker's nanny restarts it, but on a very loaded host a restart
    can outlast distributed.deploy.lost-worker-timeout, and the cluster then closes it for good."""
    cluster, client, _ = cluster3
    if len(client.scheduler_info()["workers"]) < 3:
        try:
            client.wait_for_workers(3, timeout=20)
        except Exception:  # noqa: BLE001
            cluster.scale(3)
    client.wait_for_workers(3, timeout=60)


def family_jobs(sidecar, family):
    jobs = [j for j in sidecar.jobs() if (j.get("labels") or {}).get(FAMILY) == family]
    return sorted(jobs, key=lambda j: int(j["labels"][ATTEMPT]))


def running_attempt(sidecar, pid_dir, ranks, timeout=30.0):
    """The running job of a family whose `ranks` ranks are all inside fn (each wrote its file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [j for j in sidecar.jobs() if j["state"] == "running" and FAMILY in (j.get("labels") or {})]
        if jobs and len(os.listdir(pid_dir)) >= ranks:
            return jobs[0]
        time.sleep(0.05)
    raise AssertionError(f"no attempt running with {ranks} ranks inside fn within {timeout} s: {sidecar.jobs()[-3:]}")


def job_state(sidecar, job_id):
    from dask_pmix import SidecarError

    try:
        return sidecar.job(job_id)["state"]
    except SidecarError as e:
        if e.status == 404:  # ended, released and forgotten
            return "gone"
        raise


def kill_member(client, job, rank=-1):
    victim = sorted(job["members"], key=lambda m: m["rank"])[rank]["workerId"]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    return victim


def background(call):
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def until_released(marker: str):
    """fn: in the first attempt waits in the job's barriers until the test kills a member (and
    leaves `marker`), then the next attempt returns at once: the sum of the ranks + 1."""

    def fn(comm, pid_dir, local=None):
        import os
        import time
        import uuid

        open(os.path.join(pid_dir, f"{comm.rank}-{uuid.uuid4().hex}"), "w").close()
        if not os.path.exists(marker):
            for _ in range(300):  # 15 s at most
                comm.Barrier()
                time.sleep(0.05)
        mine = float(sum(float(x.sum()) for x in local)) if local is not None else comm.rank + 1.0
        return comm.allreduce(mine)

    return fn


def test_a_member_killed_mid_job_is_run_again_and_the_result_is_right(cluster3, impl, tmp_path):
    _, client, sidecar = cluster3
    three_workers(cluster3)
    pid_dir, marker = tmp_path / "pids", str(tmp_path / "killed")
    pid_dir.mkdir()
    fn = until_released(marker)
    t0 = time.monotonic()
    thread, outcome = background(lambda: run_mpi(client, fn, str(pid_dir), n=2, impl=impl, retries=1))
    first = running_attempt(sidecar, pid_dir, 2)
    open(marker, "w").close()
    victim = kill_member(client, first)
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"] == [3.0, 3.0]
    family = first["labels"][FAMILY]
    jobs = family_jobs(sidecar, family)
    assert [j["labels"][ATTEMPT] for j in jobs] == ["1", "2"], jobs
    assert jobs[0]["state"] == "failed" and jobs[1]["state"] == "completed"
    assert victim not in [m["workerId"] for m in jobs[1]["members"]]
    events = [e for _, e in client.get_events(retries_mod.TOPIC) if e["family"] == family]
    assert [(e["attempt"], e["kind"], e["next"]) for e in events] == [(1, "member-lost", "retry")], events
    # The dashboard names each attempt.
    shown = {j["id"]: j.get("attempt") for j in sidecar._call("GET", "/v1/dashboard")["jobs"]}
    assert [shown[j["id"]] for j in jobs] == [{"family": family, "number": n, "of": 2} for n in (1, 2)]
    assert list(events[0]["lost_workers"]) == [victim]
    print(f"killed {victim}: the second attempt returned {time.monotonic() - t0:.1f} s after the call")


def make(i, n):
    return np.full(n, float(i))


def test_local_data_whose_holder_was_killed_is_computed_again_and_the_job_run_again(cluster3, impl, tmp_path):
    _, client, sidecar = cluster3
    three_workers(cluster3)
    workers = sorted(client.scheduler_info()["workers"])
    # Six pieces on two workers, free to be computed again elsewhere.
    data = [client.submit(make, i, 4, workers=[workers[i % 2]], allow_other_workers=True, pure=False) for i in range(6)]
    client.gather(data)
    before = sorted({w for ws in client.who_has(data).values() for w in ws})
    assert len(before) >= 2, before  # loose restrictions: mostly where asked
    pid_dir, marker = tmp_path / "pids", str(tmp_path / "killed")
    pid_dir.mkdir()
    fn = until_released(marker)
    thread, outcome = background(lambda: run_mpi(client, fn, str(pid_dir), local=data, impl=impl, retries=2))
    first = running_attempt(sidecar, pid_dir, len(before))
    assert sorted(m["workerId"] for m in first["members"]) == before
    open(marker, "w").close()
    victim = kill_member(client, first, rank=0)
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    total = 4.0 * sum(range(6))
    assert set(outcome["value"]) == {total}
    jobs = family_jobs(sidecar, first["labels"][FAMILY])
    assert [j["state"] for j in jobs] == ["failed", "completed"], jobs
    # The second attempt ran over the data's holders after Dask computed the lost pieces again.
    holders = {w for ws in client.who_has(data).values() for w in ws}
    assert victim not in holders
    assert sorted(m["workerId"] for m in jobs[1]["members"]) == sorted(holders)


def test_a_rank_that_raises_is_not_run_again(cluster3, impl):
    _, client, sidecar = cluster3
    three_workers(cluster3)

    def fails(comm):
        if comm.rank == 1:
            raise ValueError("boom on rank 1")
        comm.Barrier()
        return comm.rank

    before = {j["id"] for j in sidecar.jobs()}
    with pytest.raises(MPIJobError, match="boom on rank 1") as info:
        run_mpi(client, fails, n=2, impl=impl, retries=3)
    e = info.value
    assert e.kind == Failure.RANK and e.rank == 1 and len(e.attempts) == 1
    new = [j for j in sidecar.jobs() if j["id"] not in before]
    assert len(new) == 1 and new[0]["labels"][ATTEMPT] == "1", new
    events = [ev for _, ev in client.get_events(retries_mod.TOPIC) if ev["family"] == e.family]
    assert [(ev["kind"], ev["next"]) for ev in events] == [("rank", "raise")]


def test_retries_exhausted_name_every_attempt(cluster3, impl, tmp_path):
    _, client, sidecar = cluster3
    three_workers(cluster3)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    fn = until_released(str(tmp_path / "never"))
    thread, outcome = background(lambda: run_mpi(client, fn, str(pid_dir), n=2, impl=impl, retries=1))
    first = running_attempt(sidecar, pid_dir, 2)
    kill_member(client, first)
    # The second attempt: its ranks write two more files.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        second = [j for j in family_jobs(sidecar, first["labels"][FAMILY]) if j["labels"][ATTEMPT] == "2"]
        if second and second[0]["state"] == "running" and len(os.listdir(pid_dir)) >= 4:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"no second attempt running: {outcome}")
    kill_member(client, second[0], rank=0)
    thread.join(30)
    e = outcome.get("error")
    assert isinstance(e, MPIJobError), outcome
    assert [a.kind for a in e.attempts] == ["member-lost", "member-lost"]
    assert [a.job_id for a in e.attempts] == [first["id"], second[0]["id"]]
    assert e.__cause__ is e.attempts[0]
    assert f"attempt 2, after attempt 1, member-lost: MPI job {first['id']} failed" in str(e)
    assert e.job_id == second[0]["id"] and e.family == first["labels"][FAMILY]


def test_submit_mpi_futures_with_retries(cluster3, impl, tmp_path):
    _, client, sidecar = cluster3
    three_workers(cluster3)
    pid_dir, marker = tmp_path / "pids", str(tmp_path / "killed")
    pid_dir.mkdir()
    futures = submit_mpi(client, until_released(marker), str(pid_dir), n=2, impl=impl, retries=1)
    assert len(futures) == 2 and all(f.status == "pending" for f in futures)
    first = running_attempt(sidecar, pid_dir, 2)
    open(marker, "w").close()
    victim = kill_member(client, first)
    assert client.gather(futures, errors="raise") == [3.0, 3.0]
    jobs = family_jobs(sidecar, first["labels"][FAMILY])
    assert [j["state"] for j in jobs] == ["failed", "completed"], jobs
    # Each result is where the second attempt's rank made it.
    members = {m["rank"]: m["workerId"] for m in jobs[1]["members"]}
    who_has = client.who_has(futures)
    assert [list(who_has[f.key]) for f in futures] == [[members[0]], [members[1]]]
    assert victim not in members.values()

    # A rank that raises: the futures raise its error, once.
    def fails(comm):
        raise ValueError(f"no luck on rank {comm.rank}")

    futures = submit_mpi(client, fails, n=2, impl=impl, retries=2)
    with pytest.raises(MPIJobError, match="no luck on rank") as info:
        client.gather(futures)
    assert info.value.kind == Failure.RANK and len(info.value.attempts) == 1


def test_a_timeout_of_the_job_is_not_run_again(cluster3, impl):
    _, client, _ = cluster3
    three_workers(cluster3)

    def sleeps(comm):
        import time

        for _ in range(100):  # 5 s, past the job's timeout; the revoke ends it in its next Barrier
            comm.Barrier()
            time.sleep(0.05)

    with pytest.raises(MPIJobError, match="time") as info:
        run_mpi(client, sleeps, n=2, impl=impl, timeout=1, retries=2)
    assert info.value.kind == Failure.TIMEOUT and len(info.value.attempts) == 1


def test_cancelling_submit_mpi_futures_ends_the_running_attempt(cluster3, impl, tmp_path):
    _, client, sidecar = cluster3
    three_workers(cluster3)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    futures = submit_mpi(client, until_released(str(tmp_path / "never")), str(pid_dir), n=2, impl=impl, retries=1)
    t0 = time.monotonic()
    first = running_attempt(sidecar, pid_dir, 2)
    t1 = time.monotonic()
    client.cancel(futures)
    deadline = time.monotonic() + 10
    while (state := job_state(sidecar, first["id"])) in ("pending", "wiring", "running"):
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    print(f"attempt running after {t1 - t0:.2f} s; ended {time.monotonic() - t1:.2f} s after the cancel")
    time.sleep(0.5)
    # No second attempt (the first, ended by the cancel, is forgotten by the sidecar).
    assert [j["labels"][ATTEMPT] for j in family_jobs(sidecar, first["labels"][FAMILY])] in ([], ["1"])
    assert not [e for _, e in client.get_events(retries_mod.TOPIC) if e["family"] == first["labels"][FAMILY]]
    assert all(f.cancelled() for f in futures)


def test_map_blocks_mpi_runs_again_over_the_blocks_holders_after_one_was_killed(cluster3, impl, tmp_path):
    import dask.array as da

    from dask_pmix import map_blocks_mpi

    _, client, sidecar = cluster3
    three_workers(cluster3)
    from distributed import wait

    x = da.arange(30.0, chunks=5).persist()
    wait(x)
    pid_dir, marker = tmp_path / "pids", str(tmp_path / "killed")
    pid_dir.mkdir()
    members = sorted({w for ws in client.who_has(x).values() for w in ws})
    assert len(members) >= 2, members

    def double(comm, blocks):
        import os
        import time
        import uuid

        open(os.path.join(str(pid_dir), f"{comm.rank}-{uuid.uuid4().hex}"), "w").close()
        if not os.path.exists(marker):
            for _ in range(300):
                comm.Barrier()
                time.sleep(0.05)
        total = comm.allreduce(float(sum(b.data.sum() for b in blocks)))
        return {b.index: b.data * 2 + 0 * total for b in blocks}

    thread, outcome = background(lambda: map_blocks_mpi(double, x, impl=impl, retries=1).compute())
    first = running_attempt(sidecar, pid_dir, len(members))
    open(marker, "w").close()
    kill_member(client, first)
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    np.testing.assert_array_equal(outcome["value"], np.arange(30.0) * 2)
    assert [j["state"] for j in family_jobs(sidecar, first["labels"][FAMILY])] == ["failed", "completed"]


def test_a_member_retired_by_dask_mid_job_is_run_again(cluster3, impl, tmp_path):
    """Last in the module: the cluster is a worker short afterwards."""
    _, client, sidecar = cluster3
    three_workers(cluster3)
    pid_dir, marker = tmp_path / "pids", str(tmp_path / "retired")
    pid_dir.mkdir()
    fn = until_released(marker)
    thread, outcome = background(lambda: run_mpi(client, fn, str(pid_dir), n=2, impl=impl, retries=1))
    first = running_attempt(sidecar, pid_dir, 2)
    open(marker, "w").close()
    victim = sorted(first["members"], key=lambda m: m["rank"])[-1]["workerId"]
    t0 = time.monotonic()
    client.retire_workers(workers=[victim], close_workers=True)
    t1 = time.monotonic()
    thread.join(60)
    print(f"retired in {t1 - t0:.1f} s, the job returned {time.monotonic() - t0:.1f} s after the retire began")
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"] == [3.0, 3.0]
    jobs = family_jobs(sidecar, first["labels"][FAMILY])
    assert [j["state"] for j in jobs] == ["failed", "completed"], jobs
    lost = next(m for m in jobs[0]["members"] if m["workerId"] == victim)
    assert "retired" in lost["reason"], lost
    assert victim not in [m["workerId"] for m in jobs[1]["members"]]
