"""tcp+mpi://, a Dask comm backend whose worker-to-worker bulk frames move over MPI.

Loaded by distributed through the "distributed.comm.backends" entry point (python/pyproject.toml),
like distributed-ucxx: start workers with `dask worker --protocol tcp+mpi ...` or
`LocalCluster(protocol="tcp+mpi://")`. Connections between two ranks of the same MPI pool epoch
(dask_pmix.pool) carry large frames over MPI where MPI has a path between them that beats the TCP
stream (shared memory, or a fabric: paths.py); every other connection (scheduler, clients, workers
outside the pool, in another epoch or reachable only over MPI's TCP transport) stays TCP.
"""

from .stats import comm_stats
from .tcpmpi import PREFIX, TCPMPI, TCPMPIBackend, TCPMPIConnector, TCPMPIListener

__all__ = ["PREFIX", "TCPMPI", "TCPMPIBackend", "TCPMPIConnector", "TCPMPIListener", "comm_stats"]
