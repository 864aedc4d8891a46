/* A long-lived rank process for the `repeat` column: it stays up across jobs, the way a Dask
 * worker does, and takes one job per line on stdin (fields separated by tabs):
 *
 *   fork   JOB  K=V ...   fork a child that sets the env, joins with MPI Sessions, checks an
 *                         Allreduce and exits (the worker process itself never initialises MPI)
 *   forkw  JOB  K=V ...   the same with MPI_Init/MPI_Finalize (libraries without Sessions)
 *   reinit JOB  K=V ...   in this process: set the env, Session_init ... Session_finalize
 *   exec   JOB  PROGRAM  ARGS  K=V ...
 *                         fork a child that sets the env and runs PROGRAM (ARGS: comma list,
 *                         or "-" for none); reports {"started":JOB,"pid":..} and, when it ends,
 *                         {"exited":JOB,"status":..,"signal":..}
 *   pinit  K=V ...        pool mode: set the env of the pool namespace and Session_init once
 *   pjob   TAG  R1,R2,.. [WHAT]
 *                         pool mode: a communicator over these pool ranks with this tag,
 *                         Allreduce, free; WHAT: loop=N (N barriers 20 ms apart; reports
 *                         {"looping":true} first) or abort (MPI_Abort on it, status 3)
 *   winit  K=V ...        world mode (MPICH / Intel MPI): set the env of this process's world
 *                         (size 1) and MPI_Init once
 *   wports TAG RANK SIZE  world mode: open a port for each merge step job rank RANK of SIZE
 *                         accepts at; reports {"job":TAG,"ports":{"STEP":"PORT",..}}
 *   wjob   TAG RANK SIZE WHAT R.STEP=PORT ...
 *                         world mode: the job's communicator by the merge tree of accept/connect
 *                         + Intercomm_merge over these ports (python/dask_pmix/merge_tree.py),
 *                         Allreduce, free; WHAT as for pjob, or "-"
 *   quit
 *
 * Every job prints one JSON line {"feature":"repeat","job":...,"ok":...}. */
#include <sys/wait.h>

#include "compat.h"
#include "../../native/exec/pmi_connect.h"

static const char *F = "repeat";

/* Sets a job's env, and for MPICH / Intel MPI binds its PMI connection with the PMI_ID
 * credential, as a worker does before the rank's MPI starts (src/pmi/credential.ts). */
static void set_env(char **fields, int n) {
  for (int i = 0; i < n; i++) {
    char *eq = strchr(fields[i], '=');
    if (!eq) continue;
    *eq = 0;
    setenv(fields[i], eq + 1, 1);
    *eq = '=';
  }
  if (pmi_connect() != 0) printf("{\"feature\":\"%s\",\"ok\":false,\"error\":\"pmi_connect\"}\n", F);
}

#ifdef MPI_SESSION_NULL
static int session_job(const char *job, double t0) {
  MPI_Session session;
  MPI_Comm comm;
  if (compat_session_world(F, job, &session, &comm) != MPI_SUCCESS) return 4;
  double t1 = compat_now();
  int rank, size, sum = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int ok = compat_allreduce_ok(comm, &sum);
  compat_report(F, rank, size, ok, "\"job\":\"%s\",\"sum\":%d,\"comm_s\":%.4f,\"pid\":%d", job, sum, t1 - t0,
                (int)getpid());
  MPI_Comm_free(&comm);
  MPI_Session_finalize(&session);
  return ok ? 0 : 3;
}
#else
/* No Sessions (Open MPI 4.1, MPI 3.1): only the forkw mode applies. Open MPI 5.0 says MPI 3.1 in
 * mpi.h although it has Sessions, hence the test on MPI_SESSION_NULL. */
static int session_job(const char *job, double t0) {
  (void)t0;
  printf("{\"feature\":\"repeat\",\"job\":\"%s\",\"ok\":false,\"error\":\"no MPI Sessions in MPI %d.%d\"}\n", job,
         MPI_VERSION, MPI_SUBVERSION);
  return 6;
}
#endif

