"""run_mpi: an MPI job over workers the cluster already has."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Callable, Iterable

from .. import config
from ..errors import MPIJobError
from ..protocol import ACTIVE_STATES, FAILED_STATES, Call, Scheduler, rank_key
from .plugin_check import PLUGIN_MISSING

logger = logging.getLogger("dask_pmix")

# Ranks go ahead of tasks queued on their workers: the other ranks are already waiting for them.
RANK_PRIORITY = 1_000_000
POLL = 0.25  # how often run_mpi looks at the job while its ranks run
# With a job timeout, run_mpi gives the sidecar this long to report it before it says so itself.
TIMEOUT_GRACE = 5.0
# A job that ended while a rank's task has not finished: how long before that rank is given up.
ENDED_GRACE = 5.0
# A failed job's error waits at most this long for its members to be given back; the scheduler
# finishes the release. A member stuck outside MPI goes only when its watcher restarts its worker
# (3 s later): waiting for that held a hung job's timeout error back 3.1 s (7.1 s with timeout=4).
RELEASE_WAIT = 1.0
# How long a failed job's error waits for the rank the sidecar blames to report why itself (its
# exception reaches the client through Dask after the sidecar saw the rank go; 0.3 s was too short
# for an MPICH fork rank in a clean-clone run). A rank whose worker died never reports: its error
# comes this much later.
OWN_ERROR_WAIT = 1.0


def _holders(who_has: dict, futures: list) -> dict[str, list]:
    """worker address -> the futures whose data it already holds."""
    by_worker: dict[str, list] = {}
    for f in futures:
        holders = who_has.get(f.key) or []
        if holders:
            by_worker.setdefault(sorted(holders)[0], []).append(f)
    return by_worker


class MPIJob:
    """A job created on the sidecar with one Dask future per rank, each left on its worker.

    ``futures`` are in rank order; ``release()`` gives the members back (cancelling the ranks
    that have not finished; those of a failed job still running past RELEASE_WAIT are given back
    by the scheduler afterwards). run_mpi gathers and releases; submit_mpi hands the futures over.
    """

    def __init__(self, client, job: dict, futures: list):
        self.client = client
        self.job = job
        self.id: str = job["id"]
        self.mode: str = job.get("mode", "fork")
        self.members = sorted(job["members"], key=lambda m: m["rank"])
        self.futures = futures

    async def _release(self) -> None:
        unfinished = [f for f in self.futures if not f.done()]
        if unfinished:
            await self.client._cancel(unfinished)
        # Every rank returned: the job ends by itself as their reports reach the sidecar.
        finished = bool(self.futures) and all(f.status == "finished" for f in self.futures)
        if finished:
            await self.client.scheduler.dask_pmix_release_job(job_id=self.id, settle=2.0)
        else:
            await self.client.scheduler.dask_pmix_release_job(job_id=self.id, wait=RELEASE_WAIT)

    def release(self):
        return self.client.sync(self._release)


# Whether the scheduler has the plugin's handlers, asked once per client and scheduler: a call to
# a handler the scheduler lacks never returns.
_plugin_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _check_plugin(client) -> None:
    address = client.scheduler.address
    if _plugin_seen.get(client) == address:
        return
    if not await client._run_on_scheduler(lambda dask_scheduler, h=Scheduler.INFO: h in dask_scheduler.handlers):
        raise RuntimeError(PLUGIN_MISSING)
    _plugin_seen[client] = address


async def _start_job(client, fn: Callable, args: tuple = (), kwargs: dict | None = None, *, n: int | None = None,
                     workers: list[str] | None = None, pset: str | None = None, impl: str | None = None,
                     mode: str | None = None, timeout: float | None = None, wiring_timeout: float | None = None,
                     local: Iterable | None = None) -> MPIJob:
    impl = impl or config.get("job.impl")
    mode = mode or config.get("job.mode")
    timeout = config.seconds("timeouts.job") if timeout is None else timeout
    wiring_timeout = config.seconds("timeouts.wiring") if wiring_timeout is None else wiring_timeout
    if mode not in (None, "inprocess", "fork"):
        raise ValueError(f"mode must be 'inprocess' or 'fork', not {mode!r}")
    await _check_plugin(client)
    kwargs = dict(kwargs or {})
    local_by_worker = None
    if local is not None:
        local = list(local)
        who_has = await client.scheduler.who_has(keys=[f.key for f in local])
        local_by_worker = _holders(who_has, local)
        if workers is None and pset is None and n is None:
            workers = sorted(local_by_worker)
    created = await client.scheduler.dask_pmix_create_job(
        workers=workers, n=n, pset=pset, impl=impl, owner=client.id, timeout=timeout, wiring_timeout=wiring_timeout,
        mode=mode or "inprocess")
    if "error" in created:
        raise MPIJobError(created["error"])
    job = created["job"]
    if job.get("mode") == "fork" and job.get("modeReason"):
        # Asked for explicitly, in-process not being possible deserves a warning; by default it
        # is what MPICH and mixed clusters do.
        (logger.warning if mode == "inprocess" else logger.info)(
            "dask-pmix: job %s runs in fork mode: %s", job["id"], job["modeReason"])
    mpi_job = MPIJob(client, job, [])
    build_timeout = config.seconds("timeouts.communicator")
    ranks = []
    for m in mpi_job.members:
        worker_id = m["workerId"]
        mine = local_by_worker.get(worker_id, []) if local_by_worker is not None else None
        key = rank_key(job["id"], m["rank"])
        if mpi_job.mode == "inprocess":
            ranks.append((key, worker_id, Call("dask_pmix.member.task:inprocess_rank"),
                          (job, m["rank"], worker_id, fn, args, kwargs, mine, build_timeout)))
        else:
            ranks.append((key, worker_id, Call("dask_pmix.member.task:fork_rank"), (job["id"], m["rank"], worker_id, created["envs"][worker_id],
                                                         impl, fn, args, kwargs, timeout, mine)))
    try:
        mpi_job.futures.extend(_submit_ranks(client, ranks))
    except BaseException:
        await mpi_job._release()
        raise
    return mpi_job


def _submit_ranks(client, ranks: list[tuple[str, str, Callable, tuple]]) -> list:
    """One task per rank (key, worker, function, arguments), each pinned to its worker, ahead of
    the tasks queued there, never retried; futures in rank order. All go to the scheduler as one
    graph: one update-graph message instead of one per rank, which on a busy scheduler was the
    largest part of a short job's start (with Client.submit, the last rank's task started
    tens of ms after the first's at 8 ranks)."""
    try:
        from dask._expr import HLGExpr
        from dask._task_spec import Task, parse_input
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
        from distributed.spans import SpanMetadata
    except ImportError:  # a Dask without these: one submit per rank
        return [client.submit(func, *args, key=key, workers=[worker], allow_other_workers=False, pure=False,
                              retries=0, priority=RANK_PRIORITY) for key, worker, func, args in ranks]
    # One layer per rank: annotations (here, the worker) are per layer.
    layers = {key: MaterializedLayer({key: Task(key, func, *(parse_input(a) for a in args))},
                                     annotations={"workers": [worker]})
              for key, worker, func, args in ranks}
    keys = [key for key, *_ in ranks]
    graph = HighLevelGraph(layers, {key: set() for key in keys})
    futures = client._graph_to_futures(HLGExpr(dsk=graph), keys, span_metadata=SpanMetadata(collections=[{"type": "Future"}]),
                                       internal_priority={key: 0 for key in keys}, user_priority=RANK_PRIORITY,
                                       fifo_timeout="100 ms")
    return [futures[key] for key in keys]


