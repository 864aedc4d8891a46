"""Members of failed in-process jobs still stuck some seconds later, bounded from outside them.

A member's own watcher thread (dask_pmix.member.inprocess) restarts its worker when the member is still
running GRACE s after its job failed. It cannot when the member's thread holds the interpreter
lock inside MPI: mpi4py's lowercase collectives duplicate the communicator first
(MPI_Comm_dup, measured stuck in ompi_comm_nextcid -> opal_progress), and the whole worker then
runs no Python at all, answering neither Dask's heartbeats nor the sidecar. The scheduler plugin
therefore asks every member of a failed in-process job, CHECK_AFTER s after the job ended,
whether it still runs a member of that job; one that says so, or gives no answer within
ANSWER_WITHIN s, is restarted through its nanny (a separate process, which kills it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

from ..protocol import Worker

logger = logging.getLogger("dask_pmix")

# Past the member's own watcher (3 s after the job failed, plus at most 1 s keeping MPI
# progressing for the others), with room for a loaded machine.
CHECK_AFTER = 10.0
# A worker whose event loop runs answers at once; generous for a loaded CI machine.
ANSWER_WITHIN = 10.0


class StuckMembers:
    """Runs on the scheduler's event loop: ``job_ended`` starts one bounded check per job."""

    def __init__(self, scheduler, restart: Callable[[str, str], Awaitable]):
        self.scheduler = scheduler
        self.restart = restart
        self._tasks: set[asyncio.Task] = set()

    def job_ended(self, job_id: str, workers: Iterable[str]) -> None:
        task = asyncio.ensure_future(self._check(job_id, list(workers)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _check(self, job_id: str, workers: list[str]) -> None:
        await asyncio.sleep(CHECK_AFTER)
        await asyncio.gather(*(self._check_one(job_id, w) for w in workers), return_exceptions=True)

    async def _check_one(self, job_id: str, worker: str) -> None:
        if worker not in self.scheduler.workers:
            return  # gone already (its watcher restarted it, or it died): a new worker has a new address
        try:
            running = await asyncio.wait_for(getattr(self.scheduler.rpc(worker), Worker.MEMBER_RUNNING)(job_id=job_id), ANSWER_WITHIN)
        except asyncio.TimeoutError:
            reason = (f"it gave no answer within {ANSWER_WITHIN:g} s, {CHECK_AFTER:g} s after its in-process job "
                      f"{job_id} failed (a thread stuck in MPI holding the interpreter lock)")
        except Exception as e:  # noqa: BLE001 - gone meanwhile, or a worker without the pool plugin
            logger.debug("dask-pmix: could not ask %s about job %s: %r", worker, job_id, e)
            return
        else:
            if not running:
                return
            reason = f"its member of job {job_id} was still running {CHECK_AFTER:g} s after the job failed"
        if worker in self.scheduler.workers:
            await self.restart(worker, reason)
