/* What the starter of an MPICH / Intel MPI rank does before MPI_Init (src/pmi/credential.ts):
 * MPI clients send PMI_ID as an int, so the starter binds the PMI connection with the PMI_ID
 * credential itself and hands it to MPI as PMI_FD, with PMI_RANK / PMI_SIZE, the way hydra
 * hands a rank its socketpair. The C twin of python/dask_pmix/pmi_connect.py: the binder
 * (dask_pmix_exec.c, `dask-pmix exec`) and the test programs that bind in-process include it.
 *
 * pmi_connect(): if PMI_PORT and PMI_ID are set (a new job's, also after an earlier one),
 * connects (to DASK_PMIX_PMI_SOCKET, the server's UNIX socket for ranks on its host, if that
 * works, else to PMI_PORT), sends `cmd=initack pmiid=<PMI_ID>`, reads the four reply lines,
 * sets PMI_FD, PMI_RANK, PMI_SIZE and unsets PMI_PORT, PMI_ID and DASK_PMIX_PMI_SOCKET.
 * A PMI_ID that is not a credential's 32 lower-case hex digits is refused before any connection
 * (it is copied onto the wire: a newline in it would send commands of its own).
 * Returns 0 (also when there is nothing to do), or -1 with the reason on stderr. */
#ifndef DASK_PMIX_PMI_CONNECT_H
#define DASK_PMIX_PMI_CONNECT_H

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PMI_CONNECT_TIMEOUT_MS (60 * 1000)

static long pmi_connect_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Reads the initack reply: four lines. The server sends nothing more until MPI speaks, so
 * whole reads take nothing meant for MPI. Returns the bytes read, or -1 (closed, timed out). */
static int pmi_connect_reply(int fd, char *buf, size_t cap, long deadline) {
  size_t n = 0;
  int lines = 0;
  while (lines < 4 && n + 1 < cap) {
    long left = deadline - pmi_connect_now_ms();
    if (left <= 0) return -1;
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t got = read(fd, buf + n, cap - 1 - n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t i = 0; i < got; i++) lines += buf[n + i] == '\n';
    n += (size_t)got;
    /* A refusal is one line, and the server hangs up after it. */
    if (lines >= 1 && strncmp(buf, "cmd=initack rc=0", 16) != 0) break;
  }
  buf[n] = 0;
  return (int)n;
}

/* The value of ` key=` in `text`, up to the next space or newline, into out. */
static int pmi_connect_field(const char *text, const char *key, char *out, size_t cap) {
  char pat[32];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(text, pat);
  if (!p) return -1;
  p += strlen(pat);
  size_t n = strcspn(p, " \n");
  if (n >= cap) n = cap - 1;
  memcpy(out, p, n);
  out[n] = 0;
  return 0;
}

#define PMI_CONNECT_ID_DIGITS 32

/* 0 if id is a credential: exactly 32 lower-case hex digits (src/pmi/credential.ts). Else -1,
 * with what is wrong on stderr (the value is not printed: it may carry anything). */
static int pmi_connect_check_id(const char *id) {
  size_t n = strlen(id);
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      fprintf(stderr,
              "dask-pmix: PMI_ID is not a dask-pmix credential: character %zu is %s (0x%02x), and a credential "
              "is %d lower-case hex digits; nothing was sent\n",
              i + 1,
              c == '\n'                                ? "a newline"
              : ((unsigned char)c < 0x20 || c == 0x7f) ? "a control character"
                                                       : "outside 0-9a-f",
              (unsigned char)c, PMI_CONNECT_ID_DIGITS);
      return -1;
    }
  }
  if (n != PMI_CONNECT_ID_DIGITS) {
    fprintf(stderr, "dask-pmix: PMI_ID is not a dask-pmix credential: %zu hex digits, not %d; nothing was sent\n", n,
            PMI_CONNECT_ID_DIGITS);
    return -1;
  }
  return 0;
}

static int pmi_connect_unix(const char *path) {
  struct sockaddr_un a;
  if (!path || strlen(path) >= sizeof a.sun_path) return -1;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strcpy(a.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int pmi_connect_tcp(const char *port) {
  char host[256];
  snprintf(host, sizeof host, "%s", port);
  char *colon = strrchr(host, ':');
  if (!colon) {
    fprintf(stderr, "dask-pmix: PMI_PORT %s is not host:port\n", port);
    return -1;
  }
  *colon = 0;
  struct addrinfo hints, *ai, *a;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) {
    fprintf(stderr, "dask-pmix: cannot resolve the PMI server %s\n", port);
    return -1;
  }
  int fd = -1;
  for (a = ai; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    fprintf(stderr, "dask-pmix: cannot reach the PMI server at %s: %s\n", port, strerror(errno));
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int pmi_connect(void) {
  const char *port = getenv("PMI_PORT"), *id = getenv("PMI_ID");
  if (!port && !id) return 0;
  if (!port || !id) {
    /* MPICH would start on half of it and say only "PMI_Get_appnum returned -1". */
    fprintf(stderr,
            "dask-pmix: %s is set but %s is not: a rank needs the whole environment of its member "
            "(GET /v1/jobs/{id}/env/{worker}); nothing was started\n",
            port ? "PMI_PORT" : "PMI_ID", port ? "PMI_ID" : "PMI_PORT");
    return -1;
  }
  if (pmi_connect_check_id(id) != 0) return -1;
  long deadline = pmi_connect_now_ms() + PMI_CONNECT_TIMEOUT_MS;
  int fd = pmi_connect_unix(getenv("DASK_PMIX_PMI_SOCKET"));
  if (fd < 0) fd = pmi_connect_tcp(port);
  if (fd < 0) return -1;
  char buf[2048], size[32], rank[32];
  int n = snprintf(buf, sizeof buf, "cmd=initack pmiid=%s\n", id);
  if (n <= 0 || (size_t)n >= sizeof buf || write(fd, buf, (size_t)n) != n) {
    fprintf(stderr, "dask-pmix: cannot send PMI_ID to the PMI server at %s\n", port);
    close(fd);
    return -1;
  }
  int got = pmi_connect_reply(fd, buf, sizeof buf, deadline);
  if (got <= 0) {
    fprintf(stderr, "dask-pmix: no reply from the PMI server at %s within %d s\n", port, PMI_CONNECT_TIMEOUT_MS / 1000);
    close(fd);
    return -1;
  }
  if (strncmp(buf, "cmd=initack rc=0", 16) != 0) {
    /* rc=-1 msg=<reason as one token, spaces made _> */
    char msg[1024];
    if (pmi_connect_field(buf, "msg", msg, sizeof msg) != 0)
      snprintf(msg, sizeof msg, "%.*s", (int)strcspn(buf, "\n"), buf);
    for (char *c = msg; *c; c++)
      if (*c == '_') *c = ' ';
    fprintf(stderr, "dask-pmix: the PMI server refused this rank: %s\n", msg);
    close(fd);
    return -1;
  }
  if (pmi_connect_field(buf, "size", size, sizeof size) != 0 ||
      pmi_connect_field(buf, "rank", rank, sizeof rank) != 0) {
    fprintf(stderr, "dask-pmix: bad initack reply from the PMI server at %s\n", port);
    close(fd);
    return -1;
  }
  char sfd[16];
  snprintf(sfd, sizeof sfd, "%d", fd);
  setenv("PMI_FD", sfd, 1);
  setenv("PMI_RANK", rank, 1);
  setenv("PMI_SIZE", size, 1);
  unsetenv("PMI_PORT");
  unsetenv("PMI_ID");
  unsetenv("DASK_PMIX_PMI_SOCKET");
  return 0;
}

#endif
