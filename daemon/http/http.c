/*
 * http.c — the HTTP server of http.h on libmicrohttpd: the listening
 * socket, the routes, and the JSON endpoints (control requests rendered
 * with m6ctl's field tables).
 */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <inttypes.h>
#include <math.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <strings.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "proto/views.h"
#include "common/log.h"
#include "common/view.h"
#include "proto/frame.h"
#include "http/assets.h"
#include "m6.pb-c.h"

/* 421 Misdirected Request (RFC 9110 15.5.20), by number: older
 * libmicrohttpd headers lack the name */
#define MHD_HTTP_MISDIRECTED_REQUEST_ 421

/* A connection waiting for a request's headers since `since` (monotonic
 * seconds); waiting 0 once they came, until its response is done. fd is
 * a dup of the connection's socket, ours until the connection closes: the
 * reaper's shutdown can never reach another file under a reused number. */
typedef struct {
    int used, waiting;
    int fd;
    double since;
} hconn_;

struct http_server {
    struct MHD_Daemon *d;
    http_config cfg;
    /* the headers deadline: conns, guarded by mu, swept by the reaper
     * thread (libmicrohttpd's timeout is one of idleness only) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t reaper;
    int reaper_on, stopping;
    hconn_ conns[HTTP_CONNECTIONS_MAX + 16];
};

static double now_s_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- listen */

/* "PORT" alone: loopback ("127.0.0.1:PORT") into buf; else addr_port */
static const char *with_host_(const char *addr_port, char *buf, size_t len)
{
    if (*addr_port && strspn(addr_port, "0123456789") == strlen(addr_port)) {
        snprintf(buf, len, "127.0.0.1:%s", addr_port);
        return buf;
    }
    return addr_port;
}

int http_listen_host(const char *addr_port, char *buf, size_t len)
{
    char full[600];
    addr_port = with_host_(addr_port, full, sizeof full);
    const char *colon = strrchr(addr_port, ':');
    size_t n = colon ? (size_t)(colon - addr_port) : strlen(addr_port);
    if (n >= 2 && addr_port[0] == '[' && addr_port[n - 1] == ']') {
        addr_port++;
        n -= 2;
    }
    if (n >= len) return -1;
    memcpy(buf, addr_port, n);
    buf[n] = 0;
    return 0;
}

int http_host_ok(const http_config *cfg, const char *host)
{
    if (!host) return 1;  /* HTTP/1.0: no Host; browsers always send one */
    char name[300];
    size_t n;
    if (host[0] == '[') {  /* [v6] or [v6]:port */
        const char *end = strchr(host, ']');
        if (!end) return 0;
        n = (size_t)(end - host - 1);
        if (n >= sizeof name) return 0;
        memcpy(name, host + 1, n);
        name[n] = 0;
        struct in6_addr a6;
        return inet_pton(AF_INET6, name, &a6) == 1 ||
               strcasecmp(name, cfg->listen_host) == 0;
    }
    n = strcspn(host, ":");
    if (n >= sizeof name) return 0;
    memcpy(name, host, n);
    name[n] = 0;
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1) return 1;
    if (strcasecmp(name, "localhost") == 0) return 1;
    if (strcasecmp(name, cfg->listen_host) == 0) return 1;
    for (int i = 0; i < HTTP_HOSTS_MAX; i++)
        if (cfg->hosts[i][0] && strcasecmp(name, cfg->hosts[i]) == 0)
            return 1;
    return 0;
}

int http_listen(const char *addr_port, char *err, size_t errlen)
{
    char host[256], full[600];
    addr_port = with_host_(addr_port, full, sizeof full);
    const char *colon = strrchr(addr_port, ':');
    const char *port = colon ? colon + 1 : NULL;
    size_t hlen = colon ? (size_t)(colon - addr_port) : 0;
    if (!colon || hlen == 0 || hlen >= sizeof host || !*port) {
        snprintf(err, errlen, "--metrics-listen: want PORT (loopback) or "
                 "ADDR:PORT (127.0.0.1:9464, [::1]:9464), got \"%.80s\"",
                 addr_port);
        return -1;
    }
    memcpy(host, addr_port, hlen);
    host[hlen] = 0;
    if (host[0] == '[' && host[hlen - 1] == ']') { /* [v6]:port */
        memmove(host, host + 1, hlen - 2);
        host[hlen - 2] = 0;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (*end || p < 1 || p > 65535) {
        snprintf(err, errlen, "--metrics-listen: port must be 1..65535, got \"%.40s\"",
                 port);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "--metrics-listen %s: %s", addr_port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        if (e == EADDRINUSE)
            snprintf(err, errlen, "metrics listen %s: port %ld is in use (%s); "
                     "pick another with --metrics-listen", addr_port, p,
                     strerror(e));
        else
            snprintf(err, errlen, "metrics listen %s: %s", addr_port, strerror(e));
        return -1;
    }
    return fd;
}

/* ------------------------------------------------------------- responses */

static enum MHD_Result send_(http_server *h, struct MHD_Connection *conn,
                             int code, const char *type, void *body,
                             size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (code == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)code, r);
    MHD_destroy_response(r);
    stats_http(h->cfg.stats, code);
    return ret;
}

