"""Replacing a worker that cannot serve MPI jobs any more, without losing its data.

A worker asks for it itself (its member is stuck inside MPI after its job failed:
dask_pmix.member.watcher; its MPI session failed in its cohort), so its event loop runs and
Dask can move its data: it is taken out of the sidecar (no job picks it meanwhile) and out of
the pool (the dashboard shows why), retired gracefully (retire_workers moves every key only it
holds to other workers), and only then restarted through its nanny. A worker whose data cannot
be moved (no other worker can take it, or a value cannot be pickled: dask_pmix.scheduler.retire) is
not restarted: it keeps serving Dask outside the pool.
A few replacements at a time (``at_once``): at most a quarter of the cluster's workers, so that the
others can take the data, and at most two per host, whose restarts share its CPUs (a restart is
mostly a new interpreter importing Dask: on 2 cores, 16 workers replaced after a sidecar restart
were whole in 9-13 s two at a time, 17-20 s one at a time). Each worker is taken out of
the sidecar as soon as it is asked for (a job request meanwhile waits for that, and then for the
worker to be back: it leaves the sidecar as a worker expected back, dask_pmix.scheduler.returning).

A worker is not restarted while its name is still within ``distributed.deploy.lost-worker-timeout``
of its last removal: a SpecCluster (LocalCluster, dask-jobqueue) checks that long after every
removal whether a worker of that name is back, and closes the worker's nanny for good when it finds
none, which is what it finds while that worker is away for its next restart (distributed 2026.8:
deploy/spec.py, _update_worker_status). So a worker replaced twice in quick succession would not
come back. A check more than BACK_WITHIN ahead (a timeout of hours or days) delays nothing: the
restarted worker is back long before it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import dask
from dask.utils import parse_timedelta

from ..errors import SidecarError
from ..rest import AsyncSidecarClient
from .retire import retire

logger = logging.getLogger("dask_pmix")

# How long moving a worker's data may take before its replacement is given up (it keeps running),
# and how long no key of it may get a copy elsewhere.
RETIRE_WITHIN = 300.0
RETIRE_STALL = 30.0
# How long the restarted worker may take to come back before the next replacement goes ahead.
RESTART_WITHIN = 120.0
# Past a SpecCluster's check after a worker's removal (the module docstring): its timer and ours
# start at slightly different moments.
LOST_CHECK_MARGIN = 1.0
# A restarted worker is back well within this (1-13 s seen on 2 cores): a cluster's check of its
# name further ahead than this does not delay its restart.
BACK_WITHIN = 60.0
# Names whose last removal is remembered, the oldest forgotten first, whatever the timeout.
NAMES_KEPT = 4096
# Replacements at once on one host, and the share of the cluster's workers being replaced at once.
PER_HOST = 2
SHARE = 4


def lost_worker_timeout() -> float:
    """Seconds after a worker's removal at which a SpecCluster closes its nanny if no worker of
    its name is back (distributed.deploy.lost-worker-timeout; LocalCluster runs in the scheduler's
    process and reads the same settings)."""
    value = dask.config.get("distributed.deploy.lost-worker-timeout", "15s")
    return float(parse_timedelta(value, default="s") or 0.0)


class Replacer:
    def __init__(self, scheduler, rest: Callable[[], AsyncSidecarClient | None], register: Callable[[str], None]):
        self.scheduler = scheduler
        self.rest = rest
        self.register = register
        self._slots = asyncio.Condition()
        self._running: dict[str, str] = {}  # workers being replaced now -> their host
        self._pending: set[str] = set()
        self._taking_out: dict[str, asyncio.Future] = {}  # workers being taken out of the sidecar
        self._tasks: set[asyncio.Task] = set()
        self.replaced: list[dict] = []  # what was done, newest last (bounded)
        self._names: dict[str, str] = {}  # worker address -> its name (a restart keeps the name)
        self._removed_at: dict[str, float] = {}  # worker name -> when a worker of it last left

    def added(self, worker: str) -> None:
        ws = self.scheduler.workers.get(worker)
        if ws is not None:
            self._names[worker] = str(ws.name)

    def removed(self, worker: str) -> None:
        name = self._names.pop(worker, None)
        if name is None:
            return
        now = time.monotonic()
        self._removed_at.pop(name, None)  # oldest first
        self._removed_at[name] = now
        horizon = now - lost_worker_timeout() - LOST_CHECK_MARGIN
        for old in [n for n, t in self._removed_at.items() if t < horizon]:
            del self._removed_at[old]
        for old in list(self._removed_at)[: max(0, len(self._removed_at) - NAMES_KEPT)]:
            del self._removed_at[old]

    def _until_restartable(self, worker: str) -> float:
        """Seconds until ``worker`` may be restarted without a SpecCluster closing its nanny: none
        when the cluster's check of its name is past, or far enough ahead that the restarted
        worker is back long before it (a lost-worker-timeout of hours or days)."""
        left_at = self._removed_at.get(self._names.get(worker, ""))
        if left_at is None:
            return 0.0
        left = left_at + lost_worker_timeout() + LOST_CHECK_MARGIN - time.monotonic()
        return 0.0 if left <= 0 or left > BACK_WITHIN else left

    def replace(self, worker: str, reason: str) -> dict:
        if worker not in self.scheduler.workers:
            return {"error": f"{worker} is not a worker of this cluster", "status": 404}
        if worker not in self._pending:
            self._pending.add(worker)
            taken_out = self._taking_out[worker] = asyncio.ensure_future(self._take_out(worker, reason))
            taken_out.add_done_callback(lambda _: self._taking_out.pop(worker, None))
            task = asyncio.ensure_future(self._replace(worker, reason, taken_out))
            self._tasks.update((task, taken_out))
            task.add_done_callback(self._tasks.discard)
            taken_out.add_done_callback(self._tasks.discard)
        return {"replacing": worker}

    def replacing(self, worker: str) -> bool:
        """Whether `worker` is being replaced (it will be back, restarted by its nanny)."""
        return worker in self._pending

    def taking_out(self) -> list[asyncio.Future]:
        """Done once the workers asked for so far are out of the sidecar."""
        return list(self._taking_out.values())

    async def _take_out(self, worker: str, reason: str) -> None:
        rest = self.rest()
        if rest is None:
            return
        why = f"replaced by dask-pmix: {reason}"
        # Expected back: a job request short of workers meanwhile waits for it.
        for step in (lambda: rest.leave_pool(worker, why), lambda: rest.remove_worker(worker, why, returning=True)):
            try:
                await step()
            except SidecarError as e:
                if e.status != 404:
                    logger.warning("dask-pmix: could not take %s out of the sidecar: %s", worker, e)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _record(self, worker: str, reason: str, outcome: str) -> None:
        self.replaced.append({"worker": worker, "reason": reason, "outcome": outcome, "time": time.time()})
        del self.replaced[:-256]
        self.scheduler.log_event(
            "dask-pmix", {"action": "replace-worker", "worker": worker, "reason": reason, "outcome": outcome}
        )

    def at_once(self, host: str) -> bool:
        """Whether one more replacement on ``host`` may start now."""
        total = max(1, len(self.scheduler.workers) // SHARE)
        here = sum(1 for h in self._running.values() if h == host)
        return len(self._running) < total and here < PER_HOST

    @contextlib.asynccontextmanager
    async def _slot(self, worker: str):
        ws = self.scheduler.workers.get(worker)
        host = ws.host if ws is not None else ""
        async with self._slots:
            await self._slots.wait_for(lambda: self.at_once(host))
            self._running[worker] = host
        try:
            yield
        finally:
            async with self._slots:
                del self._running[worker]
                self._slots.notify_all()

    async def _replace(self, worker: str, reason: str, taken_out: asyncio.Future) -> None:
        try:
            await taken_out
            async with self._slot(worker):
                if worker not in self.scheduler.workers:
                    return
                logger.warning("dask-pmix: replacing worker %s: %s", worker, reason)
                stimulus = f"dask-pmix-replace-{time.time()}"
                retired, why = await retire(self.scheduler, worker, stimulus, RETIRE_STALL, RETIRE_WITHIN)
                if not retired:
                    if worker in self.scheduler.workers:
                        logger.error(
                            "dask-pmix: the data of worker %s could not be moved to other workers (%s); it is "
                            "not restarted and serves Dask outside the MPI pool (%s)",
                            worker,
                            why,
                            reason,
                        )
                        self._record(worker, reason, f"kept: its data could not be moved: {why}")
                        self.register(worker)
                    return
                wait = self._until_restartable(worker)
                if wait > 0:
                    logger.info(
                        "dask-pmix: worker %s is restarted in %.1f s: a worker of its name left %.0f s ago "
                        "(distributed.deploy.lost-worker-timeout)",
                        worker,
                        wait,
                        lost_worker_timeout() + LOST_CHECK_MARGIN - wait,
                    )
                    await asyncio.sleep(wait)
                # Waits for the new process to be back: it is where the next replacement's data goes.
                name = self._names.get(worker)
                out = await self.scheduler.restart_workers(
                    [worker], timeout=RESTART_WITHIN, wait_for_workers=True, on_error="return", stimulus_id=stimulus
                )
                if out.get(worker, "OK") != "OK" or not any(
                    str(ws.name) == name for ws in self.scheduler.workers.values()
                ):
                    logger.error(
                        "dask-pmix: worker %s was retired (its data moved) but did not come back within %.0f s of "
                        "its restart (%s); a SpecCluster closes a worker away longer than "
                        "distributed.deploy.lost-worker-timeout (%.0f s)",
                        worker,
                        RESTART_WITHIN,
                        out.get(worker, "not back"),
                        lost_worker_timeout(),
                    )
                    self._record(worker, reason, "data moved, restart did not come back")
                    return
                logger.warning("dask-pmix: worker %s was retired (its data moved) and restarted", worker)
                self._record(worker, reason, "data moved, restarted")
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            logger.exception("dask-pmix: replacing worker %s failed", worker)
        finally:
            self._pending.discard(worker)
