"""The task of each rank, as it runs on its worker: the entry points that run_mpi's graph names
(by import path: the client imports none of this). Both secede from the worker's thread pool:
the worker keeps running other tasks while the job runs.

A member talks to the scheduler plugin over the worker's own connection to the scheduler
(joining, leaving, asking for its worker's replacement) and hears of its job's changes from the
scheduler's pushes (dask_pmix.worker.jobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import Scheduler


def _scheduler_call(dask_worker, handler: str, **kwargs: Any) -> Any:
    """A call of a scheduler handler from a task thread (blocks the thread, never the loop)."""
    from distributed.utils import sync

    return sync(dask_worker.loop, getattr(dask_worker.scheduler, handler), **kwargs)


def _calls(job_id: str, worker_id: str):
    from distributed import get_worker

    from .watcher import Calls

    worker = get_worker()

    def join(wait: float, ports: dict | None = None) -> dict:
        try:
            return _scheduler_call(
                worker,
                Scheduler.JOIN_JOB,
                job_id=job_id,
                worker=worker_id,
                wait=wait,
                **({"ports": ports} if ports is not None else {}),
            )
        except Exception as e:  # noqa: BLE001
            return {"error": f"the scheduler could not be asked: {e}"}

    def leave(ok: bool, reason: str, failed_ranks: list) -> Any:
        return _scheduler_call(
            worker,
            Scheduler.LEAVE_JOB,
            job_id=job_id,
            worker=worker_id,
            ok=ok,
            reason=reason,
            failed_ranks=failed_ranks,
        )

    def replace(reason: str) -> Any:
        return _scheduler_call(worker, Scheduler.REPLACE_WORKER, worker=worker.address, reason=reason)

    return Calls(join=join, leave=leave, replace=replace)


def _function(fn: bytes | Callable) -> Callable:
    """The job's function (its bytes, as run_mpi pickled it once for every rank)."""
    if isinstance(fn, bytes):
        import cloudpickle

        return cloudpickle.loads(fn)
    return fn


def inprocess_rank(
    job: dict,
    rank: int,
    worker_id: str,
    fn: bytes | Callable,
    args: tuple,
    kwargs: dict,
    local: list | None,
    build_timeout: float | None = None,
) -> Any:
    """An in-process rank: the worker process itself, in this task's thread."""
    from distributed import secede

    from .inprocess import run_member

    secede()
    fn = _function(fn)
    if local is not None:
        kwargs = {**kwargs, "local": local}
    return run_member(
        job=job,
        rank=rank,
        worker=worker_id,
        fn=fn,
        args=args,
        kwargs=kwargs,
        calls=_calls(job["id"], worker_id),
        wiring_timeout=float(job["wiringTimeoutSeconds"]),
        build_timeout=build_timeout,
    )


def admitted_rank(
    admission: dict,
    rank: int,
    fn: bytes | Callable,
    args: tuple,
    kwargs: dict,
    build_timeout: float | None,
    impl: str,
    timeout: float | None,
) -> Any:
    """A rank of a job submitted before it was admitted (submit_mpi): the scheduler plugin put the
    admitted job, this rank's worker and (fork mode) its environment in `admission` when it pinned
    the task to its member; the mode is the one the sidecar chose."""
    job = admission.get("job")
    if not job:
        from ..errors import MPIJobError

        raise MPIJobError("the rank's task ran before its job was admitted (is the dask-pmix scheduler plugin there?)")
    worker_id = admission["worker"]
    if job.get("mode") == "inprocess":
        return inprocess_rank(job, rank, worker_id, fn, args, kwargs, None, build_timeout)
    return fork_rank(
        job["id"], rank, worker_id, admission["env"], impl, fn, args, kwargs, timeout, None, job.get("modeReason") or ""
    )


def fork_rank(
    job_id: str,
    rank: int,
    worker_id: str,
    env: dict,
    impl: str,
    fn: bytes | Callable,
    args: tuple,
    kwargs: dict,
    timeout: float | None,
    local: list | None,
    mode_reason: str = "",
) -> Any:
    """A fork-mode rank: a child of the worker joins the job as a new process."""
    from distributed import get_worker, secede

    from .fork import run_rank

    secede()
    fn = _function(fn)
    if local is not None:
        kwargs = {**kwargs, "local": local}
    worker = get_worker()

    def lost(reason: str) -> None:
        _scheduler_call(worker, Scheduler.MEMBER_LOST, job_id=job_id, worker=worker_id, reason=reason)

    return run_rank(
        job_id=job_id,
        rank=rank,
        worker=worker_id,
        env=env,
        impl=impl,
        fn=fn,
        args=args,
        kwargs=kwargs,
        report_lost=lost,
        timeout=timeout,
        mode_reason=mode_reason,
    )
