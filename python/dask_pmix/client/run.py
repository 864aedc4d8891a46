"""run_mpi and submit_mpi: an MPI job over workers the cluster already has.

A job is created at the scheduler plugin (which asks the sidecar: the request waits in the
sidecar's admission line while its workers are busy), then runs as one Dask task per rank,
pinned to its worker. The client learns that a job ended from the scheduler's push (client.events)
and from its ranks' futures; it never asks in a loop. Every wait has a bound: the job's timeout
(plus a grace for the sidecar's own, more telling, report), and ENDED_GRACE for a rank whose task
has not finished although its job has ended."""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .. import config
from ..errors import MPIFallbackWarning, MPIJobError
from ..protocol import FAILED_STATES, NOT_ADMITTED, Call, Scheduler, Topic, rank_key
from .events import job_ends
from .graph import pickled_function, submit_held_ranks, submit_ranks, unpicklable
from .plugin_check import PLUGIN_MISSING

logger = logging.getLogger("dask_pmix")

# With a job timeout, run_mpi gives the sidecar this long to report it before it says so itself.
TIMEOUT_GRACE = 5.0
# A job that ended while a rank's task has not finished: how long before that rank is given up.
ENDED_GRACE = 5.0
# How long a failed job's error waits for the rank the sidecar blames to report why itself (its
# exception reaches the client through Dask after the sidecar saw the rank go). A rank whose
# worker died never reports: its error comes this much later.
OWN_ERROR_WAIT = 1.0
MODES = (None, "inprocess", "fork")
#: The MPI libraries the sidecar runs jobs for (src/rm/types.ts IMPLS).
IMPLS = ("openmpi", "mpich", "intelmpi")
#: The sidecar's bounds on a job's timeouts, in seconds (src/api/schemas.ts, CreateJobRequest).
MAX_SECONDS = {"timeout": (31_536_000, "365 days"), "wiring_timeout": (86_400, "1 day")}


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

    ``futures`` are in rank order; ``release()`` cancels the ranks that have not finished, which
    ends the job and gives its members back (the scheduler plugin sees their tasks dropped).
    run_mpi gathers; submit_mpi hands the futures over.
    """

    def __init__(self, client, job: dict, futures: list):
        self.fallback: MPIFallbackWarning | None = None  # why it runs in fork mode, when not asked to
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
        elif not self.futures:
            await getattr(self.client.scheduler, Scheduler.RELEASE_JOB)(job_id=self.id)
        job_ends(self.client).forget(self.id)

    def release(self):
        return self.client.sync(self._release)


# Whether the scheduler has the plugin's handlers, asked once per client and scheduler: a call to
# a handler the scheduler lacks never returns.
_plugin_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Clients whose scheduler's plugin holds a job's rank tasks until the job is admitted (it has the
# PSET handler, which came with that): submit_mpi may send them before the admission. An older
# plugin would leave such tasks waiting for good.
_plugin_holds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _check_plugin(client) -> None:
    address = client.scheduler.address
    if _plugin_seen.get(client) == address:
        return
    found = await client._run_on_scheduler(
        lambda dask_scheduler, hs=(Scheduler.INFO, Scheduler.PSET): [h in dask_scheduler.handlers for h in hs]
    )
    if not found[0]:
        raise RuntimeError(PLUGIN_MISSING)
    _plugin_holds[client] = found[1]
    _plugin_seen[client] = address


def _seconds(name: str, value) -> float | None:
    """A timeout argument: positive seconds within the sidecar's bound, or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        raise ValueError(f"{name} must be a positive number of seconds, or None for no limit, not {value!r}")
    top, span = MAX_SECONDS.get(name, (math.inf, ""))
    if not (math.isfinite(float(value)) and float(value) <= top):
        raise ValueError(
            f"{name} must be a positive number of seconds up to {top:,} ({span}, the sidecar's bound), "
            f"or None for no limit, not {value!r}"
        )
    return float(value)


def _impl(impl) -> str:
    """The MPI library asked for (None: the dask-pmix.job.impl setting), one of IMPLS."""
    chosen = impl or config.get("job.impl")
    if chosen not in IMPLS:
        known = ", ".join(repr(i) for i in IMPLS[:-1]) + f" or {IMPLS[-1]!r}"
        where = "" if impl else " (from the dask-pmix.job.impl setting)"
        raise ValueError(f"impl must be {known} (or None for the default), not {chosen!r}{where}")
    return chosen


