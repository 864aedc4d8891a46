/* One rank of the idle-ranks benchmark (bench/idle-ranks.ts): the last rank enters MPI_Init
 * STRAGGLER_DELAY_S seconds late, so that every other rank waits for it in MPI_Init's
 * fence / barrier with its process manager. Each rank prints one JSON line: when it entered and
 * left MPI_Init (CLOCK_REALTIME, comparable across processes), the CPU time it spent in MPI_Init
 * (getrusage, all its threads), and, for a waiting rank, its CPU share while it only waited: a
 * thread of its own samples the process's CPU time 30% and 90% into the straggler's delay.
 *
 * The rank is read from the environment before MPI starts: PMI_RANK (MPICH / Intel MPI, set by
 * the starter) or PMIX_RANK (Open MPI, from the PMIx server's fork environment). */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static double g_t0, g_delay, g_share = -1;

/* Samples the process's CPU time while the rank waits in MPI_Init for the straggler. */
static void *sampler(void *unused) {
  (void)unused;
  double a = g_t0 + 0.3 * g_delay, b = g_t0 + 0.9 * g_delay;
  while (wall() < a) usleep(1000);
  double ca = cpu(), wa = wall();
  while (wall() < b) usleep(1000);
  g_share = (cpu() - ca) / (wall() - wa);
  return NULL;
}

int main(int argc, char **argv) {
  const char *r = getenv("PMI_RANK") ? getenv("PMI_RANK") : getenv("PMIX_RANK");
  const char *s = getenv("PMI_SIZE") ? getenv("PMI_SIZE") : getenv("STRAGGLER_SIZE");
  const char *d = getenv("STRAGGLER_DELAY_S");
  int rank = r ? atoi(r) : -1, size = s ? atoi(s) : -1;
  int straggler = rank >= 0 && rank == size - 1;
  if (straggler && d) usleep((useconds_t)(atof(d) * 1e6));
  double t0 = wall(), c0 = cpu();
  pthread_t th;
  g_t0 = t0;
  g_delay = d ? atof(d) : 0;
  int sampling = !straggler && g_delay > 0.05 && pthread_create(&th, NULL, sampler, NULL) == 0;
  MPI_Init(&argc, &argv);
  double t1 = wall(), c1 = cpu();
  if (sampling) pthread_join(th, NULL);
  int mpi_rank, mpi_size, one = 1, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf(
      "{\"rank\":%d,\"size\":%d,\"straggler\":%s,\"ok\":%s,\"t_init_start\":%.6f,\"t_init_end\":%.6f,\"init_cpu_s\":%."
      "4f,"
      "\"wait_cpu_share\":%.4f}\n",
      mpi_rank, mpi_size, straggler ? "true" : "false", sum == mpi_size && mpi_rank == rank ? "true" : "false", t0, t1,
      c1 - c0, g_share);
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
