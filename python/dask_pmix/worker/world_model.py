"""The MPI world that code in a job sees inside a pool worker process.

A pool worker holds one MPI Session for its life (dask_pmix.worker.pool). Open MPI 5.0.x serves a
Session-only process badly: MPI_COMM_SELF, MPI_Reduce_local, MPI_Is_thread_main, MPI_Win_create
and every use of MPI_COMM_WORLD dereference objects that only MPI_Init fills, and the process dies
of SIGSEGV (research S). So the pool's init thread also initialises the world model, once, right
after the session: with the session up, MPI_Init_thread skips the instance setup, runs no fence
(async modex and init) and only builds the predefined communicators, selects their collectives and
starts the fault-tolerance machinery. Its world is the pool's whole namespace (1,024 ranks, most of
them never started), so it is never shown to user code:

- ``MPI.COMM_WORLD`` is the job's communicator while the job's function runs (the handle inside
  mpi4py's predefined object is swapped, so references taken before the job see it too) and
  ``MPI_COMM_NULL`` outside jobs, where a call on it raises instead of waiting for ranks that do
  not exist. ``MPI.COMM_SELF`` is the real one. C code that names ``MPI_COMM_WORLD`` itself gets
  the pool's world: it must take the communicator it is handed (``comm.py2f()`` or the handle).
- ``MPI.Init``/``MPI.Init_thread`` raise (MPI is initialised, as under mpirun), and
  ``MPI.Finalize`` returns without finalizing: MPI_Finalize with fault tolerance on shrinks the
  pool's world, an agreement over ranks that never started, and would hang the worker for good.
- ``Comm.Abort`` raises instead of ending the process, which holds the worker's Dask data: in a
  job's function it fails the job (RankAborted), elsewhere it raises an error saying so.
- Any object holding ``COMM_WORLD``'s handle acts as a predefined communicator, as mpi4py
  treats clones of one: it cannot be freed, pickles by name and has the world's attributes.
- Partitioned point-to-point and the shrink of an intercommunicator raise NotImplementedError:
  Open MPI's part/persist duplicates the pool's world in the background, and an intercomm
  shrink waits for good in a pool process.

An MPICH / Intel MPI world of one (the opt-in in-process pool) is initialised with MPI_Init
already; it gets the same guards and the same ``COMM_WORLD`` during a job, and keeps its own
world of one outside jobs. The calls MPICH cannot serve across such worlds, which abort or
wedge the worker, raise NotImplementedError there: ``Create_from_group``, ``Create_from_groups``,
``Create_dist_graph`` and windows (``Win.Create``, ``Win.Allocate``, ``Win.Create_dynamic``) over
processes of other workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import RankAborted

logger = logging.getLogger("dask_pmix")

_job_threads: set[int] = set()  # the threads that run a job's function now
_world: Any = None  # mpi4py's predefined COMM_WORLD object, whose handle job_world swaps
_lock = threading.Lock()
_real: dict[str, Any] = {}  # the guarded functions of mpi4py.MPI, as mpi4py has them
_outside: int | None = None  # the handle MPI.COMM_WORLD holds outside jobs
_warned_finalize = False


def initialise(MPI, *, pool_world: bool) -> None:
    """Once per process, in the thread that initialised the session (it becomes MPI's main
    thread). ``pool_world``: the process's world is the pool's namespace (Open MPI), to be hidden
    outside jobs; else it is a world of one (MPICH, Intel MPI), already initialised."""
    global _outside
    if not MPI.Is_initialized():
        level = MPI.Init_thread(MPI.THREAD_MULTIPLE)
        if level != MPI.THREAD_MULTIPLE:
            raise RuntimeError(f"MPI_Init_thread gave thread level {level}, not MPI_THREAD_MULTIPLE")
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
    MPI.COMM_SELF.Set_errhandler(MPI.ERRORS_RETURN)
    _guard(MPI)
    global _world
    _world = MPI.COMM_WORLD
    if pool_world:
        for name in ("Psend_init", "Precv_init"):
            set_type_attribute(MPI.Comm, name, _in_place_of(MPI.Comm.__dict__[name], _partitioned))
        for name in ("Shrink", "Ishrink"):
            set_type_attribute(MPI.Comm, name, _intercomm_shrink(MPI, MPI.Comm.__dict__[name]))
        _outside = MPI._handleof(MPI.COMM_NULL)
        _set_world(MPI, _outside)
    else:
        _guard_across_worlds(MPI)


def finalize(MPI) -> None:
    """MPI_Finalize for the worker's own close (MPICH / Intel MPI worlds), past the guard."""
    (_real.get("Finalize") or MPI.Finalize)()


