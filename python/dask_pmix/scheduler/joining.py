"""Workers whose MPI session starts together with others of its pool epoch (a cohort).

Open MPI starts the sessions of a cohort together (the ranks that share a node wait up to 2 s for
each other's shared memory inside MPI_Session_init): a member that exits meanwhile fails the
others' sessions, and those workers are then replaced. Dask's downscaling (retire_workers without
a list, adaptive scaling) therefore leaves every member of a cohort alone while any of them is
still starting its session: from the pool's answer to its join until it says its session is up
(or failed), for at most `bound` seconds, so that a session that never comes up does not hold
the workers forever."""

from __future__ import annotations

import time


class CohortJoining:
    def __init__(self, bound: float = 30.0):
        # The plugin sets it from timeouts.pool-join when it starts on the scheduler.
        self.bound = bound
        self._epochs: dict[int, dict[str, bool]] = {}  # epoch -> {worker: its session is up}
        self._since: dict[int, float] = {}  # epoch -> when its last member was answered

    def answered(self, worker: str, seat: dict) -> None:
        """The pool answered the worker's join with `seat`; its session starts now."""
        if seat.get("impl") not in (None, "", "IMPL_UNSPECIFIED") or len(seat.get("localPeers") or ()) < 2:
            return  # a world of its own (MPICH), or alone on its node: nobody waits for it
        epoch = int(seat.get("epoch") or 0)
        self._epochs.setdefault(epoch, {})[worker] = False
        self._since[epoch] = time.monotonic()

    def started(self, worker: str) -> None:
        """The worker's session is up, or failed: it waits for nobody any more."""
        for epoch, members in list(self._epochs.items()):
            if worker in members:
                members[worker] = True
                self._forget_if_done(epoch)

    def gone(self, worker: str) -> None:
        for epoch, members in list(self._epochs.items()):
            if members.pop(worker, None) is not None:
                self._forget_if_done(epoch)

    def _forget_if_done(self, epoch: int) -> None:
        if all(self._epochs[epoch].values()):
            del self._epochs[epoch]
            self._since.pop(epoch, None)

    def held(self) -> set[str]:
        """Every member of a cohort in which a session is still starting (for less than `bound` s)."""
        now = time.monotonic()
        out: set[str] = set()
        for epoch, members in list(self._epochs.items()):
            if now - self._since[epoch] >= self.bound:
                del self._epochs[epoch]
                del self._since[epoch]
            else:
                out.update(members)
        return out
