"""Keeps a process's own MPI progress away from communicators being built in it.

Open MPI 5.0.x's ob1 keeps a message for a communicator it does not know yet on a list that the
new communicator's activation (mca_pml_ob1_add_comm) scans once, unlocked; a second thread
progressing MPI in that gap can leave the activation's first message behind the scan, and
MPI_Comm_create_from_group then never returns on that member. The comm backend's progress
thread moving Dask data while a job's communicator is built is such a second thread, as is a
cancelled job's rank still in its Barrier.

So while a communicator is being built in this process, the threads of ours that call MPI for
other reasons (the comm backend's engine) stay out: they run their MPI calls inside ``progress()``,
and ``building()`` waits until they are out and keeps them out until the communicator exists.

A job and the comm backend's pair communicators must not be built at the same time either (each
build progresses MPI while the other activates: seen as a job's and a pair's construction hung
together on one worker). Builders cannot simply queue, though: a communicator is collective over
processes that may each be building another one, and a queue could close a cycle between hosts.
So a new pair communicator is agreed on only while no job runs in the process (``reserve_pair``;
otherwise that Dask connection stays TCP), and a job waits before its build for the pairs already
agreed on, whose builds need nothing but their peer's (``job_begins``).
A user function's own MPI calls are not fenced (they run in the job's thread, one job at a time).

A construction whose peer will never call it (the connection that agreed on a pair died before the
peer committed to it) cannot be interrupted: its thread stays in the collective. ``abandon`` stops
counting it, so that nothing here waits for it (comm/pairs.py cancels such a build).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# How long progress stays held back by one communicator's construction. An activation takes
# milliseconds; a construction still running after this is stuck for another reason (a peer that
# never called it), and holding every other transfer of the process behind it would stall the
# worker's whole MPI traffic with it.
HOLD = 2.0


class Gate:
    def __init__(self, hold: float = HOLD) -> None:
        self._cond = threading.Condition()
        self._hold = hold
        self._builds: dict[int, tuple[float, int]] = {}  # communicators being built now: token -> (start, thread)
        self._abandoned: set[int] = set()  # threads whose constructions no longer count (abandon)
        self._tokens = itertools.count()
        self._arriving = 0  # builders waiting for the progress sections to end
        self._progressing = 0  # progress sections running now
        self._jobs = 0  # in-process jobs building or using their communicator here
        self._pairs: dict[int, float] = {}  # pair communicators agreed on, not built: token -> when

    @contextmanager
    def building(self) -> Iterator[None]:
        """Around a communicator's construction. Waits only for the progress sections running
        now, which are short (one round of non-blocking calls)."""
        with self._cond:
            self._arriving += 1
            try:
                self._cond.wait_for(lambda: self._progressing == 0)
            finally:
                self._arriving -= 1
            token = next(self._tokens)
            thread = threading.get_ident()
            if thread not in self._abandoned:
                self._builds[token] = (time.monotonic(), thread)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._builds.pop(token, None)
                self._cond.notify_all()

    def _held_for(self) -> float:
        """Seconds progress is still held back by the constructions under way (0: free to go)."""
        now = time.monotonic()
        return max((start + self._hold - now for start, _ in self._builds.values()), default=0.0)

    @contextmanager
    def progress(self) -> Iterator[None]:
        """Around one round of MPI calls that progress MPI (post, test, probe). Waits while a
        communicator is being built or about to be, for at most HOLD s per construction."""
        with self._cond:
            while True:
                held = self._held_for()
                if held <= 0 and not self._arriving:
                    break
                self._cond.wait(held if held > 0 else None)
            self._progressing += 1
        try:
            yield
        finally:
            with self._cond:
                self._progressing -= 1
                if self._progressing == 0:
                    self._cond.notify_all()

    @contextmanager
    def progress_now(self) -> Iterator[bool]:
        """progress() for a thread that must not wait (the event loop): True inside when the MPI
        calls may run now, False when a communicator is being built or about to be (then the
        caller makes no MPI call and leaves the work to a thread that may wait)."""
        with self._cond:
            free = self._held_for() <= 0 and not self._arriving
            if free:
                self._progressing += 1
        try:
            yield free
        finally:
            if free:
                with self._cond:
                    self._progressing -= 1
                    if self._progressing == 0:
                        self._cond.notify_all()

    def abandon(self, thread: int) -> None:
        """The constructions that thread ``thread`` is in, or enters before ``forget(thread)``, no
        longer count: their peer will never call them, and nothing interrupts the collective."""
        with self._cond:
            self._abandoned.add(thread)
            for token, (_, t) in list(self._builds.items()):
                if t == thread:
                    del self._builds[token]
            self._cond.notify_all()

    def forget(self, thread: int) -> None:
        """Thread ``thread`` is out of MPI: its later constructions count again."""
        with self._cond:
            self._abandoned.discard(thread)

    def reserve_pair(self) -> int | None:
        """A token if a new pair communicator may be agreed on now (no job here), counted until
        ``pair_done(token)``; None if not."""
        with self._cond:
            if self._jobs:
                return None
            token = next(self._tokens)
            self._pairs[token] = time.monotonic()
            return token

    def pair_done(self, token: int | None) -> None:
        if token is None:
            return
        with self._cond:
            self._pairs.pop(token, None)
            self._cond.notify_all()

    def job_begins(self, timeout: float) -> bool:
        """An in-process job is about to build its communicator: no new pair is agreed on until
        ``job_ends``, and the pairs agreed on within the last ``timeout`` s are waited for (an
        older one is stuck for another reason). False if one was left: the job goes on, its
        communicator bound still holds."""
        with self._cond:
            self._jobs += 1
            while True:
                now = time.monotonic()
                left = max((start + timeout - now for start in self._pairs.values()), default=0.0)
                if left <= 0:
                    return not self._pairs
                self._cond.wait(left)

    def job_ends(self) -> None:
        with self._cond:
            self._jobs -= 1

    def busy(self) -> bool:
        """Whether a communicator is being built (or about to be) in this process."""
        return bool(self._builds) or self._arriving > 0


GATE = Gate()
