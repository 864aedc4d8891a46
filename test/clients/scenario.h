/* The frame of a scenario client (pmix_client.c, pmix_conform.c): started as `PROGRAM SCENARIO
 * [ARG]` with the environment of PMIx_server_setup_fork, it prints one JSON line per result and
 * exits 0, or 2 with {"rank","error","status","name"} when a call that must succeed fails.
 */
#ifndef DASK_PMIX_TEST_SCENARIO_H
#define DASK_PMIX_TEST_SCENARIO_H

#include <stdio.h>
#include <stdlib.h>

#include "pmix_calls.h"

static void die(const char *what, pmix_status_t rc) {
  printf("{\"rank\":%u,\"error\":\"%s\",\"status\":%d,\"name\":\"%s\"}\n", me.rank, what, (int)rc,
         PMIx_Error_string(rc));
  fflush(stdout);
  exit(2);
}

/* Checks the command line and connects: exits 1 without a scenario, and 2 with {"error":"init"}
 * when PMIx_Init fails. */
static void scenario_init(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCENARIO [ARG]\n", argv[0]);
    exit(1);
  }
  pmix_status_t rc = PMIx_Init(&me, NULL, 0);
  if (PMIX_SUCCESS != rc) {
    printf("{\"error\":\"init\",\"status\":%d}\n", rc);
    exit(2);
  }
}

/* Flushes what the scenario printed, finalizes and says whether that succeeded; returns `ret`,
 * the exit status. */
static int scenario_end(int ret) {
  fflush(stdout);
  pmix_status_t rc = PMIx_Finalize(NULL, 0);
  printf("{\"rank\":%u,\"finalized\":%s}\n", me.rank, rc == PMIX_SUCCESS ? "true" : "false");
  return ret;
}

#endif