/* A short text answer (errors): "404 not found: /x\n". */
static enum MHD_Result text_(http_server *h, struct MHD_Connection *conn,
                             int code, const char *fmt, const char *arg)
{
    char *m = NULL;
    int n = asprintf(&m, fmt, arg);
    if (n < 0) return MHD_NO;
    return send_(h, conn, code, "text/plain; charset=utf-8", m, (size_t)n,
                 MHD_RESPMEM_MUST_FREE);
}

/* ------------------------------------------------------------------ JSON */

/* Ask the handlers: rq packed, the reply unpacked (free it with
 * m6__response__free_unpacked); NULL when none came. */
static M6__Response *ask_(http_server *h, const M6__Request *rq)
{
    size_t n = m6__request__get_packed_size(rq);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return NULL;
    m6__request__pack(rq, buf);
    uint8_t *frame = NULL;
    size_t flen = 0;
    int rc = h->cfg.dispatch(h->cfg.dispatch_ctx, buf, n, &frame, &flen);
    free(buf);
    if (rc < 0 || !frame || flen < M6_FRAME_HDR) {
        free(frame);
        return NULL;
    }
    M6__Response *resp = m6__response__unpack(NULL, flen - M6_FRAME_HDR,
                                              frame + M6_FRAME_HDR);
    free(frame);
    return resp;
}

/* The HTTP code of a reply that is not OK. */
static int code_of_(M6__Status st)
{
    switch (st) {
    case M6__STATUS__STATUS_NOT_FOUND: return MHD_HTTP_NOT_FOUND;
    case M6__STATUS__STATUS_BAD_REQUEST: return MHD_HTTP_BAD_REQUEST;
    default: return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}

/* A JSON body being written (open_memstream). */
typedef struct {
    FILE *f;
    char *buf;
    size_t len;
} jbody;

static int jbody_open_(jbody *j)
{
    j->buf = NULL;
    j->len = 0;
    j->f = open_memstream(&j->buf, &j->len);
    return j->f ? 0 : -1;
}

static enum MHD_Result jbody_send_(http_server *h, struct MHD_Connection *conn,
                                   jbody *j)
{
    if (fclose(j->f) != 0) {
        free(j->buf);
        return MHD_NO;
    }
    return send_(h, conn, MHD_HTTP_OK, "application/json", j->buf, j->len,
                 MHD_RESPMEM_MUST_FREE);
}

/* A reply that failed: {"error": message} with its HTTP code. */
static enum MHD_Result reply_error_(http_server *h, struct MHD_Connection *conn,
                                    const M6__Response *resp)
{
    if (!resp)
        return text_(h, conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                     "500 %s\n", "no reply from m6d's handlers");
    json_t *o = json_pack("{s:s}", "error", resp->message ? resp->message : "");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return MHD_NO;
    return send_(h, conn, code_of_(resp->status), "application/json", s,
                 strlen(s), MHD_RESPMEM_MUST_FREE);
}

/* A JSON body: the rows of one answer, rendered with m6ctl's views. */
typedef void (*render_fn)(FILE *f, const M6__Response *resp);

/* Ask m6d's handlers the request of case which holding q (&msg.base);
 * their answer as a reply: render's JSON body, or the error reply when
 * they did not answer, refused, or sent no body of case body. */
static enum MHD_Result reply_json_(http_server *h, struct MHD_Connection *conn,
                                   M6__Request__BodyCase which,
                                   ProtobufCMessage *q,
                                   M6__Response__BodyCase body,
                                   render_fn render)
{
    M6__Request rq = frame_request(which, q);
    M6__Response *resp = ask_(h, &rq);
    enum MHD_Result ret;
    jbody j;
    if (!resp || resp->status != M6__STATUS__STATUS_OK ||
        resp->body_case != body) {
        ret = reply_error_(h, conn, resp);
    } else if (jbody_open_(&j) < 0) {
        ret = MHD_NO;
    } else {
        render(j.f, resp);
        ret = jbody_send_(h, conn, &j);
    }
    if (resp) m6__response__free_unpacked(resp, NULL);
    return ret;
}

static void render_list_(FILE *f, const M6__Response *resp)
{
    view_out o = {.f = f, .v = &views_run, .form = VIEW_JSON_ARRAY};
    view_begin(&o);
    for (size_t i = 0; i < resp->list->n_runs; i++) {
        views_run_row row = {.r = resp->list->runs[i], .watch_eta = -1};
        view_row(&o, &row);
    }
    view_end(&o);
}

static enum MHD_Result api_list_(http_server *h, struct MHD_Connection *conn)
{
    M6__ListRuns lr = M6__LIST_RUNS__INIT;
    return reply_json_(h, conn, M6__REQUEST__BODY_LIST, &lr.base,
                       M6__RESPONSE__BODY_LIST, render_list_);
}

static void render_status_(FILE *f, const M6__Response *resp)
{
    view_out o = {.f = f, .v = &views_run, .form = VIEW_JSON_OBJECT};
    views_run_row row = {.r = resp->run, .watch_eta = -1};
    view_begin(&o);
    view_row(&o, &row);
    view_end(&o);
}

static enum MHD_Result api_status_(http_server *h, struct MHD_Connection *conn,
                                   int64_t id)
{
    M6__RunRef ref = M6__RUN_REF__INIT;
    ref.run_id = id;
    return reply_json_(h, conn, M6__REQUEST__BODY_STATUS, &ref.base,
                       M6__RESPONSE__BODY_RUN, render_status_);
}

/* A query argument as a number >= 0 (absent: dflt); -1 when bad. */
static long long arg_(struct MHD_Connection *conn, const char *key,
                      long long dflt)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, key);
    if (!v) return dflt;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < 0) return -1;
    return n;
}

