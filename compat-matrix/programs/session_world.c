/* session-world: MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce. */
#include "compat.h"

int main(void) {
  const char *F = "session-world";
  double t0 = compat_now();
  MPI_Session session;
  MPI_Comm comm;
  if (compat_session_world(F, "org.dask-pmix.compat.world", &session, &comm) != MPI_SUCCESS) return 4;
  double t1 = compat_now();
  int rank, size, sum = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int ok = compat_allreduce_ok(comm, &sum);
  compat_report(F, rank, size, ok, "\"sum\":%d,\"comm_s\":%.4f", sum, t1 - t0);
  MPI_Comm_free(&comm);
  MPI_Session_finalize(&session);
  return ok ? 0 : 3;
}
