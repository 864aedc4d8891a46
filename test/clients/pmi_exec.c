/* pmi_exec PROGRAM ARGS...: binds the PMI connection with the PMI_ID credential
 * (pmi_connect.h) and runs PROGRAM on it (PMI_FD). The tests' and benchmarks' stand-in for what a
 * Dask worker does before its rank's MPI_Init. */
#include "pmi_connect.h"

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: pmi_exec PROGRAM ARGS...\n"); return 2; }
    if (pmi_connect() != 0) return 3;
    execvp(argv[1], argv + 1);
    fprintf(stderr, "pmi_exec: cannot run %s: %s\n", argv[1], strerror(errno));
    return 127;
}
