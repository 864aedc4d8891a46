"""The MPI job members that run in this worker process, as the rest of the worker sees them.

A member (dask_pmix.member) enters here when its task starts and leaves when its thread has left
every MPI call of its job. The worker plugin answers the scheduler from this registry, a new
member waits here for the members of earlier jobs to leave, and the pool's finalize asks it
whether a thread may still be inside MPI."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_cond = threading.Condition()
_running: dict[str, int] = {}  # job id -> members of it running here now
# Communicators of failed jobs that members left behind (kept, not freed).
_left_behind = 0


def enter(job_id: str) -> None:
    with _cond:
        _running[job_id] = _running.get(job_id, 0) + 1


def leave(job_id: str) -> None:
    with _cond:
        left = _running.get(job_id, 0) - 1
        if left > 0:
            _running[job_id] = left
        else:
            _running.pop(job_id, None)
        _cond.notify_all()


def running(job_id: str) -> bool:
    """Whether a member of ``job_id`` still runs in this process."""
    with _cond:
        return job_id in _running


def left_behind(count: int) -> None:
    """How many communicators of failed jobs the members keep now."""
    global _left_behind
    with _cond:
        _left_behind = count


def in_flight() -> bool:
    """Whether a thread of this process may still be inside MPI: a member runs, or a job failed
    here and left a communicator behind. MPICH's finalize corrupts its heap then."""
    with _cond:
        return bool(_running) or _left_behind > 0


def wait_alone(job_id: str, bound: float, end: Callable[[str], None]) -> list[str]:
    """Waits until no member of another job runs in this process, calling ``end(job)`` once for
    each such job (outside the lock); returns the jobs still there after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    ended: set[str] = set()
    with _cond:
        while True:
            others = [j for j in _running if j != job_id]
            if not others:
                return []
            for j in others:
                if j not in ended:
                    ended.add(j)
                    _cond.release()
                    try:
                        end(j)
                    finally:
                        _cond.acquire()
            left = deadline - time.monotonic()
            if left <= 0:
                return others
            _cond.wait(left)
