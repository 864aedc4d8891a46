/* abort: after a barrier, rank 1 calls MPI_Abort while the others wait in a receive from it
 * that never comes. The runner checks every other rank ends (error or killed) within 2 s. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "abort";
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    compat_report(F, rank, size, 1, "\"aborting\":true");
    MPI_Abort(MPI_COMM_WORLD, 7);
  }
  compat_report(F, rank, size, 1, "\"waiting\":true");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int x = 0;
  int rc = MPI_Recv(&x, 1, MPI_INT, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  compat_report(F, rank, size, rc != MPI_SUCCESS, "\"recv_rc\":%d", rc);
  return 9;
}
