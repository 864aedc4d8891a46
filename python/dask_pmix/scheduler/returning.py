"""Workers the cluster lost that are expected back, as the scheduler sees them.

A worker with a nanny whose process died (a crash, a kill, a memory kill) is restarted by its
nanny; a worker dask-pmix replaces (dask_pmix.scheduler.replace) is retired and then restarted
through its nanny. Either comes back within seconds, usually under a new address. The plugin
tells the sidecar so when it removes the worker (DELETE /v1/workers/{id}?returning=true): a job
request whose selector is short of workers by no more than those waits for them, within its
wiring timeout, instead of failing at once (src/rm/returning.ts). Here the plugin keeps the same
account for its own first check of a request (``n`` larger than the cluster and those expected
back together fails at once, with what to do).

Dask's deliberate removals are not expected back: a retirement (``retire_workers``, adaptive
scaling, ``cluster.scale``: stimulus ``retire-workers-...``) and a worker closing itself
gracefully (``--lifetime``: ``worker-close-gracefully-...``); nor is a worker without a nanny."""

from __future__ import annotations

import time

# Stimulus ids of Dask's removals that mean the worker is gone for good.
DELIBERATE = ("retire-workers", "worker-close-gracefully")


def comes_back(has_nanny: bool, stimulus_id: str | None, replacing: bool = False) -> bool:
    """Whether a worker removed with `stimulus_id` is expected back."""
    if replacing:
        return True
    return has_nanny and not (stimulus_id or "").startswith(DELIBERATE)


class Returning:
    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._left: dict[str, tuple[str, float]] = {}  # address -> (host, when it left), oldest first

    def left(self, address: str, host: str) -> None:
        self._left.pop(address, None)
        self._left[address] = (host, time.monotonic())
        while len(self._left) > self.limit:
            del self._left[next(iter(self._left))]

    def joined(self, address: str, host: str) -> None:
        """A worker joined the cluster: the one that left under its address, or the oldest that
        left from its host (a restarted worker usually has a new address)."""
        if self._left.pop(address, None) is not None:
            return
        for a, (h, _) in self._left.items():
            if h == host:
                del self._left[a]
                return

    def count(self, within: float) -> int:
        """How many left at most `within` seconds ago."""
        now = time.monotonic()
        return sum(1 for _, when in self._left.values() if now - when <= within)

    def has(self, address: str, within: float) -> bool:
        entry = self._left.get(address)
        return entry is not None and time.monotonic() - entry[1] <= within
