"""The members of one in-process job meeting at the scheduler plugin before they build its
communicator (which cannot be interrupted): see SidecarPlugin.join_job."""

from __future__ import annotations

import asyncio


class JoinBarrier:
    """The members of one in-process job waiting here until all are there."""

    __slots__ = ("ready", "waiters", "present")

    def __init__(self) -> None:
        self.ready = False
        self.waiters: set[asyncio.Future] = set()
        self.present: dict[str, int] = {}  # worker -> its join calls waiting here now

    def wake(self, ready: bool = False) -> None:
        """Answers every waiting member: all are there (ready), or ask the sidecar again."""
        self.ready = self.ready or ready
        for f in self.waiters:
            if not f.done():
                f.set_result(ready)
        self.waiters.clear()
