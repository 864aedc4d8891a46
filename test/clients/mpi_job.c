/* An MPI rank for the tests, started by hand with the environment the sidecar hands out.
 *   mpi_job world     MPI_Init + Allreduce + Finalize
 *   mpi_job session   MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce
 * Prints one JSON line with the rank, size and the checked Allreduce result.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int allreduce(MPI_Comm comm, const char *mode, double t0) {
  int rank, size, mine, sum = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  mine = rank + 1;
  double t1 = now();
  int rc = MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, comm);
  int expect = size * (size + 1) / 2;
  printf(
      "{\"mode\":\"%s\",\"rank\":%d,\"size\":%d,\"sum\":%d,\"expect\":%d,\"ok\":%s,\"init_s\":%.4f,\"allreduce_s\":%."
      "4f}\n",
      mode, rank, size, sum, expect, (rc == MPI_SUCCESS && sum == expect) ? "true" : "false", t1 - t0, now() - t1);
  fflush(stdout);
  return sum == expect ? 0 : 3;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "world";
  double t0 = now();
  int ret;
  if (!strcmp(mode, "world")) {
    MPI_Init(&argc, &argv);
    ret = allreduce(MPI_COMM_WORLD, mode, t0);
    MPI_Finalize();
  } else {
    MPI_Session session;
    MPI_Group group;
    MPI_Comm comm;
    MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &session);
    int rc = MPI_Group_from_session_pset(session, "mpi://WORLD", &group);
    if (rc != MPI_SUCCESS) {
      printf("{\"error\":\"group_from_session_pset\",\"rc\":%d}\n", rc);
      return 4;
    }
    rc = MPI_Comm_create_from_group(group, "dask-pmix.test", MPI_INFO_NULL, MPI_ERRORS_RETURN, &comm);
    if (rc != MPI_SUCCESS) {
      printf("{\"error\":\"comm_create_from_group\",\"rc\":%d}\n", rc);
      return 4;
    }
    ret = allreduce(comm, mode, t0);
    MPI_Comm_free(&comm);
    MPI_Group_free(&group);
    MPI_Session_finalize(&session);
  }
  return ret;
}
