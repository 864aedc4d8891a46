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
from ..errors import Failure, MPIFallbackWarning, MPIJobError, classify
from ..protocol import FAILED_STATES, NOT_ADMITTED, Call, Scheduler, Topic, job_view, rank_key
from .events import job_ends
from .graph import pickled_function, submit_held_ranks, submit_ranks, unpicklable
from .plugin_check import PLUGIN_MISSING
from .retries import check_retries, held_now, labels_of, new_family, settle, with_retries, workers_gone

logger = logging.getLogger("dask_pmix")

# With a job timeout, run_mpi gives the sidecar this long to report it before it says so itself.
TIMEOUT_GRACE = 5.0
# A job that ended while a rank's task has not finished: how long before that rank is given up.
ENDED_GRACE = 5.0
# How long a failed job's error waits for the rank the sidecar blames to report why itself (its
# exception reaches the client through Dask after the sidecar saw the rank go). A rank whose
# worker Dask has removed never reports, and is not waited for (_own_report).
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
# Clients whose scheduler's plugin answers Scheduler.WORKERS_GONE (a retry waits on it).
_plugin_settles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _check_plugin(client) -> None:
    address = client.scheduler.address
    if _plugin_seen.get(client) == address:
        return
    found = await client._run_on_scheduler(
        lambda dask_scheduler, hs=(Scheduler.INFO, Scheduler.PSET, Scheduler.WORKERS_GONE): [
            h in dask_scheduler.handlers for h in hs
        ]
    )
    if not found[0]:
        raise RuntimeError(PLUGIN_MISSING)
    _plugin_holds[client] = found[1]
    _plugin_settles[client] = found[2]
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
    labels: dict[str, str] | None = None,
    wait: float | None = None,
) -> MPIJob:
    """``local_for`` (map_blocks_mpi's): given the members in rank order, what each worker's rank
    gets as ``local=``, with futures in it resolved where they are (in place of ``local``).
    ``labels``: the job's labels on the sidecar (an attempt's family and number, with retries).
    ``wait``: how long the request may wait for busy members (dask-pmix.timeouts.admission)."""
    impl, timeout, wiring_timeout = _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    asked = mode or config.get("job.mode")
    await _check_plugin(client)
    ends = job_ends(client)  # subscribed before the job exists: its end cannot be missed
    kwargs = dict(kwargs or {})
    local_by_worker = None
    if local is not None:
        local = list(local)
        # Where the data is is known once it exists (Dask computes again what a lost worker held).
        who_has = await held_now(client, local)
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
        **({"labels": labels} if labels else {}),
        **({"wait": wait} if wait is not None else {}),
    )
    if "error" in created:
        pickling.cancel()
        gone = sorted(await _gone_workers(client, workers)) if local_by_worker is not None and workers else []
        if gone:
            # A holder of the local= data left between the look-up and the request: Dask computes
            # or moves what it held (a retry looks again).
            raise MPIJobError(
                f"worker {gone[0]}, which held local= data, left the cluster before the job started "
                f"(the sidecar said: {created['error']})",
                worker=gone[0],
                kind=Failure.MEMBER_LOST,
                lost_workers=gone,
            )
        raise MPIJobError(created["error"], kind=Failure.REFUSED)
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
    retries: int = 0,
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
    waits for the job's admission (where the data is decides the members and their ranks).

    ``retries``: as run_mpi's. A job that lost a member runs again, up to ``retries`` times,
    with as many ranks as the futures returned (``n`` defaults to the number of workers when the
    call is made); the futures are then made by the attempt that succeeded, each left on its
    rank's worker, or raise the last attempt's error (with ``attempts``). Each attempt waits for
    its own admission, in the background; with ``local`` the call waits for the first one's, and
    a retry whose data is now held by a different number of workers fails saying so. Cancelling
    the futures ends the attempt that runs."""
    checked = _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    retries = check_retries(retries)
    if retries:
        options: dict[str, Any] = {"n": n, "workers": workers, "pset": pset, "impl": impl, "mode": mode}
        options.update(timeout=timeout, wiring_timeout=wiring_timeout)
        starting = _submit_retrying(client, fn, args, kwargs, retries, options, local)
        return starting if client.asynchronous else client.sync(lambda: starting)  # type: ignore[return-value]
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


# The background attempts of submit_mpi calls with retries (kept from the garbage collector).
_driving: set = set()


def _same(value: Any) -> Any:
    """An attempt's rank result under the key of the future submit_mpi returned (no copy)."""
    return value


