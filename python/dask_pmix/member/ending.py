"""How an in-process member ends: the error it reports, and what becomes of its communicator.

A communicator that saw a failure is kept, not freed, until the session ends (bounded): freeing it
and reusing its slot while revoke messages are in flight crashed later jobs in
ompi_comm_revoke_local. A member that leaves a failed job keeps MPI progressing until the others
have left too (``linger``): a peer still sending to it would otherwise wait for good."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..errors import MPIJobError, RankAborted
from ..protocol import MEMBER_CONNECTED
from ..worker import jobs, pool
from ..worker import members as registry

logger = logging.getLogger("dask_pmix")

_kept: list = []
KEEP = 256
# How long a member of a failed job keeps MPI progressing for the others (below the watcher's grace).
LINGER = 1.0


def give_up(comm, failed: bool) -> None:
    """Frees the communicator (or a merge_tree.Tree) of a job that went well; keeps one that saw
    a failure (bounded)."""
    if failed:
        _kept.append(comm)
        if len(_kept) > KEEP:
            free(_kept.pop(0))
        registry.left_behind(len(_kept))
        return
    free(comm)


def free(comm) -> None:
    try:
        comm.free() if hasattr(comm, "build") else comm.Free()
    except Exception as exc:  # noqa: BLE001 - a revoked or broken communicator may refuse
        logger.debug("dask-pmix: freeing a communicator failed: %r", exc)


def linger(job_id: str, rank: int, bound: float = LINGER) -> None:
    """Keeps MPI progressing, after this member left a failed job, until every other member has
    left it too (the scheduler pushes their states) or ``bound`` seconds have passed.

    Open MPI's TCP transport needs the peer's progress to finish a connection (and a rendezvous):
    a member still sending to a peer that has gone back to Dask work, with nothing progressing
    MPI there, waits in mca_pml_ob1_send for good, the revoke notwithstanding."""
    p = pool.current()
    if p is None:
        return
    req = p.MPI.Grequest.Start()

    def others_left(job: dict | None) -> bool:
        members = (job or {}).get("members") or []
        return bool(members) and all(m["state"] != MEMBER_CONNECTED for m in members if m["rank"] != rank)

    try:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            req.Test()
            if others_left(jobs.get(job_id)):
                return
            time.sleep(0.001)
        logger.debug("dask-pmix: stopped waiting after %.1f s for the other members to leave", bound)
    except Exception as exc:  # noqa: BLE001
        logger.debug("dask-pmix: keeping MPI progressing failed: %r", exc)
    finally:
        try:
            req.Complete()
            req.Wait()
        except Exception:  # noqa: BLE001
            pass


def failed_ranks(comm) -> list[int]:
    """The ranks of ``comm`` its MPI library knows to have failed (ULFM)."""
    try:
        MPI = pool.current().MPI  # type: ignore[union-attr]  # a member runs in a process of the pool
        failed = comm.Get_failed()
        try:
            ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), comm.Get_group())
        finally:
            failed.Free()
        return [r for r in ranks if r is not None and r >= 0]
    except Exception:  # noqa: BLE001
        return []


def is_mpi_error(exc: BaseException) -> bool:
    return hasattr(exc, "Get_error_class")


def has_mpi_error(exc: BaseException) -> bool:
    """Whether an MPI exception is anywhere in ``exc``'s chain."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if is_mpi_error(e):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def describe(exc: BaseException) -> str:
    if isinstance(exc, RankAborted):
        return str(exc)
    if hasattr(exc, "Get_error_string"):  # mpi4py's MPI.Exception: say which MPI error it is
        try:
            return f"MPI error: {exc.Get_error_string()}"
        except Exception:  # noqa: BLE001
            pass
    return f"{type(exc).__name__}: {exc}"


def failer(job_id: str, rank: int, worker: str, leave: Callable[[bool, str, list], object]):
    """fail(reason, cause=None, failed=None): tells the scheduler this member failed; the error
    to raise. The error travels to the client with its chain (Dask pickles causes and contexts):
    an mpi4py exception there would load, and initialise, MPI in the client process, so an MPI
    cause is dropped (the reason already says which MPI error it was)."""

    def fail(reason: str, cause: BaseException | None = None, failed: list | None = None) -> MPIJobError:
        try:
            leave(False, reason, failed or [])
        except Exception:  # noqa: BLE001 - the sidecar fails the job anyway, later
            pass
        err = MPIJobError(reason, job_id=job_id, rank=rank, worker=worker, origin="rank")
        err.__cause__ = None if cause is None or has_mpi_error(cause) else cause
        return err

    return fail
