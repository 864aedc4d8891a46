/* MPICH-specific test ranks for the PMI server, started by hand with the sidecar's env.
 *   mpich_probe die R     MPI_Init; rank R exits at once without finalizing, the others
 *                         wait a little and call MPI_Finalize (a PMI barrier that must fail)
 *   mpich_probe init      MPI_Init + MPI_Finalize, printing wall-clock times (for benchmarks)
 *   mpich_probe repeat DIR N
 *                         N rounds in one process, each a session in another job: waits for
 *                         DIR/round<k>.env (lines NAME=VALUE: that round's PMI env), sets it,
 *                         binds that job's PMI connection (pmi_connect.h), then
 *                         MPI_Session_init + mpi://WORLD + Allreduce + MPI_Session_finalize
 * Prints JSON lines.
 */
#include <mpi.h>
#include <stdio.h>

#include "pmi_connect.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Waits for DIR/round<k>.env and puts its NAME=VALUE lines into the environment. */
static int load_round(const char *dir, int k) {
  char path[4096], line[4096];
  snprintf(path, sizeof path, "%s/round%d.env", dir, k);
  FILE *f = NULL;
  for (int i = 0; i < 600 && !(f = fopen(path, "r")); i++) usleep(50 * 1000);
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *eq = strchr(line, '=');
    if (!eq) continue;
    *eq = 0;
    setenv(line, eq + 1, 1);
  }
  fclose(f);
  return 0;
}

static int repeat(const char *dir, int rounds) {
  for (int k = 1; k <= rounds; k++) {
    if (load_round(dir, k) != 0) {
      printf("{\"mode\":\"repeat\",\"round\":%d,\"error\":\"no env\"}\n", k);
      return 6;
    }
    if (pmi_connect() != 0) {
      printf("{\"mode\":\"repeat\",\"round\":%d,\"error\":\"pmi_connect\"}\n", k);
      return 6;
    }
    MPI_Session s;
    MPI_Group g;
    MPI_Comm c;
    int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &s);
    if (rc == MPI_SUCCESS) rc = MPI_Group_from_session_pset(s, "mpi://WORLD", &g);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_from_group(g, "dask-pmix.repeat", MPI_INFO_NULL, MPI_ERRORS_RETURN, &c);
    if (rc != MPI_SUCCESS) {
      printf("{\"mode\":\"repeat\",\"round\":%d,\"error\":\"init\",\"rc\":%d}\n", k, rc);
      fflush(stdout);
      return 7;
    }
    int rank, size, one, sum = 0;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    one = rank + 1;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c);
    printf("{\"mode\":\"repeat\",\"round\":%d,\"rank\":%d,\"size\":%d,\"sum\":%d,\"ok\":%s}\n", k, rank, size, sum,
           sum == size * (size + 1) / 2 ? "true" : "false");
    fflush(stdout);
    MPI_Comm_free(&c);
    MPI_Group_free(&g);
    rc = MPI_Session_finalize(&s);
    /* The last PMI traffic of the round was MPI_Session_finalize's barrier: from here on
     * the job may be ended (MPICH sends PMI finalize only when the process exits). */
    printf("{\"mode\":\"repeat\",\"round\":%d,\"finalized\":%s}\n", k, rc == MPI_SUCCESS ? "true" : "false");
    fflush(stdout);
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "init";
  if (!strcmp(mode, "repeat")) return repeat(argc > 2 ? argv[2] : ".", argc > 3 ? atoi(argv[3]) : 2);
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
  printf("{\"mode\":\"init\",\"rank\":%d,\"size\":%d,\"init_rc\":%d,\"t_start\":%.6f,\"t_init\":%.6f}\n", rank, size,
         rc, t0, t1);
  fflush(stdout);
  MPI_Finalize();
  return rc == MPI_SUCCESS ? 0 : 4;
}
