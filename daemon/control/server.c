/*
 * server.c — libuv listener and connections for the control protocol.
 *
 * Lifetimes (libuv rules): a handle is freed only in its close callback; a
 * write request is freed in its callback whatever the status; every callback
 * checks whether its connection is closing.
 *
 * Requests are handled one at a time per connection, so replies keep the
 * order of requests. Quick ones (status, list, pause, ...) are answered on
 * the event loop at once; slow ones (a submit, which reads the whole corpus;
 * plan; a resume, which waits for the runner to reopen the data; a page of
 * metrics, up to 10000 rows read and packed) run on
 * libuv's thread pool (uv_queue_work), so they never hold up the loop or
 * other connections, and quick requests never wait for a pool thread.
 * While a slow request runs, its connection keeps reading (up to one frame
 * ahead) so that a client that goes away is noticed: the session is marked
 * gone and a submit not yet queued is dropped. A connection closed while
 * its request runs is freed by the request's after-work callback. At
 * shutdown (server_drain) the listener closes first and the requests in
 * flight get their replies before their connections close.
 */
#include "control/server.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/readbuf.h"
#include "common/uvw.h"
#include "proto/frame.h"
#include "m6.pb-c.h"

#define UV_CHECK(call, err, errlen)                                           \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ < 0) {                                                        \
            snprintf(err, errlen, "%s: %s (%s:%d)", #call, uv_strerror(rc_),  \
                     __FILE__, __LINE__);                                     \
            goto fail;                                                        \
        }                                                                     \
    } while (0)

typedef struct conn conn;

#define PATH_CHECK_MS 2000  /* how often path_check_ looks at the socket */

struct server {
    uv_pipe_t listener;   /* first: handle <-> server */
    handlers_ctx *handlers;
    char path[108];
    int own_path;
    int listener_open;
    conn *conns;          /* doubly linked, for closing at exit */
    unsigned long next_id;
    int stopping;         /* server_drain: no new connections or requests */
    int draining;         /* connections whose reply server_drain awaits */
    int listener_closing; /* closed by server_drain, callback not yet run */
    int free_on_close;    /* server_fini came first: that callback frees */
    /* access: who may drive m6d (server_config) */
    gid_t group;
    char group_name[64];
    int group_read_only;
    /* the socket's path (own_path): see path_check_ */
    uv_timer_t *path_timer;  /* heap; freed in its close callback */
    uv_pipe_t *relisten;     /* the newest socket bound after a loss */
    dev_t path_dev;          /* the socket file m6d bound last */
    ino_t path_ino;
    int path_warned;         /* this loss already logged */
    /* limits (server.h): open connections, the idle sweep */
    int n_conns;
    unsigned idle_ms;
    uv_timer_t *idle_timer;  /* heap; freed in its close callback */
};

struct conn {
    uv_pipe_t pipe;       /* first: handle <-> conn */
    server *srv;
    handlers_ctx *handlers;  /* srv's, kept here: the pool thread uses it */
    unsigned long id;
    frame_reader rd;
    session sess;
    int closing;
    int reading;          /* uv_read_start is in effect */
    int drain_wait;       /* counted in srv->draining until closed */
    conn *prev, *next;
    /* the request in flight on the thread pool (busy), and its reply */
    uv_work_t work;
    int busy, free_when_done;
    uint8_t *req;
    size_t req_len;
    uint8_t *rep;
    size_t rep_len;
    int rep_rc, rep_close;
    uint64_t last_active;    /* uv_now at the last byte in or reply out */
    int privileged;          /* root or m6d's user: no per-uid cap */
};

/* ------------------------------------------------------------- connections */

static void conn_free_(conn *c)
{
    frame_reader_free(&c->rd);
    free(c);
}

static void conn_closed_(uv_handle_t *h)
{
    conn *c = (conn *)h;
    if (c->busy)
        c->free_when_done = 1;  /* after_work_ frees it */
    else
        conn_free_(c);
}

static void conn_close_(conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    if (c->drain_wait) c->srv->draining--;
    __atomic_store_n(&c->sess.gone, 1, __ATOMIC_RELEASE);
    if (c->prev) c->prev->next = c->next;
    else c->srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->srv->n_conns--;
    log_debug("conn.close", "conn=%lu", c->id);
    uv_close((uv_handle_t *)&c->pipe, conn_closed_);
}

