/* PMIx conformance probes: one behaviour per scenario, run the same way under the sidecar and
 * under prterun. Each prints JSON lines; exit 0 unless a call that must succeed fails (then 2).
 *
 *   pmix_conform keys                   PMIx_Get of the job, node, app and proc keys PRRTE registers
 *   pmix_conform local-procs            PMIx_Get(PMIX_LOCAL_PROCS) with a wildcard rank and with our own id
 *   pmix_conform lookup-wait FORM       rank 0 publishes after 1 s; the others PMIx_Lookup with PMIX_WAIT
 *                                       as FORM: int0, int1, uint32, size, bool, none (no PMIX_WAIT)
 *   pmix_conform query                  PMIx_Query_info: namespaces, a key nobody knows, the ABI versions
 *   pmix_conform job-term               rank 0 exits 1 after a fence; the others report the events they get
 *   pmix_conform log MESSAGE            PMIx_Log(PMIX_LOG_STDERR = MESSAGE)
 *   pmix_conform nodeid                 PMIx_Get(PMIX_NODEID) with a wildcard rank and with our own id
 *   pmix_conform resolve-peers          PMIx_Resolve_peers(NULL, NULL): the namespaces of the peers seen
 *   pmix_conform fences N               N empty fences; prints the mean microseconds per fence
 *   pmix_conform late-fence             rank 0 exits 1 at once; the last rank starts late (the runner
 *                                       delays it) and reports whether it could join
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

static uint32_t nprocs;

static void print_value(const pmix_value_t *v) {
  switch (v->type) {
    case PMIX_STRING:
      printf("\"%s\"", v->data.string ? v->data.string : "");
      break;
    case PMIX_BOOL:
      printf("%s", v->data.flag ? "true" : "false");
      break;
    case PMIX_UINT16:
      printf("%u", v->data.uint16);
      break;
    case PMIX_UINT32:
      printf("%u", v->data.uint32);
      break;
    case PMIX_UINT64:
      printf("%lu", (unsigned long)v->data.uint64);
      break;
    case PMIX_SIZE:
      printf("%zu", v->data.size);
      break;
    case PMIX_PROC_RANK:
      printf("%u", v->data.rank);
      break;
    case PMIX_INT:
      printf("%d", v->data.integer);
      break;
    case PMIX_PROC:
      printf("\"%s:%u\"", v->data.proc->nspace, v->data.proc->rank);
      break;
    case PMIX_REGEX:
    case PMIX_BYTE_OBJECT:
      printf("{\"bytes\":%zu}", v->data.bo.size);
      break;
    case PMIX_DATA_ARRAY:
      if (v->data.darray)
        printf("{\"array\":%u,\"size\":%zu}", v->data.darray->type, v->data.darray->size);
      else
        printf("null");
      break;
    default:
      printf("{\"type\":%u}", v->type);
      break;
  }
}

/* Gets `key` for `proc` with the qualifiers, prints {"scope","key","status","type","value"}. */
static void get_and_print(const char *scope, const pmix_proc_t *proc, const char *key, pmix_info_t *quals,
                          size_t nquals) {
  pmix_value_t *val = NULL;
  pmix_info_t opt[4];
  size_t n = 0;
  bool yes = true;
  for (size_t i = 0; i < nquals && i < 3; i++) PMIX_INFO_XFER(&opt[n++], &quals[i]);
  PMIX_INFO_LOAD(&opt[n++], PMIX_OPTIONAL, &yes, PMIX_BOOL);
  pmix_status_t rc = PMIx_Get(proc, key, opt, n, &val);
  printf("{\"rank\":%u,\"scope\":\"%s\",\"key\":\"%s\",\"status\":%d", me.rank, scope, key, rc);
  if (PMIX_SUCCESS == rc && val) {
    printf(",\"type\":%u,\"value\":", val->type);
    print_value(val);
    PMIX_VALUE_RELEASE(val);
  }
  printf("}\n");
  for (size_t i = 0; i < n; i++) PMIX_INFO_DESTRUCT(&opt[i]);
}

