"""Moving a worker's data away before it is restarted, with a bound on how long nothing moves.

Dask's ``retire_workers`` waits until every key only that worker holds has a copy elsewhere, and
retries a failed copy at every run of the active memory manager, for good: a key that cannot be
pickled (a rank's in-process result may be a lock or a communicator) never moves, and the worker
stays closing_gracefully, taking no task. Cancelling the call does not help either: the
retirement's policy stays in the memory manager and the worker's status is not restored.

So the wait is bounded by progress: when a whole ``stall`` seconds pass in which no key of the
worker got a copy elsewhere, the retirement is withdrawn the way Dask withdraws one that finds
no recipient (the policy flagged and taken out, which makes ``retire_workers`` restore the
worker's status and answer without it)."""

from __future__ import annotations

import asyncio
import logging

from distributed.active_memory_manager import RetireWorker
from distributed.core import Status

logger = logging.getLogger("dask_pmix")


def unique_keys(scheduler, worker: str) -> int:
    """How many keys only ``worker`` holds (what its retirement still has to move)."""
    ws = scheduler.workers.get(worker)
    if ws is None:
        return 0
    return sum(1 for ts in ws.has_what if len(ts.who_has or ()) <= 1)


async def _withdraw(scheduler, worker: str, task: asyncio.Future, stimulus_id: str) -> None:
    """Ends the retirement ``task`` of ``worker``, the worker taking tasks again."""
    amm = scheduler.extensions.get("amm")
    policies = getattr(amm, "policies", None) or set()
    policy = next((p for p in policies if isinstance(p, RetireWorker) and p.address == worker), None)
    if policy is not None:
        # What RetireWorker does itself when it finds no recipient: retire_workers then restores
        # the worker's status and answers without it.
        policy.no_recipients = True
        policies.discard(policy)
        await asyncio.gather(task, return_exceptions=True)
        return
    # Not in the cluster's memory manager (retire_workers runs one of its own when the cluster
    # runs none): its policy cannot be reached, so the call is cancelled and the status restored.
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    ws = scheduler.workers.get(worker)
    if ws is not None and ws.status == Status.closing_gracefully:
        scheduler.handle_worker_status_change(Status.running, ws, stimulus_id)
        scheduler.stream_comms[worker].send(
            {"op": "worker-status-change", "status": Status.running.name, "stimulus_id": stimulus_id}
        )


async def retire(scheduler, worker: str, stimulus_id: str, stall: float, within: float) -> tuple[bool, str]:
    """Retires ``worker`` without closing or removing it, its data moved to other workers.
    Returns whether it was retired, and if not, why."""
    task = asyncio.ensure_future(
        scheduler.retire_workers([worker], close_workers=False, remove=False, stimulus_id=stimulus_id)
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    left = unique_keys(scheduler, worker)
    why = ""
    try:
        while True:
            await asyncio.wait({task}, timeout=max(0.0, min(stall, deadline - loop.time())))
            if task.done():
                break
            now_left = unique_keys(scheduler, worker)
            if loop.time() >= deadline:
                why = f"moving its data took longer than {within:.0f} s"
            elif now_left >= left:
                why = (
                    f"{now_left} of its keys could not be copied to another worker in {stall:.0f} s "
                    "(a value that cannot be pickled, or no room elsewhere)"
                )
            else:
                left = now_left
                continue
            logger.info("dask-pmix: retirement of %s withdrawn: %s", worker, why)
            await _withdraw(scheduler, worker, task, stimulus_id)
            return False, why
        retired = task.result()
    except asyncio.CancelledError:
        await asyncio.shield(_withdraw(scheduler, worker, task, stimulus_id))
        raise
    if worker in retired:
        return True, ""
    return False, "Dask found no worker to take its data"