static void write_done_(void *owner, int status, int close_after)
{
    conn *c = owner;
    if (c->closing) return;
    if (status < 0) {
        log_debug("conn.write_error", "conn=%lu err=\"%s\"", c->id,
                  uv_strerror(status));
        conn_close_(c);
    } else if (close_after) {
        conn_close_(c);
    }
}

/* Queue a frame; takes ownership of buf. */
static void conn_send_(conn *c, uint8_t *buf, size_t len, int close_after)
{
    if (c->closing) {
        free(buf);
        return;
    }
    int rc = uvw_send((uv_stream_t *)&c->pipe, buf, len, c, close_after,
                      write_done_);
    if (rc < 0) {
        if (rc != UV_ENOMEM)
            log_debug("conn.write_error", "conn=%lu err=\"%s\"", c->id,
                      uv_strerror(rc));
        conn_close_(c);
    }
}

static void read_cb_(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void conn_read_stop_(conn *c)
{
    if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
}

/* Stop reading and close once the pending reply (if any) is written. */
static void conn_refuse_(conn *c, int status, const char *msg)
{
    conn_read_stop_(c);
    size_t len;
    uint8_t *f = handlers_error_frame(status, msg, &len);
    if (f)
        conn_send_(c, f, len, 1);
    else
        conn_close_(c);
}

/* Thread pool: decode, dispatch and pack one request. */
static void work_(uv_work_t *w)
{
    conn *c = w->data;
    c->rep_rc = handlers_dispatch(c->handlers, &c->sess, c->req, c->req_len,
                                  &c->rep, &c->rep_len, &c->rep_close);
}

static void conn_pump_(conn *c);

/* The peer's role before its frame is decoded, or even buffered whole: a
 * refused peer gets the refusal at its first byte; one that may only read
 * sends no frame over SERVER_FRAME_MAX_READ_ONLY (a read request is a few
 * bytes). 1 when c was refused (closing after the reply), else 0. */
static int frame_too_large_for_peer_(conn *c)
{
    size_t pending = frame_reader_pending(&c->rd);
    if (pending == 0)
        return 0;
    if (c->sess.denied[0]) {
        log_debug("conn.denied", "conn=%lu", c->id);
        conn_refuse_(c, M6__STATUS__STATUS_PERMISSION_DENIED, c->sess.denied);
        return 1;
    }
    if (!c->sess.read_only || pending < M6_FRAME_HDR)
        return 0;
    uint32_t n = frame_get_len(c->rd.buf + c->rd.pos);
    if (n <= SERVER_FRAME_MAX_READ_ONLY)
        return 0;
    char msg[200];
    snprintf(msg, sizeof msg, "frame of %u bytes refused: uid %u may only "
             "read here, and read requests are at most %u bytes", n,
             c->sess.peer_uid, SERVER_FRAME_MAX_READ_ONLY);
    log_warn("conn.oversize", "conn=%lu uid=%u len=%u read_only=1", c->id,
             c->sess.peer_uid, n);
    conn_refuse_(c, M6__STATUS__STATUS_TOO_LARGE, msg);
    return 1;
}

/* Event loop: send the reply, then go on with the next buffered frame. */
static void after_work_(uv_work_t *w, int status)
{
    conn *c = w->data;
    c->busy = 0;
    free(c->req);
    c->req = NULL;
    if (status < 0) {  /* cancelled: nothing was dispatched */
        free(c->rep);
        c->rep = NULL;
        c->rep_rc = -1;
    }
    if (c->free_when_done) {
        free(c->rep);
        conn_free_(c);
        return;
    }
    uint8_t *rep = c->rep;
    c->rep = NULL;
    if (c->closing) {
        free(rep);
        return;
    }
    if (c->rep_rc < 0) {
        conn_close_(c);
        return;
    }
    c->last_active = uv_now(c->pipe.loop);
    int close_after = c->rep_close || c->srv->stopping;
    if (close_after) conn_read_stop_(c);
    conn_send_(c, rep, c->rep_len, close_after);
    if (!close_after) conn_pump_(c);
}

/* Handle the complete frames buffered: quick ones here, in order, until a
 * slow one goes to the thread pool; then read more. */
static void conn_pump_(conn *c)
{
    while (!c->busy && !c->closing) {
        const uint8_t *payload;
        size_t len;
        if (frame_too_large_for_peer_(c))
            return;
        frame_result fr = frame_reader_next(&c->rd, &payload, &len);
        if (fr == FRAME_TOO_LARGE) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "frame of %zu bytes refused: the limit is %u bytes", len,
                     M6_FRAME_MAX);
            log_warn("conn.oversize", "conn=%lu len=%zu", c->id, len);
            conn_refuse_(c, M6__STATUS__STATUS_TOO_LARGE, msg);
            return;
        }
        if (fr == FRAME_NEED_MORE) break;
        if (!handlers_is_slow(payload, len)) {
            uint8_t *out;
            size_t outlen;
            int close_after = 0;
            if (handlers_dispatch(c->handlers, &c->sess, payload, len, &out,
                                  &outlen, &close_after) < 0) {
                conn_close_(c);
                return;
            }
            if (close_after) conn_read_stop_(c);
            conn_send_(c, out, outlen, close_after);
            if (close_after) return;
            continue;
        }
        /* A slow request: copy the payload (the reader's buffer moves on
         * the next feed) and dispatch it on the thread pool. */
        c->req = malloc(len ? len : 1);
        if (!c->req) {
            conn_refuse_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
            return;
        }
        memcpy(c->req, payload, len);
        c->req_len = len;
        c->busy = 1;
        c->work.data = c;
        int rc = uv_queue_work(c->pipe.loop, &c->work, work_, after_work_);
        if (rc < 0) {
            c->busy = 0;
            free(c->req);
            c->req = NULL;
            log_warn("conn.queue_error", "conn=%lu err=\"%s\"", c->id,
                     uv_strerror(rc));
            conn_close_(c);
            return;
        }
    }
    if (c->closing) return;
    /* Busy with a slow request: read on only to notice EOF, not to buffer
     * a pipelining client's frames without bound. */
    if (c->busy && frame_reader_pending(&c->rd) > M6_FRAME_HDR + M6_FRAME_MAX) {
        conn_read_stop_(c);
        return;
    }
    if (c->reading) return;
    int rc = uv_read_start((uv_stream_t *)&c->pipe, readbuf_alloc, read_cb_);
    if (rc < 0) {
        log_debug("conn.read_error", "conn=%lu err=\"%s\"", c->id,
                  uv_strerror(rc));
        conn_close_(c);
        return;
    }
    c->reading = 1;
}

