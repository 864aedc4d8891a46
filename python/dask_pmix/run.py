"""run_mpi: an MPI job over workers the cluster already has."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from .errors import MPIJobError

FAILED_STATES = ("failed", "aborted")
# Ranks go ahead of tasks queued on their workers: the other ranks are already waiting for them.
RANK_PRIORITY = 1_000_000


def _sidecar_calls(job_id: str, worker_id: str) -> tuple[Callable[[], dict], Callable[[str], None]]:
    """The job's state, and a loss report, through the scheduler (which relays to the sidecar),
    callable from a task thread."""
    from distributed import get_worker
    from distributed.utils import sync

    worker = get_worker()

    def state() -> dict:
        try:
            return sync(worker.loop, worker.scheduler.dask_pmix_job, job_id=job_id)
        except Exception as e:  # the scheduler is unreachable: keep running, the rank decides
            return {"state": "unknown", "error": str(e)}

    def lost(reason: str) -> None:
        sync(worker.loop, worker.scheduler.dask_pmix_member_lost, job_id=job_id, worker=worker_id, reason=reason)

    return state, lost


def _member_task(job_id: str, rank: int, worker_id: str, env: dict, impl: str, fn: Callable, args: tuple,
                 kwargs: dict, timeout: float | None, local: list | None) -> Any:
    from distributed import secede

    from .member import run_rank

    # Off the worker's thread pool: the worker keeps running other tasks while the job runs,
    # and a worker with a long-running task is never picked for downscaling.
    secede()
    if local is not None:
        kwargs = {**kwargs, "local": local}
    state, lost = _sidecar_calls(job_id, worker_id)
    return run_rank(job_id=job_id, rank=rank, worker=worker_id, env=env, impl=impl, fn=fn, args=args, kwargs=kwargs,
                    job_state=state, report_lost=lost, timeout=timeout)


def _holders(client, futures: Iterable) -> dict[str, list]:
    """worker address -> the futures whose data it already holds."""
    futures = list(futures)
    who_has = client.who_has(futures)
    by_worker: dict[str, list] = {}
    for f in futures:
        holders = who_has.get(f.key) or []
        if holders:
            by_worker.setdefault(sorted(holders)[0], []).append(f)
    return by_worker


def run_mpi(client, fn: Callable, *args, n: int | None = None, workers: list[str] | None = None,
            pset: str | None = None, impl: str = "openmpi", timeout: float | None = None,
            wiring_timeout: float | None = None, local: Iterable | None = None, **kwargs) -> list:
    """Runs ``fn(comm, *args, **kwargs)`` on each chosen worker as one MPI job; results in rank order.

    Members are ``workers`` (addresses), the members of ``pset``, ``n`` workers chosen by the
    sidecar, or, given ``local`` (futures of data already in the cluster), the workers holding
    that data; each rank then also gets ``local=[...]``: the values of the futures its own worker
    holds, which do not move. ``comm`` is an mpi4py communicator over exactly the members, built
    through MPI Sessions. The members are frozen (Dask will not retire them) until the job ends,
    and released afterwards whatever happens. Raises MPIJobError naming the rank, the worker and
    the reason when the job fails.
    """
    local_by_worker = None
    if local is not None:
        local_by_worker = _holders(client, local)
        if workers is None and pset is None and n is None:
            workers = sorted(local_by_worker)
    created = client.sync(client.scheduler.dask_pmix_create_job, workers=workers, n=n, pset=pset, impl=impl,
                          owner=client.id, timeout=timeout, wiring_timeout=wiring_timeout)
    if "error" in created:
        raise MPIJobError(created["error"])
    job = created["job"]
    job_id = job["id"]
    envs = created["envs"]
    members = sorted(job["members"], key=lambda m: m["rank"])
    futures = []
    try:
        for m in members:
            worker_id = m["workerId"]
            mine = local_by_worker.get(worker_id, []) if local_by_worker is not None else None
            futures.append(client.submit(
                _member_task, job_id, m["rank"], worker_id, envs[worker_id], impl, fn, args, kwargs, timeout, mine,
                key=f"dask-pmix-{job_id}-rank-{m['rank']}", workers=[worker_id], allow_other_workers=False,
                pure=False, retries=0, priority=RANK_PRIORITY))
        return _gather(client, job_id, members, futures)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
        client.sync(client.scheduler.dask_pmix_release_job, job_id=job_id)


def _gather(client, job_id: str, members: list[dict], futures: list) -> list:
    """Waits for every rank, but stops as soon as the sidecar fails the job: a rank whose worker
    died has a task that will never run, so its future alone would wait forever."""
    from distributed import wait
    from distributed.client import TimeoutError as DaskTimeoutError

    while True:
        try:
            wait(futures, timeout=0.25, return_when="ALL_COMPLETED")
        except (DaskTimeoutError, TimeoutError):
            pass
        pending = [f for f in futures if not f.done()]
        errored = [f for f in futures if f.status == "error"]
        if not pending and not errored:
            return client.gather(futures)
        job = client.sync(client.scheduler.dask_pmix_job, job_id=job_id)
        if errored or job.get("state") in FAILED_STATES:
            raise _job_error(client, job_id, members, futures)


def _own_error(f) -> MPIJobError | None:
    """The error a rank raised about its own function or process, if it has one."""
    if f.status != "error":
        return None
    e = f.exception()
    return e if isinstance(e, MPIJobError) and e.origin == "rank" else None


def _job_error(client, job_id: str, members: list[dict], futures: list) -> MPIJobError:
    """The most telling error. The sidecar names the rank it lost first; when that rank also
    reported why (its exception), that report wins. A rank whose worker died never reports."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.05)
    job = client.sync(client.scheduler.dask_pmix_job, job_id=job_id)
    members_now = job.get("members", [])
    culprit = next((m for m in members_now if m.get("endedJob")), None) or \
        next((m for m in members_now if m.get("state") == "lost"), None)
    if culprit is not None:
        own = _own_error(futures[culprit["rank"]])
        if own is not None:
            return own
        return MPIJobError(job.get("error") or f"the job was {job.get('state')}", job_id=job_id,
                           rank=culprit["rank"], worker=culprit["workerId"])
    own = [e for e in map(_own_error, futures) if e is not None]
    if own:
        return min(own, key=lambda e: e.rank if e.rank is not None else 1 << 30)
    if job.get("state") in FAILED_STATES:
        return MPIJobError(job.get("error") or f"the job was {job.get('state')}", job_id=job_id)
    f = next(f for f in futures if f.status == "error")
    exc = f.exception()
    if isinstance(exc, MPIJobError):
        return exc
    rank = futures.index(f)
    return MPIJobError(f"{type(exc).__name__}: {exc}", job_id=job_id, rank=rank, worker=members[rank]["workerId"],
                       origin="rank")
