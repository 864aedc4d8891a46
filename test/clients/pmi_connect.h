/* What starts an MPICH / Intel MPI rank does before MPI_Init (src/pmi/credential.ts): MPI
 * clients send PMI_ID as an int, so the starter binds the PMI connection with the PMI_ID
 * credential itself and hands it to MPI as PMI_FD, with PMI_RANK / PMI_SIZE, the way hydra
 * hands a rank its socketpair. The C twin of python/dask_pmix/pmi_connect.py, for the tests'
 * and benchmarks' ranks.
 *
 * pmi_connect(): if PMI_PORT and PMI_ID are set (a new job's, also after an earlier one),
 * connects (to DASK_PMIX_PMI_SOCKET, the server's UNIX socket for ranks on its host, if that
 * works, else to PMI_PORT), sends `cmd=initack pmiid=<PMI_ID>`,
 * reads the four reply lines, sets PMI_FD, PMI_RANK, PMI_SIZE and unsets PMI_PORT and PMI_ID.
 * Returns 0 (also when there is nothing to do), or -1 with a message on stderr. */
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
#include <unistd.h>

/* Reads one line (without its newline) within timeout_ms; byte by byte, so nothing meant for
 * MPI is read ahead. */
static int pmi_connect_line(int fd, char *out, size_t cap, int timeout_ms) {
    size_t n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r <= 0) return -1;
        char c;
        ssize_t got = read(fd, &c, 1);
        if (got <= 0) return -1;
        if (c == '\n') break;
        if (n + 1 < cap) out[n++] = c;
    }
    out[n] = 0;
    return 0;
}

static int pmi_connect_field(const char *line, const char *key, char *out, size_t cap) {
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p) return -1;
    p += strlen(pat);
    size_t n = strcspn(p, " ");
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
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

static int pmi_connect(void) {
    const char *port = getenv("PMI_PORT"), *id = getenv("PMI_ID");
    if (!port || !id) return 0;
    char host[256], line[2048], size[32], rank[32];
    snprintf(host, sizeof host, "%s", port);
    char *colon = strrchr(host, ':');
    if (!colon) { fprintf(stderr, "pmi_connect: PMI_PORT %s is not host:port\n", port); return -1; }
    *colon = 0;
    int fd = pmi_connect_unix(getenv("DASK_PMIX_PMI_SOCKET"));
    if (fd < 0) {
        struct addrinfo hints, *ai, *a;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) { fprintf(stderr, "pmi_connect: cannot resolve %s\n", port); return -1; }
        for (a = ai; a; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
        }
        freeaddrinfo(ai);
        if (fd < 0) { fprintf(stderr, "pmi_connect: cannot connect to %s: %s\n", port, strerror(errno)); return -1; }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    snprintf(line, sizeof line, "cmd=initack pmiid=%s\n", id);
    if (write(fd, line, strlen(line)) != (ssize_t)strlen(line)) { close(fd); return -1; }
    const int timeout_ms = 60 * 1000;
    if (pmi_connect_line(fd, line, sizeof line, timeout_ms) != 0 || strncmp(line, "cmd=initack rc=0", 16) != 0) {
        fprintf(stderr, "pmi_connect: the PMI server refused PMI_ID: %s\n", line);
        close(fd);
        return -1;
    }
    if (pmi_connect_line(fd, line, sizeof line, timeout_ms) != 0 || pmi_connect_field(line, "size", size, sizeof size) != 0 ||
        pmi_connect_line(fd, line, sizeof line, timeout_ms) != 0 || pmi_connect_field(line, "rank", rank, sizeof rank) != 0 ||
        pmi_connect_line(fd, line, sizeof line, timeout_ms) != 0) {
        fprintf(stderr, "pmi_connect: bad initack reply from %s\n", port);
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
