/*
 * store_client.c — the rendezvous store over the coordinator's TCP port
 * (see store_client.h).
 */
#include "cluster/store_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include "cluster/tls.h"
#include <openssl/err.h>
#include "proto/frame.h"
#include "m6.pb-c.h"

enum { IDLE_MAX_ = 8 };

/* One connection: the socket and its TLS session (tls.h). */
typedef struct {
    int fd;
    SSL *ssl;
} sconn;

static void sconn_close_(sconn *c)
{
    if (c->ssl) SSL_free(c->ssl);
    if (c->fd >= 0) close(c->fd);
    c->ssl = NULL;
    c->fd = -1;
}

/* Connections: one per call in flight, so that a get waiting for a key
 * never holds up the thread that is to set it; idle ones are kept (at
 * most IDLE_MAX_) for the next calls. mu guards the idle list only. */
typedef struct {
    pthread_mutex_t mu;
    char addr[300], host[256], port[8];
    SSL_CTX *tls;       /* the PSK's client side; the token is not kept */
    m6_store_who who;
    int64_t run, gen;
    int io_timeout_ms;
    sconn idle[IDLE_MAX_];
    int n_idle;
} tcp_store;

/* An idle connection (1 taken into *c), or 0: none. */
static int take_idle_(tcp_store *s, sconn *c)
{
    pthread_mutex_lock(&s->mu);
    int got = s->n_idle > 0;
    if (got) *c = s->idle[--s->n_idle];
    pthread_mutex_unlock(&s->mu);
    return got;
}

static void put_idle_(tcp_store *s, sconn c)
{
    pthread_mutex_lock(&s->mu);
    if (s->n_idle < IDLE_MAX_) {
        s->idle[s->n_idle++] = c;
        c.fd = -1;
        c.ssl = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    sconn_close_(&c);
}

static int64_t now_ms_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for fd to be ready for events until deadline (now_ms_ clock).
 * 1 ready, 0 deadline passed, -1 error (errno). */
static int wait_fd_(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms_();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        if (rc > 0) return 1;
    }
}

/* After an SSL call on c returned r <= 0: wait for what it wants until
 * deadline. 0 to call again; -1 with errno (ETIMEDOUT, ECONNRESET for a
 * closed peer, EPROTO for a TLS failure). */
static int ssl_wait_(sconn *c, int r, int64_t deadline)
{
    int e = SSL_get_error(c->ssl, r);
    short ev = e == SSL_ERROR_WANT_READ ? POLLIN
               : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (!ev) {
        int se = errno;
        ERR_clear_error();
        errno = e == SSL_ERROR_ZERO_RETURN ? ECONNRESET
                : e == SSL_ERROR_SYSCALL ? (se ? se : ECONNRESET) : EPROTO;
        return -1;
    }
    int w = wait_fd_(c->fd, ev, deadline);
    if (w == 0) errno = ETIMEDOUT;
    return w > 0 ? 0 : -1;
}

