"""The MPI library a worker's rank will use, loaded and checked before it joins a job, so that a
worker environment set up wrong fails with one sentence saying what to do instead of a rank that
hangs, starts as a lone singleton, or dies in a traceback from deep inside mpi4py."""

from __future__ import annotations

import sys

# The MPI families dask-pmix serves, and the extra that installs each one's mpi4py and library.
FAMILY = {"openmpi": "openmpi", "mpich": "mpich", "intelmpi": "mpich"}
EXTRA = {"openmpi": "openmpi", "mpich": "mpich", "intelmpi": "mpich"}


class WorkerMPIError(RuntimeError):
    """The worker's environment cannot run a rank of this job."""


def mpi_module():
    """mpi4py.MPI, imported without initialising MPI (a rank joins its job itself)."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        mpi4py.rc.threads = True
    from mpi4py import MPI

    return MPI


def library_name(MPI) -> str:
    text = MPI.Get_library_version()
    if "Open MPI" in text:
        return "openmpi"
    if "Intel" in text:
        return "intelmpi"
    if "MPICH" in text:
        return "mpich"
    return "unknown"


def load(impl: str):
    """mpi4py.MPI for a rank of an `impl` job, or a WorkerMPIError that says what to install."""
    extra = EXTRA.get(impl, impl)
    install = f"pip install 'dask-pmix[{extra}]' in the environment the workers run in"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise WorkerMPIError(f"this worker has no mpi4py: {install}") from None
    try:
        MPI = mpi_module()
    except (ImportError, RuntimeError, OSError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkerMPIError(f"mpi4py on this worker cannot load an MPI library ({why}): {install}") from None
    have = library_name(MPI)
    if FAMILY.get(have, have) != FAMILY.get(impl, impl):
        raise WorkerMPIError(
            f"the job is for {impl}, but mpi4py on this worker loads {have}: run the job with "
            f"impl='{have}', or {install}"
        )
    return MPI