def start_job(client, fn: Callable, args: tuple = (), kwargs: dict | None = None, **options) -> MPIJob:
    """Creates the job on the sidecar and submits one task per rank (the part of run_mpi that
    leaves the futures on the workers); awaitable with an asynchronous client. See run_mpi for
    the options."""
    return client.sync(_start_job, client, fn, args, kwargs, **options)


def submit_mpi(client, fn: Callable, *args, n: int | None = None, workers: list[str] | None = None,
               pset: str | None = None, impl: str | None = None, mode: str | None = None,
               timeout: float | None = None, wiring_timeout: float | None = None, local: Iterable | None = None,
               **kwargs) -> list:
    """Starts ``fn(comm, *args, **kwargs)`` as one MPI job, like run_mpi, and returns at once with
    one Dask future per rank, in rank order. Each result stays on its rank's worker, so later
    tasks that take a future as input run where it is (``client.submit(g, futures[r])``).
    Cancelling the futures (``client.cancel(futures)``, or dropping them before they finish) ends
    the job and gives its members back. With an asynchronous client, ``await`` it."""
    async def submit() -> list:
        job = await _start_job(client, fn, args, kwargs, n=n, workers=workers, pset=pset, impl=impl, mode=mode,
                               timeout=timeout, wiring_timeout=wiring_timeout, local=local)
        return job.futures

    return client.sync(submit)


def run_mpi(client, fn: Callable, *args, n: int | None = None, workers: list[str] | None = None,
            pset: str | None = None, impl: str | None = None, mode: str | None = None, timeout: float | None = None,
            wiring_timeout: float | None = None, local: Iterable | None = None, **kwargs) -> list:
    """Runs ``fn(comm, *args, **kwargs)`` on each chosen worker as one MPI job; results in rank order.

    Members are ``workers`` (addresses), the members of ``pset``, ``n`` workers chosen by the
    sidecar, or, given ``local`` (futures of data already in the cluster), the workers holding
    that data; each rank then also gets ``local=[...]``: the values of the futures its own worker
    holds, which do not move. ``comm`` is an mpi4py communicator over exactly the members.

    ``mode="inprocess"`` (the default) runs ``fn`` inside the worker processes themselves, in a
    task thread, on a communicator built from the workers' long-lived MPI state (Open MPI: their
    pool session; MPICH / Intel MPI: a merge tree of connect/accept among their worlds of one);
    where that cannot serve (a member outside the pool or without a world of the job's library,
    members in different pool epochs) the job runs in fork mode instead and the reason is logged
    (and recorded in the job's ``modeReason``). ``mode="fork"`` runs each rank in a child process of
    its worker, isolated from it. ``impl``, ``mode``, ``timeout`` and ``wiring_timeout`` default
    to the dask-pmix settings (job.impl, job.mode, timeouts.job, timeouts.wiring).

    This is the gather of submit_mpi: the members are frozen (Dask will not retire them) until
    the job ends, and released afterwards whatever happens. Raises MPIJobError naming the rank,
    the worker and the reason when the job fails; with ``timeout`` it returns or raises within
    about that long. With an asynchronous client, ``await`` it.
    """
    async def run() -> list:
        job = await _start_job(client, fn, args, kwargs, n=n, workers=workers, pset=pset, impl=impl, mode=mode,
                               timeout=timeout, wiring_timeout=wiring_timeout, local=local)
        try:
            return await _gather(client, job, job.job.get("timeoutSeconds") or None)
        finally:
            await job._release()

    return client.sync(run)


