"""One member of an in-process MPI job: the worker process itself, in a task thread.

The member meets the others at the scheduler (so that none enters MPI_Comm_create_from_group,
which cannot be interrupted, while another may never come), builds the job's communicator from
its pool (dask_pmix.worker.pool), runs ``fn(comm, ...)`` on the data the worker holds, frees the
communicator and tells the scheduler it is done. MPICH / Intel MPI members are worlds of their
own joined by a merge tree (dask_pmix.member.world).

Failures (Open MPI 5.0.11, fault tolerance on):
- A member that dies: the sidecar fails the job and tells the survivors which process failed;
  their MPI calls return MPI_ERR_PROC_FAILED and they go back to Dask work.
- A member whose function raises revokes the communicator, so that the others, waiting for it in
  a collective, get MPI_ERR_REVOKED instead of hanging.
- A job that fails while the function runs elsewhere (a timeout, a cancel, a member lost): the
  scheduler pushes it to every member's worker, whose watcher (dask_pmix.member.watcher) revokes
  the communicator; a member stuck inside MPI has its worker replaced, its data moved first.
- One job at a time in MPI per process: a member waits, before it joins, until the members of
  earlier jobs in this process have left (their jobs have ended, so their communicators are
  revoked at once). Open MPI 5.0.x's ob1 queues a message for a communicator not yet added to the
  PML on an unlocked list that MPI_Comm_create_from_group scans only once; another thread
  progressing MPI meanwhile can append there after the scan, and the new communicator's
  activation then waits forever.
- No revoke follows an MPI failure: the failed process is known to all already, and the extra
  revoke traffic made survivors crash in the next job more often.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import MPIJobError
from ..worker import members as registry
from ..worker import pool as pool_mod
from ..worker import world_model
from ..worker.activation import GATE
from . import comm_cache, job_comms, tracking
from .ending import describe, failed_ranks, failer, give_up, is_mpi_error, linger
from .watcher import WATCHER, Calls, revoke

logger = logging.getLogger("dask_pmix")

# How long a job waits for the comm backend's pair communicators already agreed on (activation.py):
# their builds need only their peer's call, normally milliseconds.
PAIRS_WAIT = 10.0


def end_earlier(job_id: str) -> Callable[[str], None]:
    """Ends, for ``job_id``, a job still running in this process: it has ended (a worker is in one
    job at a time), so its communicator is revoked at once and its member leaves."""
    return lambda other: WATCHER.end_now(other, f"job {job_id} wants this worker")


def wait_alone(job_id: str, deadline: float, fail: Callable[..., MPIJobError]) -> None:
    """Before joining: no member of an earlier job may still run in this process."""
    lingering = registry.wait_alone(job_id, max(0.0, deadline - time.monotonic()), end_earlier(job_id))
    if lingering:
        raise fail(
            f"a member of an earlier job ({', '.join(lingering)}) still runs in this worker after that job "
            "ended (its function has not returned); a new communicator cannot be built beside it"
        )


def join(
    calls: Calls,
    job_id: str,
    rank: int,
    worker: str,
    deadline: float,
    wiring_timeout: float,
    fail: Callable[..., MPIJobError],
    ports: dict | None = None,
) -> dict:
    """Waits at the scheduler until every member is there; its answer."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise fail(f"the other members did not come within {wiring_timeout:.0f} s")
        answer = calls.join(min(10.0, left), *([ports] if ports is not None else []))
        if "error" in answer:
            raise MPIJobError(answer["error"], job_id=job_id, rank=rank, worker=worker)
        if answer.get("ready"):
            return answer


def run_member(
    *,
    job: dict,
    rank: int,
    worker: str,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    calls: Calls,
    wiring_timeout: float,
    build_timeout: float | None = None,
) -> Any:
    """Runs ``fn(comm, *args, **kwargs)`` as ``rank`` of the in-process ``job`` in this thread.
    ``build_timeout``: how long building the communicator may take (None: no bound)."""
    job_id = job["id"]
    registry.enter(job_id)
    try:
        deadline = time.monotonic() + wiring_timeout
        fail = failer(job_id, rank, worker, calls.leave)
        p = pool_mod.current(wait=wiring_timeout)
        if p is None:
            raise fail(f"this worker is not in the MPI pool: {pool_mod.status()['reason']}")
        if job.get("impl", "openmpi") != "openmpi" or isinstance(p, pool_mod.World):
            from .world import run_world_member

            return run_world_member(
                job=job,
                rank=rank,
                worker=worker,
                fn=fn,
                args=args,
                kwargs=kwargs,
                calls=calls,
                world=p,
                deadline=deadline,
                fail=fail,
                build_timeout=build_timeout,
            )
        return _run_pool_member(
            job, rank, worker, fn, args, kwargs, calls, p, deadline, wiring_timeout, fail, build_timeout
        )
    finally:
        registry.leave(job_id)