static const char *JOB_KEYS[] = {PMIX_JOBID,
                                 PMIX_NPROC_OFFSET,
                                 PMIX_NODE_MAP,
                                 PMIX_PROC_MAP,
                                 PMIX_NUM_NODES,
                                 PMIX_UNIV_SIZE,
                                 PMIX_JOB_SIZE,
                                 PMIX_JOB_NUM_APPS,
                                 PMIX_MAX_PROCS,
                                 PMIX_AVAIL_PHYS_MEMORY,
                                 PMIX_MAPBY,
                                 PMIX_RANKBY,
                                 PMIX_BINDTO,
                                 PMIX_HOSTNAME_KEEP_FQDN,
                                 PMIX_TMPDIR,
                                 PMIX_NSDIR,
                                 PMIX_LOCAL_PROCS,
                                 PMIX_SPAWNED,
                                 PMIX_LOCAL_PEERS,
                                 PMIX_LOCAL_SIZE,
                                 PMIX_NODE_SIZE,
                                 PMIX_LOCALLDR,
                                 NULL};
static const char *NODE_KEYS[] = {PMIX_HOSTNAME,   PMIX_HOSTNAME_ALIASES, PMIX_NODEID,      PMIX_NODE_SIZE,
                                  PMIX_LOCAL_SIZE, PMIX_LOCALLDR,         PMIX_LOCAL_PEERS, NULL};
static const char *APP_KEYS[] = {PMIX_APPNUM, PMIX_APP_SIZE, PMIX_APPLDR, PMIX_WDIR, PMIX_APP_ARGV, NULL};
static const char *PROC_KEYS[] = {PMIX_RANK,        PMIX_CPUSET, PMIX_LOCALITY_STRING, PMIX_PROCDIR,
                                  PMIX_GLOBAL_RANK, PMIX_APPNUM, PMIX_APP_RANK,        PMIX_LOCAL_RANK,
                                  PMIX_NODE_RANK,   PMIX_NODEID, PMIX_REINCARNATION,   PMIX_HOSTNAME,
                                  PMIX_SPAWNED,     NULL};

static int keys(void) {
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  for (int i = 0; JOB_KEYS[i]; i++) get_and_print("job", &wild, JOB_KEYS[i], NULL, 0);
  char host[256] = "";
  pmix_value_t *val = NULL;
  if (PMIX_SUCCESS == PMIx_Get(&me, PMIX_HOSTNAME, NULL, 0, &val) && val && PMIX_STRING == val->type) {
    snprintf(host, sizeof host, "%s", val->data.string);
  }
  if (val) PMIX_VALUE_RELEASE(val);
  pmix_info_t nq[2];
  bool yes = true;
  PMIX_INFO_LOAD(&nq[0], PMIX_NODE_INFO, &yes, PMIX_BOOL);
  PMIX_INFO_LOAD(&nq[1], PMIX_HOSTNAME, host, PMIX_STRING);
  for (int i = 0; NODE_KEYS[i]; i++) get_and_print("node", &wild, NODE_KEYS[i], nq, 2);
  pmix_info_t aq[2];
  uint32_t app = 0;
  PMIX_INFO_LOAD(&aq[0], PMIX_APP_INFO, &yes, PMIX_BOOL);
  PMIX_INFO_LOAD(&aq[1], PMIX_APPNUM, &app, PMIX_UINT32);
  for (int i = 0; APP_KEYS[i]; i++) get_and_print("app", &wild, APP_KEYS[i], aq, 2);
  for (int i = 0; PROC_KEYS[i]; i++) get_and_print("proc", &me, PROC_KEYS[i], NULL, 0);
  pmix_proc_t peer;
  PMIX_LOAD_PROCID(&peer, me.nspace, (me.rank + 1) % nprocs);
  for (int i = 0; PROC_KEYS[i]; i++) get_and_print("peer", &peer, PROC_KEYS[i], NULL, 0);
  return 0;
}

static int local_procs(void) {
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  get_and_print("wildcard", &wild, PMIX_LOCAL_PROCS, NULL, 0);
  get_and_print("self", &me, PMIX_LOCAL_PROCS, NULL, 0);
  return 0;
}

static int nodeid(void) {
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  get_and_print("wildcard", &wild, PMIX_NODEID, NULL, 0);
  get_and_print("self", &me, PMIX_NODEID, NULL, 0);
  return 0;
}

