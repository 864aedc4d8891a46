/* A bare PMI-1 client for the PMI benchmark. The same program measures dask-pmix's PMI
 * server (PMI_PORT + PMI_ID, the initack handshake) and MPICH's hydra (PMI_FD + PMI_RANK +
 * PMI_SIZE), so both sides serve exactly the same requests.
 *
 *   pmi-client ITERS
 *
 * After init it times ITERS barriers, then ITERS rounds of: put own key, barrier, get the
 * next rank's key. Prints one JSON line with this rank's medians in microseconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmi-wire.h"
#include "timing.h"

static int fd = -1;
static char rbuf[8192];
static size_t rlen = 0;

static void send_line(const char *s) {
  size_t n = strlen(s), off = 0;
  while (off < n) {
    ssize_t w = write(fd, s + off, n - off);
    if (w <= 0) die("write", s);
    off += (size_t)w;
  }
}

/* Reads one reply line into out (without the newline). */
static void read_line(char *out, size_t cap) {
  for (;;) {
    char *nl = memchr(rbuf, '\n', rlen);
    if (nl) {
      size_t n = (size_t)(nl - rbuf);
      if (n >= cap) n = cap - 1;
      memcpy(out, rbuf, n);
      out[n] = 0;
      rlen -= (size_t)(nl - rbuf) + 1;
      memmove(rbuf, nl + 1, rlen);
      return;
    }
    ssize_t r = read(fd, rbuf + rlen, sizeof rbuf - rlen);
    if (r <= 0) die("read", "connection closed");
    rlen += (size_t)r;
  }
}

/* Sends a command and checks the reply has no nonzero rc; copies the reply to out if given. */
static void call(const char *cmd, char *out, size_t cap) {
  char line[4096];
  send_line(cmd);
  read_line(line, sizeof line);
  const char *rc = strstr(line, " rc=");
  if (rc && atoi(rc + 4) != 0) die("rc", line);
  if (out) snprintf(out, cap, "%s", line);
}

static const char *field(const char *line, const char *key, char *out, size_t cap) {
  char pat[64];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(line, pat);
  if (!p) return NULL;
  p += strlen(pat);
  size_t n = strcspn(p, " \n");
  if (n >= cap) n = cap - 1;
  memcpy(out, p, n);
  out[n] = 0;
  return out;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 100;
  double t_start = wall();
  int rank = -1, size = -1;
  char line[4096], kvs[256] = "", tmp[256];

  const char *pfd = getenv("PMI_FD"), *port = getenv("PMI_PORT"), *id = getenv("PMI_ID");
  if (pfd) {
    fd = atoi(pfd);
    rank = atoi(getenv("PMI_RANK") ? getenv("PMI_RANK") : "0");
    size = atoi(getenv("PMI_SIZE") ? getenv("PMI_SIZE") : "1");
  } else if (port) {
    fd = tcp_connect(port);
    if (id) {
      snprintf(line, sizeof line, "cmd=initack pmiid=%s\n", id);
      send_line(line);
      read_line(line, sizeof line); /* cmd=initack */
      read_line(line, sizeof line);
      size = atoi(field(line, "size", tmp, sizeof tmp) ? tmp : "-1");
      read_line(line, sizeof line);
      rank = atoi(field(line, "rank", tmp, sizeof tmp) ? tmp : "-1");
      read_line(line, sizeof line); /* cmd=set debug */
    } else {
      rank = atoi(getenv("PMI_RANK") ? getenv("PMI_RANK") : "0");
      size = atoi(getenv("PMI_SIZE") ? getenv("PMI_SIZE") : "1");
    }
  } else {
    die("env", "neither PMI_FD nor PMI_PORT");
  }

  call("cmd=init pmi_version=1 pmi_subversion=1\n", NULL, 0);
  call("cmd=get_maxes\n", NULL, 0);
  call("cmd=get_my_kvsname\n", line, sizeof line);
  if (!field(line, "kvsname", kvs, sizeof kvs)) die("kvsname", line);
  double t_ready = wall();
  for (int i = 0; i < 5; i++) call("cmd=barrier_in\n", NULL, 0);

  double *bar = calloc((size_t)iters, sizeof *bar), *put = calloc((size_t)iters, sizeof *put),
         *get = calloc((size_t)iters, sizeof *get), *round_ = calloc((size_t)iters, sizeof *round_);
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    call("cmd=barrier_in\n", NULL, 0);
    bar[i] = now_us() - t0;
  }
  /* A value the size of a small business card: 64 hex characters. */
  const char *val = "20FA3ED34F6C445CCB2000637577CC2B3200F8D74F00000000004F030088E494";
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    snprintf(line, sizeof line, "cmd=put kvsname=%s key=b%d-%d value=%s\n", kvs, i, rank, val);
    call(line, NULL, 0);
    double t1 = now_us();
    call("cmd=barrier_in\n", NULL, 0);
    double t2 = now_us();
    snprintf(line, sizeof line, "cmd=get kvsname=%s key=b%d-%d\n", kvs, i, (rank + 1) % size);
    call(line, line, sizeof line);
    double t3 = now_us();
    if (!strstr(line, val)) die("value", line);
    put[i] = t1 - t0;
    get[i] = t3 - t2;
    round_[i] = t3 - t0;
  }
  call("cmd=finalize\n", NULL, 0);
  printf(
      "{\"ok\":true,\"rank\":%d,\"size\":%d,\"iters\":%d,\"t_start\":%.6f,\"t_ready\":%.6f,"
      "\"barrier_us\":%.1f,\"put_us\":%.1f,\"get_us\":%.1f,\"put_barrier_get_us\":%.1f}\n",
      rank, size, iters, t_start, t_ready, median(bar, iters), median(put, iters), median(get, iters),
      median(round_, iters));
  fflush(stdout);
  return 0;
}
