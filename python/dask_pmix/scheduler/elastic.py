"""Elastic jobs at the scheduler: Dask decides which workers go, the jobs comply at their commits.

An elastic job (dask_pmix.run_elastic) runs as generations, each a job on the sidecar labelled
with the job's family (protocol.ELASTIC_LABEL). At each commit its rank 0 asks here whether the
members should change (Scheduler.ELASTIC_CHANGE):

- **leave**: members that Dask wants to retire. ``client.retire_workers()``, ``cluster.scale()``
  and a worker's lifetime all reach the scheduler's ``retire_workers`` handler, which this wraps:
  a worker that is a member of an elastic job is asked to leave at the job's next commit, and the
  retirement waits for that, at most ``dask-pmix.timeouts.drain``, then goes on as Dask's own
  (after the bound, the job loses the member and goes on from its last commit). Adaptive scaling
  asks ``workers_to_close`` which workers it may close, and Dask never offers one running a
  long-running task, which every member's rank task is: this wraps that handler too, and when it
  gives fewer workers than Adaptive wants, that many elastic members (the highest ranks first) are
  asked to leave at their jobs' next commit, so that a later round finds them free. Never below a
  job's minimum.
- **join**: while the job is below its maximum, workers that could serve it and serve nobody:
  in the cluster and running, in the same pool epoch as the members with a ready seat, in no job,
  not being retired.

Each drain request and how it ended (honoured at a commit, lapsed, overdue, withdrawn) is recorded
on the sidecar (PUT /v1/elastic/{id}/drains/{worker}), in the order it happened, off the handlers'
path: GET /v1/elastic shows them beside the job's generations.

Plain Python on the scheduler's event loop; the only waits are the retirement's (bounded) and the
sidecar's worker list (cached for a second)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..protocol import ELASTIC_LABEL

logger = logging.getLogger("dask_pmix")

# The sidecar's worker list, as the offers read it, is this fresh at most.
WORKERS_FRESH = 1.0
# An Adaptive proposal's drain request lasts this long (Adaptive proposes again every interval).
ADAPTIVE_DRAIN = 10.0


@dataclass
class Drain:
    """A request that the elastic job ``family`` give ``worker`` back at its next commit."""

    why: str
    until: float  # monotonic
    family: str
    resolved: bool = False  # honoured at a commit (kept till `until`: the worker is not offered again)


class Elastic:
    def __init__(
        self,
        scheduler,
        active_jobs: Callable[[], list],
        busy: Callable[[], set[str]],
        sidecar_workers: Callable[[], Awaitable[list[dict]]],
        drain_bound: float,
        rest: Callable[[], Any] = lambda: None,
    ) -> None:
        self.scheduler = scheduler
        self._active_jobs = active_jobs  # the plugin's mirror of the sidecar's active jobs
        self._busy = busy  # workers in a job or frozen for one
        self._sidecar_workers = sidecar_workers
        self._rest = rest  # the sidecar's AsyncSidecarClient, for the drains' record
        self.drain_bound = drain_bound
        self.drains: dict[str, Drain] = {}  # by worker
        self._recording: asyncio.Future | None = None
        self._waiters: set[asyncio.Future] = set()
        self._workers: tuple[float, list[dict]] = (0.0, [])
        self.changes = 0  # changes answered (for tests and the curious)

    # -- who is in an elastic job -------------------------------------------------------------------
    def members(self) -> dict[str, str]:
        """worker -> the family of the elastic job whose generation it is in now."""
        out: dict[str, str] = {}
        for entry in self._active_jobs():
            family = (entry.view.get("labels") or {}).get(ELASTIC_LABEL)
            if family:
                for w in entry.workers:
                    out[w] = family
        return out

    # -- drains -------------------------------------------------------------------------------------
    def _draining(self, worker: str) -> bool:
        d = self.drains.get(worker)
        if d is not None and d.until < time.monotonic():
            self._end(worker, "lapsed")
            return False
        return d is not None

    def request(self, worker: str, why: str, seconds: float) -> None:
        until = time.monotonic() + seconds
        old = self.drains.get(worker)
        if old is not None and not old.resolved:
            old.until = max(until, old.until)
            return
        family = self.members().get(worker)
        if family is None:
            return  # in no elastic job: nothing to give back
        self.drains[worker] = Drain(why, until, family)
        self._record(family, worker, "requested", why)

    def _end(self, worker: str, state: str, generation: int = 0) -> None:
        """The drain of ``worker`` ends (lapsed, overdue, withdrawn) or, honoured, is kept till its
        time runs out (so the worker is not offered to a job while it is being retired)."""
        d = self.drains.get(worker)
        if d is None:
            return
        if state == "honoured":
            if not d.resolved:
                d.resolved = True
                self._record(d.family, worker, state, d.why, generation)
            return
        del self.drains[worker]
        if not d.resolved:
            self._record(d.family, worker, state, d.why)

    def _record(self, family: str, worker: str, state: str, why: str, generation: int = 0) -> None:
        """Records a drain's change on the sidecar, after the ones before it, without waiting."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        before = self._recording

        async def send() -> None:
            if before is not None:
                await asyncio.wait([before])
            rest = self._rest()
            if rest is None:
                return
            try:
                await rest.record_drain(family, worker, state, why, generation)
            except Exception as e:  # noqa: BLE001 - the record is for people; the drain goes on
                logger.debug("dask-pmix: the drain of %s (%s) could not be recorded: %r", worker, state, e)

        self._recording = asyncio.ensure_future(send())

    async def drain(self, workers: list[str], why: str) -> None:
        """Asks the elastic jobs holding any of ``workers`` to give them back at their next commit,
        and waits (at most the drain bound) until none of them is in a job."""
        held = [w for w in workers if w in self.members()]
        if not held:
            return
        for w in held:
            self.request(w, why, self.drain_bound)
        logger.info("dask-pmix: %s: asking elastic jobs to give back %s at their next commit", why, held)
        deadline = time.monotonic() + self.drain_bound
        loop = asyncio.get_running_loop()
        while set(held) & self._busy():
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(set(held) & self._busy())
                logger.warning(
                    "dask-pmix: %s: elastic jobs did not give back %s within %g s; retiring them anyway",
                    why,
                    late,
                    self.drain_bound,
                )
                for w in late:
                    self._end(w, "overdue")
                break
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait([waiter], timeout=left)
            finally:
                self._waiters.discard(waiter)
        for w in held:
            self._end(w, "withdrawn")  # a no-op for one honoured at a commit, or overdue

    def wake(self) -> None:
        """A job changed (the plugin's mirror): drains waiting for its members look again."""
        for w in list(self._waiters):
            if not w.done():
                w.set_result(None)

    def short_of(self, missing: int, chosen: list) -> None:
        """Adaptive wanted ``missing`` more workers to close than Dask could give (members run
        long-running tasks): as many elastic members, highest ranks first, are asked to leave."""
        ranked: list[tuple[int, str]] = []
        for entry in self._active_jobs():
            if (entry.view.get("labels") or {}).get(ELASTIC_LABEL):
                for m in entry.view.get("members") or ():
                    ranked.append((int(m.get("rank") or 0), str(m.get("workerId"))))
        for _, worker in sorted(ranked, reverse=True):
            if missing <= 0:
                break
            if worker not in chosen and not self._draining(worker):
                self.request(worker, "Adaptive scaling down", ADAPTIVE_DRAIN)
                missing -= 1

    def forget(self, worker: str) -> None:
        self._end(worker, "withdrawn")

    def install(self) -> None:
        """Wraps the scheduler's retire_workers handler (what clients, clusters and workers call)."""
        original = self.scheduler.handlers["retire_workers"]
        scheduler = self.scheduler

        async def retire_workers(workers: list[str] | None = None, *, names: list | None = None, **kwargs: Any):
            if workers is not None:
                # SpecCluster (LocalCluster's scale and close) passes worker names as `workers`,
                # which Dask's own handler ignores before the cluster closes those workers: here a
                # name stands for its worker, for the drain only (Dask's call is left as it was).
                by_name = {str(ws.name): a for a, ws in scheduler.workers.items()}
                targets = [w if w in scheduler.workers else by_name.get(str(w), w) for w in workers]
            elif names is not None:
                wanted = {str(n) for n in names}
                targets = [ws.address for ws in scheduler.workers.values() if str(ws.name) in wanted]
            else:
                targets = []  # Dask chooses (workers_to_close): valid_workers_downscaling keeps members
            await self.drain(targets, "retired by Dask")
            return await original(workers=workers, names=names, **kwargs)

        self.scheduler.handlers["retire_workers"] = retire_workers
        choose = self.scheduler.handlers["workers_to_close"]

        def workers_to_close(*args: Any, **kwargs: Any):
            chosen = choose(*args, **kwargs)
            n, target = kwargs.get("n"), kwargs.get("target")
            wanted = n if n is not None else (len(scheduler.workers) - target if target is not None else None)
            if wanted and len(chosen) < wanted and self.members():
                by = kwargs.get("attribute", "address")
                addresses = [ws.address for ws in scheduler.workers.values() if getattr(ws, by, None) in chosen]
                self.short_of(wanted - len(chosen), addresses)
            return chosen

        self.scheduler.handlers["workers_to_close"] = workers_to_close

    # -- the commit's question ----------------------------------------------------------------------
    async def change(
        self,
        family: str,
        workers: list[str],
        min: int,  # noqa: A002
        max: int,  # noqa: A002
        generation: int = 0,
    ) -> dict:
        """Who leaves and who joins the elastic job ``family`` (its members ``workers``, in its
        ``generation``) now."""
        workers = [str(w) for w in workers or ()]
        lo, hi = int(min), int(max)
        leave = [w for w in workers if self._draining(w) or w not in self.scheduler.workers]
        leave = leave[: max_(0, len(workers) - lo)]
        for w in leave:
            self._end(w, "honoured", int(generation) + 1)
        stay = len(workers) - len(leave)
        join = await self._offers(workers, hi - stay) if stay < hi else []
        if leave or join:
            self.changes += 1
            logger.info("dask-pmix: elastic job %s: %s leave, %s join at this commit", family, leave, join)
        return {"leave": leave, "join": join}

    async def _offers(self, workers: list[str], room: int) -> list[str]:
        seen, listed = self._workers
        if time.monotonic() - seen > WORKERS_FRESH:
            try:
                listed = await self._sidecar_workers()
            except Exception as e:  # noqa: BLE001 - no offer this time
                logger.debug("dask-pmix: the sidecar's workers could not be read: %r", e)
                return []
            self._workers = (time.monotonic(), listed)
        by_id = {w.get("id"): w for w in listed}
        epochs = {(by_id.get(w) or {}).get("pool", {}).get("epoch") for w in workers}
        busy = self._busy() | set(workers) | set(self.members())
        offers = []
        for w in listed:
            address = str(w.get("id") or "")
            ws = self.scheduler.workers.get(address)
            seat = w.get("pool") or {}
            if (
                ws is None
                or str(getattr(ws.status, "name", ws.status)) != "running"
                or address in busy
                or self._draining(address)
                or w.get("state") != "available"
                or seat.get("state") != "ready"
                or seat.get("epoch") not in epochs
            ):
                continue
            offers.append(address)
        return sorted(offers)[: max_(0, room)]


max_ = max  # the builtin, under a name that the handler's keyword `max` does not hide
