"""Fault a fresh receive buffer in before MPI writes into it.

Open MPI's shared-memory transport copies a large message with one process_vm_readv (CMA) into
the receiver's buffer, and a buffer Dask has just allocated is untouched: each page is then
faulted in inside that copy, one at a time. Measured on this project's 2-core host (bench note in
bench/comm.py): 512 MiB arrived at 1.6 GiB/s into fresh memory and 5.8 GiB/s into touched memory,
while MADV_POPULATE_WRITE faults the fresh 512 MiB in at 6 GiB/s (numpy has asked for huge
pages on it already). So a receive first populates its buffer, then copies: about 3 GiB/s.

A large receive is posted chunk by chunk, and a helper thread populates the chunks ahead of the
posts (Ahead): on two cores the populating of chunk k+1 runs beside the copy of chunk k.

Linux 5.14 or later; elsewhere (or when the call fails) the buffer is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import queue
import sys
import threading

MADV_POPULATE_WRITE = 23
MIN_BYTES = 1 << 20  # smaller buffers fault in cheaply enough
_PAGE = mmap.PAGESIZE

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def populate(buf) -> bool:
    """Faults in the whole pages of a writable buffer (memoryview or numpy array). True if done."""
    global _madvise
    if _madvise is None:
        return False
    view = memoryview(buf)
    if view.nbytes < MIN_BYTES:
        return False
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    start = -(-addr // _PAGE) * _PAGE
    end = (addr + view.nbytes) // _PAGE * _PAGE
    if end <= start:
        return False
    if _madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
        # EINVAL: a kernel before 5.14 does not know the advice; do not ask again
        if ctypes.get_errno() == 22:
            _madvise = None
        return False
    return True


class Ahead:
    """One helper thread that populates buffers in the order asked; each ask returns an Event set
    once that buffer is populated (or given up on). Idle, the thread waits on its queue."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ask(self, buf, wake: threading.Event | None = None) -> threading.Event:
        """wake, if given, is set too once the buffer is populated (the progress thread's own
        event: it sleeps between polls and posts the chunk as soon as it is ready)."""
        done = threading.Event()
        if _madvise is None:
            done.set()
            return done
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dask-pmix-prefault", daemon=True)
                self._thread.start()
        self._queue.put((buf, done, wake))
        return done

    def _run(self) -> None:
        while True:
            buf, done, wake = self._queue.get()
            try:
                populate(buf)
            except Exception:  # noqa: BLE001 - a buffer left as it is only costs its faults later
                pass
            finally:
                done.set()
                if wake is not None:
                    wake.set()
