"""Elastic MPI jobs (run_elastic): a long job that gives workers back when Dask retires them, takes
idle ones while it is below its maximum, and goes on after losing a member, all in the same worker
processes.

The job is a chain of generations, each an ordinary in-process job on the sidecar (frozen members,
bounds, failure handling, the dashboard: all as for run_mpi), labelled with the job's family, its
number and what changed (protocol.ELASTIC_LABEL ...). Its ranks run member/elastic.rank_main,
which gives ``fn`` an ElasticContext and ends the generation at the commit where the members
agreed on a change (scheduler/elastic.py decides who leaves and who joins). This driver then
starts the next generation over the new members: the ones that stay, in their order, then the
ones that join. A generation that fails because a member was lost (Failure.MEMBER_LOST) is
followed by one over the survivors, who go on from their last commit; any other failure, or fewer
survivors than ``min``, ends the job with that error. Each generation is also a Dask event of
topic TOPIC."""

from __future__ import annotations

import asyncio
import logging
import numbers
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import Failure, MPIJobError, lost_members
from ..protocol import CHANGE_LABEL, ELASTIC_LABEL, GENERATION_LABEL, Call
from .retries import SETTLE, workers_gone
from .run import _check_request, _finish, _fresh_view, _start_job, _sync, fetch_results

logger = logging.getLogger("dask_pmix")

#: The Dask event topic of an elastic job's generations: {"family", "generation", "job", "workers",
#: "change"}.
TOPIC = "dask-pmix-elastic"
#: How long a generation that takes new workers waits for them if another job took them meanwhile
#: (it then starts without them).
JOIN_WAIT = 2.0


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number of members, 1 or more, not {value!r}")
    return int(value)


