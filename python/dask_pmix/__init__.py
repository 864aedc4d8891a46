"""Run MPI jobs on the workers of a running Dask cluster, through the dask-pmix sidecar.

    client.register_plugin(dask_pmix.SidecarPlugin())      # or: dask scheduler --preload dask_pmix
    sums = dask_pmix.run_mpi(client, fn, n=3)              # fn(comm) on 3 workers, rank order
"""

from pathlib import Path

from . import config  # noqa: F401  (registers the dask-pmix settings with dask.config)
from . import pool
from .comm.stats import comm_stats
from .errors import MPIJobError, SidecarError
from .plugin import SidecarPlugin, dask_setup, wait_for_plugin
from .rest import SidecarClient
from .run import run_mpi, submit_mpi
from .worker import PoolPlugin

__version__ = (Path(__file__).resolve().parent / "VERSION").read_text().strip()
__all__ = ["comm_stats", "MPIJobError", "SidecarError", "SidecarPlugin", "SidecarClient", "PoolPlugin", "pool", "run_mpi",
           "submit_mpi", "dask_setup", "wait_for_plugin", "__version__"]
