/* pmi_exec [-s] PROGRAM ARGS...: binds the PMI connection with the PMI_ID credential
 * (pmi_connect.h) and runs PROGRAM on it (PMI_FD). The tests' and benchmarks' stand-in for what a
 * Dask worker does before its rank's MPI_Init. -s: in a session of its own first (setsid), as
 * hydra's proxy starts each rank (the benchmark starts ranks alike on both sides). */
#include "pmi_connect.h"

int main(int argc, char **argv) {
    int a = 1;
    if (argc > 1 && !strcmp(argv[1], "-s")) {
        setsid();
        a = 2;
    }
    if (argc <= a) { fprintf(stderr, "usage: pmi_exec [-s] PROGRAM ARGS...\n"); return 2; }
    if (pmi_connect() != 0) return 3;
    execvp(argv[a], argv + a);
    fprintf(stderr, "pmi_exec: cannot run %s: %s\n", argv[a], strerror(errno));
    return 127;
}
