/* pset-group: MPI_Group_from_session_pset on a custom name (argv[1]) + MPI_Comm_create_from_group
 * + Allreduce. Ranks of two disjoint psets run this at the same time with different names. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "pset-group";
  const char *pset = argc > 1 ? argv[1] : "";
  MPI_Session session;
  MPI_Group group;
  MPI_Comm comm;
  int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &session);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Session_init", rc);
    return 4;
  }
  rc = MPI_Group_from_session_pset(session, pset, &group);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Group_from_session_pset", rc);
    return 4;
  }
  int grank = MPI_UNDEFINED, gsize = 0;
  MPI_Group_rank(group, &grank);
  MPI_Group_size(group, &gsize);
  if (grank == MPI_UNDEFINED) {
    compat_report(F, -1, gsize, 0, "\"pset\":\"%s\",\"error\":\"not a member of the group\"", pset);
    return 3;
  }
  char tag[256];
  snprintf(tag, sizeof tag, "org.dask-pmix.compat.%s", pset);
  rc = MPI_Comm_create_from_group(group, tag, MPI_INFO_NULL, MPI_ERRORS_RETURN, &comm);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Comm_create_from_group", rc);
    return 4;
  }
  int sum = 0;
  int ok = compat_allreduce_ok(comm, &sum);
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  compat_report(F, rank, size, ok, "\"pset\":\"%s\",\"sum\":%d", pset, sum);
  MPI_Comm_free(&comm);
  MPI_Group_free(&group);
  MPI_Session_finalize(&session);
  return ok ? 0 : 3;
}
