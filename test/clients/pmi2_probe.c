/* A PMI-2 client built on Slurm's libpmi2 (Debian libpmi2-0-dev): a real third-party client of
 * the older PMI-2 dialect (srcid=PMI_ID, left-aligned length, ;; escapes), the one Intel MPI
 * loads with I_MPI_PMI=pmi2. Every rank puts a key, fences, reads every other rank's key,
 * exercises job and node attributes and the name service, and prints one JSON line.
 */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    int _rc = (call);                                                                       \
    if (_rc != PMI2_SUCCESS) {                                                              \
      printf("{\"ok\":false,\"rank\":%d,\"failed\":\"%s\",\"rc\":%d}\n", rank, #call, _rc); \
      fflush(stdout);                                                                       \
      return 2;                                                                             \
    }                                                                                       \
  } while (0)

int main(void) {
  int spawned = 0, size = 0, rank = -1, appnum = -1, found = 0, vallen = 0;
  char jobid[256], key[64], val[1024], mapping[1024] = "";
  CHECK(PMI2_Init(&spawned, &size, &rank, &appnum));
  CHECK(PMI2_Job_GetId(jobid, sizeof jobid));
  CHECK(PMI2_Info_GetJobAttr("PMI_process_mapping", mapping, sizeof mapping, &found));

  snprintf(key, sizeof key, "card-%d", rank);
  snprintf(val, sizeof val, "value;of %d", rank); /* a ';' and a space: escaped as ;; on the wire */
  CHECK(PMI2_KVS_Put(key, val));
  /* Node attribute: rank 0 puts it, the others wait for it. */
  if (rank == 0) CHECK(PMI2_Info_PutNodeAttr("shm-seg", "/dev/shm/probe"));
  char attr[1024] = "";
  int afound = 0;
  CHECK(PMI2_Info_GetNodeAttr("shm-seg", attr, sizeof attr, &afound, 1));
  CHECK(PMI2_KVS_Fence());
  int kvs_ok = 1;
  for (int r = 0; r < size; r++) {
    char k[64], want[1024], got[1024] = "";
    snprintf(k, sizeof k, "card-%d", r);
    snprintf(want, sizeof want, "value;of %d", r);
    CHECK(PMI2_KVS_Get(jobid, r, k, got, sizeof got, &vallen));
    if (strcmp(got, want) != 0) kvs_ok = 0;
  }
  char svc[300], port[1024] = "";
  snprintf(svc, sizeof svc, "svc-%s", jobid);
  if (rank == 0) CHECK(PMI2_Nameserv_publish(svc, NULL, "tag#0$port$"));
  CHECK(PMI2_KVS_Fence());
  int ns_ok = 1;
  if (rank == size - 1) {
    CHECK(PMI2_Nameserv_lookup(svc, NULL, port, sizeof port));
    ns_ok = strcmp(port, "tag#0$port$") == 0;
  }
  CHECK(PMI2_KVS_Fence());
  if (rank == 0) CHECK(PMI2_Nameserv_unpublish(svc, NULL));
  int ok = kvs_ok && ns_ok && afound && !strcmp(attr, "/dev/shm/probe") && found;
  printf(
      "{\"ok\":%s,\"rank\":%d,\"size\":%d,\"appnum\":%d,\"spawned\":%d,\"jobid\":\"%s\",\"mapping\":\"%s\",\"kvs_ok\":%"
      "d,\"ns_ok\":%d,\"node_attr\":\"%s\"}\n",
      ok ? "true" : "false", rank, size, appnum, spawned, jobid, mapping, kvs_ok, ns_ok, attr);
  fflush(stdout);
  CHECK(PMI2_Finalize());
  return ok ? 0 : 3;
}