static int world_job(const char *job, double t0) {
  MPI_Init(NULL, NULL);
  double t1 = compat_now();
  int rank, size, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int ok = compat_allreduce_ok(MPI_COMM_WORLD, &sum);
  compat_report(F, rank, size, ok, "\"job\":\"%s\",\"sum\":%d,\"comm_s\":%.4f,\"pid\":%d", job, sum, t1 - t0,
                (int)getpid());
  MPI_Finalize();
  return ok ? 0 : 3;
}

static void forked(const char *job, char **env, int nenv, int world) {
  double t0 = compat_now();
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    set_env(env, nenv);
    _exit(world ? world_job(job, t0) : session_job(job, t0));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    printf("{\"feature\":\"%s\",\"job\":\"%s\",\"ok\":false,\"child_status\":%d}\n", F, job, status);
  printf("{\"done\":\"%s\"}\n", job);
  fflush(stdout);
}

static void exec_job(const char *job, const char *program, char *args_csv, char **env, int nenv) {
  char *argv[64];
  int argc = 0;
  argv[argc++] = (char *)program;
  if (strcmp(args_csv, "-") != 0)
    for (char *tok = strtok(args_csv, ","); tok && argc < 63; tok = strtok(NULL, ",")) argv[argc++] = tok;
  argv[argc] = NULL;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    set_env(env, nenv);
    execv(program, argv);
    printf("{\"exec_failed\":\"%s\"}\n", program);
    _exit(127);
  }
  printf("{\"started\":\"%s\",\"pid\":%d}\n", job, (int)pid);
  fflush(stdout);
  int status = 0;
  waitpid(pid, &status, 0);
  printf("{\"exited\":\"%s\",\"status\":%d,\"signal\":%d,\"t\":%.6f}\n", job,
         WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0, compat_now());
  fflush(stdout);
}

#ifdef MPI_SESSION_NULL
/* What a job does after its first Allreduce: loop=N barriers (member-death cells kill one meanwhile),
 * or abort. Returns 0 once an MPI call failed. */
static int job_action(const char *job, MPI_Comm comm, const char *what) {
  if (what && !strncmp(what, "loop=", 5)) {
    printf("{\"feature\":\"%s\",\"job\":\"%s\",\"looping\":true,\"t\":%.6f}\n", F, job, compat_now());
    fflush(stdout);
    for (int i = atoi(what + 5); i > 0; i--) {
      int rc = MPI_Barrier(comm);
      if (rc != MPI_SUCCESS) {
        compat_error(F, "MPI_Barrier", rc);
        return 0;
      }
      usleep(20000);
    }
  } else if (what && !strcmp(what, "abort")) {
    printf("{\"feature\":\"%s\",\"job\":\"%s\",\"aborting\":true,\"t\":%.6f}\n", F, job, compat_now());
    fflush(stdout);
    MPI_Abort(comm, 3);
  }
  return 1;
}

static MPI_Session pool_session = MPI_SESSION_NULL;
static MPI_Group pool_world;

static void pool_job(const char *job, char *ranks_csv, const char *what) {
  double t0 = compat_now();
  int ranks[1024], n = 0, me = -1;
  for (char *tok = strtok(ranks_csv, ","); tok && n < 1024; tok = strtok(NULL, ",")) ranks[n++] = atoi(tok);
  MPI_Group_rank(pool_world, &me);
  MPI_Group sub;
  MPI_Group_incl(pool_world, n, ranks, &sub);
  MPI_Comm comm;
  int rc = MPI_Comm_create_from_group(sub, job, MPI_INFO_NULL, MPI_ERRORS_RETURN, &comm);
  if (rc != MPI_SUCCESS) {
    compat_error(F, "MPI_Comm_create_from_group", rc);
  } else {
    double t1 = compat_now();
    int rank, size, sum = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int ok = compat_allreduce_ok(comm, &sum);
    if (ok) ok = job_action(job, comm, what);
    compat_report(F, rank, size, ok, "\"job\":\"%s\",\"sum\":%d,\"comm_s\":%.4f,\"pool_rank\":%d", job, sum, t1 - t0,
                  me);
    /* A communicator that saw a failure is kept (freeing it crashed later jobs, research H). */
    if (ok) MPI_Comm_free(&comm);
  }
  MPI_Group_free(&sub);
  printf("{\"done\":\"%s\"}\n", job);
  fflush(stdout);
}
#endif

