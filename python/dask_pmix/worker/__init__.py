"""Code that runs in a Dask worker process: its place in the in-process MPI pool (pool), the
worker plugin that joins it (plugin), the MPI library it loads (library, mpi), the members that run
in it (members) and the gate that keeps its own MPI progress away from communicator builds
(activation)."""