static void render_metrics_(FILE *f, const M6__Response *resp)
{
    const M6__MetricRows *m = resp->metrics;
    /* as m6ctl metrics --json: an MoE run's rows with its columns */
    view_out o = {.f = f, .form = VIEW_JSON_ARRAY,
                  .v = m->n_rows && m->rows[0]->moe_aux_loss > 0
                           ? &views_metrics_moe : &views_metrics};
    view_begin(&o);
    for (size_t i = 0; i < m->n_rows; i++) view_row(&o, m->rows[i]);
    view_end(&o);
}

static enum MHD_Result api_metrics_(http_server *h, struct MHD_Connection *conn,
                                    int64_t id)
{
    long long after = arg_(conn, "after", 0), limit = arg_(conn, "limit", 0);
    if (after < 0 || limit < 0 || limit > INT32_MAX)
        return text_(h, conn, MHD_HTTP_BAD_REQUEST,
                     "400 %s: after and limit must be integers >= 0\n",
                     "bad query");
    M6__RunRef ref = M6__RUN_REF__INIT;
    M6__MetricsQuery q = M6__METRICS_QUERY__INIT;
    ref.run_id = id;
    q.run = &ref;
    q.after_step = after;
    q.limit = (int32_t)limit;
    return reply_json_(h, conn, M6__REQUEST__BODY_METRICS, &q.base,
                       M6__RESPONSE__BODY_METRICS, render_metrics_);
}

static void render_events_(FILE *f, const M6__Response *resp)
{
    view_out o = {.f = f, .v = &views_events, .form = VIEW_JSON_ARRAY};
    view_begin(&o);
    for (size_t i = 0; i < resp->events->n_events; i++)
        view_row(&o, resp->events->events[i]);
    view_end(&o);
}

static enum MHD_Result api_events_(http_server *h, struct MHD_Connection *conn,
                                   int64_t id)
{
    long long after = arg_(conn, "after", 0);
    if (after < 0)
        return text_(h, conn, MHD_HTTP_BAD_REQUEST,
                     "400 %s: after must be an integer >= 0\n", "bad query");
    M6__RunRef ref = M6__RUN_REF__INIT;
    M6__EventsQuery q = M6__EVENTS_QUERY__INIT;
    ref.run_id = id;
    q.run = &ref;
    q.after_id = after;
    return reply_json_(h, conn, M6__REQUEST__BODY_EVENTS, &q.base,
                       M6__RESPONSE__BODY_EVENTS, render_events_);
}