/* World mode: the merge tree (python/dask_pmix/merge_tree.py is the reference): at step 1, 2,
 * 4, .. the group of `step` ranks starting at a multiple of 2*step accepts, on its first rank's
 * port for that step, the group right after it, and both merge, the lower group first. */
#define MAX_STEPS 32
static int world_steps[MAX_STEPS], world_nports = 0;
static char world_ports[MAX_STEPS][MPI_MAX_PORT_NAME];

static void world_close_ports(void) {
  for (int i = 0; i < world_nports; i++) MPI_Close_port(world_ports[i]);
  world_nports = 0;
}

static void world_open_ports(const char *job, int rank, int size) {
  world_close_ports();
  printf("{\"feature\":\"%s\",\"job\":\"%s\",\"ports\":{", F, job);
  for (int step = 1; step < size; step *= 2) {
    if (rank % (2 * step) || rank + step >= size || world_nports == MAX_STEPS) continue;
    int rc = MPI_Open_port(MPI_INFO_NULL, world_ports[world_nports]);
    if (rc != MPI_SUCCESS) continue; /* the runner sees the port missing */
    world_steps[world_nports] = step;
    printf("%s\"%d\":\"%s\"", world_nports ? "," : "", step, world_ports[world_nports]);
    world_nports++;
  }
  printf("}}\n");
}

/* PORTS: "R.STEP=PORT" fields; the port job rank `lower` accepts on at `step`. */
static const char *world_port_of(char **ports, int n, int lower, int step) {
  char key[32];
  snprintf(key, sizeof key, "%d.%d=", lower, step);
  for (int i = 0; i < n; i++)
    if (!strncmp(ports[i], key, strlen(key))) return ports[i] + strlen(key);
  return NULL;
}

static void world_job_run(const char *job, int rank, int size, const char *what, char **ports, int nports) {
  double t0 = compat_now();
  MPI_Comm comm = MPI_COMM_SELF, kept[2 * MAX_STEPS];
  int nkept = 0, rc = MPI_SUCCESS, ok = 0, sum = 0;
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "timeout", "30");
  for (int step = 1; step < size && rc == MPI_SUCCESS; step *= 2) {
    int lower = rank / (2 * step) * (2 * step), upper = lower + step;
    if (upper >= size) continue;
    const char *port = world_port_of(ports, nports, lower, step);
    if (!port) {
      printf("{\"feature\":\"%s\",\"ok\":false,\"error\":\"no port for rank %d step %d\"}\n", F, lower, step);
      rc = MPI_ERR_PORT;
      break;
    }
    MPI_Comm inter, merged;
    rc = rank < upper ? MPI_Comm_accept(port, info, 0, comm, &inter) : MPI_Comm_connect(port, info, 0, comm, &inter);
    if (rc != MPI_SUCCESS) {
      compat_error(F, rank < upper ? "MPI_Comm_accept" : "MPI_Comm_connect", rc);
      break;
    }
    rc = MPI_Intercomm_merge(inter, rank >= upper, &merged);
    if (rc != MPI_SUCCESS) {
      compat_error(F, "MPI_Intercomm_merge", rc);
      break;
    }
    kept[nkept++] = inter;
    if (comm != MPI_COMM_SELF) kept[nkept++] = comm;
    comm = merged;
  }
  MPI_Info_free(&info);
  if (rc == MPI_SUCCESS && comm == MPI_COMM_SELF) rc = MPI_Comm_dup(MPI_COMM_SELF, &comm);
  if (rc == MPI_SUCCESS) {
    double t1 = compat_now();
    int r, n;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);
    ok = r == rank && n == size && compat_allreduce_ok(comm, &sum);
    if (ok) ok = job_action(job, comm, what);
    compat_report(F, r, n, ok, "\"job\":\"%s\",\"sum\":%d,\"comm_s\":%.4f", job, sum, t1 - t0);
  }
  /* What a failed job built is kept (its peers may still be inside it). */
  if (ok) {
    MPI_Comm_free(&comm);
    while (nkept > 0) MPI_Comm_free(&kept[--nkept]);
    world_close_ports();
  }
  printf("{\"done\":\"%s\"}\n", job);
  fflush(stdout);
}

