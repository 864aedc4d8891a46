/* Many simulated PMI-1 ranks of one job in one process, over the real wire: the 1,024-rank
 * scale benchmark's client (bench/pmi-scale.ts). Each rank is its own connection, bound with its
 * PMI_ID credential, then speaks exactly what an MPICH rank would: init, get_maxes,
 * get_my_kvsname, then
 *   - barriers: every rank sends barrier_in at once; timed from the first send to the last
 *     barrier_out received;
 *   - an all-to-all business-card exchange, as MPICH's ch4 does at MPI_Init without node roots
 *     (MPIDU_bc_table_create): every rank puts its card, all barrier, every rank gets every
 *     other rank's card, one request at a time per connection (PMI-1 clients are synchronous),
 *     all connections at once.
 *
 *   pmi-sim (--port HOST:PORT | --socket PATH) BARRIERS CARD_HEX_CHARS < ids
 *
 * ids: one PMI_ID per line, in rank order. CARD_HEX_CHARS 0 skips the exchange. Prints one JSON line. One epoll loop:
 * the simulator's own cost per message is a read and a write. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "pmi-wire.h"
#include "timing.h"

#define MAX_RANKS 16384
#define LINE 4096

struct conn {
  int fd;
  char buf[LINE];
  size_t len;
  int next; /* index of the next command of the phase to send */
  int done;
};

static struct conn *conns;
static int n;
static char kvsname[256];
static char *card; /* hex card; rank r's card starts with its rank as 8 hex digits */
static int card_len;

static int open_conn(const char *port, const char *path) {
  int fd;
  if (path) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect", strerror(errno));
    return fd;
  }
  return tcp_connect(port);
}

static void send_all(int fd, const char *s, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, s + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("write", strerror(errno));
    off += (size_t)w;
  }
}

/* Blocking read of one line on connection c (setup only). */
static void read_line(struct conn *c, char *out) {
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl) {
      size_t k = (size_t)(nl - c->buf);
      memcpy(out, c->buf, k);
      out[k] = 0;
      c->len -= k + 1;
      memmove(c->buf, nl + 1, c->len);
      return;
    }
    ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
    if (r <= 0) die("read", "connection closed during setup");
    c->len += (size_t)r;
  }
}

static void call(struct conn *c, const char *cmd, char *reply) {
  send_all(c->fd, cmd, strlen(cmd));
  read_line(c, reply);
  const char *rc = strstr(reply, " rc=");
  if (!rc || atoi(rc + 4) != 0) die("rc", reply);
}

/* The phase's k-th command of rank r into out; returns its length, or 0 when r has no more. */
typedef int (*command_fn)(int r, int k, char *out);

static int cmd_barrier(int r, int k, char *out) {
  (void)r;
  return k == 0 ? sprintf(out, "cmd=barrier_in\n") : 0;
}

static int cmd_put(int r, int k, char *out) {
  if (k != 0) return 0;
  char head[9];
  snprintf(head, sizeof head, "%08X", r);
  memcpy(card, head, 8);
  return sprintf(out, "cmd=put kvsname=%s key=bc-%d value=%s\n", kvsname, r, card);
}

static int cmd_get_all(int r, int k, char *out) {
  if (k >= n - 1) return 0;
  int peer = (r + 1 + k) % n;
  return sprintf(out, "cmd=get kvsname=%s key=bc-%d\n", kvsname, peer);
}

static long checked;

/* Checks one reply: rc=0, and for a get the peer's card. */
static void check_reply(int r, int k, command_fn fn, const char *line) {
  const char *rc = strstr(line, " rc=");
  if (!rc || atoi(rc + 4) != 0) die("rc", line);
  if (fn == cmd_get_all) {
    int peer = (r + 1 + k) % n;
    const char *v = strstr(line, " value=");
    char head[9];
    snprintf(head, sizeof head, "%08X", peer);
    if (!v || strncmp(v + 7, head, 8) != 0 || (int)strlen(v + 7) != card_len) die("card", line);
    checked++;
  }
}

/* Runs a phase: every connection sends its first command at once, and the next one as each reply
 * comes. Returns the seconds from the first send to the last reply. */
static double phase(int ep, command_fn fn) {
  char out[LINE + 64], line[LINE];
  int left = 0;
  double t0 = now_s();
  for (int r = 0; r < n; r++) {
    conns[r].next = 0;
    conns[r].done = 0;
    int len = fn(r, 0, out);
    if (len == 0) {
      conns[r].done = 1;
      continue;
    }
    send_all(conns[r].fd, out, (size_t)len);
    left++;
  }
  struct epoll_event evs[256];
  while (left > 0) {
    int k = epoll_wait(ep, evs, 256, 60000);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("epoll", "no reply within 60 s");
    for (int i = 0; i < k; i++) {
      int r = evs[i].data.u32;
      struct conn *c = &conns[r];
      ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
      if (got <= 0) die("read", "connection closed");
      c->len += (size_t)got;
      char *nl;
      while (!c->done && (nl = memchr(c->buf, '\n', c->len))) {
        size_t m = (size_t)(nl - c->buf);
        memcpy(line, c->buf, m);
        line[m] = 0;
        c->len -= m + 1;
        memmove(c->buf, nl + 1, c->len);
        check_reply(r, c->next, fn, line);
        int len = fn(r, ++c->next, out);
        if (len == 0) {
          c->done = 1;
          left--;
        } else {
          send_all(c->fd, out, (size_t)len);
        }
      }
    }
  }
  return now_s() - t0;
}

