/* session-world: MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce. */
#include "compat.h"

int main(void) {
    const char *F = "session-world";
    double t0 = compat_now();
    MPI_Session session;
    MPI_Group group;
    MPI_Comm comm;
    int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &session);
    if (rc != MPI_SUCCESS) { compat_error(F, "MPI_Session_init", rc); return 4; }
    rc = MPI_Group_from_session_pset(session, "mpi://WORLD", &group);
    if (rc != MPI_SUCCESS) { compat_error(F, "MPI_Group_from_session_pset", rc); return 4; }
    rc = MPI_Comm_create_from_group(group, "org.dask-pmix.compat.world", MPI_INFO_NULL, MPI_ERRORS_RETURN, &comm);
    if (rc != MPI_SUCCESS) { compat_error(F, "MPI_Comm_create_from_group", rc); return 4; }
    double t1 = compat_now();
    int rank, size, sum = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int ok = compat_allreduce_ok(comm, &sum);
    compat_report(F, rank, size, ok, "\"sum\":%d,\"comm_s\":%.4f", sum, t1 - t0);
    MPI_Comm_free(&comm);
    MPI_Group_free(&group);
    MPI_Session_finalize(&session);
    return ok ? 0 : 3;
}
