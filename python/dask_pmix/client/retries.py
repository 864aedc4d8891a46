"""Re-running a job that lost a member (``retries=`` of run_mpi, submit_mpi, map_blocks_mpi and
map_partitions_mpi).

One call with retries is a *family* of attempts. Each attempt is a job of its own on the sidecar,
labelled with the family and its number (LABELS: the dashboard shows them), and each attempt
that is followed by another is logged as a Dask event of topic TOPIC. Only a failure of kind
Failure.MEMBER_LOST (errors.classify) is retried. Before the next attempt the client waits, within
SETTLE seconds, for Dask to have removed the workers whose loss failed the attempt, so that the
sidecar does not choose them again and ``local=`` data they held is looked for where Dask computes
it again. The last attempt's error is raised with every attempt's error (MPIJobError.attempts)."""

from __future__ import annotations

import asyncio
import logging
import numbers
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import Failure, MPIJobError
from ..protocol import Scheduler

logger = logging.getLogger("dask_pmix")

T = TypeVar("T")

#: The Dask event topic of a family's attempts: {"family", "attempt", "attempts", "job", "kind",
#: "reason", "lost_workers", "next"}, logged when an attempt fails (next: "retry" or "raise").
TOPIC = "dask-pmix-retry"
#: The labels of an attempt's job on the sidecar.
FAMILY_LABEL = "dask-pmix.family"
ATTEMPT_LABEL = "dask-pmix.attempt"
ATTEMPTS_LABEL = "dask-pmix.attempts"
#: How long a retry waits for Dask to remove the lost workers, and for data they held to be held
#: again (computed again by Dask), before it goes on anyway.
SETTLE = 10.0


def check_retries(retries: Any) -> int:
    """``retries`` as given: a whole number, 0 or more."""
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral):
        raise TypeError(f"retries must be a whole number of times to run the job again (0 for none), not {retries!r}")
    if retries < 0:
        raise ValueError(f"retries must be 0 or more (how many times to run the job again), not {retries!r}")
    return int(retries)


def labels_of(family: str, attempt: int, attempts: int) -> dict[str, str]:
    return {FAMILY_LABEL: family, ATTEMPT_LABEL: str(attempt), ATTEMPTS_LABEL: str(attempts)}


def new_family() -> str:
    return f"r{uuid.uuid4().hex[:12]}"


async def with_retries(
    client,
    retries: int,
    attempt: Callable[[dict[str, str] | None], Awaitable[T]],
    *,
    settle_with: Callable[[MPIJobError], Awaitable[None]] | None = None,
    family: str | None = None,
) -> T:
    """``attempt(labels)`` once, and again up to ``retries`` times while it fails with a lost
    member; its value, or the last attempt's error with every attempt's. ``labels`` is None without
    retries (the job is as it always was)."""
    family = family or new_family()
    errors: list[MPIJobError] = []
    for number in range(1, retries + 2):
        labels = labels_of(family, number, retries + 1) if retries else None
        try:
            return await attempt(labels)
        except MPIJobError as e:
            failed = e
        if not retries:
            raise failed
        failed.family, failed.attempt = family, number
        if errors and failed.__cause__ is None:
            failed.__cause__ = errors[-1]  # the chain of attempts, the first at its root
        errors.append(failed)
        again = failed.kind == Failure.MEMBER_LOST and number <= retries
        await _log(client, failed, retries + 1, "retry" if again else "raise")
        if not again:
            break
        logger.info(
            "dask-pmix: attempt %d of %d of %s failed (%s), running it again: %s",
            number,
            retries + 1,
            family,
            failed.kind,
            failed,
        )
        if settle_with is not None:
            await settle_with(failed)
    raise failed.with_attempts(errors) if len(errors) > 1 else failed


async def _log(client, e: MPIJobError, attempts: int, then: str) -> None:
    msg = {
        "family": e.family,
        "attempt": e.attempt,
        "attempts": attempts,
        "job": e.job_id,
        "kind": e.kind,
        "reason": e.reason,
        "rank": e.rank,
        "worker": e.worker,
        "lost_workers": list(e.lost_workers),
        "next": then,
    }
    try:
        await client.scheduler.log_event(topic=TOPIC, msg=msg)
    except Exception as exc:  # noqa: BLE001 - an event not logged does not change the outcome
        logger.debug("dask-pmix: could not log the attempt: %r", exc)


async def workers_gone(client, workers: list[str], wait: float, job_id: str | None = None) -> dict | None:
    """The scheduler plugin's answer (Scheduler.WORKERS_GONE), given once Dask has removed
    ``workers`` and every member of the ended job ``job_id`` has left it, or after ``wait`` s: the
    workers still there ("left") and the members still in the job ("members"). The plugin is woken
    by those changes; nothing is asked again. None when it could not be asked (an older plugin
    has no such handler: see _plugin_settles in run.py)."""
    try:
        answer = await getattr(client.scheduler, Scheduler.WORKERS_GONE)(
            workers=sorted(workers), wait=wait, job_id=job_id or None
        )
    except Exception as exc:  # noqa: BLE001 - the caller goes on as after the bound
        logger.debug("dask-pmix: waiting for workers to leave failed: %r", exc)
        return None
    return answer if isinstance(answer, dict) else {}


async def settle(client, failed: MPIJobError, plugin_waits: bool) -> None:
    """Waits (within SETTLE s) until Dask has removed the workers whose loss failed the attempt,
    the sidecar has heard of it, and every member of the failed job has left it (a member still
    inside MPI is replaced by dask-pmix, its data moved, before the next attempt chooses its
    members). Pushed: the plugin answers when that is so (Scheduler.WORKERS_GONE); an older plugin
    without that handler is not waited for."""
    lost = list(failed.lost_workers or ([failed.worker] if failed.worker else []))
    if not plugin_waits or not (lost or failed.job_id):
        return
    answer = await workers_gone(client, lost, SETTLE, failed.job_id)
    if answer is None:
        return  # the next attempt says what is wrong, if anything
    left, inside = answer.get("left") or [], answer.get("members") or []
    if left or inside:
        logger.info(
            "dask-pmix: %g s after the loss, %s still in the cluster and %s still in the failed job; running it again",
            SETTLE,
            left,
            inside,
        )


async def held_now(client, futures: list, bound: float = SETTLE) -> dict:
    """who_has of ``futures`` once each is computed and held by a worker: a future whose holder
    was lost is computed again by Dask (its client hears so a moment after the scheduler: the
    look-up is made again, with a short pause, until each is held or ``bound`` s have passed).
    Raises MPIJobError (REFUSED) for a future that erred or was cancelled."""
    from distributed.client import _wait

    deadline = time.monotonic() + bound
    pause = 0.02
    while True:
        try:
            await _wait(futures)
        except Exception as e:  # a future cancelled: lost with its worker and not computable again
            raise MPIJobError(f"the job's local= data cannot be had: {e}", kind=Failure.REFUSED) from e
        erred = next((f for f in futures if f.status == "error"), None)
        if erred is not None:
            exc = await erred._exception()
            raise MPIJobError(
                f"the job's local= future {erred.key!r} could not be computed: {exc!r}", kind=Failure.REFUSED
            ) from exc
        who_has = await client.scheduler.who_has(keys=[f.key for f in futures])
        if all(who_has.get(f.key) for f in futures) or time.monotonic() > deadline:
            return who_has
        await asyncio.sleep(pause)
        pause = min(2 * pause, 0.5)
