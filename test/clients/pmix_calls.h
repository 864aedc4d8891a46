/* The PMIx calls that the client programs of the tests (test/clients) and of the PMIx benchmark
 * (bench/pmix-client.c) make alike. Header only: each program is one file built by one gcc call,
 * which finds this header beside the source it includes it from.
 *
 * The including program defines die(): how it reports a call that failed (one JSON line on
 * stdout) before it exits 2.
 */
#ifndef DASK_PMIX_TEST_PMIX_CALLS_H
#define DASK_PMIX_TEST_PMIX_CALLS_H

#include <pmix.h>
#include <stdbool.h>
#include <stdint.h>

/* This process, as PMIx_Init or PMIx_tool_init named it. */
static pmix_proc_t me;

static void die(const char *what, pmix_status_t rc) __attribute__((noreturn));

/* The size of our namespace (PMIX_JOB_SIZE). */
static inline uint32_t job_size(void) {
  pmix_proc_t wild;
  pmix_value_t *val = NULL;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  pmix_status_t rc = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val);
  if (PMIX_SUCCESS != rc) die("get job size", rc);
  uint32_t n = val->data.uint32;
  PMIX_VALUE_RELEASE(val);
  return n;
}

/* PMIx_Put of a string in the global scope, then PMIx_Commit. */
static inline void put_commit(const char *key, const char *value) {
  pmix_value_t v;
  PMIX_VALUE_LOAD(&v, value, PMIX_STRING);
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
  PMIX_VALUE_DESTRUCT(&v);
  if (PMIX_SUCCESS != rc) die("put", rc);
  if (PMIX_SUCCESS != (rc = PMIx_Commit())) die("commit", rc);
}

/* Every rank of our namespace of `n` ranks (PMIX_PROC_FREE them). */
static inline pmix_proc_t *namespace_procs(uint32_t n) {
  pmix_proc_t *procs;
  PMIX_PROC_CREATE(procs, n);
  for (uint32_t i = 0; i < n; i++) PMIX_LOAD_PROCID(&procs[i], me.nspace, i);
  return procs;
}

/* A query of the NULL-terminated `keys` that the server answers afresh (PMIX_QUERY_REFRESH_CACHE)
 * rather than the client from its cache. */
static inline void load_query(pmix_query_t *q, const char *const keys[]) {
  bool yes = true;
  PMIX_QUERY_CONSTRUCT(q);
  for (int i = 0; keys[i]; i++) PMIx_Argv_append_nosize(&q->keys, keys[i]);
  q->nqual = 1;
  PMIX_INFO_CREATE(q->qualifiers, 1);
  PMIX_INFO_LOAD(&q->qualifiers[0], PMIX_QUERY_REFRESH_CACHE, &yes, PMIX_BOOL);
}

/* PMIx_Query_info of one such query. */
static inline pmix_status_t query_keys(const char *const keys[], pmix_info_t **results, size_t *nresults) {
  pmix_query_t q;
  load_query(&q, keys);
  *results = NULL;
  *nresults = 0;
  return PMIx_Query_info(&q, 1, results, nresults);
}

#endif