static int lookup_wait(const char *form) {
  pmix_status_t rc;
  char key[128];
  snprintf(key, sizeof key, "conform-%s-%s", me.nspace, form);
  if (me.rank == 0) {
    sleep(1);
    pmix_info_t pub;
    PMIX_INFO_LOAD(&pub, key, "the-port", PMIX_STRING);
    if (PMIX_SUCCESS != (rc = PMIx_Publish(&pub, 1))) die("publish", rc);
    PMIX_INFO_DESTRUCT(&pub);
  } else {
    pmix_pdata_t pd;
    PMIX_PDATA_CONSTRUCT(&pd);
    PMIX_LOAD_KEY(pd.key, key);
    pmix_info_t dirs[2];
    size_t nd = 0;
    int i0 = 0, i1 = 1, timeout = 10;
    uint32_t u = 0;
    size_t sz = 0;
    bool yes = true;
    if (!strcmp(form, "int0"))
      PMIX_INFO_LOAD(&dirs[nd++], PMIX_WAIT, &i0, PMIX_INT);
    else if (!strcmp(form, "int1"))
      PMIX_INFO_LOAD(&dirs[nd++], PMIX_WAIT, &i1, PMIX_INT);
    else if (!strcmp(form, "uint32"))
      PMIX_INFO_LOAD(&dirs[nd++], PMIX_WAIT, &u, PMIX_UINT32);
    else if (!strcmp(form, "size"))
      PMIX_INFO_LOAD(&dirs[nd++], PMIX_WAIT, &sz, PMIX_SIZE);
    else if (!strcmp(form, "bool"))
      PMIX_INFO_LOAD(&dirs[nd++], PMIX_WAIT, &yes, PMIX_BOOL);
    PMIX_INFO_LOAD(&dirs[nd++], PMIX_TIMEOUT, &timeout, PMIX_INT);
    time_t t0 = time(NULL);
    rc = PMIx_Lookup(&pd, 1, dirs, nd);
    printf("{\"rank\":%u,\"form\":\"%s\",\"lookup\":%d,\"value\":\"%s\",\"seconds\":%ld}\n", me.rank, form, rc,
           PMIX_SUCCESS == rc && PMIX_STRING == pd.value.type ? pd.value.data.string : "", (long)(time(NULL) - t0));
    PMIX_PDATA_DESTRUCT(&pd);
  }
  fflush(stdout);
  if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, NULL, 0))) die("fence", rc);
  return 0;
}

static int query(void) {
  pmix_query_t q[3];
  load_query(&q[0], (const char *[]){PMIX_QUERY_NAMESPACES, NULL});
  load_query(&q[1], (const char *[]){"pmix.qry.nobody.knows", NULL});
  load_query(&q[2], (const char *[]){PMIX_QUERY_STABLE_ABI_VERSION, PMIX_QUERY_PROVISIONAL_ABI_VERSION, NULL});
  pmix_info_t *results = NULL;
  size_t n = 0;
  pmix_status_t rc = PMIx_Query_info(q, 3, &results, &n);
  printf("{\"rank\":%u,\"query\":%d,\"answers\":{", me.rank, rc);
  for (size_t i = 0; i < n; i++) {
    printf("%s\"%s\":", i ? "," : "", results[i].key);
    print_value(&results[i].value);
  }
  printf("}}\n");
  /* the namespaces alone */
  rc = query_keys((const char *[]){PMIX_QUERY_NAMESPACES, NULL}, &results, &n);
  printf("{\"rank\":%u,\"namespaces\":%d,\"value\":\"%s\"}\n", me.rank, rc,
         PMIX_SUCCESS == rc && n > 0 && PMIX_STRING == results[0].value.type ? results[0].value.data.string : "");
  return 0;
}

