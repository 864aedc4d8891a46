/* MPICH-specific test ranks for the PMI server, started by hand with the sidecar's env.
 *   mpich_probe die R     MPI_Init; rank R exits at once without finalizing, the others
 *                         wait a little and call MPI_Finalize (a PMI barrier that must fail)
 *   mpich_probe init      MPI_Init + MPI_Finalize, printing wall-clock times (for benchmarks)
 * Prints JSON lines.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double wall(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "init";
    double t0 = wall();
    int rank = -1, size = -1;
    int rc = MPI_Init(&argc, &argv);
    double t1 = wall();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!strcmp(mode, "die")) {
        int victim = argc > 2 ? atoi(argv[2]) : 1;
        printf("{\"mode\":\"die\",\"rank\":%d,\"size\":%d,\"init_rc\":%d}\n", rank, size, rc);
        fflush(stdout);
        if (rank == victim) _exit(3);
        usleep(300 * 1000);
        /* MPI_Finalize's PMI barrier fails; MPICH's fatal handler aborts the rank (exit 15). */
        rc = MPI_Finalize();
        printf("{\"mode\":\"die\",\"rank\":%d,\"finalize_rc\":%d}\n", rank, rc);
        fflush(stdout);
        return rc == MPI_SUCCESS ? 0 : 5;
    }
    printf("{\"mode\":\"init\",\"rank\":%d,\"size\":%d,\"init_rc\":%d,\"t_start\":%.6f,\"t_init\":%.6f}\n", rank, size, rc, t0, t1);
    fflush(stdout);
    MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : 4;
}
