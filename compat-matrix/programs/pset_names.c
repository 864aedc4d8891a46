/* pset-names: list the process sets the session sees (the runner checks the sidecar's names). */
#include "compat.h"

int main(void) {
  const char *F = "pset-names";
  MPI_Session session;
  int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &session);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Session_init", rc);
    return 4;
  }
  int n = 0;
  rc = MPI_Session_get_num_psets(session, MPI_INFO_NULL, &n);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Session_get_num_psets", rc);
    return 4;
  }
  char names[4096] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    char name[MPI_MAX_PSET_NAME_LEN];
    int len = sizeof name;
    rc = MPI_Session_get_nth_pset(session, MPI_INFO_NULL, i, &len, name);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Session_get_nth_pset", rc);
      return 4;
    }
    used += snprintf(names + used, sizeof names - used, "%s\"%s\"", i ? "," : "", name);
    if (used >= sizeof names) break;
  }
  /* The names must also be usable: mpi://WORLD resolves to a group this rank belongs to. */
  MPI_Group world;
  rc = MPI_Group_from_session_pset(session, "mpi://WORLD", &world);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Group_from_session_pset", rc);
    return 4;
  }
  int rank = MPI_UNDEFINED, size = 0;
  MPI_Group_rank(world, &rank);
  MPI_Group_size(world, &size);
  int ok = rank != MPI_UNDEFINED && size > 0;
  compat_report(F, rank, size, ok, "\"num\":%d,\"names\":[%s]", n, names);
  MPI_Group_free(&world);
  MPI_Session_finalize(&session);
  return ok ? 0 : 3;
}
