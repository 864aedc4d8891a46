/* Shared helpers for the compatibility programs: each prints one JSON line per rank,
 * {"feature": ..., "rank": r, "size": n, "ok": true|false, ...}, and exits 0 when it passed. */
#ifndef DASK_PMIX_COMPAT_H
#define DASK_PMIX_COMPAT_H

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline double compat_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Prints {"feature":F,"rank":R,"size":N,"ok":OK, <extra>} where extra is a printf-formatted
 * fragment of further JSON members (may be empty). */
static inline void compat_report(const char *feature, int rank, int size, int ok, const char *extra, ...) {
  char buf[4096] = "";
  if (extra && *extra) {
    va_list ap;
    va_start(ap, extra);
    buf[0] = ',';
    vsnprintf(buf + 1, sizeof buf - 1, extra, ap);
    va_end(ap);
  }
  printf("{\"feature\":\"%s\",\"rank\":%d,\"size\":%d,\"ok\":%s,\"t\":%.6f%s}\n", feature, rank, size,
         ok ? "true" : "false", compat_now(), buf);
  fflush(stdout);
}

static inline void compat_error(const char *feature, const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  for (char *p = msg; *p; ++p)
    if (*p == '"' || *p == '\\' || *p == '\n') *p = ' ';
  printf("{\"feature\":\"%s\",\"ok\":false,\"error\":\"%s\",\"rc\":%d,\"message\":\"%s\",\"t\":%.6f}\n", feature, what,
         rc, msg, compat_now());
  fflush(stdout);
}

/* Sum of rank+1 over comm, checked against n(n+1)/2. */
static inline int compat_allreduce_ok(MPI_Comm comm, int *sum_out) {
  int rank, size, mine, sum = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  mine = rank + 1;
  if (MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, comm) != MPI_SUCCESS) return 0;
  if (sum_out) *sum_out = sum;
  return sum == size * (size + 1) / 2;
}

#ifdef MPI_SESSION_NULL
/* MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group(tag). Reports and returns the MPI
 * error on failure. Open MPI 5.0 says MPI 3.1 in mpi.h although it has Sessions, hence the test
 * on MPI_SESSION_NULL rather than MPI_VERSION. */
static inline int compat_session_world(const char *feature, const char *tag, MPI_Session *session, MPI_Comm *comm) {
  MPI_Group group;
  int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, session);
  if (rc != MPI_SUCCESS) {
    compat_error(feature, "MPI_Session_init", rc);
    return rc;
  }
  rc = MPI_Group_from_session_pset(*session, "mpi://WORLD", &group);
  if (rc != MPI_SUCCESS) {
    compat_error(feature, "MPI_Group_from_session_pset", rc);
    return rc;
  }
  rc = MPI_Comm_create_from_group(group, tag, MPI_INFO_NULL, MPI_ERRORS_RETURN, comm);
  MPI_Group_free(&group);
  if (rc != MPI_SUCCESS) compat_error(feature, "MPI_Comm_create_from_group", rc);
  return rc;
}
#endif

#endif
