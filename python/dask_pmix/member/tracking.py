"""Whether a member's thread is inside an MPI call, as evidence for replacing its worker.

A member of a failed job that is still running may be busy in Python (it comes back by itself:
its next MPI call fails on the revoked communicator) or stuck inside MPI (an operation that the
revoke does not end). Only the second is a reason to replace the worker. So the communicator
handed to the job's function is of a subclass of mpi4py's Intracomm whose methods record, per
thread, since when the thread is inside one of them; communicators made from it (Dup, Split,
Create_*) are of the same class (mpi4py builds them with ``type(self)``). MPI calls made some
other way are not seen: such a member is never taken for stuck.

A call costs two dictionary writes on top of mpi4py's.

The same class turns ``Abort`` into an exception (RankAborted) in the job's function: MPI_Abort
ends the calling process, which in-process is a Dask worker holding the user's data. The member
then fails the job with the error code and revokes the communicator, as for any exception, and the
worker goes back to Dask work. MPI_Abort reached another way (a communicator not made from the
job's, C code) still ends the process, as MPI defines it."""

from __future__ import annotations

import threading
import time
from typing import Any, NoReturn

from ..errors import RankAborted

_lock = threading.Lock()
_inside: dict[int, tuple[str, float, int]] = {}  # thread id -> (call, since, depth)


def enter(call: str) -> None:
    tid = threading.get_ident()
    with _lock:
        prev = _inside.get(tid)
        _inside[tid] = (prev[0], prev[1], prev[2] + 1) if prev else (call, time.monotonic(), 1)


def leave() -> None:
    tid = threading.get_ident()
    with _lock:
        prev = _inside.get(tid)
        if prev is None:
            return
        if prev[2] > 1:
            _inside[tid] = (prev[0], prev[1], prev[2] - 1)
        else:
            del _inside[tid]


def inside(thread_id: int) -> tuple[str, float] | None:
    """(the MPI call, since when) the thread is in, or None."""
    with _lock:
        found = _inside.get(thread_id)
    return (found[0], found[1]) if found else None


class within:
    """``with within("MPI_Comm_create_from_group"):`` marks this thread inside MPI for the block."""

    def __init__(self, call: str):
        self.call = call

    def __enter__(self) -> None:
        enter(self.call)

    def __exit__(self, *exc: Any) -> None:
        leave()


_classes: dict[type, type] = {}

# Methods that do not enter the MPI library's progress (names, handles, attributes).
_LOCAL = {
    "Get_size",
    "Get_rank",
    "Get_group",
    "Get_name",
    "Set_name",
    "Get_topology",
    "Is_inter",
    "Is_intra",
    "Get_errhandler",
    "Set_errhandler",
    "Get_attr",
    "Set_attr",
    "Delete_attr",
    "Get_info",
    "Set_info",
    "Is_revoked",
    "Revoke",
    "Get_failed",
    "Ack_failed",
    "Free",
    "free",
    "py2f",
    "f2py",
    "tomemory",
    "fromhandle",
    "toint",
    "fromint",
    "Create_keyval",
    "Free_keyval",
    "Create_errhandler",
    "Call_errhandler",
    "Get_parent",
    "Join",
    "Compare",
    "Abort",
    "handle",
    "group",
    "size",
    "rank",
    "info",
    "name",
    "topology",
    "is_inter",
    "is_intra",
    "is_topo",
}


def tracked(comm):
    """The same MPI communicator, as an object whose calls are tracked. Free it through ``comm``,
    which the caller keeps: the two objects share one MPI handle."""
    base = type(comm)
    if base in _classes.values():
        return comm
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = _subclass(base)
    return cls(comm)


def _subclass(base: type) -> type:
    def wrap(name: str, method):
        def call(self, *args, **kwargs):
            enter(name)
            try:
                return method(self, *args, **kwargs)
            finally:
                leave()

        call.__name__ = name
        call.__qualname__ = f"{base.__name__}.{name}"
        call.__doc__ = getattr(method, "__doc__", None)
        return call

    def abort(self, errorcode: int = 0) -> NoReturn:
        raise RankAborted(errorcode)

    abort.__qualname__ = f"{base.__name__}.Abort"
    # world_model guards Comm.Abort itself; this one holds where that guard could not be set.
    namespace: dict[str, Any] = {"__doc__": base.__doc__, "__module__": base.__module__, "Abort": abort}
    for name in dir(base):
        if name.startswith("_") or name in _LOCAL:
            continue
        method = getattr(base, name, None)
        # Plain methods only: classmethods and static methods build new objects themselves.
        if (
            callable(method)
            and not isinstance(base.__dict__.get(name), (classmethod, staticmethod))
            and type(method).__name__ in ("method_descriptor", "function", "cython_function_or_method")
        ):
            namespace[name] = wrap(name, method)
    return type(base.__name__, (base,), namespace)
