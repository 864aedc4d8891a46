/* publish-lookup: rank 0 publishes a service, the others look it up, rank 0 unpublishes and the
 * lookup then fails. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "publish-lookup";
  const char *service = argc > 1 ? argv[1] : "dask-pmix-compat";
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char port[MPI_MAX_PORT_NAME] = "";
  int ok = 1, rc;
  if (rank == 0) {
    snprintf(port, sizeof port, "port-%d-%s", (int)getpid(), service);
    rc = MPI_Publish_name(service, MPI_INFO_NULL, port);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Publish_name", rc);
      ok = 0;
    }
  }
  MPI_Bcast(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank != 0) {
    char found[MPI_MAX_PORT_NAME] = "";
    rc = MPI_Lookup_name(service, MPI_INFO_NULL, found);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Lookup_name", rc);
      ok = 0;
    } else if (strcmp(found, port) != 0)
      ok = 0;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int gone = 1;
  if (rank == 0) {
    rc = MPI_Unpublish_name(service, MPI_INFO_NULL, port);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Unpublish_name", rc);
      ok = 0;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == size - 1 && size > 1) {
    char again[MPI_MAX_PORT_NAME] = "";
    gone = MPI_Lookup_name(service, MPI_INFO_NULL, again) != MPI_SUCCESS;
  }
  int all = 0, mine = ok && gone;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  compat_report(F, rank, size, all, "\"port\":\"%s\",\"unpublished\":%s", port, gone ? "true" : "false");
  MPI_Finalize();
  return all ? 0 : 3;
}
