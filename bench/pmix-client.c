/* A bare PMIx client (no MPI) for the PMIx benchmark. The same program runs under dask-pmix's
 * sidecar (started by hand with the environment the sidecar hands out) and under PRRTE's
 * prterun, so both servers answer exactly the same requests.
 *
 *   pmix-client ITERS [SECTIONS]
 *
 * SECTIONS is a comma list of fence,fence_data,group,dmodex (default: all, in this order; the
 * direct-modex section leaves a key per iteration behind, which a group construct after it would
 * carry: libpmix's cost of a construct grows with the data its members committed). Every section is
 * preceded by a barrier so that the ranks start it together, and each iteration is timed on its
 * own (CLOCK_MONOTONIC around the PMIx call(s) only); the rank prints one JSON line with its
 * per-iteration medians in microseconds:
 *   init_us        PMIx_Init (connecting to the server, once; not a median)
 *   cpu_us         this client's own CPU time (user + system) over its whole run
 *   fence_us       PMIx_Fence over the namespace, no data
 *   fence_data_us  PMIx_Put of a 64-byte value + PMIx_Commit + PMIx_Fence(PMIX_COLLECT_DATA)
 *   dmodex_get_us  PMIx_Get (PMIX_GET_REFRESH_CACHE) of the next rank's key, given a new value
 *                  and committed just before (an untimed barrier in between, no data-collecting
 *                  fence): the client asks the server, which answers from the peer's commit
 *   group_us       PMIx_Group_construct over the namespace with PMIX_GROUP_ASSIGN_CONTEXT_ID
 *   group_destruct_us  the matching PMIx_Group_destruct
 * Values read back are checked; any failure prints ok:false and exits 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../test/clients/pmix_calls.h"
#include "timing.h"

static uint32_t nprocs;

static void die(const char *what, pmix_status_t rc) {
  printf("{\"rank\":%u,\"ok\":false,\"error\":\"%s\",\"status\":\"%s\"}\n", me.rank, what, PMIx_Error_string(rc));
  fflush(stdout);
  exit(2);
}

/* Whether the comma list `list` names `item`. */
static int has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (!strncmp(p, item, n) && (p[n] == ',' || p[n] == 0)) return 1;
  return 0;
}

static void barrier(void) {
  pmix_status_t rc = PMIx_Fence(NULL, 0, NULL, 0);
  if (PMIX_SUCCESS != rc) die("barrier", rc);
}

/* A 64-byte value (about an Open MPI business card per rank), distinct per rank and round. */
static void card(char *out, uint32_t rank, int round) {
  snprintf(out, 65, "card-%06u-%06d-", rank, round);
  size_t n = strlen(out);
  memset(out + n, 'x', 64 - n);
  out[64] = 0;
}

static void expect_peer(const char *key, uint32_t peer_rank, const char *want, const pmix_info_t *dirs, size_t ndirs) {
  pmix_proc_t peer;
  PMIX_LOAD_PROCID(&peer, me.nspace, peer_rank);
  pmix_value_t *got = NULL;
  pmix_status_t rc = PMIx_Get(&peer, key, dirs, ndirs, &got);
  if (PMIX_SUCCESS != rc) die("get", rc);
  if (PMIX_STRING != got->type || strcmp(got->data.string, want)) {
    fprintf(stderr, "rank %u: %s of %u is %s, want %s\n", me.rank, key, peer_rank,
            PMIX_STRING == got->type ? got->data.string : "(not a string)", want);
    die("get: wrong value", PMIX_ERR_BAD_PARAM);
  }
  PMIX_VALUE_RELEASE(got);
}

static double fence(int iters) {
  double *t = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    barrier();
    t[i] = now_us() - t0;
  }
  double m = median(t, iters);
  free(t);
  return m;
}

static double fence_data(int iters) {
  double *t = malloc(sizeof(double) * iters);
  char value[65], want[65];
  pmix_info_t collect;
  bool yes = true;
  PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  for (int i = 0; i < iters; i++) {
    card(value, me.rank, i);
    double t0 = now_us();
    put_commit("bench.card", value);
    pmix_status_t rc = PMIx_Fence(NULL, 0, &collect, 1);
    t[i] = now_us() - t0;
    if (PMIX_SUCCESS != rc) die("fence with data", rc);
  }
  PMIX_INFO_DESTRUCT(&collect);
  /* the last round's card of the next rank arrived with the fence */
  card(want, (me.rank + 1) % nprocs, iters - 1);
  expect_peer("bench.card", (me.rank + 1) % nprocs, want, NULL, 0);
  double m = median(t, iters);
  free(t);
  return m;
}

