/*
 * store_client.h — an m6_store (dist/store.h) backed by the coordinator's
 * store service over TCP (coordinator.h): what the collectives' bootstrap
 * (Gloo's store, NCCL's unique id) uses on a worker node.
 *
 * One TCP connection per store, opened with a StoreOpen (the token, the run
 * and generation: keys of other runs or generations are not seen). Calls
 * are serialized by a mutex (Gloo calls from its own threads) and use
 * blocking I/O with poll() deadlines, never the m6d loop. A get/wait
 * waits on the coordinator, which answers when the keys are set or with
 * STATUS_TIMEOUT at timeout_ms; the client allows io_timeout_ms more for
 * the answer to come back.
 *
 * Errors (dist/store.h's contract): M6_EINTERNAL for a coordinator that
 * cannot be reached or stops answering, naming its address and how long
 * it was tried ("rendezvous store at 127.0.0.1:7070: cannot connect:
 * connection refused (tried for 2.0 s)"); M6_ECANCELLED for a key not set
 * in time, naming the key and the time waited; M6_EINVALID for a key or
 * value over the limits. A connection that breaks between calls is opened
 * again once, at the next call.
 */
#ifndef M6_CLUSTER_STORE_CLIENT_H
#define M6_CLUSTER_STORE_CLIENT_H

#include <stdint.h>

#include "cluster/cluster.h"
#include "common/err.h"
#include "dist/store.h"

/* Connect to the coordinator at addr ("HOST:PORT"), retrying a refused
 * connect until io_timeout_ms has passed, and open the namespace (run_id,
 * generation). Fills *out (free with m6_store_tcp_close). 0, or -1 with
 * *err. */
int m6_store_tcp_open(const char *addr, const cluster_token *token,
                      int64_t run_id, int64_t generation, int io_timeout_ms,
                      m6_store *out, m6_err *err);

/* Close the connection and free the store's context; out->ctx NULL after. */
void m6_store_tcp_close(m6_store *s);

#endif /* M6_CLUSTER_STORE_CLIENT_H */