static int write_all_(sconn *c, const uint8_t *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        int chunk = n > (1u << 30) ? 1 << 30 : (int)n;
        int w = SSL_write(c->ssl, p, chunk);
        if (w <= 0) {
            if (ssl_wait_(c, w, deadline) < 0) return -1;
            continue;  /* the same buffer again, as OpenSSL wants */
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read one Response until deadline. NULL with errno (ETIMEDOUT, ECONNRESET
 * for EOF, EPROTO for a bad frame). */
static M6__Response *read_reply_(sconn *c, int64_t deadline)
{
    frame_reader rd;
    frame_reader_init(&rd);
    M6__Response *r = NULL;
    uint8_t buf[65536];
    for (;;) {
        const uint8_t *payload;
        size_t len;
        frame_result fr = frame_reader_next(&rd, &payload, &len);
        if (fr == FRAME_OK) {
            r = m6__response__unpack(NULL, len, payload);
            if (!r) errno = EPROTO;
            break;
        }
        if (fr == FRAME_TOO_LARGE) {
            errno = EPROTO;
            break;
        }
        int n = SSL_read(c->ssl, buf, sizeof buf);
        if (n <= 0) {
            if (ssl_wait_(c, n, deadline) < 0) break;
            continue;
        }
        if (frame_reader_feed(&rd, buf, (size_t)n) < 0) {
            errno = ENOMEM;
            break;
        }
    }
    frame_reader_free(&rd);
    return r;
}

/* One non-blocking connect to ai, finished before deadline. fd or -1. */
static int connect_one_(const struct addrinfo *ai, int64_t deadline)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) goto fail;
        int r = wait_fd_(fd, POLLOUT, deadline);
        if (r <= 0) {
            if (r == 0) errno = ETIMEDOUT;
            goto fail;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            errno = soerr;
            goto fail;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* The TLS handshake on a connected fd (taken: closed on failure), before
 * deadline. 0 with *c, or -1 with errno (EPROTO: the peer cannot prove
 * that it holds the token; why holds OpenSSL's reason). */
static int handshake_(tcp_store *s, int fd, sconn *c, int64_t deadline,
                      char *why, size_t whylen)
{
    c->fd = fd;
    c->ssl = SSL_new(s->tls);
    if (!c->ssl || !SSL_set_fd(c->ssl, fd)) {
        sconn_close_(c);
        errno = ENOMEM;
        return -1;
    }
    SSL_set_connect_state(c->ssl);
    for (;;) {
        int r = SSL_connect(c->ssl);
        if (r == 1) return 0;
        int e = SSL_get_error(c->ssl, r);
        if (e == SSL_ERROR_SSL) {
            cluster_tls_reason(why, whylen);
            sconn_close_(c);
            errno = EPROTO;
            return -1;
        }
        if (ssl_wait_(c, r, deadline) < 0) {
            int en = errno;
            sconn_close_(c);
            errno = en;
            return -1;
        }
    }
}

/* Connect and open the namespace, retrying until io_timeout_ms. 0 with
 * *out, or -1 with *err. */
static int connect_(tcp_store *s, sconn *out, m6_err *err)
{
    int64_t t0 = now_ms_(), deadline = t0 + s->io_timeout_ms;
    char why[512] = "timed out";
    int tried = 0;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC,
                                 .ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(s->host, s->port, &hints, &res);
        if (g != 0) {
            snprintf(why, sizeof why, "cannot resolve %s: %s", s->host,
                     gai_strerror(g));
        } else {
            int fd = -1;
            for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
                fd = connect_one_(ai, deadline);
            /* a connect cut short by the deadline keeps the reason of the
             * attempts before it (connection refused) */
            if (fd < 0 && (errno != ETIMEDOUT || !tried))
                snprintf(why, sizeof why, "cannot connect: %s", strerror(errno));
            tried = 1;
            freeaddrinfo(res);
            sconn c = {.fd = -1};
            char tr[256] = "";
            if (fd >= 0 && handshake_(s, fd, &c, deadline, tr, sizeof tr) < 0) {
                if (errno == EPROTO) {  /* no point in trying again */
                    m6_err_set(err, M6_EINTERNAL, "rendezvous store at %s "
                               "refused the connection: authentication "
                               "failed (TLS: %s): it does not hold this "
                               "cluster's token, or it is not an m6 "
                               "coordinator", s->addr, tr[0] ? tr : "?");
                    return -1;
                }
                snprintf(why, sizeof why, "TLS handshake: %s",
                         strerror(errno));
                fd = -1;
            } else if (fd >= 0) {
                M6__StoreOpen so = M6__STORE_OPEN__INIT;
                so.protocol_version = M6_PROTOCOL_VERSION;
                so.run_id = s->run;
                so.generation = s->gen;
                so.node_uuid = s->who.node_uuid;
                so.node_secret.data = s->who.secret;
                so.node_secret.len = CLUSTER_SECRET_LEN;
                so.rank = s->who.rank;
                M6__Request rq = frame_request(M6__REQUEST__BODY_STORE_OPEN, &so.base);
                size_t len;
                uint8_t *f = frame_pack(&rq.base, &len);
                M6__Response *r = NULL;
                if (f && write_all_(&c, f, len, deadline) == 0)
                    r = read_reply_(&c, deadline);
                else if (!f) errno = ENOMEM;
                free(f);
                if (r && r->status == M6__STATUS__STATUS_OK) {
                    m6__response__free_unpacked(r, NULL);
                    *out = c;
                    return 0;
                }
                int en = errno;
                sconn_close_(&c);
                errno = en;
                if (r) {  /* refused: no point in trying again */
                    m6_err_set(err, M6_EINTERNAL, "rendezvous store at %s "
                               "refused the connection: %s", s->addr,
                               r->message ? r->message : "no reason given");
                    m6__response__free_unpacked(r, NULL);
                    return -1;
                }
                snprintf(why, sizeof why, "no answer to StoreOpen: %s",
                         strerror(errno));
            }
        }
        int64_t left = deadline - now_ms_();
        if (left <= 0) break;
        struct timespec ts = {0, (left < 100 ? left : 100) * 1000000L};
        nanosleep(&ts, NULL);
    }
    m6_err_set(err, M6_EINTERNAL, "rendezvous store at %s: %s (tried for "
               "%.1f s)", s->addr, why, (now_ms_() - t0) / 1000.0);
    return -1;
}

/* Send rq on an idle connection (or a new one), read its reply (wait_ms:
 * how long the coordinator may take on purpose). The reply, or NULL with
 * *err. what names the call for messages. */
static M6__Response *call_(tcp_store *s, const M6__Request *rq, int wait_ms,
                           const char *what, m6_err *err)
{
    size_t len;
    uint8_t *f = frame_pack(&rq->base, &len);
    if (!f) {
        m6_err_set(err, M6_EINVALID, "store %s: request over the frame limit",
                   what);
        return NULL;
    }
    M6__Response *r = NULL;
    for (int tries = 0; tries < 2 && !r; tries++) {
        sconn c;
        int fresh = !take_idle_(s, &c);
        if (fresh && connect_(s, &c, err) < 0) break;
        int64_t t0 = now_ms_();
        int64_t deadline = t0 + wait_ms + s->io_timeout_ms;
        if (write_all_(&c, f, len, deadline) == 0)
            r = read_reply_(&c, deadline);
        if (r) {
            put_idle_(s, c);
            break;
        }
        int e = errno;
        sconn_close_(&c);
        /* a kept connection that broke meanwhile: once more, fresh */
        if (!fresh && e != ETIMEDOUT) continue;
        m6_err_set(err, M6_EINTERNAL, "rendezvous store at %s: %s: %s "
                   "(after %.1f s)", s->addr, what,
                   e == ETIMEDOUT ? "no answer" : e == ECONNRESET
                       ? "the coordinator closed the connection" : strerror(e),
                   (now_ms_() - t0) / 1000.0);
        break;
    }
    free(f);
    if (r && r->status != M6__STATUS__STATUS_OK) {
        m6_code code = r->status == M6__STATUS__STATUS_TIMEOUT ? M6_ECANCELLED
                       : r->status == M6__STATUS__STATUS_TOO_LARGE ||
                               r->status == M6__STATUS__STATUS_BAD_REQUEST
                           ? M6_EINVALID : M6_EINTERNAL;
        m6_err_set(err, code, "rendezvous store at %s: %s", s->addr,
                   r->message ? r->message : "refused");
        m6__response__free_unpacked(r, NULL);
        r = NULL;
    }
    return r;
}

/* The coordinator waits at most 600 s per request (coordinator_store.c): a
 * longer timeout is waited out in pieces of that length. *tmo is the
 * request's timeout_ms field. */
enum { WAIT_PIECE_MS_ = 600000 };

static M6__Response *call_waiting_(tcp_store *s, const M6__Request *rq,
                                   int32_t *tmo, int timeout_ms,
                                   const char *what, m6_err *err)
{
    long long left = timeout_ms < 0 ? 0 : timeout_ms;
    for (;;) {
        m6_err e = M6_ERR_NONE;
        *tmo = (int32_t)(left > WAIT_PIECE_MS_ ? WAIT_PIECE_MS_ : left);
        left -= *tmo;
        M6__Response *r = call_(s, rq, *tmo, what, &e);
        if (r) return r;
        if (e.code == M6_ECANCELLED && left > 0) {
            m6_err_free(&e);  /* a piece of a longer wait: the next one */
            continue;
        }
        if (e.code == M6_ECANCELLED && timeout_ms > WAIT_PIECE_MS_) {
            char total[64];
            snprintf(total, sizeof total, "after %d ms in all", timeout_ms);
            m6_err_prefix(&e, total);
        }
        if (err) {
            m6_err_free(err);
            *err = e;
        } else {
            m6_err_free(&e);
        }
        return NULL;
    }
}

static int check_key_(const char *key, m6_err *err)
{
    size_t n = key ? strlen(key) : 0;
    if (n >= 1 && n <= M6_STORE_KEY_MAX) return 0;
    m6_err_set(err, M6_EINVALID, "store key of %zu bytes: want 1..%d", n,
               M6_STORE_KEY_MAX);
    return -1;
}

static int set_(void *ctx, const char *key, const void *val, size_t len,
                m6_err *err)
{
    tcp_store *s = ctx;
    if (check_key_(key, err) < 0) return -1;
    if (len > M6_STORE_VALUE_MAX) {
        m6_err_set(err, M6_EINVALID, "store value of %zu bytes for \"%s\": "
                   "the limit is %u", len, key, M6_STORE_VALUE_MAX);
        return -1;
    }
    M6__StoreSet ss = M6__STORE_SET__INIT;
    ss.key = (char *)key;
    ss.value.data = (uint8_t *)val;
    ss.value.len = len;
    M6__Request rq = frame_request(M6__REQUEST__BODY_STORE_SET, &ss.base);
    M6__Response *r = call_(s, &rq, 0, "set", err);
    if (!r) return -1;
    m6__response__free_unpacked(r, NULL);
    return 0;
}

static int get_(void *ctx, const char *key, void **val, size_t *len,
                int timeout_ms, m6_err *err)
{
    tcp_store *s = ctx;
    *val = NULL;
    *len = 0;
    if (check_key_(key, err) < 0) return -1;
    M6__StoreGet sg = M6__STORE_GET__INIT;
    sg.key = (char *)key;
    M6__Request rq = frame_request(M6__REQUEST__BODY_STORE_GET, &sg.base);
    M6__Response *r = call_waiting_(s, &rq, &sg.timeout_ms, timeout_ms, "get",
                                    err);
    if (!r) return -1;
    int rc = 0;
    if (r->body_case != M6__RESPONSE__BODY_STORE_VALUE) {
        m6_err_set(err, M6_EINTERNAL, "rendezvous store at %s: get \"%s\": "
                   "the reply holds no value", s->addr, key);
        rc = -1;
    } else {
        size_t n = r->store_value->value.len;
        *val = malloc(n ? n : 1);
        if (!*val) {
            m6_err_set(err, M6_EINTERNAL, "out of memory");
            rc = -1;
        } else {
            if (n) memcpy(*val, r->store_value->value.data, n);
            *len = n;
        }
    }
    m6__response__free_unpacked(r, NULL);
    return rc;
}

static int wait_(void *ctx, const char *const *keys, size_t n, int timeout_ms,
                 m6_err *err)
{
    tcp_store *s = ctx;
    for (size_t i = 0; i < n; i++)
        if (check_key_(keys[i], err) < 0) return -1;
    if (n == 0) return 0;
    M6__StoreWait sw = M6__STORE_WAIT__INIT;
    sw.keys = (char **)keys;
    sw.n_keys = n;
    M6__Request rq = frame_request(M6__REQUEST__BODY_STORE_WAIT, &sw.base);
    M6__Response *r = call_waiting_(s, &rq, &sw.timeout_ms, timeout_ms, "wait",
                                    err);
    if (!r) return -1;
    m6__response__free_unpacked(r, NULL);
    return 0;
}

int m6_store_who_load(const char *state_dir, int rank, m6_store_who *who,
                      char *err, size_t errlen)
{
    memset(who, 0, sizeof *who);
    who->rank = rank;
    if (cluster_node_uuid(state_dir, who->node_uuid, err, errlen) < 0)
        return -1;
    int r = cluster_node_secret_load(state_dir, who->secret, err, errlen);
    if (r == 1)
        snprintf(err, errlen, "%s/node-secret: none yet (the coordinator "
                 "issues it at the node's first join)", state_dir);
    return r == 0 ? 0 : -1;
}

int m6_store_tcp_open(const char *addr, const cluster_token *token,
                      const m6_store_who *who, int64_t run_id,
                      int64_t generation, int io_timeout_ms, m6_store *out,
                      m6_err *err)
{
    memset(out, 0, sizeof *out);
    tcp_store *s = calloc(1, sizeof *s);
    if (!s) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    char perr[400];
    int port;
    if (cluster_parse_addr(addr, 0, s->host, sizeof s->host, &port, perr,
                           sizeof perr) < 0) {
        m6_err_set(err, M6_EINVALID, "rendezvous store address %s", perr);
        free(s);
        return -1;
    }
    snprintf(s->port, sizeof s->port, "%d", port);
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    if (!(s->tls = cluster_tls_ctx(token, 0, perr, sizeof perr))) {
        m6_err_set(err, M6_EINTERNAL, "rendezvous store: %s", perr);
        free(s);
        return -1;
    }
    s->who = *who;
    s->run = run_id;
    s->gen = generation;
    s->io_timeout_ms = io_timeout_ms > 0 ? io_timeout_ms : 1;
    pthread_mutex_init(&s->mu, NULL);
    sconn c;
    if (connect_(s, &c, err) < 0) {  /* now: an unreachable coordinator is named here */
        pthread_mutex_destroy(&s->mu);
        cluster_tls_ctx_free(s->tls);
        OPENSSL_cleanse(s, sizeof *s);
        free(s);
        return -1;
    }
    put_idle_(s, c);
    out->ctx = s;
    out->set = set_;
    out->get = get_;
    out->wait = wait_;
    return 0;
}

void m6_store_tcp_close(m6_store *st)
{
    tcp_store *s = st->ctx;
    if (!s) return;
    for (int i = 0; i < s->n_idle; i++) sconn_close_(&s->idle[i]);
    pthread_mutex_destroy(&s->mu);
    cluster_tls_ctx_free(s->tls);
    OPENSSL_cleanse(s, sizeof *s);
    free(s);
    st->ctx = NULL;
}