def run_elastic(
    client,
    fn: Callable,
    *args,
    state: Any = None,
    n: int | None = None,
    workers: list[str] | None = None,
    min: int = 1,  # noqa: A002 - the bounds' names in the docs
    max: int | None = None,  # noqa: A002
    impl: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    **kwargs,
) -> list:
    """Runs ``fn(ctx, *args, **kwargs)`` as an elastic MPI job in the worker processes; the last
    generation's results, in rank order.

    The job starts on ``n`` workers chosen by the sidecar, or on ``workers``. ``ctx`` is a
    :class:`dask_pmix.member.elastic.ElasticContext`: ``ctx.comm`` (over exactly the current
    members), ``ctx.rank``, ``ctx.size``, ``ctx.state`` (where to start from: ``state`` at first,
    the newest committed state after a change) and ``ctx.commit(state)``, the sync point: every
    rank calls it at the same point with the same state. At a commit the membership may change:

    - a worker that Dask retires (``client.retire_workers``, ``cluster.scale``, Adaptive, a
      worker's lifetime) leaves, and its retirement waits for that (``dask-pmix.timeouts.drain``);
    - while the job has fewer than ``max`` members (``max`` defaults to the first size: no
      growth), idle workers of the same pool epoch join;
    - never fewer than ``min``.

    ``fn`` then leaves the commit (do not catch BaseException around it) and runs again in the new
    generation, from ``ctx.state``: the state committed last, which a joining member receives from
    the others. A member lost mid-generation (its worker killed, crashed or removed) makes the
    survivors go on from their last commit as long as at least ``min`` are left; otherwise, or for
    any other failure (``fn`` raising, a timeout), MPIJobError as run_mpi raises it. ``timeout``
    bounds each generation. In-process only (Open MPI's pool, or MPICH's with
    ``dask-pmix.pool.mpich``); the committed state lives in the members' worker processes, so
    if every member holding it is lost the job starts again from ``state``. With an asynchronous
    client, ``await`` it.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (fn(ctx, ...)), not {fn!r}")
    if (n is None) == (workers is None):
        raise ValueError("give exactly one of n (a number of workers) or workers (their addresses)")
    size = _count("n", n) if workers is None else len(list(workers))
    lo = _count("min", min)
    hi = size if max is None else _count("max", max)
    if not lo <= size <= hi:
        raise ValueError(f"the job starts with {size} members, which must be within min={lo} and max={hi}")
    _check_request(n, list(workers) if workers is not None else None, "inprocess", impl, timeout, wiring_timeout)
    fallbacks: list = []
    options = {"impl": impl, "timeout": timeout, "wiring_timeout": wiring_timeout}

    async def run() -> list:
        return await _drive(client, fn, args, kwargs, state, n, workers, lo, hi, options, fallbacks)

    return _sync(client, fallbacks, run)


# MPI libraries whose ranks cannot leave an MPI call that waits for a lost member (no revoke).
UNREVOCABLE = ("mpich", "intelmpi")


async def _drive(client, fn, args, kwargs, state, n, workers, lo: int, hi: int, options: dict, fallbacks) -> list:
    import cloudpickle

    family = f"e{uuid.uuid4().hex[:12]}"
    fn_bytes = await asyncio.to_thread(cloudpickle.dumps, fn)
    initial = await asyncio.to_thread(cloudpickle.dumps, state)
    members = list(workers) if workers is not None else None
    generation, change = 0, ""
    joining: list[str] = []
    while True:
        spec = {"family": family, "generation": generation, "initial": initial, "min": lo, "max": hi}
        labels = {ELASTIC_LABEL: family, GENERATION_LABEL: str(generation), CHANGE_LABEL: change[:200]}
        try:
            job = await _start_job(
                client,
                # The member half, by reference: the client imports none of it (test_layout).
                Call("dask_pmix.member.elastic:rank_main"),
                (spec, fn_bytes, args, kwargs),
                n=n if members is None else None,
                workers=members,
                mode="inprocess",
                labels=labels,
                wait=JOIN_WAIT if joining else None,
                **options,
            )
        except MPIJobError as e:
            if not joining or e.kind != Failure.REFUSED:
                raise
            # A worker it meant to take is busy or gone: start without the newcomers.
            members = [w for w in members or () if w not in joining]
            change, joining = f"{change}; without {', '.join(joining)}: {e.reason or e}", []
            continue
        ranks = [m["workerId"] for m in job.members]
        await _log(client, family, generation, job.id, ranks, change)
        try:
            futures = await _finish(client, job, fallbacks, fetch=False)
        except MPIJobError as e:
            if e.kind != Failure.MEMBER_LOST:
                raise
            if job.job.get("impl") in UNREVOCABLE:
                # MPICH's survivors stay inside the MPI call that waits for the lost member (it
                # cannot revoke a communicator), and dask-pmix replaces their workers, with the
                # state they kept: there is nothing to go on from.
                raise MPIJobError(
                    f"{e.reason} (an elastic job on {job.job.get('impl')} cannot survive a lost member: its MPI "
                    "library cannot take the other members out of their MPI calls, so their workers are "
                    "replaced; run it again, or use Open MPI's pool)",
                    job_id=e.job_id,
                    rank=e.rank,
                    worker=e.worker,
                    kind=e.kind,
                    lost_workers=list(e.lost_workers or ()),
                ) from e
            # The lost workers only: the error's rank may be a survivor whose MPI call failed first.
            # The error names the one that ended the job; another that died meanwhile is in the
            # job's view, and Dask may not have removed it yet (naming it would be refused).
            lost = set(e.lost_workers or ()) | lost_members(await _fresh_view(client, job.id))
            if lost:
                await _gone(client, lost)
            alive = set((await client.scheduler.identity()).get("workers") or ())
            survivors = [w for w in ranks if w in alive and w not in lost]
            if len(survivors) < lo:
                raise MPIJobError(
                    f"{e.reason} (the elastic job had {len(survivors)} of its members left, fewer than min={lo}; "
                    f"gone: {', '.join(sorted(set(ranks) - set(survivors)))})",
                    job_id=e.job_id,
                    rank=e.rank,
                    worker=e.worker,
                    kind=e.kind,
                    lost_workers=sorted(lost),
                ) from e
            members, joining = survivors, []
            change = "lost " + ", ".join(sorted(set(ranks) - set(survivors)))
            generation += 1
            continue
        # At a change every rank returns what the members agreed on: rank 0's result is enough, and
        # the others' are dropped where they are (each fetch waits on the scheduler, busy with the
        # old generation's end, while the next generation waits for this answer).
        [first] = await fetch_results(client, job, futures[:1])
        agreed = first.get("change") if isinstance(first, dict) else None
        if agreed is None:
            results = await fetch_results(client, job, futures)
            agreed = next((r["change"] for r in results if isinstance(r, dict) and "change" in r), None)
            if agreed is None:
                return [r["done"] for r in results]
        leave = [w for w in agreed.get("leave") or () if w in ranks]
        joining = [w for w in agreed.get("join") or () if w not in ranks]
        members = [w for w in ranks if w not in leave] + joining
        change = "; ".join(p for p in (" ".join(f"-{w}" for w in leave), " ".join(f"+{w}" for w in joining)) if p)
        generation += 1


async def _gone(client, lost: set[str]) -> None:
    """Waits (within retries.SETTLE s) until Dask has removed the lost workers, so that they are
    neither chosen again nor offered. Unlike a retry, not for the failed generation's other
    members to leave it: a survivor whose fn returned from its commit as the generation failed
    never reports leaving, and the next generation waits for any member still in the old one."""
    answer = await workers_gone(client, sorted(lost), SETTLE)
    # None: not asked; the next generation's admission says what is wrong, if anything.
    left = (answer or {}).get("left")
    if left:
        # The next generation goes on without them anyway; a member named lost that is alive costs
        # the job that member and these seconds.
        logger.warning("dask-pmix: elastic job: workers %s, lost, were still in the cluster after %g s", left, SETTLE)


async def _log(client, family: str, generation: int, job_id: str, workers: list[str], change: str) -> None:
    msg = {"family": family, "generation": generation, "job": job_id, "workers": workers, "change": change}
    try:
        await client.scheduler.log_event(topic=TOPIC, msg=msg)
    except Exception:  # noqa: BLE001 - an event not logged changes nothing
        pass
