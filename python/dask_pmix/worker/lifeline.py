"""Keeps a pool process alive when its PMIx server (the sidecar) goes away, and tells it so.

Open MPI 5.0.x registers a default PMIx event handler for every code; on PMIX_ERR_LOST_CONNECTION
it queues ompi_errhandler_event_cb, which at the process's next MPI progress calls
errors_are_fatal on no communicator ("unknown handle") and aborts the process (ompi
errhandler.c, ompi_errhandler_callback and ompi_errhandler_event_cb). No MCA parameter and no
errhandler on a session or communicator prevents it. A handler registered for that one code runs
before the default ones, and answering PMIX_EVENT_ACTION_COMPLETE ends the chain
(openpmix pmix_event_notification.c), so the default handler never runs.

libpmix is the one libmpi loaded (opened here with RTLD_NOLOAD: never a second copy). The
callback runs on libpmix's progress thread: it only calls ``on_lost`` (which must be short) and
completes the event. Communicators that exist keep working (their transport needs no PMIx); new
ones cannot be built (PMIx_Group_construct fails), so the worker takes no new in-process job."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

PMIX_ERR_LOST_CONNECTION = -61
PMIX_EVENT_ACTION_COMPLETE = -334

# void pmix_event_notification_cbfunc_fn_t(pmix_status_t, pmix_info_t*, size_t, pmix_op_cbfunc_t, void*, void*)
_NOTIFY_CB = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)
# void pmix_notification_fn_t(size_t evhdlr_id, pmix_status_t, const pmix_proc_t*, pmix_info_t[], size_t,
#                             pmix_info_t[], size_t, pmix_event_notification_cbfunc_fn_t, void*)
_HANDLER = ctypes.CFUNCTYPE(
    None,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_void_p,
)

# libpmix holds the handler's pointer for the process's life.
_kept: list = []


def _libpmix() -> ctypes.CDLL:
    """The libpmix already mapped into this process (by libmpi)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/libpmix.so" in line}
    if len(paths) != 1:
        raise RuntimeError(f"expected one libpmix in this process, found {sorted(paths) or 'none'}")
    lib = ctypes.CDLL(paths.pop(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    lib.PMIx_Register_event_handler.restype = ctypes.c_int
    lib.PMIx_Register_event_handler.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        _HANDLER,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    return lib


def survive(on_lost: Callable[[], None]) -> int:
    """Registers the lost-connection handler (after MPI_Session_init); its registration id."""

    def handler(ref, status, source, info, ninfo, results, nresults, cbfunc, cbdata):
        try:
            on_lost()
        finally:
            if cbfunc:
                _NOTIFY_CB(cbfunc)(PMIX_EVENT_ACTION_COMPLETE, None, 0, None, None, cbdata)

    callback = _HANDLER(handler)
    _kept.append(callback)
    codes = (ctypes.c_int * 1)(PMIX_ERR_LOST_CONNECTION)
    ref = _libpmix().PMIx_Register_event_handler(codes, 1, None, 0, callback, None, None)
    if ref < 0:
        raise RuntimeError(f"PMIx_Register_event_handler failed with status {ref}")
    return ref
