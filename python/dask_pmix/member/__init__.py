"""One rank of an MPI job, in a worker: in the worker process itself (inprocess: Open MPI's pool,
and MPICH / Intel MPI worlds joined by a merge tree), or in a child process (fork)."""