def _check_request(n, workers, mode, impl, timeout, wiring_timeout) -> tuple[str, float | None, float | None]:
    """Everything about a job request that can be refused before the cluster is asked; the MPI
    library and the timeouts with the settings' defaults filled in."""
    _check_options(n, workers, mode)
    return (
        _impl(impl),
        _seconds("timeout", config.seconds("timeouts.job") if timeout is None else timeout),
        _seconds("wiring_timeout", config.seconds("timeouts.wiring") if wiring_timeout is None else wiring_timeout),
    )


def _check_options(n, workers, mode) -> None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
        raise ValueError(f"n must be a positive whole number of members, or None, not {n!r}")
    if workers is not None and (isinstance(workers, str) or not workers):
        raise ValueError(f"workers must be a non-empty list of worker addresses, not {workers!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be 'inprocess' or 'fork' (or None for the default), not {mode!r}")


async def _start_job(
    client,
    fn: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    n: int | None = None,
    workers: list[str] | None = None,
    pset: str | None = None,
    impl: str | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    local: Iterable | None = None,
    local_for: Callable[[list[dict]], dict[str, Any]] | None = None,
) -> MPIJob:
    """``local_for`` (map_blocks_mpi's): given the members in rank order, what each worker's rank
    gets as ``local=``, with futures in it resolved where they are (in place of ``local``)."""
    impl, timeout, wiring_timeout = _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    asked = mode or config.get("job.mode")
    await _check_plugin(client)
    ends = job_ends(client)  # subscribed before the job exists: its end cannot be missed
    kwargs = dict(kwargs or {})
    local_by_worker = None
    if local is not None:
        local = list(local)
        from distributed.client import _wait

        await _wait(local)  # where the data is is known once it exists
        who_has = await client.scheduler.who_has(keys=[f.key for f in local])
        local_by_worker = _holders(who_has, local)
        if workers is None and pset is None and n is None:
            workers = sorted(local_by_worker)
    # Pickled once for every rank (not by the scheduler as it sends each rank's task: cloudpickle of a
    # function by value takes milliseconds), while the job is being created.
    pickling = asyncio.ensure_future(asyncio.to_thread(pickled_function, fn))
    created = await getattr(client.scheduler, Scheduler.CREATE_JOB)(
        workers=workers,
        n=n,
        pset=pset,
        impl=impl,
        owner=client.id,
        timeout=timeout,
        wiring_timeout=wiring_timeout,
        mode=asked or "inprocess",
        strict=asked == "inprocess",
    )
    if "error" in created:
        pickling.cancel()
        raise MPIJobError(created["error"])
    job = created["job"]
    mpi_job = MPIJob(client, job, [])
    try:
        function = await pickling
    except Exception as e:
        await mpi_job._release()
        raise TypeError(unpicklable(fn, (), {}) or f"the MPI job's function cannot be pickled: {e!r}") from e
    if job.get("mode") == "fork" and job.get("modeReason") and asked != "fork":
        # No job id in the text: Python shows a warning once per call site and text, so a loop
        # of jobs that fall back for one reason (an MPICH cluster, whose in-process pool is off
        # by default) warns once, not at every job.
        mpi_job.fallback = MPIFallbackWarning(
            "dask-pmix: MPI jobs run in fork mode (each rank a child process of its worker, "
            f"not the worker itself): {job['modeReason']}"
        )
    if local_for is not None:
        try:
            local_by_worker = local_for(mpi_job.members)
        except BaseException:
            await mpi_job._release()
            raise
    build_timeout = config.seconds("timeouts.communicator")
    ranks: list[tuple[str, str, Callable[..., Any], tuple[Any, ...]]] = []
    for m in mpi_job.members:
        worker_id = m["workerId"]
        mine = local_by_worker.get(worker_id, []) if local_by_worker is not None else None
        key = rank_key(job["id"], m["rank"])
        if mpi_job.mode == "inprocess":
            ranks.append(
                (
                    key,
                    worker_id,
                    Call("dask_pmix.member.task:inprocess_rank"),
                    (job, m["rank"], worker_id, function, args, kwargs, mine, build_timeout),
                )
            )
        else:
            ranks.append(
                (
                    key,
                    worker_id,
                    Call("dask_pmix.member.task:fork_rank"),
                    (
                        job["id"],
                        m["rank"],
                        worker_id,
                        created["envs"][worker_id],
                        impl,
                        function,
                        args,
                        kwargs,
                        timeout,
                        mine,
                        job.get("modeReason") or "",
                    ),
                )
            )
    try:
        mpi_job.futures.extend(submit_ranks(client, ranks))
    except BaseException as e:
        await mpi_job._release()
        why = unpicklable(fn, args, kwargs) if isinstance(e, Exception) else None
        if why:
            raise TypeError(why) from e
        raise
    ends.expect(job["id"])
    return mpi_job


