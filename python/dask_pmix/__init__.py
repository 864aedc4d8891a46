"""Run MPI jobs on the workers of a running Dask cluster, through the dask-pmix sidecar."""

__version__ = "0.1.0"
