/* world: MPI_Init + Allreduce + Finalize. */
#include "compat.h"

int main(int argc, char **argv) {
  double t0 = compat_now();
  MPI_Init(&argc, &argv);
  double t1 = compat_now();
  int rank, size, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int ok = compat_allreduce_ok(MPI_COMM_WORLD, &sum);
  compat_report("world", rank, size, ok, "\"sum\":%d,\"init_s\":%.4f", sum, t1 - t0);
  MPI_Finalize();
  return ok ? 0 : 3;
}
