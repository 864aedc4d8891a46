/* A PMIx tool for the tests: connects to the server at a URI, runs one scenario, prints one JSON
 * line per result and exits 0, or 2 with {"error":...} when a call fails.
 *
 *   pmix_tool URI connect          PMIx_tool_init, then PMIx_tool_finalize
 *   pmix_tool URI query            also PMIx_Query_info(PMIX_QUERY_NAMESPACES, PMIX_QUERY_PSET_NAMES)
 *   pmix_tool URI given NSPACE     connects with an identifier of its own (PMIX_TOOL_NSPACE, rank 0)
 */
#include <pmix_tool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmix_calls.h"

static void die(const char *what, pmix_status_t rc) {
  printf("{\"error\":\"%s\",\"status\":%d,\"name\":\"%s\"}\n", what, (int)rc, PMIx_Error_string(rc));
  fflush(stdout);
  exit(2);
}

static void query(void) {
  pmix_info_t *results;
  size_t n;
  pmix_status_t rc = query_keys((const char *[]){PMIX_QUERY_NAMESPACES, PMIX_QUERY_PSET_NAMES, NULL}, &results, &n);
  if (PMIX_SUCCESS != rc && PMIX_ERR_PARTIAL_SUCCESS != rc) die("query", rc);
  const char *ns = "", *psets = "";
  for (size_t i = 0; i < n; i++) {
    if (PMIX_CHECK_KEY(&results[i], PMIX_QUERY_NAMESPACES) && PMIX_STRING == results[i].value.type)
      ns = results[i].value.data.string;
    if (PMIX_CHECK_KEY(&results[i], PMIX_QUERY_PSET_NAMES) && PMIX_STRING == results[i].value.type)
      psets = results[i].value.data.string;
  }
  printf("{\"query\":%d,\"namespaces\":\"%s\",\"psets\":\"%s\"}\n", rc, ns, psets);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s URI SCENARIO [ARG]\n", argv[0]);
    return 1;
  }
  const char *what = argv[2];
  pmix_info_t info[4];
  size_t ninfo = 0;
  bool no = false;
  PMIX_INFO_LOAD(&info[ninfo++], PMIX_SERVER_URI, argv[1], PMIX_STRING);
  PMIX_INFO_LOAD(&info[ninfo++], PMIX_CONNECT_TO_SYSTEM, &no, PMIX_BOOL);
  if (!strcmp(what, "given") && argc > 3) {
    pmix_rank_t rank = 0;
    PMIX_INFO_LOAD(&info[ninfo++], PMIX_TOOL_NSPACE, argv[3], PMIX_STRING);
    PMIX_INFO_LOAD(&info[ninfo++], PMIX_TOOL_RANK, &rank, PMIX_PROC_RANK);
  }
  pmix_status_t rc = PMIx_tool_init(&me, info, ninfo);
  if (PMIX_SUCCESS != rc) die("init", rc);
  printf("{\"init\":true,\"nspace\":\"%s\",\"rank\":%u}\n", me.nspace, me.rank);
  fflush(stdout);
  if (!strcmp(what, "query")) query();
  rc = PMIx_tool_finalize();
  printf("{\"finalized\":%s}\n", PMIX_SUCCESS == rc ? "true" : "false");
  return 0;
}
