"""The task of each rank, as it runs on its worker: the entry points that run_mpi's graph names
(by import path: the client imports none of this)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable


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


def fork_rank(job_id: str, rank: int, worker_id: str, env: dict, impl: str, fn: Callable, args: tuple,
                 kwargs: dict, timeout: float | None, local: list | None) -> Any:
    """A fork-mode rank: a child of the worker joins the job as a new process."""
    from distributed import secede

    from .fork import run_rank

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

    def join(wait: float, ports: dict | None = None) -> dict:
        try:
            return sync(worker.loop, worker.scheduler.dask_pmix_join_job, job_id=job_id, worker=worker_id, wait=wait,
                        **({"ports": ports} if ports is not None else {}))
        except Exception as e:  # noqa: BLE001
            return {"error": f"the scheduler could not be asked: {e}"}

    def leave(ok: bool, reason: str, failed_ranks: list) -> Any:
        if ok:
            # Not waited for: the result goes back at once; whoever releases the job waits for the
            # sidecar to have heard every member (run_mpi's release does).
            asyncio.run_coroutine_threadsafe(
                worker.scheduler.dask_pmix_leave_job(job_id=job_id, worker=worker_id, ok=True, reason="",
                                                     failed_ranks=[]), worker.loop.asyncio_loop)
            return None
        return sync(worker.loop, worker.scheduler.dask_pmix_leave_job, job_id=job_id, worker=worker_id, ok=ok,
                    reason=reason, failed_ranks=failed_ranks)

    def restart(reason: str) -> Any:
        return sync(worker.loop, worker.scheduler.dask_pmix_restart_worker, worker=worker.address, reason=reason)

    return SidecarCalls(join=join, leave=leave, state=state, restart=restart)


def inprocess_rank(job: dict, rank: int, worker_id: str, fn: Callable, args: tuple, kwargs: dict,
                    local: list | None, build_timeout: float | None = None) -> Any:
    """An in-process rank: the worker process itself, in this task's thread."""
    from distributed import secede

    from .inprocess import run_member

    secede()
    if local is not None:
        kwargs = {**kwargs, "local": local}
    return run_member(job=job, rank=rank, worker=worker_id, fn=fn, args=args, kwargs=kwargs,
                      calls=_inprocess_calls(job["id"], worker_id), wiring_timeout=float(job["wiringTimeoutSeconds"]),
                      build_timeout=build_timeout)
