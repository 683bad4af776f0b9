/*
 * handlers.h — one handler per request type of proto/m6.proto. The server
 * hands over each complete frame; handlers_dispatch checks everything before
 * dispatch (decodes, Hello first, protocol version, known request type,
 * sizes, run references) and produces exactly one Response frame.
 */
#ifndef M6_HANDLERS_H
#define M6_HANDLERS_H

#include <stddef.h>
#include <stdint.h>

#include "runner/runner.h"
#include "http/stats.h"
#include "state/state.h"

typedef struct {
    state *st;
    runner *runner;
    http_stats *stats;  /* counts each request by type and status for
                         * /metrics; NULL none */
    /* nodes (daemon/cluster): the coordinator's address when this m6d is
     * a worker (--join), whose `m6ctl nodes` is refused pointing there;
     * NULL for a coordinator or a single m6d */
    const char *cluster_join;
} handlers_ctx;

/* Per-connection protocol state. */
typedef struct {
    int hello_done;
    int gone;  /* set (atomically) by the server when the connection closes
                * or m6d stops: a submit still being checked is dropped */
    /* access (server.c, from the peer's SO_PEERCRED): denied[0] != 0: every
     * request is refused with STATUS_PERMISSION_DENIED and this message,
     * and the connection closed; read_only: only the read requests
     * (handlers_is_read) are served, the others refused the same way. */
    int read_only;
    char denied[320];
    unsigned peer_uid;  /* for the read-only refusal's message */
    /* protocol refusals in a row (unknown request type, request before
     * Hello): at HANDLERS_PROTOCOL_REFUSALS_MAX the connection is closed
     * with the last reply, so a peer sending garbage that decodes (e.g.
     * zero bytes: empty frames) gets a few replies, not one per frame */
    int protocol_refusals;
} session;

#define HANDLERS_PROTOCOL_REFUSALS_MAX 8

/* Handle one frame payload. Runs on libuv's thread pool (server.c), so
 * handlers for different connections run concurrently: they touch only the
 * session of their own connection and the thread-safe state_* and runner_*
 * calls. Returns a malloc'd frame (header included) in
 * *out and *outlen; *close_after tells the server to close the connection once
 * the reply is written. Returns -1 only when no reply could be built (OOM). */
int handlers_dispatch(handlers_ctx *h, session *s, const uint8_t *payload,
                      size_t len, uint8_t **out, size_t *outlen,
                      int *close_after);

/* Whether a payload is a request that may take long (Submit reads the
 * whole corpus; Plan; Resume waits for the runner; Metrics reads and packs
 * a page of up to 10000 rows) and so runs on the thread pool; the others
 * are answered on the event loop at once. */
int handlers_is_slow(const uint8_t *payload, size_t len);

/* Whether a request type (M6__Request body case) only reads: those marked
 * read in handlers.c's table (hello, list, status, metrics, plan, events,
 * checkpoints, nodes), what a --group-read-only member may send; any other
 * (submit, pause, resume, delink, stop, and every type added later until
 * marked) changes m6d's state. */
int handlers_is_read(int body_case);

/* A reply frame carrying only a status and message (for framing errors
 * found before a payload exists, e.g. an oversized length). */
uint8_t *handlers_error_frame(int status, const char *message, size_t *outlen);

#endif /* M6_HANDLERS_H */
