/*
 * server.h — the control socket: a libuv Unix-socket listener, one session
 * per connection, frames handed to handlers_dispatch in order.
 */
#ifndef M6_SERVER_H
#define M6_SERVER_H

#include <stddef.h>
#include <uv.h>

#include "control/handlers.h"

typedef struct server server;

typedef struct {
    uv_loop_t *loop;
    const char *socket_path;  /* bind here (mode 0660) unless listen_fd >= 0 */
    int listen_fd;            /* inherited listening socket (systemd), or -1 */
    handlers_ctx *handlers;
    /* Who may drive m6d (each connection's SO_PEERCRED): root and m6d's
     * own uid everything; members of group (primary or supplementary
     * group of the peer) everything, or only the read requests
     * (handlers_is_read) with group_read_only; anyone else is refused
     * (STATUS_PERMISSION_DENIED naming the uid, logged). The socket m6d
     * binds is 0660 whatever the umask, group-owned by group; its
     * directory, when it is state_dir, is made 0750 and given to group. */
    gid_t group;              /* --group's gid, or m6d's egid */
    const char *group_name;   /* for messages */
    int group_read_only;      /* --group-read-only */
    const char *state_dir;    /* m6d's own directory (may be NULL) */
    /* A connection that sends nothing and awaits no reply for this long
     * is closed (--conn-idle-timeout); 0: SERVER_IDLE_DEFAULT_MS. */
    unsigned idle_timeout_ms;
} server_config;

/* Limits on connections, so that idle or hostile local peers cannot take
 * every descriptor or hold m6d's memory (docs/OPERATIONS.md, access):
 * at most SERVER_CONN_MAX connections; a peer that is neither root nor
 * m6d's user at most SERVER_CONN_MAX_PER_UID of them, with frames of at
 * most SERVER_FRAME_MAX_READ_ONLY bytes when it may only read; a refused
 * peer gets its refusal at its first byte, before any frame is buffered. */
#define SERVER_CONN_MAX 512
#define SERVER_CONN_MAX_PER_UID 32
#define SERVER_FRAME_MAX_READ_ONLY (64u * 1024u)
#define SERVER_IDLE_DEFAULT_MS (300u * 1000u)

server *server_init(const server_config *cfg, char *err, size_t errlen);
/* At shutdown, before server_fini: take no new connection or request;
 * close idle connections; a connection whose request is in flight (a
 * submit, plan or resume on the thread pool) gets its reply, then closes.
 * Run the loop until server_draining is 0. */
void server_drain(server *s);
/* Connections whose reply server_drain still awaits. */
int server_draining(const server *s);
/* Close the listener and every connection (memory freed in close callbacks,
 * so run the loop afterwards); unlink the socket if we created it. */
void server_fini(server *s);

#endif /* M6_SERVER_H */
