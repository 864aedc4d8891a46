"""Code that runs in a Dask client: run_mpi and submit_mpi."""