static void read_cb_(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = (conn *)stream;
    if (c->closing) goto out;
    if (nread < 0) {
        if (nread != UV_EOF)
            log_debug("conn.read_error", "conn=%lu err=\"%s\"", c->id,
                      uv_strerror((int)nread));
        conn_close_(c);
        goto out;
    }
    if (nread == 0) goto out;
    c->last_active = uv_now(c->pipe.loop);
    if (frame_reader_feed(&c->rd, buf->base, (size_t)nread) < 0) {
        conn_refuse_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
        goto out;
    }
    conn_pump_(c);
out:
    free(buf->base);
}

static void check_peer_(server *s, conn *c);

/* Refuse c (an answer naming the limit, then close) when it is one
 * connection too many: over SERVER_CONN_MAX in all, or over
 * SERVER_CONN_MAX_PER_UID for its uid when it is neither root nor m6d's
 * user. Refused connections are logged once per second at most, with a
 * count. */
static void conn_cap_(server *s, conn *c)
{
    static uint64_t last_log;
    static unsigned long unlogged;
    char msg[200] = "";
    if (s->n_conns > SERVER_CONN_MAX) {
        snprintf(msg, sizeof msg, "too many connections: m6d serves at most "
                 "%d at a time", SERVER_CONN_MAX);
    } else if (!c->privileged) {
        int mine = 0;
        for (const conn *o = s->conns; o; o = o->next)
            if (!o->closing && o->sess.peer_uid == c->sess.peer_uid)
                mine++;
        if (mine > SERVER_CONN_MAX_PER_UID)
            snprintf(msg, sizeof msg, "too many connections from uid %u: at "
                     "most %d at a time", c->sess.peer_uid,
                     SERVER_CONN_MAX_PER_UID);
    }
    if (!msg[0])
        return;
    uint64_t now = uv_now(c->pipe.loop);
    unlogged++;
    if (now - last_log >= 1000 || last_log == 0) {
        log_warn("conn.refused", "conn=%lu uid=%u count=%lu msg=\"%s\"",
                 c->id, c->sess.peer_uid, unlogged, msg);
        last_log = now;
        unlogged = 0;
    }
    conn_refuse_(c, M6__STATUS__STATUS_BUSY, msg);
}

