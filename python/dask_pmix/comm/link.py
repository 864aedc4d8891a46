"""What the comm backend needs from the process's MPI pool membership, and where it gets it.

A worker process can carry Dask frames over MPI only while it holds an MPI session in a pool epoch
(a long-lived PMIx namespace of the sidecar; see dask_pmix.pool). Two processes can build a
communicator together only when they are ranks of the same epoch, so the epoch string is what the
two ends of a connection compare before they agree on MPI.

The pool is looked up at every new connection, not cached: a worker may join the pool after it
started listening, and a new epoch may replace the old one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PoolLink:
    epoch: str  # identity of the pool epoch (PMIx namespace and more)
    rank: int  # this process's rank in the epoch
    MPI: Any  # mpi4py.MPI, initialised through a session
    create_comm: Callable[[list, str], Any]  # blocking, collective over the ranks: (ranks, tag) -> Intracomm
    session: Any = None  # kept alive as long as the link
    local_peers: frozenset = frozenset()  # the epoch's ranks that share memory with this one (itself included)
    # The epoch's secret, which only its members hold (the sidecar hands it to each in its pool
    # join answer): hellos are bound to it (hello.py). None: this process cannot prove that it is
    # a member, nor check another, so its connections stay TCP.
    secret: bytes | None = field(default=None, repr=False)


_override: PoolLink | None = None
_override_lock = threading.Lock()


def set_link(link: PoolLink | None) -> None:
    """Use this membership instead of the pool's (processes started by an MPI launcher, tests)."""
    global _override
    with _override_lock:
        _override = link


def current_link() -> PoolLink | None:
    """The pool membership of this process, or None when it is in no pool (scheduler, clients,
    workers outside the pool): then every connection stays TCP."""
    if _override is not None:
        return _override
    return _from_pool()


def _from_pool() -> PoolLink | None:
    from ..worker import pool

    member = pool.current()
    if member is None or isinstance(member, pool.World):
        # An MPICH / Intel MPI world has no pool ranks to build communicators from.
        return None
    _watch_pool_close(pool)
    # Two processes share communicators only within one epoch: its PMIx namespace names it.
    return PoolLink(
        epoch=f"{member.namespace}#{member.epoch}",
        rank=int(member.rank),
        MPI=member.MPI,
        create_comm=member.comm,
        session=member.session,
        local_peers=_shared_of(member),
        secret=member.comm_secret,
    )


_shared: dict[int, frozenset] = {}


def _shared_of(member) -> frozenset:
    """The pool ranks Open MPI put on this process's node (its shared-memory process set, i.e. the
    PMIX_LOCAL_PEERS it read at initialisation): the processes its sm transport can reach. Asked
    once per session."""
    key = id(member.session)
    got = _shared.get(key)
    if got is None:
        got = _shared[key] = shared_ranks(member.MPI, member.session, member.world)
    return got


# Open MPI 5.0.x names the process set of the processes on this node "mpix://SHARED"
# (instance.c, ompi_group_from_pset); MPI 4.1 names none, and later versions may say "mpi://".
SHARED_PSETS = ("mpix://SHARED", "mpi://SHARED")


def shared_ranks(MPI, session, world) -> frozenset:
    """WORLD ranks of the session's shared-memory process set (just this process's if the
    library names none)."""
    for name in SHARED_PSETS:
        try:
            shared = session.Create_group(name)
            break
        except Exception:  # noqa: BLE001 - not this library's name for it
            continue
    else:
        return frozenset({world.Get_rank()})
    try:
        ranks = shared.Translate_ranks(list(range(shared.Get_size())), world)
        return frozenset(int(r) for r in ranks if r != MPI.UNDEFINED)
    finally:
        shared.Free()


_watching = False


def _watch_pool_close(pool) -> None:
    """Before the pool finalizes this process's session, the backend stops every MPI call of its
    own and frees its communicators (an MPI call after finalize aborts the process)."""
    global _watching
    if _watching:
        return
    _watching = True
    pool.on_close(_leave_pool)


# What else holds MPI objects of this process's session, each returning how many of its MPI calls
# are still under way once it has let go (pairs.py registers its pair communicators here).
_on_leave: list[Callable[[], int]] = []


def on_leave(release: Callable[[], int]) -> None:
    """Call ``release`` before the session is finalized (once per module that holds MPI objects)."""
    if release not in _on_leave:
        _on_leave.append(release)


def _leave_pool() -> None:
    from .engine import stop_engine

    stop_engine()
    pending = sum(release() for release in list(_on_leave))
    if pending:
        from ..worker import pool

        pool.keep_session(f"{pending} pair communicator construction(s) of the comm backend still inside MPI")


def pool_starting() -> bool:
    """Whether this process is joining a pool right now (its session is being initialised)."""
    from ..worker import pool

    status = getattr(pool, "status", None)
    return status is not None and status().get("state") == "starting"


def join_launcher_world() -> PoolLink:
    """Membership for a process started by an MPI launcher (mpirun/prterun): the launcher's
    namespace is the epoch and its mpi://WORLD the pool. Initialises one MPI session for the
    process's lifetime, as the pool does."""
    from ..worker.mpi import mpi_module

    MPI = mpi_module()
    info = MPI.Info.Create()
    info.Set("thread_level", "MPI_THREAD_MULTIPLE")
    session = MPI.Session.Init(info=info)
    info.Free()
    world = session.Create_group("mpi://WORLD")
    lock = threading.Lock()

    def create_comm(ranks: list, tag: str):
        with lock:  # Group.Incl on a shared group handle; the collective itself runs unlocked
            group = world.Incl(list(ranks))
        try:
            return MPI.Intracomm.Create_from_group(group, stringtag=tag)
        finally:
            group.Free()

    epoch = os.environ.get("PMIX_NAMESPACE") or f"launcher-{os.getppid()}"
    return PoolLink(
        epoch=epoch,
        rank=world.Get_rank(),
        MPI=MPI,
        create_comm=create_comm,
        session=session,
        local_peers=shared_ranks(MPI, session, world),
        secret=_launcher_secret(create_comm, world),
    )


def _launcher_secret(create_comm: Callable[[list, str], Any], world) -> bytes:
    """The world's secret for its hellos: no sidecar hands one out, so rank 0 makes it and sends it
    to every rank over a communicator of the world, which no process outside it is in. Collective:
    every rank of the launcher joins its world at start."""
    comm = create_comm(list(range(world.Get_size())), "dask-pmix-comm-secret")
    try:
        return comm.bcast(os.urandom(32) if comm.Get_rank() == 0 else None, root=0)
    finally:
        comm.Free()


def leave_launcher_world(link: PoolLink) -> None:
    """End a launcher-world membership at process exit: stop the engine, free the pair
    communicators, finalize the session (the launcher reports an unfinalized exit as a failure)."""
    set_link(None)
    _leave_pool()
    link.session.Finalize()