int main(int argc, char **argv) {
  const char *port = NULL, *path = NULL;
  int i = 1;
  if (argc > 2 && !strcmp(argv[1], "--port"))
    port = argv[2];
  else if (argc > 2 && !strcmp(argv[1], "--socket"))
    path = argv[2];
  else
    die("usage", "pmi-sim (--port HOST:PORT | --socket PATH) BARRIERS CARD_HEX_CHARS < ids");
  i = 3;
  int barriers = argc > i ? atoi(argv[i]) : 20;
  card_len = argc > i + 1 ? atoi(argv[i + 1]) : 256;
  if (card_len != 0 && (card_len < 8 || card_len > 1024)) die("card", "CARD_HEX_CHARS must be 0 or 8..1024");

  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);

  static char ids[MAX_RANKS][40];
  while (n < MAX_RANKS && scanf("%39s", ids[n]) == 1) n++;
  if (n < 2) die("ids", "need at least 2 PMI_IDs on stdin");
  conns = calloc((size_t)n, sizeof *conns);
  card = malloc((size_t)card_len + 9);
  for (int k = 0; k < card_len; k++) card[k] = "0123456789ABCDEF"[(k * 7 + 3) % 16];
  card[card_len] = 0;

  /* Setup, as MPI_Init's first PMI calls; timed as a whole. */
  double t_setup = now_s();
  char cmd[256], reply[LINE];
  for (int r = 0; r < n; r++) {
    conns[r].fd = open_conn(port, path);
    snprintf(cmd, sizeof cmd, "cmd=initack pmiid=%s\n", ids[r]);
    send_all(conns[r].fd, cmd, strlen(cmd));
    read_line(&conns[r], reply);
    if (strncmp(reply, "cmd=initack rc=0", 16) != 0) die("initack", reply);
    for (int k = 0; k < 3; k++) read_line(&conns[r], reply);
    call(&conns[r], "cmd=init pmi_version=1 pmi_subversion=1\n", reply);
    call(&conns[r], "cmd=get_maxes\n", reply);
    call(&conns[r], "cmd=get_my_kvsname\n", reply);
    const char *kv = strstr(reply, "kvsname=");
    if (!kv) die("kvsname", reply);
    snprintf(kvsname, sizeof kvsname, "%s", kv + 8);
  }
  t_setup = now_s() - t_setup;

  int ep = epoll_create1(0);
  for (int r = 0; r < n; r++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)r};
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[r].fd, &ev);
  }

  phase(ep, cmd_barrier); /* warm-up */
  double *bar = calloc((size_t)barriers, sizeof *bar);
  for (int k = 0; k < barriers; k++) bar[k] = phase(ep, cmd_barrier);
  double t_put = 0, t_fence = 0, t_get = 0;
  long gets = 0;
  if (card_len > 0) {
    t_put = phase(ep, cmd_put);
    t_fence = phase(ep, cmd_barrier);
    t_get = phase(ep, cmd_get_all);
    gets = (long)n * (n - 1);
  }
  sort_doubles(bar, barriers);
  if (checked != gets) die("gets", "not every card was checked");

  for (int r = 0; r < n; r++) call(&conns[r], "cmd=finalize\n", reply);
  printf(
      "{\"ok\":true,\"ranks\":%d,\"transport\":\"%s\",\"setup_ms\":%.2f,\"barriers\":%d,"
      "\"barrier_ms_median\":%.3f,\"barrier_ms_min\":%.3f,\"barrier_ms_max\":%.3f,"
      "\"card_hex_chars\":%d,\"exchange\":{\"put_ms\":%.2f,\"barrier_ms\":%.2f,\"get_ms\":%.2f,"
      "\"total_ms\":%.2f,\"gets\":%ld,\"gets_per_s\":%.0f}}\n",
      n, path ? "unix" : "tcp", t_setup * 1e3, barriers, bar[barriers / 2] * 1e3, bar[0] * 1e3, bar[barriers - 1] * 1e3,
      card_len, t_put * 1e3, t_fence * 1e3, t_get * 1e3, (t_put + t_fence + t_get) * 1e3, gets,
      t_get > 0 ? gets / t_get : 0);
  return 0;
}
