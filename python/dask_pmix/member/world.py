"""One member of an in-process MPICH / Intel MPI job: the worker process is an MPI world of its
own (dask_pmix.worker.pool.World), and the job's communicator comes from a merge tree of
connect/accept over ports the members bring to their join (dask_pmix.member.merge_tree).

MPICH neither reports failed processes nor can revoke (MPIX_Comm_revoke asserts in ch4): a
member left inside one of fn's MPI calls after its job failed has its worker replaced. The
members end the job with a barrier of their own that they poll, so a member leaves MPI only once
every function has returned (MPI progresses only while its processes call it), and gives the
barrier up when the job fails."""

from __future__ import annotations

import array
import time
import zlib
from collections.abc import Callable
from typing import Any

from ..errors import MPIJobError
from ..worker import pool as pool_mod
from ..worker import world_model
from . import comm_cache, merge_tree, tracking
from .ending import KEEP, describe, give_up
from .inprocess import join, wait_alone
from .watcher import WATCHER, Calls, Watch

# The ports of jobs whose merge tree failed stay open: a connector of such a job still under way
# must not reach a port of a later job that got the same tag (MPICH reuses a closed port's tag).
_stale_ports: list[dict] = []


def run_world_member(
    *,
    job: dict,
    rank: int,
    worker: str,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    calls: Calls,
    world,
    deadline: float,
    fail: Callable[..., MPIJobError],
    build_timeout: float | None = None,
) -> Any:
    """The merge tree over the members' worlds, fn, a polled barrier."""
    job_id = job["id"]
    if not isinstance(world, pool_mod.World) or world.impl != job["impl"]:
        have = getattr(world, "impl", "openmpi")
        raise fail(f"this worker's in-process MPI is {have}, the job is for {job['impl']}")
    wait_alone(job_id, deadline, fail)
    MPI = world.MPI
    size = len(job["members"])
    ports = merge_tree.open_ports(MPI, rank, size)
    built = False
    try:
        answer = join(calls, job_id, rank, worker, deadline, float(job["wiringTimeoutSeconds"]), fail, ports)
        plan = comm_cache.plan_of(answer)
        comm_cache.settle(plan)
        entry = plan.get("use") or plan.get("keep")
        peers = [m.get("ports") or {} for m in answer.get("ports") or []]
        if len(peers) != size:
            raise fail(f"the sidecar sent the ports of {len(peers)} members, not {size}")
        w = WATCHER.watch(
            job_id,
            calls,
            build_timeout=build_timeout,
            job_timeout=float(job.get("timeoutSeconds") or 0),
            revocable=False,
        )
        tree = merge_tree.Tree(MPI, MPI.COMM_SELF)
        try:
            # Errors are raised after their except blocks: raised inside, they would carry the
            # (mpi4py) exception being handled as their context, and Dask pickles it to the client.
            error = None
            try:
                comm, own = build(MPI, tree, rank, size, peers, deadline, plan)
                with tracking.within("the job communicator's check"):
                    check_tree(MPI, comm, rank, size, job_id)
            except Exception as exc:  # noqa: BLE001
                comm_cache.taint(entry)
                error = fail(f"building the job's communicator failed: {describe(exc)}", exc)
            if error is not None:
                raise error
            built = True
            w.enter("fn", comm)
            raised: BaseException | None = None
            try:
                with world_model.job_world(MPI, comm):
                    value = fn(tracking.tracked(comm), *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001
                raised = exc
            if raised is not None:
                comm_cache.taint(entry)
                # The others may be done: a short barrier lets them leave MPI cleanly.
                end_barrier(comm, w, limit=0.5)
                with w.lock:
                    w.phase = "done"
                give_up(own, failed=True)
                raise fail(describe(raised), raised)
            finished = end_barrier(comm, w)
            with w.lock:
                w.phase = "done"
            if not finished:
                comm_cache.taint(entry)
            give_up(own, failed=not finished)
        finally:
            WATCHER.unwatch(job_id)
    finally:
        if built or not ports:
            merge_tree.close_ports(MPI, ports)
        else:
            _stale_ports.append(ports)
            if len(_stale_ports) > KEEP:
                merge_tree.close_ports(MPI, _stale_ports.pop(0))
    # Its job hears that it left when the scheduler sees its task finish (all members at once).
    return value


def build(MPI, tree: merge_tree.Tree, rank: int, size: int, peers: list, deadline: float, plan: dict):
    """(the job's communicator, what the job gives up at its end), as the scheduler planned it
    (dask_pmix.scheduler.comm_cache): derived from the merged communicator of a tree kept from an
    earlier job over these members or more (``use``), or the merge tree, kept (``keep``: the job
    then gets a Dup of its communicator) or not (the job gives the whole tree up)."""
    use, keep = plan.get("use"), plan.get("keep")
    if use is not None:
        kept = comm_cache.take(use)
        with tracking.within(comm_cache.what(plan)):
            comm = comm_cache.derive(kept.comm, plan.get("ranks"))
        comm_cache.count("reused")
        if plan.get("ranks"):
            comm_cache.count("derived")
        return comm, comm
    with tracking.within("the merge tree's connect/accept"):
        merged = tree.build(rank, size, peers, timeout=max(1.0, deadline - time.monotonic()))
    comm_cache.count("built")
    if keep is None:
        return merged, tree
    comm_cache.put(keep, tree)
    with tracking.within("MPI_Comm_dup of the communicator just kept"):
        comm = comm_cache.dup(merged)
    return comm, comm


def check_tree(MPI, comm, rank: int, size: int, job_id: str) -> None:
    """Every member built the same communicator, in the job's rank order."""
    if comm.Get_size() != size or comm.Get_rank() != rank:
        raise RuntimeError(f"the merge tree gave rank {comm.Get_rank()} of {comm.Get_size()}, not {rank} of {size}")
    h = zlib.crc32(job_id.encode())
    out = array.array("q", [0, 0])
    comm.Allreduce(array.array("q", [h, -h]), out, op=MPI.MAX)
    if out[0] != h or -out[1] != h:
        raise RuntimeError("the merge tree joined members of another job")


def end_barrier(comm, w: Watch, limit: float | None = None) -> bool:
    """A barrier over the job, polled: True once every member reached it; False when the job
    failed meanwhile (or after ``limit`` seconds). Testing it keeps MPI progressing here until
    every member is done: a member whose last send still sits in its MPI library must not stop
    calling MPI before its peer received it."""
    try:
        req = comm.Ibarrier()
    except Exception:  # noqa: BLE001
        return False
    t0 = time.monotonic()
    pause = 0.0
    with tracking.within("the job's closing barrier"):
        while True:
            try:
                if req.Test():
                    return True
            except Exception:  # noqa: BLE001
                return False
            if w.failed_at is not None or (limit is not None and time.monotonic() - t0 > limit):
                return False
            time.sleep(pause)
            pause = min(0.001, pause + 0.0001)