/* /api/runs/ID[/metrics|/events] */
static enum MHD_Result api_run_(http_server *h, struct MHD_Connection *conn,
                                const char *url, const char *rest)
{
    char *end;
    errno = 0;
    long long id = *rest >= '0' && *rest <= '9' ? strtoll(rest, &end, 10) : 0;
    if (id <= 0 || errno)
        return text_(h, conn, MHD_HTTP_NOT_FOUND, "404 not found: %s\n", url);
    if (!*end) return api_status_(h, conn, id);
    if (!strcmp(end, "/metrics")) return api_metrics_(h, conn, id);
    if (!strcmp(end, "/events")) return api_events_(h, conn, id);
    return text_(h, conn, MHD_HTTP_NOT_FOUND, "404 not found: %s\n", url);
}

/* ---------------------------------------------------------------- routes */

/* The headers deadline's bookkeeping (MHD_OPTION_NOTIFY_CONNECTION): a
 * new connection starts waiting for its headers (with a dup of its
 * socket), a closed one is forgotten and its dup closed. Past the table,
 * or without a descriptor to dup, a connection has no deadline beyond
 * libmicrohttpd's idle timeout. */
static void on_connection_(void *cls, struct MHD_Connection *conn,
                           void **socket_context,
                           enum MHD_ConnectionNotificationCode toe)
{
    http_server *h = cls;
    pthread_mutex_lock(&h->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hconn_ *c = NULL;
        for (size_t i = 0; fi && !c && i < sizeof h->conns / sizeof h->conns[0]; i++)
            if (!h->conns[i].used) c = &h->conns[i];
        int fd = c ? fcntl(fi->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (fd >= 0)
            *c = (hconn_){.used = 1, .waiting = 1, .fd = fd, .since = now_s_()};
        *socket_context = fd >= 0 ? c : NULL;
    } else if (*socket_context) {
        hconn_ *c = *socket_context;
        close(c->fd);
        c->used = 0;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&h->mu);
}

/* The connection's headers came (waiting 0) or its response is done and
 * the next request's headers are awaited (waiting 1, from now). */
static void set_waiting_(http_server *h, struct MHD_Connection *conn, int waiting)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&h->mu);
    hconn_ *c = ci ? ci->socket_context : NULL;
    if (c && c->used) {
        c->waiting = waiting;
        c->since = now_s_();
    }
    pthread_mutex_unlock(&h->mu);
}

static void on_completed_(void *cls, struct MHD_Connection *conn,
                          void **req_cls, enum MHD_RequestTerminationCode toe)
{
    (void)req_cls;
    (void)toe;
    set_waiting_(cls, conn, 1);
}

/* The reaper: four times a second, a connection that has waited longer
 * than HTTP_HEADERS_DEADLINE_S for a request's headers is shut down (once:
 * libmicrohttpd then sees its end and closes it). */