/* Every few seconds: close the connections idle for longer than
 * s->idle_ms (nothing received and no request in flight). */
static void idle_sweep_(uv_timer_t *t)
{
    server *s = t->data;
    uint64_t now = uv_now(t->loop);
    conn *next;
    for (conn *c = s->conns; c; c = next) {
        next = c->next;
        if (c->busy || c->closing || now - c->last_active < s->idle_ms)
            continue;
        log_debug("conn.idle", "conn=%lu uid=%u idle_ms=%llu", c->id,
                  c->sess.peer_uid, (unsigned long long)(now - c->last_active));
        conn_close_(c);
    }
}

static void on_connection_(uv_stream_t *ls, int status)
{
    server *s = ls->data;  /* the listener or a relisten */
    if (!s->listener_open) return;
    if (status < 0) {
        log_warn("conn.accept_error", "err=\"%s\"", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    c->handlers = s->handlers;
    c->id = ++s->next_id;
    frame_reader_init(&c->rd);
    int rc = uv_pipe_init(ls->loop, &c->pipe, 0);
    if (rc < 0) {
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    if ((rc = uv_accept(ls, (uv_stream_t *)&c->pipe)) == 0 &&
        (rc = uv_read_start((uv_stream_t *)&c->pipe, readbuf_alloc,
                            read_cb_)) == 0)
        c->reading = 1;
    if (rc < 0) {
        log_warn("conn.accept_error", "err=\"%s\"", uv_strerror(rc));
        conn_close_(c);
        return;
    }
    s->n_conns++;
    c->last_active = uv_now(ls->loop);
    check_peer_(s, c);
    conn_cap_(s, c);
    log_debug("conn.open", "conn=%lu", c->id);
}

/* ------------------------------------------------------------------ access */

/* The user's name for messages ("?" unknown). May consult NSS: called for
 * refused connections only. */
static void user_name_(uid_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, len, "%s", pw.pw_name);
    else
        snprintf(buf, len, "?");
}

/* Whether the peer of fd (credentials cr) has group g, as its primary
 * group or a supplementary one: SO_PEERGROUPS (the groups it had when it
 * connected; Linux 4.13), else the user database's groups of cr->uid. */
static int peer_in_group_(int fd, const struct ucred *cr, gid_t g)
{
    if (cr->gid == g) return 1;
#ifdef SO_PEERGROUPS
    gid_t buf[64], *v = buf;
    socklen_t len = sizeof buf;
    int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, v, &len);
    if (rc != 0 && errno == ERANGE && (v = malloc(len)) != NULL)
        rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, v, &len);
    if (rc == 0) {
        int in = 0;
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
            if (v[i] == g) in = 1;
        if (v != buf) free(v);
        return in;
    }
    if (v && v != buf) free(v);
#endif
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwuid_r(cr->uid, &pw, tmp, sizeof tmp, &res) != 0 || !res)
        return 0;
    gid_t groups[256];
    int ng = 256;
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &ng) < 0) return 0;
    for (int i = 0; i < ng; i++)
        if (groups[i] == g) return 1;
    return 0;
}

/* A new connection's rights from its peer's credentials (SO_PEERCRED,
 * taken by the kernel at connect): root and m6d's own user everything;
 * members of the group everything, or only reads (group_read_only);
 * anyone else is refused at its first request, which names the uid
 * (handlers_dispatch), and logged here. */