def _sync(client, fallbacks: list, coro_fn):
    """client.sync(coro_fn), with the fallback warnings (the coroutine collects them in
    `fallbacks`) issued in the caller's thread once it is done, whatever the outcome. With an
    asynchronous client the caller awaits the coroutine, which issues them itself."""
    if client.asynchronous:
        fallbacks.append(None)  # the marker: warn at once
        return client.sync(coro_fn)
    try:
        return client.sync(coro_fn)
    finally:
        for w in fallbacks:
            warnings.warn(w, stacklevel=3)


def _warn_soon(fallbacks: list, job: MPIJob) -> None:
    if job.fallback is not None:
        if fallbacks[:1] == [None]:
            warnings.warn(job.fallback, stacklevel=3)
        else:
            fallbacks.append(job.fallback)


def start_job(client, fn: Callable, args: tuple = (), kwargs: dict | None = None, **options) -> MPIJob:
    """Creates the job on the sidecar and submits one task per rank (the part of run_mpi that
    leaves the futures on the workers); awaitable with an asynchronous client. See run_mpi for
    the options."""
    fallbacks: list = []

    async def start() -> MPIJob:
        job = await _start_job(client, fn, args, kwargs, **options)
        _warn_soon(fallbacks, job)
        return job

    return _sync(client, fallbacks, start)


def submit_mpi(
    client,
    fn: Callable,
    *args,
    n: int | None = None,
    workers: list[str] | None = None,
    pset: str | None = None,
    impl: str | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    local: Iterable | None = None,
    **kwargs,
) -> list:
    """Starts ``fn(comm, *args, **kwargs)`` as one MPI job, like run_mpi, and returns at once with
    one Dask future per rank, in rank order. Each result stays on its rank's worker, so later
    tasks that take a future as input run where it is (``client.submit(g, futures[r])``).
    Cancelling the futures (``client.cancel(futures)``, or dropping them before they finish) ends
    the job and gives its members back. With an asynchronous client, ``await`` it.

    A job whose members are busy waits for them as its futures do, not in this call: the ranks'
    tasks are submitted at once and held by the scheduler until the sidecar admits the job (jobs
    submitted one after another are admitted in that order), then run on the members it froze.
    A job that cannot be admitted within its ``timeout`` (or dask-pmix.timeouts.admission), or
    that the sidecar refuses, makes its futures raise MPIJobError with the sidecar's reason;
    cancelling them while the job waits takes it out of the line. With ``local`` the call still
    waits for the job's admission (where the data is decides the members and their ranks)."""
    checked = _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    if local is None:
        if client.asynchronous:
            # Awaited by the caller, as client.sync's coroutine is.
            return _submit_held(client, fn, args, kwargs, n, workers, pset, mode, *checked)  # type: ignore[return-value]
        if _plugin_seen.get(client) != client.scheduler.address:
            client.sync(_check_plugin, client)  # once per client
        if _plugin_holds.get(client):
            if n is None and workers is None:  # how many ranks: the pset's members, or every worker
                n = client.sync(_held_count, client, n, workers, pset)
            # The graph goes from this thread, as Client.submit sends its own: no wait for the
            # client's event loop, which may be busy (with the scheduler itself, in a LocalCluster).
            return _held_ranks(client, fn, args, kwargs, n, workers, pset, mode, *checked)
    fallbacks: list = []

    async def submit() -> list:
        job = await _start_job(
            client,
            fn,
            args,
            kwargs,
            n=n,
            workers=workers,
            pset=pset,
            impl=impl,
            mode=mode,
            timeout=timeout,
            wiring_timeout=wiring_timeout,
            local=local,
        )
        _warn_soon(fallbacks, job)
        return job.futures

    return _sync(client, fallbacks, submit)