int main(void) {
  char line[65536];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("{\"agent\":\"ready\",\"pid\":%d}\n", (int)getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = 0;
    char *fields[512];
    int n = 0;
    for (char *tok = strtok(line, "\t"); tok && n < 512; tok = strtok(NULL, "\t")) fields[n++] = tok;
    if (n == 0) continue;
    if (!strcmp(fields[0], "quit")) break;
    if ((!strcmp(fields[0], "fork") || !strcmp(fields[0], "forkw")) && n >= 2) {
      forked(fields[1], fields + 2, n - 2, fields[0][4] == 'w');
    } else if (!strcmp(fields[0], "exec") && n >= 4) {
      exec_job(fields[1], fields[2], fields[3], fields + 4, n - 4);
    } else if (!strcmp(fields[0], "winit")) {
      set_env(fields + 1, n - 1);
      int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SINGLE, &provided), size = 0;
      if (rc == MPI_SUCCESS) {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
      } else {
        compat_error(F, "MPI_Init_thread", rc);
      }
      printf("{\"pool\":\"%s\",\"world_size\":%d}\n", rc == MPI_SUCCESS && size == 1 ? "ready" : "failed", size);
    } else if (!strcmp(fields[0], "wports") && n >= 4) {
      world_open_ports(fields[1], atoi(fields[2]), atoi(fields[3]));
    } else if (!strcmp(fields[0], "wjob") && n >= 5) {
      world_job_run(fields[1], atoi(fields[2]), atoi(fields[3]), strcmp(fields[4], "-") ? fields[4] : NULL, fields + 5,
                    n - 5);
    } else if (!strcmp(fields[0], "reinit") && n >= 2) {
      set_env(fields + 2, n - 2);
      session_job(fields[1], compat_now());
      printf("{\"done\":\"%s\"}\n", fields[1]);
#ifdef MPI_SESSION_NULL
    } else if (!strcmp(fields[0], "pinit")) {
      set_env(fields + 1, n - 1);
      int rc = MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &pool_session);
      if (rc == MPI_SUCCESS) rc = MPI_Group_from_session_pset(pool_session, "mpi://WORLD", &pool_world);
      if (rc != MPI_SUCCESS) compat_error(F, "pool init", rc);
      printf("{\"pool\":\"%s\"}\n", rc == MPI_SUCCESS ? "ready" : "failed");
    } else if (!strcmp(fields[0], "pjob") && n >= 3) {
      pool_job(fields[1], fields[2], n >= 4 ? fields[3] : NULL);
#endif
    } else {
      printf("{\"agent\":\"unknown command\"}\n");
    }
    fflush(stdout);
  }
#ifdef MPI_SESSION_NULL
  if (pool_session != MPI_SESSION_NULL) {
    MPI_Group_free(&pool_world);
    MPI_Session_finalize(&pool_session);
  }
#endif
  return 0;
}
