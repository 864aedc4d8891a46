/* A PMIx client for the tests: runs one scenario and prints one JSON line per result.
 * It is started as a separate process with only the environment from PMIx_server_setup_fork.
 *
 *   pmix_client put-get                  Put/Commit/Fence(collect)/Get a peer's key
 *   pmix_client publish-lookup SERVICE   rank 0 publishes after 300 ms; others Lookup with PMIX_WAIT
 *   pmix_client query-psets              PMIx_Query_info for pset count and names
 *   pmix_client group NAME               PMIx_Group_construct over the whole nspace with a context id
 *   pmix_client abort STATUS             PMIx_Abort
 *   pmix_client fence                    Fence without data, then Finalize
 *   pmix_client hang                     Init, then wait to be killed
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scenario.h"

static int put_get(void) {
  char key[64], value[64];
  uint32_t n = job_size();
  snprintf(key, sizeof key, "test.key.%u", me.rank);
  snprintf(value, sizeof value, "value-from-%u", me.rank);
  put_commit(key, value);
  pmix_status_t rc;
  pmix_info_t collect;
  bool yes = true;
  PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, &collect, 1))) die("fence", rc);
  PMIX_INFO_DESTRUCT(&collect);
  pmix_proc_t peer;
  PMIX_LOAD_PROCID(&peer, me.nspace, (me.rank + 1) % n);
  snprintf(key, sizeof key, "test.key.%u", peer.rank);
  pmix_value_t *got = NULL;
  if (PMIX_SUCCESS != (rc = PMIx_Get(&peer, key, NULL, 0, &got))) die("get", rc);
  printf("{\"rank\":%u,\"size\":%u,\"peer\":%u,\"got\":\"%s\"}\n", me.rank, n, peer.rank, got->data.string);
  PMIX_VALUE_RELEASE(got);
  return 0;
}

static int publish_lookup(const char *service) {
  pmix_status_t rc;
  if (me.rank == 0) {
    usleep(300 * 1000); /* the others are already waiting */
    pmix_info_t pub;
    char port[300];
    snprintf(port, sizeof port, "port-of-%s", me.nspace);
    PMIX_INFO_LOAD(&pub, service, port, PMIX_STRING);
    if (PMIX_SUCCESS != (rc = PMIx_Publish(&pub, 1))) die("publish", rc);
    PMIX_INFO_DESTRUCT(&pub);
    printf("{\"rank\":0,\"published\":\"%s\"}\n", port);
  } else {
    pmix_pdata_t pd;
    PMIX_PDATA_CONSTRUCT(&pd);
    PMIX_LOAD_KEY(pd.key, service);
    pmix_info_t dirs[2];
    bool yes = true;
    int timeout = 10;
    PMIX_INFO_LOAD(&dirs[0], PMIX_WAIT, &yes, PMIX_BOOL);
    PMIX_INFO_LOAD(&dirs[1], PMIX_TIMEOUT, &timeout, PMIX_INT);
    if (PMIX_SUCCESS != (rc = PMIx_Lookup(&pd, 1, dirs, 2))) die("lookup", rc);
    printf("{\"rank\":%u,\"looked_up\":\"%s\",\"publisher\":%u}\n", me.rank, pd.value.data.string, pd.proc.rank);
    PMIX_PDATA_DESTRUCT(&pd);
  }
  /* keep rank 0 alive until the others have looked up */
  if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, NULL, 0))) die("fence", rc);
  return 0;
}

static int query_psets(void) {
  pmix_info_t *results;
  size_t nresults;
  pmix_status_t rc =
      query_keys((const char *[]){PMIX_QUERY_NUM_PSETS, PMIX_QUERY_PSET_NAMES, NULL}, &results, &nresults);
  if (PMIX_SUCCESS != rc) die("query", rc);
  size_t num = 0;
  const char *names = "";
  for (size_t i = 0; i < nresults; i++) {
    if (PMIX_CHECK_KEY(&results[i], PMIX_QUERY_NUM_PSETS)) num = results[i].value.data.size;
    if (PMIX_CHECK_KEY(&results[i], PMIX_QUERY_PSET_NAMES)) names = results[i].value.data.string;
  }
  printf("{\"rank\":%u,\"num_psets\":%zu,\"pset_names\":\"%s\"}\n", me.rank, num, names);
  return 0;
}

static int group(const char *name) {
  uint32_t n = job_size();
  pmix_proc_t *procs = namespace_procs(n);
  pmix_info_t dir;
  bool yes = true;
  PMIX_INFO_LOAD(&dir, PMIX_GROUP_ASSIGN_CONTEXT_ID, &yes, PMIX_BOOL);
  pmix_info_t *results = NULL;
  size_t nresults = 0;
  pmix_status_t rc = PMIx_Group_construct(name, procs, n, &dir, 1, &results, &nresults);
  if (PMIX_SUCCESS != rc) die("group construct", rc);
  size_t cid = 0;
  int found = 0;
  for (size_t i = 0; i < nresults; i++) {
    if (PMIX_CHECK_KEY(&results[i], PMIX_GROUP_CONTEXT_ID)) {
      found = 1;
      PMIX_VALUE_GET_NUMBER(rc, &results[i].value, cid, size_t);
    }
  }
  if (!found) die("no context id", PMIX_ERR_NOT_FOUND);
  printf("{\"rank\":%u,\"group\":\"%s\",\"context_id\":%zu}\n", me.rank, name, cid);
  fflush(stdout);
  if (PMIX_SUCCESS != (rc = PMIx_Group_destruct(name, NULL, 0))) die("group destruct", rc);
  return 0;
}

int main(int argc, char **argv) {
  scenario_init(argc, argv);
  pmix_status_t rc;
  const char *what = argv[1];
  const char *arg = argc > 2 ? argv[2] : "";
  printf("{\"rank\":%u,\"nspace\":\"%s\",\"init\":true}\n", me.rank, me.nspace);
  fflush(stdout);
  int ret = 0;
  if (!strcmp(what, "put-get"))
    ret = put_get();
  else if (!strcmp(what, "publish-lookup"))
    ret = publish_lookup(arg);
  else if (!strcmp(what, "query-psets"))
    ret = query_psets();
  else if (!strcmp(what, "group"))
    ret = group(arg);
  else if (!strcmp(what, "abort")) {
    rc = PMIx_Abort(atoi(arg), "test client abort", NULL, 0);
    printf("{\"rank\":%u,\"abort_returned\":%d}\n", me.rank, rc);
    fflush(stdout);
    pause();
  } else if (!strcmp(what, "fence")) {
    if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, NULL, 0))) die("fence", rc);
  } else if (!strcmp(what, "hang")) {
    pause();
  } else {
    fprintf(stderr, "unknown scenario %s\n", what);
    ret = 1;
  }
  return scenario_end(ret);
}