_fallback_heard: weakref.WeakSet = weakref.WeakSet()


def _warn_on_fallback(client) -> None:
    """A job submitted before its admission learns its mode only then: the scheduler pushes a
    fallback to fork mode (Topic.FALLBACK), and it is warned about here, as start_job warns (in
    the client's event-loop thread, so once per reason rather than once per call site)."""
    if client in _fallback_heard:
        return
    _fallback_heard.add(client)

    def heard(event) -> None:
        _, job = event
        reason = job.get("modeReason") if isinstance(job, dict) else None
        if reason:
            warnings.warn(
                MPIFallbackWarning(
                    "dask-pmix: MPI jobs run in fork mode (each rank a child process of its worker, "
                    f"not the worker itself): {reason}"
                ),
                stacklevel=1,
            )

    client.subscribe_topic(Topic.FALLBACK, heard)


async def _held_count(client, n: int | None, workers: list[str] | None, pset: str | None) -> int | None:
    """`n` for a job submitted before its admission: as given; with `pset`, its members now; else
    (neither n nor workers) every worker there is now, as create_job counts them."""
    if n is not None or workers is not None:
        return n
    if pset is not None:
        members = (await getattr(client.scheduler, Scheduler.PSET)(name=pset)).get("members")
        if not members:
            raise MPIJobError(f"the sidecar has no process set named {pset!r} (or it has no members)")
        return len(members)
    count = len(await client.scheduler.ncores())
    if not count:
        raise MPIJobError("the cluster has no workers: add workers first (cluster.scale(...))")
    return count


async def _submit_held(client, fn: Callable, args: tuple, kwargs: dict, n, workers, pset, mode, *checked) -> list:
    """submit_mpi with an asynchronous client."""
    await _check_plugin(client)
    if not _plugin_holds.get(client):
        job = await _start_job(
            client, fn, args, kwargs, n=n, workers=workers, pset=pset, mode=mode, impl=checked[0],
            timeout=checked[1], wiring_timeout=checked[2],
        )  # fmt: skip
        return job.futures
    n = await _held_count(client, n, workers, pset)
    return _held_ranks(client, fn, args, kwargs, n, workers, pset, mode, *checked)


def _held_ranks(
    client,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    n: int | None,
    workers: list[str] | None,
    pset: str | None,
    mode: str | None,
    impl: str,
    timeout: float | None,
    wiring_timeout: float | None,
) -> list:
    """submit_mpi's ranks, submitted before their job is admitted (graph.submit_held_ranks): the
    scheduler plugin asks the sidecar for the job and lets them run once it is admitted."""
    job_ends(client)  # the scheduler pushes the job's end to this client: someone must listen
    _warn_on_fallback(client)
    asked = mode or config.get("job.mode")
    if workers is not None:
        workers = list(workers)
        count = len(workers)
    else:
        count = int(n or 0)
    # The request waits in the sidecar's line for at most the job's timeout: a job that cannot even
    # start within it fails then, as run_mpi's would.
    admission = config.seconds("timeouts.admission")
    wait = min(admission, timeout) if timeout and admission else (timeout or admission)
    request = {
        "workers": workers,
        "n": None if workers is not None or pset is not None else n,
        "pset": pset,
        "impl": impl,
        "timeout": timeout,
        "wiring_timeout": wiring_timeout,
        "mode": asked or "inprocess",
        "strict": asked == "inprocess",
        "wait": wait or 0.0,
    }
    ticket = f"q{uuid.uuid4().hex}"
    request["labels"] = {"dask-pmix.request": ticket}
    try:
        function = pickled_function(fn)
    except Exception as e:
        raise TypeError(unpicklable(fn, (), {}) or f"the MPI job's function cannot be pickled: {e!r}") from e
    build_timeout = config.seconds("timeouts.communicator")
    kwargs = dict(kwargs or {})
    mark = {"ticket": ticket, "ranks": count, "request": request}
    ranks: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict]] = [
        (
            rank_key(ticket, r),
            Call("dask_pmix.member.task:admitted_rank"),
            (NOT_ADMITTED, r, function, args, kwargs, build_timeout, impl, timeout),
            {**mark, "rank": r},
        )
        for r in range(count)
    ]
    try:
        return submit_held_ranks(client, ranks)
    except Exception as e:
        why = unpicklable(fn, args, kwargs)
        if why:
            raise TypeError(why) from e
        raise