def _run_pool_member(
    job: dict,
    rank: int,
    worker: str,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    calls: Calls,
    p,
    deadline: float,
    wiring_timeout: float,
    fail: Callable[..., MPIJobError],
    build_timeout: float | None,
) -> Any:
    job_id = job["id"]
    if p.namespace != job["namespace"]:
        raise fail(f"this worker is in pool {p.namespace}, the job in {job['namespace']}")
    ranks = [m["poolRank"] for m in sorted(job["members"], key=lambda m: m["rank"])]
    wait_alone(job_id, deadline, fail)
    plan = comm_cache.plan_of(join(calls, job_id, rank, worker, deadline, wiring_timeout, fail))
    comm_cache.settle(plan)
    entries = [e for e in (plan.get("use"), plan.get("keep")) if e]

    w = WATCHER.watch(job_id, calls, build_timeout=build_timeout, job_timeout=float(job.get("timeoutSeconds") or 0))
    # No new pair communicator of the comm backend while this job builds and uses its own, and
    # none still being built when it starts (activation.py).
    if not GATE.job_begins(PAIRS_WAIT):
        logger.warning(
            "dask-pmix: job %s: a pair communicator of the comm backend was still being built "
            "after %.0f s; building the job's anyway",
            job_id,
            PAIRS_WAIT,
        )
    try:
        # Errors are raised after their except blocks: raised inside, they would carry the
        # exception being handled as their context (see ending.failer).
        error = None
        try:
            comm = build(p, ranks, job["tag"], plan)
            with tracking.within("MPI_Comm_dup (mpi4py's duplicate of the job's communicator)"):
                job_comms.begin(p.MPI, job_id, comm)
        except Exception as exc:  # noqa: BLE001
            comm_cache.taint(*entries)
            error = fail(f"building the job's communicator failed: {describe(exc)}", exc)
        if error is not None:
            raise error
        w.enter("fn", comm)
        try:
            with world_model.job_world(p.MPI, comm):
                value = fn(tracking.tracked(comm), *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            comm_cache.taint(*entries)
            with w.lock:
                w.phase = "done"
                mpi = is_mpi_error(exc)
                failed = failed_ranks(comm) if mpi else []
                if not mpi:
                    # The others may wait on this member in a collective: revoking ends that.
                    revoke(comm, job_id)
                give_up(comm, failed=True)
            error = fail(describe(exc), exc, failed)
        if error is not None:
            linger(job_id, rank)
            raise error
        with w.lock:
            w.phase = "done"
            if w.revoked:
                comm_cache.taint(*entries)
            give_up(comm, failed=w.revoked)
    finally:
        job_comms.end(job_id)
        GATE.job_ends()
        WATCHER.unwatch(job_id)
    # Its job hears that it left when the scheduler sees its task finish (all members at once).
    return value


def build(p, ranks: list[int], tag: str, plan: dict):
    """The job's communicator, as the scheduler planned it (dask_pmix.scheduler.comm_cache):
    derived from the communicator kept from an earlier job over these members or more (``use``;
    with ``shrink``, from MPI_Comm_shrink of it, kept), or MPI_Comm_create_from_group over
    ``ranks``, kept (``keep``, the job then gets a Dup of it) or not. A derivation is left alone
    as a group construct is (the watcher's build bound and stuck evidence hold for both):
    revoking a communicator while a Dup of it activates is where Open MPI 5.0.x was seen to
    crash (ompi_comm_revoke_local during ompi_comm_activate)."""
    use, keep = plan.get("use"), plan.get("keep")
    if use is not None:
        parent = comm_cache.take(use)
        if plan.get("shrink") and keep is not None:
            with tracking.within("MPI_Comm_shrink of a kept communicator"):
                parent = comm_cache.shrink(parent)
            comm_cache.put(keep, parent)
            comm_cache.count("shrunk")
        what = comm_cache.what(plan)
    else:
        with tracking.within("MPI_Comm_create_from_group"):
            parent = p.comm(ranks, tag)
        comm_cache.count("built")
        if keep is None:
            return parent
        comm_cache.put(keep, parent)
        what = "MPI_Comm_dup of the communicator just kept"
    with tracking.within(what):
        comm = comm_cache.derive(parent, plan.get("ranks") if use is not None else None)
    if use is not None:
        comm_cache.count("reused")
        if plan.get("ranks"):
            comm_cache.count("derived")
    return comm
