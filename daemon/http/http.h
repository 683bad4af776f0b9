/*
 * http.h — m6d's HTTP side (only with --metrics-listen ADDR:PORT), served
 * by libmicrohttpd on its own thread:
 *
 *   GET /metrics            the Prometheus text exposition (stats.h)
 *   GET /                   the dashboard (assets/, compiled in)
 *   GET /api/runs           the runs, as `m6ctl list --json`
 *   GET /api/runs/ID        one run, as `m6ctl status ID --json`
 *   GET /api/runs/ID/metrics?after=N&limit=M
 *                           its metrics rows with step > N (at most M,
 *                           default and most 10000), as `m6ctl metrics
 *                           ID --json`
 *   GET /api/runs/ID/events its events, as `m6ctl events ID --json`
 *
 * The JSON is m6ctl's own: each request is the control protocol's Request,
 * answered by the control handlers (through the dispatch callback, so this
 * module does not link them) and rendered with m6ctl's field tables
 * (proto/views.c). Read-only: nothing here changes a run. HEAD is served
 * like GET; other methods get 405, other paths 404, a request whose headers
 * pass 32 KiB 431 (libmicrohttpd's own answer).
 *
 * Threads: the handlers are the thread-safe ones the control server runs
 * on libuv's pool; this thread takes only their locks and the stats mutex,
 * never the trainer, and the control socket never waits on it.
 */
#ifndef M6_HTTP_H
#define M6_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "http/stats.h"

/* Answer one control-protocol request payload (a packed m6.Request,
 * without the 4-byte frame header) with a malloc'd frame (header
 * included) in *frame, *len, as handlers_dispatch does. 0, or -1 when no
 * reply could be built. */
typedef int (*http_dispatch_fn)(void *ctx, const uint8_t *payload, size_t len,
                                uint8_t **frame, size_t *framelen);

typedef struct http_server http_server;

/* Bind and listen on "ADDR:PORT" ("127.0.0.1:9464", "[::1]:9464",
 * "localhost:9464"; PORT 1..65535), or "PORT" alone, which is loopback
 * (127.0.0.1:PORT). Done before m6d opens its state, so
 * a port in use stops the start: -1 with err naming the address and the
 * port ("metrics listen 127.0.0.1:9464: port 9464 is in use (Address
 * already in use)"). Else the listening socket (close-on-exec). */
int http_listen(const char *addr_port, char *err, size_t errlen);

/* Whether the n bytes of p are the bearer token (constant time). */
typedef int (*http_auth_fn)(void *ctx, const void *p, size_t n);

/* Requests are refused unless (421 Misdirected Request) their Host header
 * is absent, an IP address literal, "localhost", the host of the listen
 * address, or one of hosts: a page that a DNS-rebinding attack loads
 * from a name of its own cannot read the API. With auth set, every
 * request needs "Authorization: Bearer TOKEN" (401 otherwise). */
#define HTTP_HOSTS_MAX 8
#define HTTP_PER_ADDRESS_MAX 8    /* connections from one client address */
#define HTTP_CONNECTIONS_MAX 64   /* connections in all */
#define HTTP_TIMEOUT_S 15         /* a connection idle (headers or body) */
/* a request's headers, all of them, within this many seconds of the
 * connection's start or of the previous response on it: a client that
 * trickles a byte now and then is not idle, and is closed all the same */
#define HTTP_HEADERS_DEADLINE_S 15
/* libmicrohttpd's messages (http.error): each text once per interval,
 * with the count of its repeats in between */
#define HTTP_LOG_INTERVAL_S 10

typedef struct {
    int fd;                   /* from http_listen; owned by the server now */
    http_stats *stats;        /* rendered at /metrics; counts responses */
    http_dispatch_fn dispatch;
    void *dispatch_ctx;
    char listen_host[256];    /* http_listen_host of the listen address */
    char hosts[HTTP_HOSTS_MAX][256];  /* --metrics-host names; "" unused */
    http_auth_fn auth;        /* NULL: no token (loopback use) */
    void *auth_ctx;
} http_config;

/* The host part of a --metrics-listen address ("127.0.0.1" for "PORT",
 * "::1" for "[::1]:9464") into buf. 0, or -1 when it does not fit. */
int http_listen_host(const char *addr_port, char *buf, size_t len);

/* Whether host (a Host header's value, port included or not; NULL when
 * absent) names this server under cfg's rule above. 1 or 0. */
int http_host_ok(const http_config *cfg, const char *host);

/* Start serving on cfg->fd from libmicrohttpd's thread, with a second
 * thread that closes connections past HTTP_HEADERS_DEADLINE_S. NULL with
 * err when it cannot start (the fd is then left as it is: m6d exits). */
http_server *http_start(const http_config *cfg, char *err, size_t errlen);

/* Stop: joins the deadline thread, waits for the requests in flight,
 * joins libmicrohttpd's thread, which closes the listening socket. NULL:
 * nothing. */
void http_stop(http_server *h);

#endif /* M6_HTTP_H */
