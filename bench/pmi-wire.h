/* What the benchmark's PMI-1 clients (pmi-client.c, pmi-sim.c) share besides their clocks:
 * how they fail, and their TCP connection to a PMI server. Header only, like timing.h. */
#ifndef DASK_PMIX_BENCH_PMI_WIRE_H
#define DASK_PMIX_BENCH_PMI_WIRE_H

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Prints {"ok":false,"error","detail"} and exits 2. */
static void die(const char *what, const char *detail) {
  printf("{\"ok\":false,\"error\":\"%s\",\"detail\":\"%s\"}\n", what, detail ? detail : "");
  fflush(stdout);
  exit(2);
}

/* A connected TCP socket (TCP_NODELAY) to HOST:PORT, the form of PMI_PORT. */
static int tcp_connect(const char *hostport) {
  char host[256];
  snprintf(host, sizeof host, "%s", hostport);
  char *colon = strrchr(host, ':');
  if (!colon) die("port", hostport);
  *colon = 0;
  struct addrinfo hints, *ai;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) die("resolve", hostport);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) die("connect", strerror(errno));
  freeaddrinfo(ai);
  return fd;
}

#endif