async def _gather(client, job: MPIJob, timeout: float | None) -> list:
    """Waits for every rank, but stops as soon as the sidecar fails the job: a rank whose worker
    died has a task that will never run, so its future alone would wait forever. Every wait is
    bounded: by the job's timeout (plus a grace for the sidecar's own, more telling, report), and
    by ENDED_GRACE for a rank whose task has not finished although its job has ended."""
    from distributed.client import _wait

    loop = asyncio.get_running_loop()
    deadline = None if not timeout else loop.time() + timeout + TIMEOUT_GRACE
    ended_since: float | None = None
    while True:
        try:
            await _wait(job.futures, timeout=POLL)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        pending = [f for f in job.futures if not f.done()]
        errored = [f for f in job.futures if f.status == "error"]
        if not pending and not errored:
            return await client._gather(job.futures)
        state = await client.scheduler.dask_pmix_job(job_id=job.id)
        if errored or state.get("state") in FAILED_STATES:
            raise await _job_error(client, job)
        now = loop.time()
        if state.get("state") not in (*ACTIVE_STATES, "unknown"):
            ended_since = ended_since or now
            if now - ended_since > ENDED_GRACE:
                f = pending[0]
                m = job.members[job.futures.index(f)]
                raise MPIJobError(f"the job {state.get('state')}, but rank {m['rank']}'s task never finished on its "
                                  f"worker (it is still {f.status}; the worker may have gone)", job_id=job.id,
                                  rank=m["rank"], worker=m["workerId"])
        if deadline is not None and now > deadline:
            raise MPIJobError(f"timed out after {timeout:g} s", job_id=job.id)


async def _exceptions(futures: list) -> list[BaseException | None]:
    return [await f._exception() if f.status == "error" else None for f in futures]


def _own_error(e: BaseException | None) -> MPIJobError | None:
    """The error a rank raised about its own function or process, if it has one."""
    return e if isinstance(e, MPIJobError) and e.origin == "rank" else None


async def _job_error(client, job: MPIJob) -> MPIJobError:
    """The most telling error. The sidecar names the rank it lost first; when that rank also
    reported why (its exception, which comes soon if its worker lives), that report wins. A rank
    whose worker died never reports."""
    loop = asyncio.get_running_loop()

    async def settle(futures: list, seconds: float) -> None:
        deadline = loop.time() + seconds
        while loop.time() < deadline and not all(f.done() for f in futures):
            await asyncio.sleep(0.02)

    state = await client.scheduler.dask_pmix_job(job_id=job.id)
    members_now = state.get("members", [])
    culprit = next((m for m in members_now if m.get("endedJob")), None)
    if culprit is None and state.get("state") in FAILED_STATES and state.get("error"):
        # Ended for a reason of its own (a timeout, a DELETE, the sidecar gone): members that
        # failed afterwards, because it ended, are not to blame.
        return MPIJobError(state["error"], job_id=job.id)
    if culprit is None:
        await settle(job.futures, 1.0)
        culprit = next((m for m in members_now if m.get("state") == "lost"), None)
    if culprit is not None:
        await settle([job.futures[culprit["rank"]]], OWN_ERROR_WAIT)
        own = _own_error((await _exceptions([job.futures[culprit["rank"]]]))[0])
        if own is not None:
            return own
        return MPIJobError(state.get("error") or f"the job was {state.get('state')}", job_id=job.id,
                           rank=culprit["rank"], worker=culprit["workerId"])
    excs = await _exceptions(job.futures)
    own = [e for e in map(_own_error, excs) if e is not None]
    if own:
        return min(own, key=lambda e: e.rank if e.rank is not None else 1 << 30)
    if state.get("state") in FAILED_STATES:
        return MPIJobError(state.get("error") or f"the job was {state.get('state')}", job_id=job.id)
    rank, exc = next((r, e) for r, e in enumerate(excs) if e is not None)
    if isinstance(exc, MPIJobError):
        return exc
    return MPIJobError(f"{type(exc).__name__}: {exc}", job_id=job.id, rank=rank, worker=job.members[rank]["workerId"],
                       origin="rank")
