"""The communicators this worker process keeps across in-process jobs (the member half of the
communicator cache; the scheduler half, which decides, is dask_pmix.scheduler.comm_cache).

The scheduler's plan for a job (its join answer's ``comm``) says whether the members derive the
job's communicator from a kept one (``use``: a Dup, or with ``ranks`` MPI_Comm_create_group over
those of its ranks), build anew and keep what they built (``keep``), or build anew and keep
nothing; and which ids are still kept anywhere (``live``). A member never drops an entry on
its own: only the plan does (an id no longer live), or the session's close. An entry whose job
went wrong here (its function raised, the job was revoked, its duplicate failed) is marked so,
and is left behind like a failed job's communicator (dask_pmix.member.ending.give_up) instead of
being freed when it is dropped.

Open MPI keeps the job's MPI.Intracomm (from MPI_Comm_create_from_group); MPICH / Intel MPI keep
the merge tree (dask_pmix.member.merge_tree.Tree) whose ``comm`` is the merged communicator.
One job at a time is in MPI in a process (dask_pmix.member.inprocess), so an entry is never used
by two jobs here at once; the lock guards the dictionary only."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from ..worker import members as registry
from ..worker import pool as pool_mod
from ..worker.activation import GATE
from .ending import free, give_up

_lock = threading.Lock()
_kept: dict[str, Any] = {}  # id -> the communicator (Open MPI) or merge tree (MPICH)
_tainted: set[str] = set()  # ids whose job went wrong here
_counts: Counter[str] = Counter()
_hooked = False


class Missing(LookupError):
    """The plan names a communicator this process does not hold."""


def plan_of(answer: dict) -> dict:
    """The plan in a join answer ({} from a plugin without the cache: build anew, keep nothing)."""
    plan = answer.get("comm")
    return plan if isinstance(plan, dict) else {}


def settle(plan: dict) -> None:
    """Drops the entries the plan no longer lists as live (before the job builds)."""
    live = plan.get("live")
    if live is None:
        return
    live = set(live)
    with _lock:
        gone = [(i, _kept.pop(i), i in _tainted) for i in list(_kept) if i not in live]
        for i, _, _ in gone:
            _tainted.discard(i)
    for _i, comm, tainted in gone:
        _counts["dropped"] += 1
        if tainted:
            give_up(comm, failed=True)
        else:
            free(comm)


def take(entry_id: str) -> Any:
    """The kept communicator (or merge tree) ``entry_id``; Missing if this process has none."""
    with _lock:
        comm = _kept.get(entry_id)
    if comm is None:
        raise Missing(
            f"the scheduler planned to duplicate kept communicator {entry_id}, which this worker does not hold"
        )
    return comm


def put(entry_id: str, comm: Any) -> None:
    _hook()
    with _lock:
        _kept[entry_id] = comm
    _counts["kept"] += 1


def taint(*entry_ids: str | None) -> None:
    """The job on these entries went wrong here: when dropped, they are left behind, not freed."""
    with _lock:
        _tainted.update(i for i in entry_ids if i in _kept)


def dup(comm: Any) -> Any:
    """A duplicate of ``comm`` (collective over its members), as a construction (activation.py)."""
    with GATE.building():
        return comm.Dup()


def shrink(comm: Any) -> Any:
    """The communicator of ``comm``'s members not known failed (MPI_Comm_shrink, ULFM: an
    agreement among the survivors, collective over all of them), as a construction."""
    with GATE.building():
        return comm.Shrink()


# MPI_Comm_create_group's tag. One tag serves every job: a kept communicator serves one job at a
# time (scheduler.comm_cache), so two groups created from it at once never share a member.
CREATE_TAG = 0


def derive(comm: Any, ranks: list[int] | None) -> Any:
    """The job's communicator from kept ``comm``: a duplicate (``ranks`` None), else the
    communicator of ``comm``'s ranks ``ranks``, ranked in that order (MPI_Comm_create_group,
    collective over those ranks only), as a construction (activation.py)."""
    if ranks is None:
        return dup(comm)
    group = comm.Get_group()
    try:
        sub = group.Incl(ranks)
    finally:
        group.Free()
    try:
        with GATE.building():
            return comm.Create_group(sub, CREATE_TAG)
    finally:
        sub.Free()


def what(plan: dict) -> str:
    """How a job on a kept communicator derives its own, for the stuck-call evidence."""
    kept = "a shrunk kept communicator" if plan.get("shrink") else "a kept communicator"
    return f"MPI_Comm_create_group of {kept}" if plan.get("ranks") else f"MPI_Comm_dup of {kept}"


def count(what: str) -> None:
    _counts[what] += 1


def stats() -> dict:
    """How this process built its job communicators: ``built`` (anew), ``reused`` (derived from a
    kept one), ``derived`` (of those, the ones over other ranks or another order than the kept
    one's), ``kept`` (entries made), ``dropped``, and the ids held now."""
    with _lock:
        held = sorted(_kept)
    counted = ("built", "reused", "derived", "kept", "dropped", "shrunk")
    return {**{k: _counts.get(k, 0) for k in counted}, "held": held}


def clear() -> None:
    """Frees every entry (the session is about to be finalized); none while a member may still be
    inside MPI here (it could be duplicating one), as the finalize itself is then skipped or
    given up (dask_pmix.worker.pool.close)."""
    if registry.in_flight():
        return
    with _lock:
        gone = [(_kept.pop(i), i in _tainted) for i in list(_kept)]
        _tainted.clear()
    for comm, tainted in gone:
        if not tainted:
            free(comm)


def _hook() -> None:
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    pool_mod.on_close(clear)
