"""Workers started by an MPI launcher (dask-mpi style) carry their Dask traffic over MPI too:

    mpirun -n 4 dask worker SCHEDULER --no-nanny --protocol tcp+mpi --preload dask_pmix.comm.launcher

Each worker joins the launcher's world through one MPI session (its namespace is the pool epoch,
its world the pool) before it listens. Without a nanny: a nanny's worker is a child process that
would inherit the launcher's identity of its parent.
"""

from __future__ import annotations

from . import link


def dask_setup(worker) -> None:
    if link.current_link() is None:
        link.set_link(link.join_launcher_world())