@contextlib.contextmanager
def job_world(MPI, comm) -> Iterator[None]:
    """``MPI.COMM_WORLD`` is ``comm`` in this process while the block runs (one job at a time is
    in MPI in a process: dask_pmix.member.inprocess)."""
    with _lock:
        before = MPI._handleof(MPI.COMM_WORLD)
        _set_world(MPI, MPI._handleof(comm))
    me = threading.get_ident()
    _job_threads.add(me)
    try:
        yield
    finally:
        _job_threads.discard(me)
        with _lock:
            _set_world(MPI, before if _outside is None else _outside)


def _set_world(MPI, handle: int) -> None:
    _set_handle(MPI, MPI.COMM_WORLD, handle)


def _set_handle(MPI, obj, handle: int) -> None:
    """Points mpi4py's ``obj`` at another MPI handle (nothing is freed or made)."""
    slot = MPI._addressof(obj)
    size = MPI._sizeof(MPI.Comm)
    if size == ctypes.sizeof(ctypes.c_void_p):
        ctypes.c_void_p.from_address(slot).value = handle
    elif size == ctypes.sizeof(ctypes.c_int):
        ctypes.c_int.from_address(slot).value = handle
    else:
        raise RuntimeError(f"an MPI_Comm handle of {size} bytes")


def _guard(MPI) -> None:
    if _real:
        return

    def init(*args: Any, **kwargs: Any) -> Any:
        raise MPI.Exception(MPI.ERR_OTHER)

    def finalize() -> None:
        global _warned_finalize
        if not _warned_finalize:
            _warned_finalize = True
            logger.info(
                "dask-pmix: MPI.Finalize() in a worker does nothing: the worker's MPI lives as long as the "
                "worker (jobs are communicators)"
            )

    _real.update(Init=MPI.Init, Init_thread=MPI.Init_thread, Finalize=MPI.Finalize)
    for name, fn in (("Init", init), ("Init_thread", init), ("Finalize", finalize)):
        setattr(MPI, name, _in_place_of(_real[name], fn))
    set_type_attribute(MPI.Comm, "Abort", _in_place_of(MPI.Comm.Abort, _abort))
    comm = dict(MPI.Comm.__dict__)  # mpi4py's own methods (the type's dictionary changes below)
    names = ("TAG_UB", "HOST", "IO", "WTIME_IS_GLOBAL", "LASTUSEDCODE", "APPNUM")  # HOST: not in mpi4py 4
    world_attrs = tuple(getattr(MPI, k) for k in names if hasattr(MPI, k))
    pool_world = MPI.Comm.fromhandle(MPI._handleof(MPI.COMM_WORLD))

    # COMM_WORLD stays a predefined communicator, whichever it stands for, and so does every
    # object with its handle (a clone, ``MPI.Intracomm(MPI.COMM_WORLD)``, the ``comm`` a job's
    # function gets): Free and Disconnect refuse it, the safe free leaves it, it pickles by name
    # (a clone as a new object of it), and its predefined attributes are the world's (a job's
    # communicator has none).
    null = MPI._handleof(MPI.COMM_NULL)

    def refuse(self) -> None:
        raise MPI.Exception(MPI.ERR_COMM)

    def world_attr(self, keyval: int) -> Any:
        return pool_world.Get_attr(keyval) if keyval in world_attrs else comm["Get_attr"](self, keyval)

    on_world = {
        "Free": refuse,
        "Disconnect": refuse,
        # mpi4py's safe free of a predefined handle: the object forgets it, COMM_WORLD keeps it.
        "free": lambda self: None if self is _world else _set_handle(MPI, self, null),
        "__reduce__": lambda self: "COMM_WORLD" if self is _world else (type(_world), (_world,)),
        "Get_attr": world_attr,
    }
    for name, world_fn in on_world.items():
        set_type_attribute(MPI.Comm, name, _on_world(MPI, null, comm[name], world_fn))