def _raise(error: BaseException) -> Any:
    """The last attempt's error, raised by the futures submit_mpi returned."""
    raise error


async def _submit_retrying(client, fn, args, kwargs, retries: int, options: dict, local) -> list:
    """submit_mpi with retries: one future per rank, of a key of the family's own, returned at
    once; the attempts run in the background (_drive) and the futures are made by the one that
    succeeds (its results under their keys, where they are) or raise the last attempt's error."""
    from distributed import Future

    await _check_plugin(client)
    family = new_family()
    first: MPIJob | None = None
    local = list(local) if local is not None else None
    if local is not None:
        # Where the data is decides how many ranks there are: the first attempt is started now.
        first = await _start_job(
            client, fn, args, kwargs, local=local, labels=labels_of(family, 1, retries + 1), **options
        )
        if first.fallback is not None:
            warnings.warn(first.fallback, stacklevel=4)
        count = len(first.members)
    else:
        counted = await _held_count(client, options["n"], options["workers"], options["pset"])
        count = len(options["workers"]) if options["workers"] is not None else int(counted or 0)
        if options["workers"] is None and options["pset"] is None:
            options = {**options, "n": count}  # the same number of ranks at every attempt
    futures: list = [Future(f"dask-pmix-{family}-result-{r}", client) for r in range(count)]
    states = [f._state for f in futures]
    task = asyncio.ensure_future(
        _drive(client, family, states, count, fn, args, kwargs, retries, options, local, first)
    )
    _driving.add(task)
    task.add_done_callback(_driving.discard)
    return futures