def run_mpi(
    client,
    fn: Callable,
    *args,
    n: int | None = None,
    workers: list[str] | None = None,
    pset: str | None = None,
    impl: str | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    local: Iterable | None = None,
    **kwargs,
) -> list:
    """Runs ``fn(comm, *args, **kwargs)`` on each chosen worker as one MPI job; results in rank order.

    Members are ``workers`` (addresses), the members of ``pset``, ``n`` workers chosen by the
    sidecar, or, given ``local`` (futures of data already in the cluster), the workers holding
    that data; each rank then also gets ``local=[...]``: the values of the futures its own worker
    holds, which do not move. ``comm`` is an mpi4py communicator over exactly the members.

    By default (``mode=None``) ``fn`` runs inside the worker processes themselves, in a task
    thread, on a communicator built from the workers' long-lived MPI state (Open MPI: their pool
    session; MPICH / Intel MPI with ``dask-pmix.pool.mpich``: a merge tree of connect/accept among
    their worlds); a job waits (``dask-pmix.timeouts.pool-join``) for members whose session is
    still starting, and where in-process cannot serve (a member outside the pool, members in
    different pool epochs, an MPI library without it) it runs in fork mode instead, with an
    ``MPIFallbackWarning`` saying why. ``mode="inprocess"`` never falls back: it waits, or fails
    saying why. ``mode="fork"`` runs each rank in a child process of its worker, isolated from it
    (``get_worker()`` is not available there). ``impl``, ``mode``, ``timeout`` and
    ``wiring_timeout`` default to the dask-pmix settings (job.impl, job.mode, timeouts.job,
    timeouts.wiring); ``impl`` is "openmpi", "mpich" or "intelmpi"; timeouts are positive seconds
    (at most 365 days, a wiring timeout 1 day), or None for no limit. Bad options raise ValueError
    before the cluster is asked.

    The members are frozen (Dask will not retire them) until the job ends, and released afterwards
    whatever happens. Raises MPIJobError naming the rank, the worker and the reason when the job
    fails; with ``timeout`` it returns or raises within about that long. With an asynchronous
    client, ``await`` it.
    """
    _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    fallbacks: list = []

    async def run() -> list:
        job = await _start_job(
            client,
            fn,
            args,
            kwargs,
            n=n,
            workers=workers,
            pset=pset,
            impl=impl,
            mode=mode,
            timeout=timeout,
            wiring_timeout=wiring_timeout,
            local=local,
        )
        _warn_soon(fallbacks, job)
        try:
            return await _gather(client, job, job.job.get("timeoutSeconds") or None)
        except BaseException:
            await job._release()
            raise
        finally:
            job_ends(client).forget(job.id)

    return _sync(client, fallbacks, run)


async def _all_or_first_error(futures: list) -> None:
    """Returns once every future is done, or one of them has erred."""
    pending = {asyncio.ensure_future(f._state.wait()): f for f in futures if not f.done()}
    try:
        if any(f.status == "error" for f in futures):
            return
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                if pending.pop(d).status == "error":
                    return
    finally:
        for task in pending:
            task.cancel()


async def _settled(futures: list, seconds: float) -> None:
    """Waits up to `seconds` for the futures to be done."""
    waits = [asyncio.ensure_future(f._state.wait()) for f in futures if not f.done()]
    if waits:
        _, pending = await asyncio.wait(waits, timeout=seconds)
        for task in pending:
            task.cancel()


