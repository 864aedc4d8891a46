/* spawn: MPI_Comm_spawn of two children running this program with "child"; parent and children
 * sum over the merged communicator. Reports the error when the process manager refuses. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "spawn";
  MPI_Init(&argc, &argv);
  MPI_Comm parent;
  MPI_Comm_get_parent(&parent);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (parent != MPI_COMM_NULL) {
    MPI_Comm merged;
    MPI_Intercomm_merge(parent, 1, &merged);
    int sum = 0;
    compat_allreduce_ok(merged, &sum);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm children;
  int errcodes[2];
  char *child_argv[] = {"child", NULL};
  int rc = MPI_Comm_spawn(argv[0], child_argv, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &children, errcodes);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Comm_spawn", rc);
    MPI_Finalize();
    return 5;
  }
  MPI_Comm merged;
  MPI_Intercomm_merge(children, 0, &merged);
  int msize = 0, sum = 0;
  MPI_Comm_size(merged, &msize);
  int ok = compat_allreduce_ok(merged, &sum) && msize == size + 2;
  compat_report(F, rank, size, ok, "\"merged_size\":%d,\"sum\":%d", msize, sum);
  MPI_Comm_free(&merged);
  MPI_Comm_disconnect(&children);
  MPI_Finalize();
  return ok ? 0 : 3;
}
