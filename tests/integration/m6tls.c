/*
 * m6tls.c — a client of the coordinator's TCP port that speaks its TLS
 * (cluster/tls.h: TLS 1.3 keyed by the token) and nothing else, for the
 * tests' hand-made frames (nodes_peer.py): what python's ssl module cannot
 * do (TLS 1.3 external PSKs).
 *
 *   m6tls ADDR TOKEN_FILE
 *
 * Connects, runs the handshake, then copies stdin into the TLS session and
 * the session's plaintext to stdout until the coordinator closes (or an
 * error). Exit 0 when the coordinator closed the connection, 1 when the
 * handshake or the connection failed (stderr says why: "m6tls: TLS
 * handshake failed: REASON"), 2 bad usage.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/tls.h"

static int connect_(const char *addr)
{
    char host[256], err[400];
    int port;
    if (cluster_parse_addr(addr, 0, host, sizeof host, &port, err,
                           sizeof err) < 0) {
        fprintf(stderr, "m6tls: %s\n", err);
        return -1;
    }
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res) {
        fprintf(stderr, "m6tls: cannot resolve %s\n", host);
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        fprintf(stderr, "m6tls: connect %s: %s\n", addr, strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int write_all_(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: m6tls ADDR TOKEN_FILE\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    cluster_token tok;
    char err[600], why[256];
    if (cluster_token_load(argv[2], &tok, err, sizeof err) < 0) {
        fprintf(stderr, "m6tls: %s\n", err);
        return 2;
    }
    SSL_CTX *ctx = cluster_tls_ctx(&tok, 0, err, sizeof err);
    if (!ctx) {
        fprintf(stderr, "m6tls: %s\n", err);
        return 1;
    }
    int fd = connect_(argv[1]);
    if (fd < 0) return 1;
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        cluster_tls_reason(why, sizeof why);
        fprintf(stderr, "m6tls: TLS handshake failed: %s\n",
                why[0] ? why : "the peer closed the connection");
        return 1;
    }
    fprintf(stderr, "m6tls: connected\n");
    int in_open = 1;
    char buf[65536];
    for (;;) {
        if (SSL_pending(ssl) == 0) {
            struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
                                  {.fd = 0, .events = POLLIN}};
            if (poll(p, in_open ? 2 : 1, -1) < 0) {
                if (errno == EINTR) continue;
                return 1;
            }
            if (in_open && (p[1].revents & (POLLIN | POLLHUP))) {
                ssize_t n = read(0, buf, sizeof buf);
                if (n <= 0) in_open = 0;
                else if (SSL_write(ssl, buf, (int)n) != (int)n) {
                    fprintf(stderr, "m6tls: write failed\n");
                    return 1;
                }
                continue;
            }
            if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        }
        int n = SSL_read(ssl, buf, sizeof buf);
        if (n > 0) {
            if (write_all_(1, buf, (size_t)n) < 0) return 1;
            continue;
        }
        int e = SSL_get_error(ssl, n);
        if (e == SSL_ERROR_WANT_READ) continue;
        /* closed: close_notify, or the socket's end */
        return e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SYSCALL ? 0 : 1;
    }
}
