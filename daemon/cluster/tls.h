/*
 * tls.h — the cluster's control channel (coordinator.h, join.h,
 * store_client.h) inside TLS 1.3 with an external pre-shared key: OpenSSL,
 * no certificates, one cipher suite (TLS_AES_128_GCM_SHA256), the key
 * exchanged with (EC)DHE under the PSK (psk_dhe_ke: forward secrecy).
 *
 * The PSK is cluster_token.psk (cluster.h: HKDF-SHA256 of the token file),
 * so the token itself never crosses the wire and both ends prove that
 * they hold it: a peer without it cannot finish the handshake, whichever
 * side it plays (a worker refuses a listener that is not the coordinator,
 * the coordinator a client without the token). No session tickets are
 * issued: every connection runs a full handshake.
 *
 * Two drivers: a non-blocking one over memory BIOs for m6d's libuv streams
 * (cluster_tls_*: the caller moves ciphertext between the socket and the
 * BIOs), and blocking sockets with poll deadlines in store_client.c (the
 * SSL object on the fd, SSL_set_fd). Writes on a socket of the latter may
 * raise SIGPIPE: its callers ignore SIGPIPE (m6d does, main.c).
 */
#ifndef M6_CLUSTER_TLS_H
#define M6_CLUSTER_TLS_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "cluster/cluster.h"
#include "proto/frame.h"

/* The PSK's identity in the ClientHello (public: the key is the secret). */
#define CLUSTER_TLS_IDENTITY "m6-cluster-psk-v1"

/* An SSL_CTX for the control channel with the PSK of t (copied: t may go
 * away afterwards): server 1 for the coordinator's listener, 0 for a
 * client (a worker's join, a store client). Free with cluster_tls_ctx_free.
 * NULL with err (OpenSSL's reason) on failure. */
SSL_CTX *cluster_tls_ctx(const cluster_token *t, int server, char *err,
                         size_t errlen);
void cluster_tls_ctx_free(SSL_CTX *ctx);

/* OpenSSL's first queued error as text ("" none), the queue cleared. */
void cluster_tls_reason(char *out, size_t outlen);

/* One connection over memory BIOs. */
typedef struct {
    SSL *ssl;
    int handshaken;   /* the handshake finished */
} cluster_tls;

/* Start a connection on ctx (server as for cluster_tls_ctx). A client
 * queues its ClientHello at once: send cluster_tls_take_out's bytes.
 * 0, or -1 (out of memory). */
int cluster_tls_init(cluster_tls *t, SSL_CTX *ctx, int server);
void cluster_tls_free(cluster_tls *t);

typedef enum {
    CLUSTER_TLS_OK = 0,       /* fed; nothing wrong (the handshake may go on) */
    CLUSTER_TLS_CLOSED = 1,   /* the peer closed the TLS session */
    CLUSTER_TLS_FAILED = -1,  /* handshake or record failure: why says how */
} cluster_tls_result;

/* Take n ciphertext bytes from the socket: the handshake goes on, and once
 * it is done the plaintext goes into rd (the frames). Afterwards send what
 * cluster_tls_take_out holds (a handshake reply, an alert). */
cluster_tls_result cluster_tls_feed(cluster_tls *t, const void *p, size_t n,
                                    frame_reader *rd, char *why,
                                    size_t whylen);

/* Encrypt n plaintext bytes (after the handshake). 0, or -1. */
int cluster_tls_write(cluster_tls *t, const void *p, size_t n);

/* The ciphertext queued for the socket: *out a malloc'd buffer of *len
 * bytes (the caller sends and frees it), NULL when none. 0, or -1 (out of
 * memory). */
int cluster_tls_take_out(cluster_tls *t, uint8_t **out, size_t *len);

#endif /* M6_CLUSTER_TLS_H */
