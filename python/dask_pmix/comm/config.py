"""Settings of the tcp+mpi backend, read from dask.config under "dask-pmix.comm" (or the
environment, e.g. DASK_DASK_PMIX__COMM__SM_THRESHOLD=1MiB), with these defaults."""

from __future__ import annotations

import dask.config
from dask.utils import parse_bytes, parse_timedelta

DEFAULTS = {
    # frames at least this large go over MPI between workers that share memory (see paths.py);
    # smaller ones stay in the TCP stream, where a message costs what it costs on tcp://. Measured
    # on a loaded 2-core host (bench/comm.py, paired rounds): from 4 MiB on MPI wins in every run
    # (1.1-1.7x), at 1-2 MiB it won in some runs and lost in others (0.76-1.33x)
    "sm-threshold": "4 MiB",
    # whether this worker's MPI library reaches workers of other hosts over a network faster than
    # TCP (UCX or OFI on InfiniBand, RoCE, EFA): then pairs on different hosts use MPI too
    "fabric": False,
    # ... for frames at least this large
    "fabric-threshold": "1 MiB",
    # whether workers of one host that do not share memory in Open MPI's eyes (a worker that joined
    # after its host's cohort, or that its nanny restarted) copy frames straight out of each
    # other's memory (process_vm_readv, as Open MPI's smsc/cma does), where the kernel allows it
    "cma": True,
    # how the workers of a host's cohort, which share memory in MPI, move their large frames:
    # "mpi" (over MPI's shared-memory transport, sm-threshold) or "copy" (the single copy above,
    # as every other pair of the host does)
    "same-host": "mpi",
    # ... for frames at least this large; smaller ones stay in the TCP stream. A message and a
    # reply between two tcp+mpi comms, median of 40 (loaded 2-core host): 512 KiB 0.21 ms in the
    # stream vs 0.23 ms copied, 1 MiB 0.44 vs 0.27, 8 MiB 3.3 vs 0.75
    "cma-threshold": "1 MiB",
    # one frame moves as MPI messages of this size (Open MPI 5.0 counts are C ints); both ends of a
    # connection must use the same. A receiver faults a chunk in while the one before is copied
    "chunk": "8 MiB",
    # the TCP stream closed while a message's MPI frames are in flight: wait this long for them
    # (a clean close leaves them to arrive), then the read raises CommClosedError (a dead peer)
    "liveness": "3 s",
    # after a connection closes, stray MPI messages on its tag are received and dropped this long
    "drain": "10 s",
}

_BYTES = ("sm-threshold", "fabric-threshold", "cma-threshold", "chunk")
_FLAGS = ("fabric", "cma")


def get(key: str):
    value = dask.config.get(f"dask-pmix.comm.{key}", DEFAULTS[key])
    if key in _BYTES:
        return parse_bytes(value) if isinstance(value, str) else int(value)
    if key in _FLAGS:
        return value in (True, 1) or (isinstance(value, str) and value.lower() in ("true", "yes", "1"))
    if key == "same-host":
        if value not in ("mpi", "copy"):
            raise ValueError(f"dask-pmix.comm.same-host must be 'mpi' or 'copy', not {value!r}")
        return value
    return parse_timedelta(value, default="seconds")
