/* Clocks and medians of the benchmark's C clients (pmi-client.c, pmix-client.c, pmi-sim.c).
 * Header only: each client is one file built by one gcc call, which finds this header beside it. */
#ifndef DASK_PMIX_BENCH_TIMING_H
#define DASK_PMIX_BENCH_TIMING_H

#include <stdlib.h>
#include <time.h>

/* Microseconds on CLOCK_MONOTONIC: what a client times its calls with. */
static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

/* Seconds on CLOCK_MONOTONIC. */
static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Seconds on CLOCK_REALTIME: comparable across processes. */
static inline double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v[0..n) in place, ascending. */
static inline void sort_doubles(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

/* The median of v[0..n) (the upper one for an even n), which it sorts; 0 when n is 0. */
static inline double median(double *v, int n) {
  sort_doubles(v, n);
  return n ? v[n / 2] : 0;
}

#endif