static void check_peer_(server *s, conn *c)
{
    uv_os_fd_t fd;
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0) {
        int e = errno;
        snprintf(c->sess.denied, sizeof c->sess.denied, "permission denied: "
                 "m6d cannot read this connection's credentials "
                 "(SO_PEERCRED: %s)", strerror(e));
        log_warn("conn.refused", "conn=%lu err=\"SO_PEERCRED: %s\"", c->id,
                 strerror(e));
        return;
    }
    c->sess.peer_uid = (unsigned)cr.uid;
    if (cr.uid == 0 || cr.uid == geteuid()) {
        c->privileged = 1;
        return;
    }
    if (peer_in_group_(fd, &cr, s->group)) {
        c->sess.read_only = s->group_read_only;
        log_debug("conn.peer", "conn=%lu uid=%u group=%s read_only=%d", c->id,
                  (unsigned)cr.uid, s->group_name, s->group_read_only);
        return;
    }
    char name[64];
    user_name_(cr.uid, name, sizeof name);
    snprintf(c->sess.denied, sizeof c->sess.denied, "permission denied: uid "
             "%u (%s) may not use this m6d: it serves root, its own user "
             "(uid %u) and the members of group %s (gid %u)",
             (unsigned)cr.uid, name, (unsigned)geteuid(), s->group_name,
             (unsigned)s->group);
    log_warn("conn.refused", "conn=%lu uid=%u gid=%u pid=%d user=%s "
             "group=%s msg=\"not root, m6d's user or a member of the group\"",
             c->id, (unsigned)cr.uid, (unsigned)cr.gid, (int)cr.pid, name,
             s->group_name);
}

/* The socket m6d bound: group-owned by the group (0660 is set by the
 * caller); its directory, when it is m6d's state dir, 02750 and the
 * group's, so that members reach the socket, what m6d creates there
 * (m6.db, runs/ and the checkpoints) is the group's too (setgid: members
 * read what its modes let the group read), and no one else lists or
 * enters the directory. Another directory is the operator's: a warning
 * when it is looser than 0750. 0, or -1 with err. */
static int socket_group_(server *s, char *err, size_t errlen)
{
    struct stat ss;
    if (stat(s->path, &ss) == 0 && ss.st_gid != s->group &&
        chown(s->path, (uid_t)-1, s->group) < 0) {
        snprintf(err, errlen, "cannot give the socket %s to group %s (gid "
                 "%u): %s; m6d's user (uid %u) must be a member of it (the "
                 "unit's Group=)", s->path, s->group_name, (unsigned)s->group,
                 strerror(errno), (unsigned)geteuid());
        return -1;
    }
    return 0;
}

