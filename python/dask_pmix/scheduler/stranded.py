"""Rank tasks left with nowhere to run: their worker is gone, and nothing can compute them again.

A rank's task is pinned to its member's worker. When that worker leaves, Dask releases the task
and, finding no worker it may run on, leaves it in no-worker for good, so its future would never
finish: a `wait(futures)` or `as_completed` over a job's futures would hang. Two cases:

- the rank had returned and its result went with its worker (found by the plugin's transition
  hook, before the job's end is known);
- the rank was running when its worker left: the sidecar fails the job, naming the member, and
  the rank's task then errs with that job's failure, whichever came first.
"""

from __future__ import annotations

import time

from ..errors import Failure, MPIJobError
from ..protocol import rank_key
from . import queued
from .jobs import Entry


def result_lost(scheduler, key: str, job_id: str, rank: int, worker: str) -> bool:
    """The rank's future raises member-lost, if its task still has nowhere to run: its result went
    with its worker. Whether it erred."""
    ts = scheduler.tasks.get(key)
    if ts is None or ts.state != "no-worker":
        return False
    error = MPIJobError(
        f"rank {rank}'s result was lost with its worker {worker}, which left after the rank returned and before "
        "the result was gathered",
        job_id=job_id,
        rank=rank,
        worker=worker,
        kind=Failure.MEMBER_LOST,
        lost_workers=[worker],
    )
    queued.fail(scheduler, [key], error, f"dask-pmix-result-lost-{key}-{time.time()}")
    return True


def lost_while_running(scheduler, entry: Entry, prefixes: list[str]) -> list[str]:
    """The ranks of the ended job `entry` whose worker left while they ran err with its failure.
    `prefixes`: what the job's rank keys are named after (its id, or the ticket of its request).
    Returns the keys erred."""
    erred = []
    for rank in range(len(entry.workers)):
        worker = entry.worker_of(rank)
        if worker is None or worker in scheduler.workers:
            continue
        for prefix in prefixes:
            key = rank_key(prefix, rank)
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state != "no-worker":
                continue
            error = MPIJobError(
                f"rank {rank}'s worker {worker} left while the rank ran; job {entry.id} {entry.state}: "
                f"{entry.view.get('error') or 'a member was lost'}",
                job_id=entry.id,
                rank=rank,
                worker=worker,
                kind=Failure.MEMBER_LOST,
                lost_workers=[worker],
            )
            queued.fail(scheduler, [key], error, f"dask-pmix-member-gone-{key}-{time.time()}")
            erred.append(key)
    return erred
