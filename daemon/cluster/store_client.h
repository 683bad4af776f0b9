/*
 * store_client.h — an m6_store (dist/store.h) backed by the coordinator's
 * store service over TCP (coordinator.h): what the collectives' bootstrap
 * (Gloo's store, NCCL's unique id) uses on a worker node.
 *
 * Each connection is TLS keyed by the token (tls.h) and opens with a
 * StoreOpen (the run and generation: keys of other runs or generations
 * are not seen; this node's id, secret and rank: a rank sets only its own
 * keys, coordinator.h). A call
 * takes a connection of its own for its duration (an idle one, else a new
 * one; up to 8 idle ones are kept), so calls from several threads (Gloo
 * calls from its own) run side by side: a get waiting for a key never
 * holds up the thread that is to set it. I/O is blocking with poll()
 * deadlines, never on the m6d loop. A get/wait waits on the coordinator,
 * which answers when the keys are set or with STATUS_TIMEOUT at
 * timeout_ms; the client allows io_timeout_ms more for the answer.
 *
 * Errors (dist/store.h's contract): M6_EINTERNAL for a coordinator that
 * cannot be reached or stops answering, naming its address and how long
 * it was tried ("rendezvous store at 127.0.0.1:7070: cannot connect:
 * connection refused (tried for 2.0 s)"); M6_ECANCELLED for a key not set
 * in time, naming the key and the time waited; M6_EINVALID for a key or
 * value over the limits. A kept connection that broke between calls is
 * replaced by a new one, once, at the next call.
 */
#ifndef M6_CLUSTER_STORE_CLIENT_H
#define M6_CLUSTER_STORE_CLIENT_H

#include <stdint.h>

#include "cluster/cluster.h"
#include "common/err.h"
#include "dist/store.h"

/* Who opens the store (StoreOpen; coordinator.h): this node's id and
 * secret, and the rank it writes as. */
typedef struct {
    char node_uuid[33];
    uint8_t secret[CLUSTER_SECRET_LEN];
    int rank;
} m6_store_who;

/* This node's who for rank: its id and secret from state_dir (node-id,
 * node-secret; cluster.h). 0, or -1 with err (no secret yet: the node has
 * not joined, or the coordinator's was not made). */
int m6_store_who_load(const char *state_dir, int rank, m6_store_who *who,
                      char *err, size_t errlen);

/* Connect to the coordinator at addr ("HOST:PORT"), retrying a refused
 * connect until io_timeout_ms has passed, and open the namespace (run_id,
 * generation) as who (copied). Fills *out (free with m6_store_tcp_close).
 * 0, or -1 with *err. */
int m6_store_tcp_open(const char *addr, const cluster_token *token,
                      const m6_store_who *who, int64_t run_id,
                      int64_t generation, int io_timeout_ms, m6_store *out,
                      m6_err *err);

/* Close the connections and free the store's context (no call may be in
 * flight); s->ctx NULL after. */
void m6_store_tcp_close(m6_store *s);

#endif /* M6_CLUSTER_STORE_CLIENT_H */