def _on_world(MPI, null: int, method, world_fn):
    """``method``, but ``world_fn`` on mpi4py's COMM_WORLD object and on any object that holds
    the handle it holds now (outside jobs, MPI_COMM_NULL, which stays mpi4py's)."""

    def call(self, *args: Any, **kwargs: Any):
        if self is _world or (_world is not None and MPI._handleof(self) == MPI._handleof(_world) != null):
            return world_fn(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    return _in_place_of(method, call)


def _in_place_of(method, body):
    """``body`` under the name and docstring of the mpi4py function it stands in for."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any):
        return body(*args, **kwargs)

    return call


def _partitioned(self, *args: Any, **kwargs: Any):
    """Open MPI's one partitioned component (part/persist) duplicates MPI_COMM_WORLD, the pool's,
    at its first progress: a collective over ranks that never started, which waits for good."""
    raise NotImplementedError(
        "partitioned point-to-point (Psend_init/Precv_init) cannot run in an in-process job: Open MPI's "
        "implementation needs a world of the job's ranks; run the job with mode='fork'"
    )


def _intercomm_shrink(MPI, shrink):
    """MPI_Comm_shrink of an intercommunicator waits for good in a pool process (Open MPI 5.0.11,
    mpi4py's TestULFMInter.testShrink): raise instead; an intracommunicator shrinks."""

    def call(self, *args: Any, **kwargs: Any):
        if isinstance(self, MPI.Intercomm):
            raise NotImplementedError(
                f"{shrink.__name__} of an intercommunicator hangs in an in-process job (Open MPI 5.0.x): shrink "
                "the intracommunicators it joins, or run the job with mode='fork'"
            )
        return shrink(self, *args, **kwargs)

    return _in_place_of(shrink, call)


def _guard_across_worlds(MPI) -> None:
    """An MPICH pool worker is a world of its own, and a job's communicator a merge of such worlds
    (dask_pmix.member.merge_tree). MPICH 5.0.2 cannot serve some calls on processes of other
    worlds, and those end or wedge the worker; they raise NotImplementedError instead, naming
    what works. Calls within the worker's own world (COMM_SELF, a group of the worker alone) are
    MPICH's own.

    - ``Intracomm.Create_from_group`` and ``Intercomm.Create_from_groups``: MPICH builds them over
      its MPI_COMM_WORLD (mpi/comm/comm_impl.c), the worker alone, and translating the group's
      ranks to it fails an MPIR_Assert (allreduce_group.c:111): MPICH aborts the process (mpi4py's
      test_comm_inter.testCreateFromGroups ended all three workers).
    - ``Intracomm.Create_dist_graph``: the edges are exchanged with a blocking MPI_ANY_SOURCE
      probe and receive (mpi/topo), and all members stay in it (test_comm_topo). A blocking
      MPI_Recv from MPI_ANY_SOURCE of another world's message waits for good here too (measured;
      MPI_Iprobe and MPI_Mprobe from MPI_ANY_SOURCE match it).
    - Windows over other workers (``Win.Create``, ``Win.Allocate``, ``Win.Create_dynamic``): in
      mpi4py's test_rma and test_rma_nb a get-accumulate's reply failed an MPIR_Assert
      (mpidig_rma_callbacks.c:812, actual_pack_bytes == result_data_sz) and MPICH aborted the
      worker, and with the accumulate calls refused the members waited for good in
      testGetAccumulate, testAccumulate or testPutGet, a different one from run to run. Windows
      on COMM_SELF are the worker's own and work."""
    own = MPI.COMM_WORLD.Get_group()  # before any job: the world of one

    def outside(*groups) -> bool:
        for group in groups:
            if isinstance(group, MPI.Group) and group != MPI.GROUP_NULL and group.Get_size():
                ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), own)
                if MPI.UNDEFINED in ranks:
                    return True
        return False

    def of(obj) -> bool:
        group = obj.Get_group()
        try:
            return outside(group)
        finally:
            group.Free()

    def refuse(name: str, instead: str):
        raise NotImplementedError(
            f"{name} over processes of other workers cannot run in an in-process MPICH job: MPICH 5.0 would "
            f"abort or wedge the worker (each worker is an MPI world of its own). {instead}, or run the job "
            "with mode='fork'"
        )

    def arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
        return args[i] if len(args) > i else kwargs.get(name)

    intra = MPI.Intracomm.__dict__["Create_from_group"].__func__
    inter = MPI.Intercomm.__dict__["Create_from_groups"].__func__

    def create_from_group(cls, *args: Any, **kwargs: Any):
        if outside(arg(args, kwargs, 0, "group")):
            refuse("MPI_Comm_create_from_group", "Use Create_group (MPI_Comm_create_group) on the job's communicator")
        return intra(cls, *args, **kwargs)

    def create_from_groups(cls, *args: Any, **kwargs: Any):
        if outside(arg(args, kwargs, 0, "local_group"), arg(args, kwargs, 2, "remote_group")):
            refuse(
                "MPI_Intercomm_create_from_groups",
                "Use Create_group and then Create_intercomm (MPI_Intercomm_create) on the job's communicator",
            )
        return inter(cls, *args, **kwargs)

    set_type_attribute(MPI.Intracomm, "Create_from_group", classmethod(_in_place_of(intra, create_from_group)))
    set_type_attribute(MPI.Intercomm, "Create_from_groups", classmethod(_in_place_of(inter, create_from_groups)))

    def on_spanning(cls: type, name: str, call: str, instead: str) -> None:
        method = cls.__dict__[name]

        def guarded(self, *args: Any, **kwargs: Any):
            if of(self):
                refuse(call, instead)
            return method(self, *args, **kwargs)

        set_type_attribute(cls, name, _in_place_of(method, guarded))

    on_spanning(
        MPI.Intracomm,
        "Create_dist_graph",
        "MPI_Dist_graph_create",
        "Use Create_dist_graph_adjacent, each process naming its own neighbours",
    )
    # Windows: (memory, disp_unit, info, comm) for Create and Allocate, (info, comm) for
    # Create_dynamic; the default communicator is COMM_SELF. Allocate_shared over other workers
    # is refused by MPICH itself with an MPI error (no shared memory domain).
    for name, at in (("Create", 3), ("Allocate", 3), ("Create_dynamic", 1)):
        make = MPI.Win.__dict__[name].__func__

        def window(cls, *args: Any, _make=make, _at=at, _name=name, **kwargs: Any):
            comm = arg(args, kwargs, _at, "comm")
            if isinstance(comm, MPI.Comm) and comm != MPI.COMM_NULL and of(comm):
                refuse(
                    f"MPI_Win_{_name.lower()}",
                    "Windows on COMM_SELF work; move data with the job's communicator (point-to-point, collectives)",
                )
            return _make(cls, *args, **kwargs)

        set_type_attribute(MPI.Win, name, classmethod(_in_place_of(make, window)))


def job_threads() -> set[int]:
    """The threads running a job's function now."""
    return set(_job_threads)


def _abort(self, errorcode: int = 0):
    """Comm.Abort in a pool worker: MPI_Abort would end the process and lose its Dask data."""
    if threading.get_ident() in _job_threads:
        raise RankAborted(errorcode)
    raise RuntimeError(
        f"MPI_Abort({errorcode}) outside an MPI job: a dask-pmix worker process is not ended (it holds Dask data)"
    )


def set_type_attribute(cls: type, name: str, value: Any) -> None:
    """Sets an attribute of an extension type, which Python refuses for static types: through the
    type's own dictionary, then drops the method caches of the type and its subclasses."""
    try:
        mapping = next(r for r in gc.get_referents(cls.__dict__) if isinstance(r, dict))
        mapping[name] = value
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))
    except Exception:  # noqa: BLE001 - the guard is a best effort; say so
        logger.warning("dask-pmix: cannot guard %s.%s: mpi4py's own stays in place", cls.__name__, name)
