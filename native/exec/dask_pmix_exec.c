/* dask-pmix exec [--setsid] [--] PROGRAM ARGS...
 *
 * Starts a plain MPICH / Intel MPI program as a member of a dask-pmix job: with the member's
 * environment from the sidecar (PMI_PORT, PMI_ID, ...) it binds the PMI connection with the
 * credential (pmi_connect.h), hands it to MPI as PMI_FD with PMI_RANK / PMI_SIZE, and execs the
 * program in its own place (same pid, signals, exit status). Without PMI_PORT / PMI_ID it just
 * execs. What `python -m dask_pmix.pmi_connect PROGRAM` does, without an interpreter's start.
 *
 * --setsid: the program runs in a session of its own, as hydra's proxy starts each rank (with
 * the kernel's autogroup scheduling a session is one share of the CPU).
 */
#include "pmi_connect.h"

static const char USAGE[] = "usage: dask-pmix exec [--setsid] [--] PROGRAM ARGS...\n";

int main(int argc, char **argv) {
  int a = 1, setsid_ = 0;
  for (; a < argc && argv[a][0] == '-'; a++) {
    if (!strcmp(argv[a], "--")) {
      a++;
      break;
    }
    if (!strcmp(argv[a], "--setsid") || !strcmp(argv[a], "-s")) {
      setsid_ = 1;
    } else if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
      fputs(USAGE, stdout);
      return 0;
    } else {
      fprintf(stderr, "dask-pmix exec: unknown option %s\n%s", argv[a], USAGE);
      return 2;
    }
  }
  if (a >= argc) {
    fputs(USAGE, stderr);
    return 2;
  }
  if (setsid_) setsid();
  if (pmi_connect() != 0) return 3;
  execvp(argv[a], argv + a);
  fprintf(stderr, "dask-pmix exec: cannot run %s: %s\n", argv[a], strerror(errno));
  return 127;
}