static double dmodex(int iters) {
  double *t = malloc(sizeof(double) * iters);
  char value[65], want[65];
  /* One key, a new value each round: the client must ask the server for it (refresh), and the
   * answer stays the same size (a fresh key per round would grow the peer's blob, which the
   * server sends whole, and every later group construct with it). */
  pmix_info_t refresh;
  bool yes = true;
  PMIX_INFO_LOAD(&refresh, PMIX_GET_REFRESH_CACHE, &yes, PMIX_BOOL);
  for (int i = 0; i < iters; i++) {
    card(value, me.rank, i);
    put_commit("bench.dm", value);
    barrier(); /* every rank has committed; nothing was collected */
    card(want, (me.rank + 1) % nprocs, i);
    double t0 = now_us();
    expect_peer("bench.dm", (me.rank + 1) % nprocs, want, &refresh, 1);
    t[i] = now_us() - t0;
    barrier(); /* nobody commits the next round's value before everyone has read this one */
  }
  PMIX_INFO_DESTRUCT(&refresh);
  double m = median(t, iters);
  free(t);
  return m;
}

static void group(int iters, double *construct_us, double *destruct_us) {
  double *tc = malloc(sizeof(double) * iters), *td = malloc(sizeof(double) * iters);
  pmix_proc_t *procs = namespace_procs(nprocs);
  pmix_info_t dir;
  bool yes = true;
  PMIX_INFO_LOAD(&dir, PMIX_GROUP_ASSIGN_CONTEXT_ID, &yes, PMIX_BOOL);
  char name[64];
  for (int i = 0; i < iters; i++) {
    snprintf(name, sizeof name, "bench.g.%d", i);
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    double t0 = now_us();
    pmix_status_t rc = PMIx_Group_construct(name, procs, nprocs, &dir, 1, &results, &nresults);
    tc[i] = now_us() - t0;
    if (PMIX_SUCCESS != rc) die("group construct", rc);
    int found = 0;
    for (size_t k = 0; k < nresults; k++) found |= PMIX_CHECK_KEY(&results[k], PMIX_GROUP_CONTEXT_ID);
    if (!found) die("group construct: no context id", PMIX_ERR_NOT_FOUND);
    if (results) PMIX_INFO_FREE(results, nresults);
    t0 = now_us();
    rc = PMIx_Group_destruct(name, NULL, 0);
    td[i] = now_us() - t0;
    if (PMIX_SUCCESS != rc) die("group destruct", rc);
  }
  PMIX_INFO_DESTRUCT(&dir);
  PMIX_PROC_FREE(procs, nprocs);
  *construct_us = median(tc, iters);
  *destruct_us = median(td, iters);
  free(tc);
  free(td);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 100;
  const char *sections = argc > 2 ? argv[2] : "fence,fence_data,group,dmodex";
  if (iters < 1) iters = 1;
  double t_init = now_us();
  pmix_status_t rc = PMIx_Init(&me, NULL, 0);
  if (PMIX_SUCCESS != rc) die("init", rc);
  t_init = now_us() - t_init;
  nprocs = job_size();

  char out[512];
  int len = snprintf(out, sizeof out, "{\"rank\":%u,\"size\":%u,\"ok\":true,\"init_us\":%.1f", me.rank, nprocs, t_init);
  /* warm up the connection and both sides' code paths */
  for (int i = 0; i < 10; i++) barrier();
  if (has(sections, "fence")) {
    barrier();
    len += snprintf(out + len, sizeof out - len, ",\"fence_us\":%.1f", fence(iters));
  }
  if (has(sections, "fence_data")) {
    barrier();
    len += snprintf(out + len, sizeof out - len, ",\"fence_data_us\":%.1f", fence_data(iters));
  }
  if (has(sections, "group")) {
    double c, d;
    barrier();
    group(iters, &c, &d);
    len += snprintf(out + len, sizeof out - len, ",\"group_us\":%.1f,\"group_destruct_us\":%.1f", c, d);
  }
  if (has(sections, "dmodex")) {
    barrier();
    len += snprintf(out + len, sizeof out - len, ",\"dmodex_get_us\":%.1f", dmodex(iters));
  }
  barrier();
  if (PMIX_SUCCESS != (rc = PMIx_Finalize(NULL, 0))) die("finalize", rc);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("%s,\"cpu_us\":%.0f}\n", out,
         (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  fflush(stdout);
  return 0;
}
