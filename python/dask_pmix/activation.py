"""Keeps a process's own MPI progress away from communicators being built in it.

Open MPI 5.0.x's ob1 keeps a message for a communicator it does not know yet on a list that the
new communicator's activation (mca_pml_ob1_add_comm) scans once, unlocked; a second thread
progressing MPI in that gap can leave the activation's first message behind the scan, and
MPI_Comm_create_from_group then never returns on that member. Seen here with the comm backend's
progress thread moving Dask data while a job's communicator was built (the job failed at the
communicator bound, 1 in about 60 jobs), as before with a cancelled job's rank still in its Barrier.

So while a communicator is being built in this process, the threads of ours that call MPI for
other reasons (the comm backend's engine) stay out: they run their MPI calls inside ``progress()``,
and ``building()`` waits until they are out and keeps them out until the communicator exists.
Builders never wait for each other: a communicator is collective over processes that may each be
building another one at the same time, and making them queue could close a cycle between hosts.
A user function's own MPI calls are not fenced (they run in the job's thread, one job at a time).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class Gate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._building = 0      # communicators being built now
        self._arriving = 0      # builders waiting for the progress sections to end
        self._progressing = 0   # progress sections running now

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
            self._building += 1
        try:
            yield
        finally:
            with self._cond:
                self._building -= 1
                self._cond.notify_all()

    @contextmanager
    def progress(self) -> Iterator[None]:
        """Around one round of MPI calls that progress MPI (post, test, probe). Waits while a
        communicator is being built or about to be."""
        with self._cond:
            self._cond.wait_for(lambda: self._building == 0 and self._arriving == 0)
            self._progressing += 1
        try:
            yield
        finally:
            with self._cond:
                self._progressing -= 1
                if self._progressing == 0:
                    self._cond.notify_all()

    def busy(self) -> bool:
        """Whether a communicator is being built (or about to be) in this process."""
        return self._building > 0 or self._arriving > 0


GATE = Gate()
