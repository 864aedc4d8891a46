"""Moving a worker's data away before it is restarted, with a bound on how long nothing moves.

Dask's ``retire_workers`` waits until every key only that worker holds has a copy elsewhere, and
retries a failed copy at every run of the active memory manager, for good: a key that cannot be
pickled (a rank's in-process result may be a lock or a communicator) never moves, and the worker
stays closing_gracefully, taking no task. Cancelling the call does not help either: the
retirement's policy stays in the memory manager and the worker's status is not restored.

So the wait is bounded by progress: when no key of the worker got a copy elsewhere for
``stall`` seconds, the retirement is withdrawn the way Dask withdraws one that finds no
recipient (the policy flagged and taken out, which makes ``retire_workers`` restore the worker's
status and answer without it)."""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("dask_pmix")

# How often the keys left to move are counted.
POLL = 0.5


def unique_keys(scheduler, worker: str) -> int:
    """How many keys only ``worker`` holds (what its retirement still has to move)."""
    ws = scheduler.workers.get(worker)
    if ws is None:
        return 0
    return sum(1 for ts in ws.has_what if len(ts.who_has or ()) <= 1)


def _withdraw(scheduler, worker: str) -> bool:
    amm = scheduler.extensions.get("amm")
    policies = getattr(amm, "policies", None)
    for policy in list(policies or ()):
        if type(policy).__name__ == "RetireWorker" and getattr(policy, "address", None) == worker:
            policy.no_recipients = True
            policies.discard(policy)  # type: ignore[union-attr]
            return True
    return False


def _restore(scheduler, worker: str, stimulus_id: str) -> None:
    """The worker takes tasks again (what retire_workers does when it finds no recipient)."""
    from distributed.core import Status

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
    start = last_progress = loop.time()
    left = unique_keys(scheduler, worker)
    why = ""
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=POLL)
            now = loop.time()
            count = unique_keys(scheduler, worker)
            if count < left:
                left, last_progress = count, now
            if task.done():
                break
            if now - last_progress > stall or now - start > within:
                why = (
                    f"{left} of its keys could not be copied to another worker in {now - last_progress:.0f} s "
                    "(a value that cannot be pickled, or no room elsewhere)"
                    if now - last_progress > stall
                    else f"moving its data took longer than {within:.0f} s"
                )
                logger.info("dask-pmix: retirement of %s withdrawn: %s", worker, why)
                if not _withdraw(scheduler, worker):
                    # Not in the cluster's memory manager (one retire_workers started for itself
                    # when the cluster runs none): its policy cannot be reached.
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    _restore(scheduler, worker, stimulus_id)
                    return False, why
                break
        retired = await task
    except asyncio.CancelledError:
        _withdraw(scheduler, worker)
        task.cancel()
        raise
    if worker in retired:
        return True, ""
    return False, why or "Dask found no worker to take its data"