static void *reaper_(void *arg)
{
    http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        double now = now_s_();
        for (size_t i = 0; i < sizeof h->conns / sizeof h->conns[0]; i++) {
            hconn_ *c = &h->conns[i];
            if (c->used && c->waiting && now - c->since > HTTP_HEADERS_DEADLINE_S) {
                log_debug("http.deadline", "fd=%d waited=%.1fs", c->fd, now - c->since);
                shutdown(c->fd, SHUT_RDWR);
                c->waiting = 0;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static enum MHD_Result on_request_(void *cls, struct MHD_Connection *conn,
                                   const char *url, const char *method,
                                   const char *version, const char *upload,
                                   size_t *upload_size, void **req_cls)
{
    http_server *h = cls;
    (void)version;
    (void)upload;
    if (!*req_cls) { /* the first call of a request: its headers are in */
        *req_cls = h;
        set_waiting_(h, conn, 0);
    }
    /* who may ask, before what is asked */
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_HOST);
    if (!http_host_ok(&h->cfg, host)) {
        *upload_size = 0;
        return text_(h, conn, MHD_HTTP_MISDIRECTED_REQUEST_, "421 misdirected "
                     "request: Host \"%.100s\" is not a name of this server "
                     "(m6d --metrics-host adds one)\n", host);
    }
    if (h->cfg.auth) {
        const char *a = MHD_lookup_connection_value(
            conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!a || strncmp(a, "Bearer ", 7) != 0 ||
            !h->cfg.auth(h->cfg.auth_ctx, a + 7, strlen(a + 7))) {
            *upload_size = 0;
            return text_(h, conn, MHD_HTTP_UNAUTHORIZED, "401 unauthorized: "
                         "%s\n", "this server wants \"Authorization: Bearer "
                         "TOKEN\" (the token of m6d --metrics-token-file)");
        }
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        *upload_size = 0; /* the body is not read: the answer is no */
        return text_(h, conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                     "405 method not allowed: %s (GET or HEAD only)\n", method);
    }
    if (!strcmp(url, "/metrics")) {
        char *body;
        size_t len;
        if (stats_render(h->cfg.stats, &body, &len) < 0)
            return text_(h, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "500 %s\n",
                         "out of memory");
        return send_(h, conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                     body, len, MHD_RESPMEM_MUST_FREE);
    }
    if (!strcmp(url, "/api/runs")) return api_list_(h, conn);
    if (!strncmp(url, "/api/runs/", 10)) return api_run_(h, conn, url, url + 10);
    for (int i = 0; i < http_n_assets; i++)
        if (!strcmp(url, http_assets[i].path))
            return send_(h, conn, MHD_HTTP_OK, http_assets[i].type,
                         (void *)http_assets[i].data, http_assets[i].len,
                         MHD_RESPMEM_PERSISTENT);
    return text_(h, conn, MHD_HTTP_NOT_FOUND, "404 not found: %s\n", url);
}

/* libmicrohttpd's messages, each text at most once per
 * HTTP_LOG_INTERVAL_S with a count of the repeats in between: it says
 * "connection limit" for every connection it refuses, and a flood of
 * them would otherwise write a line each. */
static pthread_mutex_t log_mu_ = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char msg[160];
    double last;
    unsigned long repeats;
} log_seen_[8];

static void mhd_log_(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    double now = now_s_();
    size_t n = sizeof log_seen_ / sizeof log_seen_[0], k = 0;
    pthread_mutex_lock(&log_mu_);
    for (size_t i = 0; i < n; i++) {
        if (strncmp(log_seen_[i].msg, msg, sizeof log_seen_[i].msg - 1) == 0) {
            k = i;
            break;
        }
        if (log_seen_[i].last < log_seen_[k].last) k = i;
    }
    int same = strncmp(log_seen_[k].msg, msg, sizeof log_seen_[k].msg - 1) == 0;
    if (same && log_seen_[k].last > 0 && now - log_seen_[k].last < HTTP_LOG_INTERVAL_S) {
        log_seen_[k].repeats++;
        pthread_mutex_unlock(&log_mu_);
        return;
    }
    unsigned long repeats = same ? log_seen_[k].repeats : 0;
    size_t len = strnlen(msg, sizeof log_seen_[k].msg - 1);
    memcpy(log_seen_[k].msg, msg, len);  /* the key: the first 159 bytes */
    log_seen_[k].msg[len] = 0;
    log_seen_[k].last = now;
    log_seen_[k].repeats = 0;
    pthread_mutex_unlock(&log_mu_);
    log_warn("http.error", "msg=\"%s\" repeats=%lu", msg, repeats);
}

http_server *http_start(const http_config *cfg, char *err, size_t errlen)
{
    http_server *h = calloc(1, sizeof *h);
    if (!h) {
        close(cfg->fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->cfg = *cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* one polling thread (epoll) for every connection: a slow or hostile
     * client holds only its own connections, HTTP_PER_ADDRESS_MAX of them,
     * for HTTP_TIMEOUT_S at most without sending and HTTP_HEADERS_DEADLINE_S
     * at most without a whole request's headers */
    h->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request_, h,
                            /* first: libmicrohttpd logs the options
                             * before it to stderr, and says so */
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log_, NULL,
                            MHD_OPTION_LISTEN_SOCKET, cfg->fd,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection_, h,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed_, h,
                            MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)HTTP_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)HTTP_CONNECTIONS_MAX,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)HTTP_PER_ADDRESS_MAX,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768,
                            MHD_OPTION_END);
    if (!h->d) {
        /* the socket is not closed here: whether libmicrohttpd already
         * did is not said, and a second close could hit another thread's
         * new file (m6d stops anyway) */
        snprintf(err, errlen, "libmicrohttpd did not start on the metrics socket");
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    int rc = pthread_create(&h->reaper, NULL, reaper_, h);
    if (rc != 0) {
        snprintf(err, errlen, "the HTTP headers deadline's thread: %s", strerror(rc));
        http_stop(h);
        return NULL;
    }
    h->reaper_on = 1;
    return h;
}

void http_stop(http_server *h)
{
    if (!h) return;
    if (h->reaper_on) {
        pthread_mutex_lock(&h->mu);
        h->stopping = 1;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reaper, NULL);
    }
    MHD_stop_daemon(h->d); /* closes the listening socket too */
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
