"""Per-process counters of the tcp+mpi comm backend, per transport.

Bytes are counted where they physically went ("tcp": the connection's socket, "mpi": MPI
point-to-point, "cma": copied by the receiver out of the sender's memory); a message counts under
"mpi" or "cma" when at least one of its frames went that way.
"paths" counts the connections between two pool workers by the path they chose (paths.py).
Read them in a worker with dask_pmix.comm_stats(); workers also report them as the
"dask_pmix_comm" worker metric (scheduler side: WorkerState.metrics).
"""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()

TRANSPORTS = ("tcp", "mpi", "cma")
FIELDS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received", "connections")


def add(transport: str, **fields: int) -> None:
    with _lock:
        for name, value in fields.items():
            _counts[(transport, name)] += value


def sent(tcp_bytes: int, mpi_bytes: int, cma_bytes: int = 0) -> None:
    """One message written (called on the event loop only: no lock on this hot path)."""
    c = _counts
    c[_TCP_SENT] += tcp_bytes
    if mpi_bytes:
        c[_MPI_SENT] += mpi_bytes
        c[_MPI_MSG_SENT] += 1
    elif cma_bytes:
        c[_CMA_SENT] += cma_bytes
        c[_CMA_MSG_SENT] += 1
    else:
        c[_TCP_MSG_SENT] += 1


def received(tcp_bytes: int, mpi_bytes: int, cma_bytes: int = 0) -> None:
    c = _counts
    c[_TCP_RECV] += tcp_bytes
    if mpi_bytes:
        c[_MPI_RECV] += mpi_bytes
        c[_MPI_MSG_RECV] += 1
    elif cma_bytes:
        c[_CMA_RECV] += cma_bytes
        c[_CMA_MSG_RECV] += 1
    else:
        c[_TCP_MSG_RECV] += 1


_TCP_SENT, _MPI_SENT = ("tcp", "bytes_sent"), ("mpi", "bytes_sent")
_TCP_RECV, _MPI_RECV = ("tcp", "bytes_received"), ("mpi", "bytes_received")
_TCP_MSG_SENT, _MPI_MSG_SENT = ("tcp", "messages_sent"), ("mpi", "messages_sent")
_TCP_MSG_RECV, _MPI_MSG_RECV = ("tcp", "messages_received"), ("mpi", "messages_received")
_CMA_SENT, _CMA_RECV = ("cma", "bytes_sent"), ("cma", "bytes_received")
_CMA_MSG_SENT, _CMA_MSG_RECV = ("cma", "messages_sent"), ("cma", "messages_received")


PATHS = ("sm", "fabric", "cma", "tcp")


def path(name: str) -> None:
    """A connection between two pool workers chose its path (paths.py): "tcp" when its frames
    stay in the TCP stream."""
    with _lock:
        _counts[("paths", name)] += 1


def note(event: str, n: int = 1) -> None:
    """Events that are not per transport: fallbacks and their reasons, communicators built."""
    with _lock:
        _counts[("events", event)] += n


def comm_stats() -> dict:
    """{"tcp": {...}, "mpi": {...}, "paths": {...}, "events": {...}}: counters since the process
    started. "paths": connections between two pool workers by the path they chose (paths.py)."""
    with _lock:
        items = list(_counts.items())
    out: dict = {t: dict.fromkeys(FIELDS, 0) for t in TRANSPORTS}
    out["paths"] = dict.fromkeys(PATHS, 0)
    out["events"] = {}
    for (group, name), value in items:
        out.setdefault(group, {})[name] = value
    return out


def reset() -> None:
    with _lock:
        _counts.clear()
