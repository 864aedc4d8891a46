"""run_mpi: an MPI job over workers the cluster already has."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from .errors import MPIJobError

logger = logging.getLogger("dask_pmix")

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
    """A fork-mode rank: a child of the worker joins the job as a new process."""
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


def _inprocess_calls(job_id: str, worker_id: str):
    """The sidecar as an in-process member sees it, through the scheduler, from a task thread."""
    from distributed import get_worker
    from distributed.utils import sync

    from .inprocess import SidecarCalls

    worker = get_worker()
    state, _ = _sidecar_calls(job_id, worker_id)

    def join(wait: float) -> dict:
        try:
            return sync(worker.loop, worker.scheduler.dask_pmix_join_job, job_id=job_id, worker=worker_id, wait=wait)
        except Exception as e:  # noqa: BLE001
            return {"error": f"the scheduler could not be asked: {e}"}

    def leave(ok: bool, reason: str, failed_ranks: list) -> Any:
        return sync(worker.loop, worker.scheduler.dask_pmix_leave_job, job_id=job_id, worker=worker_id, ok=ok,
                    reason=reason, failed_ranks=failed_ranks)

    def restart(reason: str) -> Any:
        return sync(worker.loop, worker.scheduler.dask_pmix_restart_worker, worker=worker.address, reason=reason)

    return SidecarCalls(join=join, leave=leave, state=state, restart=restart)


def _inprocess_task(job: dict, rank: int, worker_id: str, fn: Callable, args: tuple, kwargs: dict,
                    local: list | None) -> Any:
    """An in-process rank: the worker process itself, in this task's thread."""
    from distributed import secede

    from .inprocess import run_member

    secede()
    if local is not None:
        kwargs = {**kwargs, "local": local}
    return run_member(job=job, rank=rank, worker=worker_id, fn=fn, args=args, kwargs=kwargs,
                      calls=_inprocess_calls(job["id"], worker_id), wiring_timeout=float(job["wiringTimeoutSeconds"]))


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


class MPIJob:
    """A job created on the sidecar with one Dask future per rank, each left on its worker.

    ``futures`` are in rank order; ``release()`` gives the members back (cancelling the ranks
    that have not finished). run_mpi gathers and releases; other front ends may keep the futures.
    """

    def __init__(self, client, job: dict, futures: list):
        self.client = client
        self.job = job
        self.id: str = job["id"]
        self.mode: str = job.get("mode", "fork")
        self.members = sorted(job["members"], key=lambda m: m["rank"])
        self.futures = futures

    def release(self) -> None:
        for f in self.futures:
            if not f.done():
                f.cancel()
        self.client.sync(self.client.scheduler.dask_pmix_release_job, job_id=self.id)


def start_job(client, fn: Callable, args: tuple = (), kwargs: dict | None = None, *, n: int | None = None,
              workers: list[str] | None = None, pset: str | None = None, impl: str = "openmpi",
              mode: str | None = None, timeout: float | None = None, wiring_timeout: float | None = None,
              local: Iterable | None = None) -> MPIJob:
    """Creates the job on the sidecar and submits one task per rank (the part of run_mpi that
    leaves the futures on the workers). See run_mpi for the arguments."""
    if mode not in (None, "inprocess", "fork"):
        raise ValueError(f"mode must be 'inprocess' or 'fork', not {mode!r}")
    kwargs = dict(kwargs or {})
    local_by_worker = None
    if local is not None:
        local_by_worker = _holders(client, local)
        if workers is None and pset is None and n is None:
            workers = sorted(local_by_worker)
    created = client.sync(client.scheduler.dask_pmix_create_job, workers=workers, n=n, pset=pset, impl=impl,
                          owner=client.id, timeout=timeout, wiring_timeout=wiring_timeout, mode=mode or "inprocess")
    if "error" in created:
        raise MPIJobError(created["error"])
    job = created["job"]
    if job.get("mode") == "fork" and job.get("modeReason"):
        # Asked for explicitly, in-process not being possible deserves a warning; by default it
        # is what MPICH and mixed clusters do.
        (logger.warning if mode == "inprocess" else logger.info)(
            "dask-pmix: job %s runs in fork mode: %s", job["id"], job["modeReason"])
    mpi_job = MPIJob(client, job, [])
    try:
        for m in mpi_job.members:
            worker_id = m["workerId"]
            mine = local_by_worker.get(worker_id, []) if local_by_worker is not None else None
            key = f"dask-pmix-{job['id']}-rank-{m['rank']}"
            if mpi_job.mode == "inprocess":
                f = client.submit(_inprocess_task, job, m["rank"], worker_id, fn, args, kwargs, mine, key=key,
                                  workers=[worker_id], allow_other_workers=False, pure=False, retries=0,
                                  priority=RANK_PRIORITY)
            else:
                f = client.submit(_member_task, job["id"], m["rank"], worker_id, created["envs"][worker_id], impl, fn,
                                  args, kwargs, timeout, mine, key=key, workers=[worker_id], allow_other_workers=False,
                                  pure=False, retries=0, priority=RANK_PRIORITY)
            mpi_job.futures.append(f)
    except BaseException:
        mpi_job.release()
        raise
    return mpi_job


def run_mpi(client, fn: Callable, *args, n: int | None = None, workers: list[str] | None = None,
            pset: str | None = None, impl: str = "openmpi", mode: str | None = None, timeout: float | None = None,
            wiring_timeout: float | None = None, local: Iterable | None = None, **kwargs) -> list:
    """Runs ``fn(comm, *args, **kwargs)`` on each chosen worker as one MPI job; results in rank order.

    Members are ``workers`` (addresses), the members of ``pset``, ``n`` workers chosen by the
    sidecar, or, given ``local`` (futures of data already in the cluster), the workers holding
    that data; each rank then also gets ``local=[...]``: the values of the futures its own worker
    holds, which do not move. ``comm`` is an mpi4py communicator over exactly the members.

    ``mode="inprocess"`` (the default for Open MPI) runs ``fn`` inside the worker processes
    themselves, in a task thread, on a communicator built from the workers' long-lived MPI pool
    session; where that cannot serve (a member outside the pool, members in different pool
    epochs, MPICH or Intel MPI) the job runs in fork mode instead and the reason is logged (and
    recorded in the job's ``modeReason``). ``mode="fork"`` runs each rank in a child process of
    its worker, isolated from it.

    The members are frozen (Dask will not retire them) until the job ends, and released
    afterwards whatever happens. Raises MPIJobError naming the rank, the worker and the reason
    when the job fails.
    """
    job = start_job(client, fn, args, kwargs, n=n, workers=workers, pset=pset, impl=impl, mode=mode,
                    timeout=timeout, wiring_timeout=wiring_timeout, local=local)
    try:
        return _gather(client, job.id, job.members, job.futures)
    finally:
        job.release()


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
    reported why (its exception, which comes soon if its worker lives), that report wins. A rank
    whose worker died never reports."""
    job = client.sync(client.scheduler.dask_pmix_job, job_id=job_id)
    members_now = job.get("members", [])
    culprit = next((m for m in members_now if m.get("endedJob")), None)
    if culprit is None and job.get("state") in FAILED_STATES and job.get("error"):
        # Ended for a reason of its own (a timeout, a DELETE): members that failed afterwards,
        # because it ended, are not to blame.
        return MPIJobError(job["error"], job_id=job_id)
    if culprit is None:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            time.sleep(0.05)
        culprit = next((m for m in members_now if m.get("state") == "lost"), None)
    if culprit is not None:
        mine = futures[culprit["rank"]]
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline and not mine.done():
            time.sleep(0.02)
        own = _own_error(mine)
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
