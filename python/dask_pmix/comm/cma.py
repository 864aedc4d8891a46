"""Single copy between two processes of one host: the receiver copies a frame straight out of the
sender's memory with process_vm_readv (cross-memory attach, what Open MPI's smsc/cma does inside
its shared-memory transport).

This is the same-host path of workers that Open MPI cannot put in shared memory with each other:
Open MPI 5.0.x fixes a process's locality when it initialises, so a worker that joined the pool
after its host's cohort, or that its nanny restarted, is remote to every other worker in MPI's
eyes. The kernel does not care when the processes started: one copy, from the sender's pages into
the receiver's fresh buffer, as fast as a memcpy into fresh memory.

The kernel allows it only where ptrace would be allowed: the same user, a dumpable target, and
under Yama's ptrace_scope 1 a target that named this process (or any) as its tracer. Rather than
guess from the settings, a pair proves it works when it meets: each end reads a probe from the
other (hello.py), and a pair where either read fails keeps its frames in the TCP stream.
"""

from __future__ import annotations

import ctypes
import errno
import os
from functools import lru_cache

_IOV_MAX = 1024  # the kernel refuses more iovecs per call


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@lru_cache(maxsize=1)
def _readv():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


def available() -> bool:
    """Whether this process can try at all (Linux with process_vm_readv)."""
    return _readv() is not None


@lru_cache(maxsize=1)
def host() -> str | None:
    """What two processes must share to count as one host here: the running kernel (its boot id)
    and the pid namespace, without which one cannot read the other by pid, and the network
    namespace. The copy itself would work across network namespaces, but a network namespace of
    its own is how a container (or this project's multi-host tests) stands for another host, and
    Dask and the sidecar then see another address: the pair is treated as they treat it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}/{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return None


def address(frame) -> int:
    """Where a (contiguous) frame's bytes start in this process, read-only buffers too."""
    import numpy as np

    view = memoryview(frame)
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view.cast("B"), dtype=np.uint8).ctypes.data)


class CopyError(OSError):
    """The peer's memory could not be read (it died, or the kernel refused)."""


def read(pid: int, frames: list, addresses: list) -> None:
    """Fills each writable buffer in frames with as many bytes from pid's memory at the address
    beside it. Blocks for the copy (call it off the event loop for large frames)."""
    fn = _readv()
    if fn is None:
        raise CopyError(errno.ENOSYS, "process_vm_readv is not available")
    pieces = []
    for frame, addr in zip(frames, addresses):
        view = memoryview(frame)
        n = view.nbytes
        if n == 0:
            continue
        if view.readonly:
            raise ValueError("a single-copy read needs writable buffers")
        pieces.append((address(view), addr, n))
    for start in range(0, len(pieces), _IOV_MAX):
        batch = pieces[start : start + _IOV_MAX]
        _read_batch(fn, pid, batch)


def _read_batch(fn, pid: int, batch: list) -> None:
    # A call may copy less than asked (the kernel stops at a fault and returns what it copied):
    # go on from there until every byte is in, or a call copies nothing.
    todo = [list(p) for p in batch]
    while todo:
        count = len(todo)
        local = (_Iovec * count)(*[_Iovec(b, n) for b, _, n in todo])
        remote = (_Iovec * count)(*[_Iovec(a, n) for _, a, n in todo])
        got = fn(pid, local, count, remote, count, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise CopyError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        if got == 0:
            raise CopyError(errno.EFAULT, f"process_vm_readv from pid {pid} copied nothing")
        while got and todo:
            b, a, n = todo[0]
            if got >= n:
                got -= n
                todo.pop(0)
            else:
                todo[0] = [b + got, a + got, n - got]
                got = 0


def process_gone(pid: int | None) -> bool:
    """Whether the process pid (of this host) has ended: gone, or a zombie its parent (the
    nanny) has not reaped yet."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot be asked: rely on the grace
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")"
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state in (b"Z", b"X", b"x")