async def _gather(client, job: MPIJob, timeout: float | None, fetch: bool = True) -> list:
    """The ranks' results, or the job's error as soon as the job fails (pushed by the scheduler).
    ``fetch=False``: once every rank has finished, their futures, the results left where they are."""
    loop = asyncio.get_running_loop()
    deadline = None if not timeout else loop.time() + timeout + TIMEOUT_GRACE
    end = job_ends(client).expect(job.id)
    ranks = asyncio.ensure_future(_all_or_first_error(job.futures))
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait({ranks, end}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if ranks in done:
                if all(f.status == "finished" for f in job.futures):
                    if not fetch:
                        return job.futures
                    try:
                        return await client._gather(job.futures)
                    except Exception as e:
                        raise _result_error(job, e) from e
                # A rank raised: the job's end names the rank that ended it (the others' errors
                # may only say that it ended).
                await asyncio.wait({end}, timeout=OWN_ERROR_WAIT)
                raise await _job_error(job, end.result() if end.done() else None)
            if end in done:
                view = end.result()
                if view.get("state") in FAILED_STATES:
                    raise await _job_error(job, view)
                # Ended well: the ranks' results are on their way.
                await asyncio.wait({ranks}, timeout=ENDED_GRACE)
                if not ranks.done():
                    f = next(f for f in job.futures if not f.done())
                    m = job.members[job.futures.index(f)]
                    raise MPIJobError(
                        f"the job {view.get('state')}, but rank {m['rank']}'s task never finished on "
                        f"its worker (it is still {f.status}; the worker may have gone)",
                        job_id=job.id,
                        rank=m["rank"],
                        worker=m["workerId"],
                    )
                continue
            raise MPIJobError(f"timed out after {timeout:g} s", job_id=job.id)
    finally:
        ranks.cancel()


def _result_error(job: MPIJob, e: Exception) -> Exception:
    """A rank's result that could not come back, named."""
    text = str(e)
    if "serialize" in text or "pickle" in text.lower():
        return MPIJobError(
            f"a rank's result could not be sent back to the client ({type(e).__name__}: {text}); "
            "return a value Dask can serialize, or leave it on the worker with submit_mpi",
            job_id=job.id,
        )
    return e


async def _exceptions(futures: list) -> list[BaseException | None]:
    return [await f._exception() if f.status == "error" else None for f in futures]


def _own_error(e: BaseException | None) -> MPIJobError | None:
    """The error a rank raised about its own function or process, if it has one."""
    return e if isinstance(e, MPIJobError) and e.origin == "rank" else None


async def _job_error(job: MPIJob, view: dict | None) -> MPIJobError:
    """The most telling error. The sidecar names the rank it lost first; when that rank also
    reported why (its exception, which comes soon if its worker lives), that report wins. A rank
    whose worker died never reports."""
    view = view or {}
    members_now = view.get("members", [])
    culprit = next((m for m in members_now if m.get("endedJob")), None)
    if culprit is None and view.get("state") in FAILED_STATES and view.get("error"):
        # Ended for a reason of its own (a timeout, a cancel, the sidecar gone): members that
        # failed afterwards, because it ended, are not to blame.
        return MPIJobError(view["error"], job_id=job.id)
    if culprit is None:
        await _settled(job.futures, 1.0)
        culprit = next((m for m in members_now if m.get("state") == "lost"), None)
    if culprit is not None:
        await _settled([job.futures[culprit["rank"]]], OWN_ERROR_WAIT)
        own = _own_error((await _exceptions([job.futures[culprit["rank"]]]))[0])
        if own is not None:
            return own
        return MPIJobError(
            view.get("error") or f"the job was {view.get('state')}",
            job_id=job.id,
            rank=culprit["rank"],
            worker=culprit["workerId"],
        )
    excs = await _exceptions(job.futures)
    owns = [e for e in map(_own_error, excs) if e is not None]
    if owns:
        return min(owns, key=lambda e: e.rank if e.rank is not None else 1 << 30)
    if view.get("state") in FAILED_STATES:
        return MPIJobError(view.get("error") or f"the job was {view.get('state')}", job_id=job.id)
    failed = next(((r, e) for r, e in enumerate(excs) if e is not None), None)
    if failed is None:
        return MPIJobError("the job failed", job_id=job.id)
    rank, exc = failed
    if isinstance(exc, MPIJobError):
        return exc
    return MPIJobError(
        f"{type(exc).__name__}: {exc}", job_id=job.id, rank=rank, worker=job.members[rank]["workerId"], origin="rank"
    )
