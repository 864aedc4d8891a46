"""What this worker process knows of the jobs its members are in, as the scheduler pushes it.

The scheduler plugin sends each member's worker every change of its job (Stream.JOB over Dask's
scheduler-to-worker stream); the worker plugin's stream handler calls ``update`` on the event
loop. Member threads wait here for a change (``wait``), and a fork-mode rank's supervisor waits
on a pipe that turns readable at each change of its job (``fd``): nobody asks the scheduler
for a job's state in a loop."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable

from ..protocol import FAILED_STATES

# Jobs remembered after their last change (a member may look at its job after it ended).
KEPT = 1024

_cond = threading.Condition()
_jobs: collections.OrderedDict[str, dict] = collections.OrderedDict()
_pipes: dict[str, list[int]] = {}  # job id -> write ends of the pipes of those waiting on fds
_changes = 0  # counts every change and poke: what wait_change waits for


def update(job: dict) -> None:
    """A pushed change of `job` (protocol.job_view)."""
    job_id = job.get("id")
    if not job_id:
        return
    global _changes
    with _cond:
        _changes += 1
        _jobs[job_id] = job
        _jobs.move_to_end(job_id)
        while len(_jobs) > KEPT:
            _jobs.popitem(last=False)
        writers = list(_pipes.get(job_id, ()))
        _cond.notify_all()
    for w in writers:
        try:
            os.write(w, b"!")
        except OSError:  # full (the reader is behind: it reads the latest state anyway) or closed
            pass


def poke() -> None:
    """Wakes whoever waits for a change (something else they look at has changed)."""
    global _changes
    with _cond:
        _changes += 1
        _cond.notify_all()


def changes() -> int:
    with _cond:
        return _changes


def wait_change(seen: int, timeout: float | None) -> None:
    """Waits until anything changed after `seen` (a count from changes()), or `timeout` s."""
    with _cond:
        _cond.wait_for(lambda: _changes != seen, timeout=timeout)


def fail_locally(job_id: str, reason: str) -> None:
    """The job fails as this worker sees it (its scheduler is gone): as if it had been pushed."""
    with _cond:
        job = dict(_jobs.get(job_id) or {"id": job_id, "members": []})
    if job.get("state") not in FAILED_STATES:
        update({**job, "state": "failed", "error": reason})


def get(job_id: str) -> dict | None:
    with _cond:
        job = _jobs.get(job_id)
        return dict(job) if job is not None else None


def failed(job_id: str) -> dict | None:
    """The job, if it has failed (or was aborted)."""
    job = get(job_id)
    return job if job is not None and job.get("state") in FAILED_STATES else None


def wait(job_id: str, done: Callable[[dict | None], bool], timeout: float | None) -> dict | None:
    """Waits until ``done(job)`` holds (job None: nothing pushed yet) or `timeout` s; the job."""
    with _cond:
        _cond.wait_for(lambda: done(_jobs.get(job_id)), timeout=timeout)
        job = _jobs.get(job_id)
        return dict(job) if job is not None else None


class Watch:
    """A pipe that turns readable whenever `job_id` changes, and once at the start (for select
    loops); close it."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)
        with _cond:
            _pipes.setdefault(job_id, []).append(self._w)
        os.write(self._w, b"!")  # readable at once: what was pushed before this watch is looked at too

    def drain(self) -> dict | None:
        """Empties the pipe; the job's latest state."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass
        return get(self.job_id)

    def close(self) -> None:
        with _cond:
            ws = _pipes.get(self.job_id, [])
            if self._w in ws:
                ws.remove(self._w)
            if not ws:
                _pipes.pop(self.job_id, None)
        os.close(self.fd)
        os.close(self._w)
