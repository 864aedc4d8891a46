"""The members of an in-process job meeting at the scheduler plugin before they build its
communicator (which cannot be interrupted, so none may enter it while another may never come).

Members wait here, never in a request held open at the sidecar. When every member of a job the
plugin knows is here at once (the usual case), the barrier is met here and the sidecar hears of no
join: the communicator's group construct tells it every member is there. A member left waiting
longer than QUIET tells the sidecar, which records the join (and so can name the members that
never came when the job's wiring times out) and says whether every member has joined there.
Either way the answer that all are there wakes them all. An MPICH / Intel MPI member brings the
ports it accepts on and needs everyone's: it joins at the sidecar itself, which holds them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..errors import SidecarError
from ..rest import AsyncSidecarClient

# A member waits here at most this long before it asks again (the barrier learns of a job that
# ended from the plugin, and of anything missed at the next round).
ROUND = 1.0
# How long a member of a job whose members the plugin knows waits for the others here before it
# tells the sidecar it is there.
QUIET = 0.25


class _Barrier:
    __slots__ = ("ready", "waiters", "present")

    def __init__(self) -> None:
        self.ready = False
        self.waiters: set[asyncio.Future] = set()
        self.present: dict[str, int] = {}  # worker -> its join calls waiting here now

    def wake(self, ready: bool = False) -> None:
        """Answers every waiting member: all are there (ready), or ask again."""
        self.ready = self.ready or ready
        for f in self.waiters:
            if not f.done():
                f.set_result(ready)
        self.waiters.clear()


class JoinBarriers:
    def __init__(self, rest: Callable[[], AsyncSidecarClient], members: Callable[[str], set[str] | None]):
        self.rest = rest
        self.members = members  # job id -> its member workers, if the plugin knows them
        self._barriers: dict[str, _Barrier] = {}

    def wake(self, job_id: str | None = None) -> None:
        """Members waiting to join `job_id` (all, with None) ask again: the job ended, or the
        plugin may have missed that it did."""
        for jid, barrier in list(self._barriers.items()):
            if job_id is None or jid == job_id:
                barrier.wake()

    async def join(self, job_id: str, worker: str, wait: float, ports: dict | None = None) -> dict:
        if ports is not None:
            try:
                return await self.rest().join_job(job_id, worker, float(wait), ports)
            except SidecarError as e:
                return {"error": e.message, "status": e.status}
        barrier = self._barriers.get(job_id)
        if barrier is not None and barrier.ready:
            return {"ready": True}
        if barrier is None:
            barrier = self._barriers[job_id] = _Barrier()
        members = self.members(job_id)
        loop = asyncio.get_running_loop()
        round_end = loop.time() + max(0.0, min(float(wait), ROUND))
        waiter = loop.create_future()
        barrier.waiters.add(waiter)
        barrier.present[worker] = barrier.present.get(worker, 0) + 1
        try:
            if members and worker in members and members.issubset(barrier.present):
                barrier.wake(ready=True)
                return {"ready": True}
            if members and worker in members:
                await asyncio.wait([waiter], timeout=min(QUIET, max(0.0, round_end - loop.time())))
                if waiter.done() and waiter.result():
                    return {"ready": True}
            try:
                answer = await self.rest().join_job(job_id, worker, 0.0)
            except SidecarError as e:
                barrier.wake()  # the others ask again and hear the same
                return {"error": e.message, "status": e.status}
            if answer.get("ready") or (waiter.done() and waiter.result()):
                barrier.wake(ready=True)
                return {"ready": True}
            if not waiter.done():
                await asyncio.wait([waiter], timeout=max(0.0, round_end - loop.time()))
            return {"ready": bool(waiter.done() and waiter.result())}
        finally:
            barrier.waiters.discard(waiter)
            barrier.present[worker] -= 1
            if not barrier.present[worker]:
                del barrier.present[worker]
            if not barrier.present and self._barriers.get(job_id) is barrier:
                del self._barriers[job_id]