async def _drive(client, family, states, count, fn, args, kwargs, retries, options, local, first) -> None:
    """The attempts of a submit_mpi call with retries, until one succeeds, one fails for good, or
    the caller cancels (or drops) the futures."""
    stop = asyncio.ensure_future(_any_done(states))
    pending_first = [first]

    async def attempt(labels: dict | None) -> list:
        job = pending_first.pop() if pending_first and pending_first[0] is not None else None
        if job is None:
            job = await _start_job(client, fn, args, kwargs, local=local, labels=labels, **options)
            if job.fallback is not None:
                warnings.warn(job.fallback, stacklevel=1)
        try:
            if stop.done():
                raise asyncio.CancelledError
            if len(job.members) != count:
                raise MPIJobError(
                    f"this attempt's job has {len(job.members)} ranks (the workers holding local= now), but "
                    f"submit_mpi returned {count} futures: call it again",
                    job_id=job.id,
                    kind=Failure.REFUSED,
                )
            gathering = asyncio.ensure_future(_gather(client, job, job.job.get("timeoutSeconds") or None, fetch=False))
            await asyncio.wait({gathering, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not gathering.done():
                gathering.cancel()
                raise asyncio.CancelledError
            done = gathering.result()
        except BaseException:
            await job._release()
            raise
        finally:
            job_ends(client).forget(job.id)
        return [(m["workerId"], f) for m, f in zip(job.members, done)]

    try:
        ranks = await with_retries(client, retries, attempt, settle_with=_settler(client), family=family)
    except asyncio.CancelledError:
        return  # the futures were cancelled or dropped: nothing to make
    except Exception as e:  # noqa: BLE001 - the last attempt's error (or anything else) reaches the futures
        if not stop.done():
            _made(client, [(s.key, _raise, (e,), None) for s in states])
        return
    finally:
        stop.cancel()
    if any(s.status == "cancelled" for s in states):
        return
    _made(client, [(s.key, _same, (f,), worker) for s, (worker, f) in zip(states, ranks)])


def _made(client, tasks: list) -> list:
    """Tasks (key, function, arguments, worker or None) under the keys of submit_mpi's futures, as
    one graph; a task with a worker prefers it (its argument is there), and runs elsewhere only
    once that worker is gone."""
    from dask._task_spec import Task, parse_input

    from .graph import _submit_layers

    return _submit_layers(
        client,
        [
            (
                key,
                Task(key, func, *(parse_input(a) for a in args)),
                {"workers": [worker], "allow_other_workers": True} if worker else {},
            )
            for key, func, args, worker in tasks
        ],
    )


async def _any_done(states: list) -> None:
    """Returns once one of the futures' states is done: before _drive makes them, only a cancel
    (or every future dropped) does that."""
    waits = [asyncio.ensure_future(s.wait()) for s in states]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


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
    retries: int = 0,
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
    fails (its ``kind`` says why: a :class:`dask_pmix.errors.Failure`); with ``timeout`` it
    returns or raises within about that long (each attempt, with retries). With an asynchronous
    client, ``await`` it.

    ``retries`` (a whole number, 0 by default): how many times a job that failed because a member
    was lost (its worker died, was retired or removed by Dask, restarted, or its MPI session
    ended: ``kind == "member-lost"``) is run again, on the workers there are then: ``n`` workers
    chosen afresh, or with ``local=`` the workers that hold the data once Dask has computed again
    what the lost worker held. A rank's own exception, a timeout, a cancel or a refused request
    is never retried. The error of the last attempt is raised, with ``attempts`` (every
    attempt's error, in order) and the earlier attempts in its message and its ``__cause__``
    chain; each attempt is a job of its own on the sidecar, labelled with its family and number.
    """
    _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    retries = check_retries(retries)
    fallbacks: list = []
    local = list(local) if local is not None else None

    async def attempt(labels: dict | None) -> list:
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
            labels=labels,
        )
        return await _finish(client, job, fallbacks)

    async def run() -> list:
        return await with_retries(client, retries, attempt, settle_with=_settler(client))

    return _sync(client, fallbacks, run)


async def _finish(client, job: MPIJob, fallbacks: list, fetch: bool = True) -> list:
    """The results of a started job, in rank order (``fetch=False``: its futures, once every rank
    has finished, for fetch_results); its members are released whatever happens."""
    _warn_soon(fallbacks, job)
    try:
        return await _gather(client, job, job.job.get("timeoutSeconds") or None, fetch=fetch)
    except BaseException:
        await job._release()
        # The caller never sees these futures: the finished ranks' results would otherwise stay
        # in their workers' memory for as long as the error (its traceback holds them) lives.
        for f in job.futures:
            f.release()
        raise
    finally:
        job_ends(client).forget(job.id)


def _settler(client) -> Callable[[MPIJobError], Any]:
    """What a retry waits for (retries.settle): the lost workers gone and the failed job's members
    out of it (bounded), where the plugin can say."""

    async def wait(failed: MPIJobError) -> None:
        await settle(client, failed, bool(_plugin_settles.get(client)))

    return wait


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
                    return await fetch_results(client, job, job.futures)
                # A rank raised: the job's end names the rank that ended it (the others' errors
                # may only say that it ended).
                await asyncio.wait({end}, timeout=OWN_ERROR_WAIT)
                raise await _job_error(job, end.result() if end.done() else None, client)
            if end in done:
                view = end.result()
                if view.get("state") in FAILED_STATES:
                    raise await _job_error(job, view, client)
                # Ended well: the ranks' results are on their way.
                await asyncio.wait({ranks}, timeout=ENDED_GRACE)
                if not ranks.done():
                    f = next(f for f in job.futures if not f.done())
                    m = job.members[job.futures.index(f)]
                    gone = m["workerId"] in await _gone_workers(client, [m["workerId"]])
                    raise MPIJobError(
                        f"the job {view.get('state')}, but rank {m['rank']}'s task never finished on "
                        f"its worker (it is still {f.status}; "
                        + ("the worker has gone)" if gone else "the worker may have gone)"),
                        job_id=job.id,
                        rank=m["rank"],
                        worker=m["workerId"],
                        kind=Failure.MEMBER_LOST if gone else Failure.JOB,
                        lost_workers=[m["workerId"]] if gone else [],
                    )
                continue
            raise MPIJobError(f"timed out after {timeout:g} s", job_id=job.id, kind=Failure.TIMEOUT)
    finally:
        ranks.cancel()


async def fetch_results(client, job: MPIJob, futures: list) -> list:
    """The values of finished rank ``futures`` of ``job``; a result that cannot come back, named."""
    try:
        return await client._gather(futures)
    except Exception as e:
        raise _result_error(job, e) from e


def _result_error(job: MPIJob, e: Exception) -> Exception:
    """A rank's result that could not come back, named."""
    text = str(e)
    if "serialize" in text or "pickle" in text.lower():
        return MPIJobError(
            f"a rank's result could not be sent back to the client ({type(e).__name__}: {text}); "
            "return a value Dask can serialize, or leave it on the worker with submit_mpi",
            job_id=job.id,
            kind=Failure.RANK,
        )
    return e


async def _exceptions(futures: list) -> list[BaseException | None]:
    return [await f._exception() if f.status == "error" else None for f in futures]


def _own_error(e: BaseException | None) -> MPIJobError | None:
    """The error a rank raised about its own function or process, if it has one."""
    return e if isinstance(e, MPIJobError) and e.origin == "rank" else None


async def _gone_workers(client, workers: list[str]) -> set[str]:
    """Those of `workers` that Dask no longer has."""
    if client is None or not workers:
        return set()
    try:
        now = await client.scheduler.ncores()
    except Exception:  # noqa: BLE001 - no evidence: none gone
        return set()
    return {w for w in workers if w not in now}


async def _fresh_view(client, job_id: str) -> dict:
    """The job as the sidecar has it now (members with their reasons), or {}."""
    try:
        job = await getattr(client.scheduler, Scheduler.JOB)(job_id=job_id)
    except Exception:  # noqa: BLE001
        return {}
    return job_view(job) if isinstance(job, dict) and job.get("members") else {}


async def _own_report(client, future, worker: str) -> None:
    """Waits up to OWN_ERROR_WAIT for the rank's task to settle, or until Dask has removed its
    worker (the plugin answers then): a rank killed with its worker never reports, and waiting
    out the bound for it made every job that lost a member fail a second late (and an elastic job
    resume that late)."""
    settled = asyncio.ensure_future(_settled([future], OWN_ERROR_WAIT))
    if client is None or not _plugin_settles.get(client):
        await settled
        return
    gone = asyncio.ensure_future(workers_gone(client, [worker], OWN_ERROR_WAIT))
    try:
        done, _ = await asyncio.wait({settled, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone in done and gone.result() is None:
            await settled  # the plugin could not be asked: the bound alone
    finally:
        gone.cancel()
        settled.cancel()


async def _members_out(client, job_id: str, view: dict) -> None:
    """Returns once every member has left the failed job (the plugin answers then: a lost member
    leaves it as soon as the sidecar or Dask sees it go), at most OWN_ERROR_WAIT later; after
    OWN_ERROR_WAIT when the plugin cannot say (an older one, or a job not seen to have ended)."""
    if _plugin_settles.get(client) and view.get("state") in FAILED_STATES:
        if await workers_gone(client, [], OWN_ERROR_WAIT, job_id) is not None:
            return
    await asyncio.sleep(OWN_ERROR_WAIT)


async def _job_error(job: MPIJob, view: dict | None, client=None) -> MPIJobError:
    """The most telling error (_blamed), with why the job failed (its kind: errors.classify) and
    the workers whose loss failed it."""
    err = await _blamed(job, view, client)
    if err.kind is not None or client is None:
        return err
    view = view if view and view.get("members") else await _fresh_view(client, job.id)
    workers = [m["workerId"] for m in job.members]
    own = err if err.origin == "rank" else None
    kind, lost = classify(view, own=own, gone=await _gone_workers(client, workers), mode=job.mode)
    if kind == Failure.RANK and "MPI error" in err.reason:
        # An MPI call that failed may have failed because a member went before the sidecar said so.
        await _members_out(client, job.id, view)
        view = await _fresh_view(client, job.id) or view
        kind, lost = classify(view, own=own, gone=await _gone_workers(client, workers), mode=job.mode)
    if not view.get("members") and own is not None:
        kind = Failure.RANK  # nothing heard of the job: a rank said it failed
    err.kind = kind
    err.lost_workers = tuple(lost)
    return err


async def _blamed(job: MPIJob, view: dict | None, client=None) -> MPIJobError:
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
        await _own_report(client, job.futures[culprit["rank"]], culprit["workerId"])
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