static int secure_socket_(server *s, const server_config *cfg, char *err,
                          size_t errlen)
{
    if (socket_group_(s, err, errlen) < 0) return -1;
    char dir[sizeof s->path];
    snprintf(dir, sizeof dir, "%s", s->path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    char rd[PATH_MAX], rs[PATH_MAX];
    int own = cfg->state_dir && realpath(dir, rd) &&
              realpath(cfg->state_dir, rs) && strcmp(rd, rs) == 0;
    struct stat sb;
    if (stat(dir, &sb) < 0) return 0;
    if (own && sb.st_uid == geteuid()) {
        if ((sb.st_gid != s->group && chown(dir, (uid_t)-1, s->group) < 0) ||
            ((sb.st_mode & 07777) != 02750 && chmod(dir, 02750) < 0)) {
            snprintf(err, errlen, "cannot make the state dir %s mode 02750, "
                     "group %s: %s", dir, s->group_name, strerror(errno));
            return -1;
        }
        if ((sb.st_mode & 07777) != 02750)
            log_info("server.dir", "dir=%s old_mode=%04o mode=2750 group=%s",
                     dir, (unsigned)(sb.st_mode & 07777), s->group_name);
    } else if (sb.st_mode & 0027) {
        log_warn("server.dir", "dir=%s mode=%04o msg=\"the socket's directory "
                 "is looser than 0750; the socket itself is 0660 and each "
                 "connection is checked (SO_PEERCRED)\"", dir,
                 (unsigned)(sb.st_mode & 07777));
    }
    return 0;
}

/* ---------------------------------------------------------------- listener */

/* A socket file that nobody answers on is stale: remove it. One that
 * answers belongs to a running m6d: refuse to start. */
static int clear_stale_(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    if (lstat(path, &sb) < 0) return 0;
    if (!S_ISSOCK(sb.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int live = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (fd >= 0) close(fd);
    if (live) {
        snprintf(err, errlen, "%s: another m6d is listening there", path);
        return -1;
    }
    unlink(path);
    return 0;
}

static void free_handle_(uv_handle_t *h) { free(h); }

/* Bind a socket to s->path (no file there: clear_stale_ first), mode 0660
 * whatever the umask, group-owned, open it in p and listen. Bound here,
 * not by uv_pipe_bind: libuv unlinks a path it bound when the handle
 * closes, which would remove a socket bound there since (another m6d's,
 * or this one's newer one). Records the file's identity for path_check_.
 * 0, or -1 with err. */
static int bind_path_(server *s, uv_pipe_t *p, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", s->path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    mode_t old = umask(0117);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0) {
        snprintf(err, errlen, "bind %s: %s", s->path, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat sb;
    if (lstat(s->path, &sb) == 0) {
        s->path_dev = sb.st_dev;
        s->path_ino = sb.st_ino;
    }
    s->own_path = 1;
    if ((rc = uv_pipe_open(p, fd)) < 0) {
        snprintf(err, errlen, "uv_pipe_open %s: %s", s->path, uv_strerror(rc));
        close(fd);
        return -1;
    }
    if (chmod(s->path, 0660) < 0) {
        snprintf(err, errlen, "chmod %s: %s", s->path, strerror(errno));
        return -1;
    }
    if (socket_group_(s, err, errlen) < 0) return -1;
    rc = uv_listen((uv_stream_t *)p, 64, on_connection_);
    if (rc < 0) {
        snprintf(err, errlen, "listen %s: %s", s->path, uv_strerror(rc));
        return -1;
    }
    return 0;
}

/* Whether the file at s->path is still the socket m6d bound. */
static int path_ours_(const server *s)
{
    struct stat sb;
    return lstat(s->path, &sb) == 0 && sb.st_dev == s->path_dev &&
           sb.st_ino == s->path_ino;
}

/* Every PATH_CHECK_MS: a socket file removed (by hand, or by a cleaner of
 * /tmp or /run) leaves m6d serving the connections it has and reachable by
 * no one else. m6d then binds the path again, on a new socket, and says
 * so; the old one stays open for what is already queued on it. A path
 * that now holds something else (a file, or a socket another process
 * answers on) is left alone, logged once. */
static void path_check_(uv_timer_t *t)
{
    server *s = t->data;
    if (s->stopping || path_ours_(s)) return;
    char err[512];
    uv_pipe_t *p = NULL;
    if (clear_stale_(s->path, err, sizeof err) < 0) goto fail;
    p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    int rc = uv_pipe_init(t->loop, p, 0);
    if (rc < 0) {
        free(p);
        p = NULL;
        snprintf(err, sizeof err, "uv_pipe_init: %s", uv_strerror(rc));
        goto fail;
    }
    p->data = s;
    if (bind_path_(s, p, err, sizeof err) < 0) goto fail;
    if (s->relisten) uv_close((uv_handle_t *)s->relisten, free_handle_);
    s->relisten = p;
    s->path_warned = 0;
    log_warn("server.socket_restored", "socket=%s msg=\"the socket file was "
             "removed or replaced; m6d listens there again\"", s->path);
    return;
fail:
    if (p) {
        if (path_ours_(s)) unlink(s->path);
        uv_close((uv_handle_t *)p, free_handle_);
    }
    if (!s->path_warned)
        log_warn("server.socket_lost", "socket=%s msg=\"the socket file was "
                 "removed or replaced and m6d cannot listen there again: %s; "
                 "it tries every %d s\"", s->path, err, PATH_CHECK_MS / 1000);
    s->path_warned = 1;
}

/* Stop watching the path, the idle sweep, and close the relisten socket
 * (drain, fini). */
static void path_watch_close_(server *s)
{
    if (s->idle_timer) {  /* the idle sweep: no connection to sweep now */
        uv_close((uv_handle_t *)s->idle_timer, free_handle_);
        s->idle_timer = NULL;
    }
    if (s->path_timer) {
        uv_close((uv_handle_t *)s->path_timer, free_handle_);
        s->path_timer = NULL;
    }
    if (s->relisten) {
        uv_close((uv_handle_t *)s->relisten, free_handle_);
        s->relisten = NULL;
    }
}

static void listener_closed_(uv_handle_t *h)
{
    free((server *)h);
}

/* server_drain's close of the listener: free the server only if
 * server_fini has already been called. */
static void listener_drained_(uv_handle_t *h)
{
    server *s = (server *)h;
    s->listener_closing = 0;
    if (s->free_on_close) free(s);
}

/* A repeating timer of the server's (data: s) calling cb every `every`
 * ms, unref'd so that it alone keeps no loop alive. NULL out of memory. */
static uv_timer_t *sweep_timer_(server *s, uv_loop_t *loop, uv_timer_cb cb,
                                uint64_t every)
{
    uv_timer_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    uv_timer_init(loop, t);
    t->data = s;
    uv_timer_start(t, cb, every, every);
    uv_unref((uv_handle_t *)t);
    return t;
}

server *server_init(const server_config *cfg, char *err, size_t errlen)
{
    server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->handlers = cfg->handlers;
    s->group = cfg->group;
    s->group_read_only = cfg->group_read_only;
    snprintf(s->group_name, sizeof s->group_name, "%s",
             cfg->group_name ? cfg->group_name : "?");
    UV_CHECK(uv_pipe_init(cfg->loop, &s->listener, 0), err, errlen);
    s->listener.data = s;
    s->listener_open = 1;
    if (cfg->listen_fd >= 0) {
        UV_CHECK(uv_pipe_open(&s->listener, cfg->listen_fd), err, errlen);
        snprintf(s->path, sizeof s->path, "fd %d", cfg->listen_fd);
    } else {
        if (strlen(cfg->socket_path) >= sizeof s->path) {
            snprintf(err, errlen, "%s: socket path too long (max %zu)",
                     cfg->socket_path, sizeof s->path - 1);
            goto fail;
        }
        snprintf(s->path, sizeof s->path, "%s", cfg->socket_path);
        if (clear_stale_(s->path, err, errlen) < 0) goto fail;
        if (bind_path_(s, &s->listener, err, errlen) < 0 ||
            secure_socket_(s, cfg, err, errlen) < 0)
            goto fail;
        s->path_timer = sweep_timer_(s, cfg->loop, path_check_, PATH_CHECK_MS);
        if (!s->path_timer) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    s->idle_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms
                                      : SERVER_IDLE_DEFAULT_MS;
    /* sweep at a tenth of the timeout: closed within 1.1x of it */
    s->idle_timer = sweep_timer_(s, cfg->loop, idle_sweep_,
                                 s->idle_ms / 10 ? s->idle_ms / 10 : 1);
    if (!s->idle_timer) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (cfg->listen_fd >= 0)
        UV_CHECK(uv_listen((uv_stream_t *)&s->listener, 64, on_connection_),
                 err, errlen);
    log_info("server.listen", "socket=%s group=%s%s", s->path, s->group_name,
             s->group_read_only ? " group_read_only=1" : "");
    return s;
fail:
    server_fini(s);
    return NULL;
}

void server_drain(server *s)
{
    s->stopping = 1;
    path_watch_close_(s);
    /* no new connection: a client now gets "connection refused", as from
     * an m6d that is gone (watch reconnects); the path stays until
     * server_fini so that the next m6d finds it stale */
    if (s->listener_open) {
        s->listener_open = 0;
        s->listener_closing = 1;
        uv_close((uv_handle_t *)&s->listener, listener_drained_);
    }
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->busy) {  /* its reply is sent, then it closes (after_work_) */
            conn_read_stop_(c);
            c->drain_wait = 1;
            s->draining++;
        } else {
            conn_close_(c);
        }
    }
}

int server_draining(const server *s) { return s->draining; }

void server_fini(server *s)
{
    if (!s) return;
    while (s->conns) conn_close_(s->conns);
    path_watch_close_(s);
    /* not a file that has replaced ours since */
    if (s->own_path && path_ours_(s)) unlink(s->path);
    if (s->listener_open) {
        s->listener_open = 0;
        uv_close((uv_handle_t *)&s->listener, listener_closed_);
    } else if (s->listener_closing) {
        s->free_on_close = 1;  /* listener_drained_ frees */
    } else {
        free(s);
    }
}
