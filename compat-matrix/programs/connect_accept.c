/* connect-accept: two jobs joined with MPI_Open_port / MPI_Comm_accept / MPI_Comm_connect.
 *   connect_accept accept SERVICE   (job A: rank 0 opens and publishes a port; all accept)
 *   connect_accept connect SERVICE  (job B: rank 0 looks the port up; all connect)
 * Then the merged communicator sums ranks across both jobs. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "connect-accept";
  const char *role = argc > 1 ? argv[1] : "accept";
  const char *service = argc > 2 ? argv[2] : "dask-pmix-compat-ca";
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank, size, rc;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char port[MPI_MAX_PORT_NAME] = "";
  MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
  int accept = strcmp(role, "accept") == 0;
  if (accept) {
    if (rank == 0) {
      rc = MPI_Open_port(MPI_INFO_NULL, port);
      if (rc != MPI_SUCCESS) {
        compat_error(F, "MPI_Open_port", rc);
        MPI_Abort(MPI_COMM_WORLD, 4);
      }
      rc = MPI_Publish_name(service, MPI_INFO_NULL, port);
      if (rc != MPI_SUCCESS) {
        compat_error(F, "MPI_Publish_name", rc);
        MPI_Abort(MPI_COMM_WORLD, 4);
      }
    }
    rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Comm_accept", rc);
      return 4;
    }
  } else {
    if (rank == 0) {
      /* The acceptor may not have published yet: retry for a while. */
      for (int i = 0; i < 200; i++) {
        if (MPI_Lookup_name(service, MPI_INFO_NULL, port) == MPI_SUCCESS) break;
        usleep(50 * 1000);
      }
    }
    rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Comm_connect", rc);
      return 4;
    }
  }
  int remote = 0;
  MPI_Comm_remote_size(inter, &remote);
  MPI_Intercomm_merge(inter, accept ? 0 : 1, &merged);
  int msize = 0, sum = 0;
  MPI_Comm_size(merged, &msize);
  int ok = compat_allreduce_ok(merged, &sum) && msize == size + remote;
  compat_report(F, rank, size, ok, "\"role\":\"%s\",\"remote_size\":%d,\"merged_size\":%d,\"sum\":%d", role, remote,
                msize, sum);
  MPI_Comm_free(&merged);
  MPI_Comm_disconnect(&inter);
  if (accept && rank == 0) {
    MPI_Unpublish_name(service, MPI_INFO_NULL, port);
    MPI_Close_port(port);
  }
  MPI_Finalize();
  return ok ? 0 : 3;
}
