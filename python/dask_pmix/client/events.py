"""The end of this client's jobs, as the scheduler plugin pushes it (a Dask event of topic
Topic.JOB, sent to the client that created the job). run_mpi waits on it beside its ranks'
futures: a rank whose worker died has a task that never runs, so its future alone would wait
forever. Nothing here asks the scheduler anything."""

from __future__ import annotations

import asyncio
import collections
import weakref

from ..protocol import Topic

# Ends heard before anyone waited for them (the event can come before create_job's answer).
EARLY_KEPT = 1024


class JobEnds:
    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future] = {}
        self._early: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def handle(self, event) -> None:
        _, job = event
        job_id = job.get("id") if isinstance(job, dict) else None
        if not job_id:
            return
        waiter = self._waiting.get(job_id)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(job)
            return
        self._early[job_id] = job
        while len(self._early) > EARLY_KEPT:
            self._early.popitem(last=False)

    def expect(self, job_id: str) -> asyncio.Future:
        """A future of the job's view when it ends (at once if it has)."""
        waiter = self._waiting.get(job_id)
        if waiter is None:
            waiter = self._waiting[job_id] = asyncio.get_running_loop().create_future()
            early = self._early.pop(job_id, None)
            if early is not None:
                waiter.set_result(early)
        return waiter

    def forget(self, job_id: str) -> None:
        self._waiting.pop(job_id, None)
        self._early.pop(job_id, None)


_ends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def job_ends(client) -> JobEnds:
    """This client's JobEnds, subscribed to the scheduler's pushes on first use."""
    ends = _ends.get(client)
    if ends is None:
        ends = _ends[client] = JobEnds()
        client.subscribe_topic(Topic.JOB, ends.handle)
    return ends