static volatile int events_seen = 0;
static pmix_status_t job_end_status = 0;

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                     pmix_info_t *results, size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
  const char *affected = "";
  char buf[PMIX_MAX_NSLEN + 32] = "";
  int term = 0;
  for (size_t i = 0; i < ninfo; i++) {
    if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && PMIX_PROC == info[i].value.type) {
      snprintf(buf, sizeof buf, "%s:%d", info[i].value.data.proc->nspace, (int)info[i].value.data.proc->rank);
      affected = buf;
    }
    if (PMIX_CHECK_KEY(&info[i], PMIX_JOB_TERM_STATUS) && PMIX_STATUS == info[i].value.type)
      term = info[i].value.data.status;
  }
  printf("{\"rank\":%u,\"event\":%d,\"affected\":\"%s\",\"term_status\":%d}\n", me.rank, status, affected, term);
  fflush(stdout);
  if (PMIX_EVENT_JOB_END == status) job_end_status = status;
  events_seen++;
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static int job_term(void) {
  pmix_status_t codes[] = {PMIX_EVENT_JOB_END, PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_ERR_PROC_ABORTED,
                           PMIX_EVENT_PROC_TERMINATED};
  pmix_status_t rc = PMIx_Register_event_handler(codes, 4, NULL, 0, on_event, NULL, NULL);
  if (rc < 0) die("register", rc);
  if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, NULL, 0))) die("fence", rc);
  if (me.rank == 0) {
    printf("{\"rank\":0,\"exiting\":1}\n");
    fflush(stdout);
    _exit(1);
  }
  for (int i = 0; i < 200 && !job_end_status; i++) usleep(50 * 1000);
  printf("{\"rank\":%u,\"job_end\":%s}\n", me.rank, job_end_status ? "true" : "false");
  fflush(stdout);
  _exit(0);
}

static int do_log(const char *msg) {
  pmix_info_t data;
  PMIX_INFO_LOAD(&data, PMIX_LOG_STDERR, msg, PMIX_STRING);
  pmix_status_t rc = PMIx_Log(&data, 1, NULL, 0);
  printf("{\"rank\":%u,\"log\":%d}\n", me.rank, rc);
  return 0;
}

static int resolve_peers(void) {
  pmix_proc_t *procs = NULL;
  size_t n = 0;
  pmix_status_t rc = PMIx_Resolve_peers(NULL, NULL, &procs, &n);
  printf("{\"rank\":%u,\"resolve\":%d,\"peers\":[", me.rank, rc);
  for (size_t i = 0; i < n; i++) printf("%s\"%s:%u\"", i ? "," : "", procs[i].nspace, procs[i].rank);
  printf("]}\n");
  if (procs) PMIX_PROC_FREE(procs, n);
  return 0;
}

int main(int argc, char **argv) {
  /* the runner delays the last rank of late-fence by ARG seconds before it connects */
  if (argc > 2 && !strcmp(argv[1], "late-fence")) sleep((unsigned)atoi(argv[2]));
  scenario_init(argc, argv);
  const char *what = argv[1];
  const char *arg = argc > 2 ? argv[2] : "";
  pmix_status_t rc;
  nprocs = job_size();
  printf("{\"rank\":%u,\"nspace\":\"%s\",\"size\":%u,\"init\":true}\n", me.rank, me.nspace, nprocs);
  fflush(stdout);
  int ret = 0;
  if (!strcmp(what, "keys"))
    ret = keys();
  else if (!strcmp(what, "local-procs"))
    ret = local_procs();
  else if (!strcmp(what, "lookup-wait"))
    ret = lookup_wait(arg);
  else if (!strcmp(what, "query"))
    ret = query();
  else if (!strcmp(what, "job-term"))
    ret = job_term();
  else if (!strcmp(what, "log"))
    ret = do_log(arg);
  else if (!strcmp(what, "nodeid"))
    ret = nodeid();
  else if (!strcmp(what, "resolve-peers"))
    ret = resolve_peers();
  else if (!strcmp(what, "fences")) {
    int n = atoi(arg) > 0 ? atoi(arg) : 100;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++)
      if (PMIX_SUCCESS != (rc = PMIx_Fence(NULL, 0, NULL, 0))) die("fence", rc);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("{\"rank\":%u,\"fences\":%d,\"us_per_fence\":%.1f}\n", me.rank, n,
           ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3) / n);
  } else if (!strcmp(what, "late-fence")) {
    if (me.rank == 0) _exit(1);
    rc = PMIx_Fence(NULL, 0, NULL, 0);
    printf("{\"rank\":%u,\"fence\":%d}\n", me.rank, rc);
  } else {
    fprintf(stderr, "unknown scenario %s\n", what);
    ret = 1;
  }
  return scenario_end(ret);
}
