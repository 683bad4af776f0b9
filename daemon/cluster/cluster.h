/*
 * cluster.h — what the coordinator's TCP side (coordinator.h), the worker's
 * join (join.h) and the store client (store_client.h) share: HOST:PORT
 * addresses, the cluster's shared token, this node's facts (hostname,
 * backend, devices, memory) and its stable node id.
 *
 * Time units: milliseconds unless a name says otherwise.
 */
#ifndef M6_CLUSTER_H
#define M6_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

/* Defaults: a node silent this long is lost; it heartbeats at a third of
 * it. The first frame of a TCP peer must arrive within
 * CLUSTER_AUTH_TIMEOUT_MS (or the node timeout, if shorter). */
#define CLUSTER_TIMEOUT_MS_DEFAULT 30000
#define CLUSTER_AUTH_TIMEOUT_MS 5000
/* The first frame of a TCP peer (a NodeJoin or StoreOpen) is small: a
 * larger declared length is refused before anything is buffered. */
#define CLUSTER_FIRST_FRAME_MAX (64u * 1024u)
/* Shortest token accepted (bytes, after the trailing newline is cut). */
#define CLUSTER_TOKEN_MIN 16
#define CLUSTER_TOKEN_MAX 4096

/* "HOST:PORT", "[V6]:PORT": host into host (no brackets), port 0..65535
 * (0 only when allow_zero: the coordinator's "any free port").
 * 0, or -1 with err naming the text and what is wrong. */
int cluster_parse_addr(const char *text, int allow_zero, char *host,
                       size_t hostlen, int *port, char *err, size_t errlen);

#define CLUSTER_PSK_LEN 32

/* The shared token: the file's bytes less one trailing newline, and the
 * control channel's TLS pre-shared key derived from them (tls.h):
 * HKDF-SHA256 (RFC 5869) with salt CLUSTER_PSK_SALT, info
 * CLUSTER_PSK_INFO, 32 bytes. The token never crosses the wire; the PSK
 * only keys the handshake. */
#define CLUSTER_PSK_SALT "m6 cluster token"
#define CLUSTER_PSK_INFO "m6 tls13 external psk v1"
typedef struct {
    uint8_t raw[CLUSTER_TOKEN_MAX];
    size_t len;
    uint8_t sha256[32];
    uint8_t psk[CLUSTER_PSK_LEN];
} cluster_token;

/* Read the token file (and derive its PSK). Refused (-1, err names the path and why): a file
 * any other user may read (mode & 0004: "mode 0644 lets every user read
 * it: chmod 600 PATH"), not a regular file, empty or shorter than
 * CLUSTER_TOKEN_MIN, longer than CLUSTER_TOKEN_MAX. */
int cluster_token_load(const char *path, cluster_token *t, char *err,
                       size_t errlen);

/* 1 when the n bytes at p are the token, else 0. Constant time in the
 * content of both: SHA-256 of each, compared with OpenSSL's CRYPTO_memcmp,
 * so neither the length nor a common prefix shows in the time taken. */
int cluster_token_matches(const cluster_token *t, const void *p, size_t n);

/* What a node tells the coordinator about itself (NodeJoin). */
typedef struct {
    char hostname[256];
    char backend[16];            /* "cpu" or "cuda" */
    int devices;                 /* the ranks this node runs, one a device:
                                  * m6d --devices; else every visible GPU
                                  * of a cuda node in a cluster, or 1 (a
                                  * single cuda m6d; the host on cpu) */
    uint64_t memory;             /* host memory (MemTotal), bytes */
    uint64_t free_device_memory; /* bytes: CUDA free memory over devices;
                                  * MemAvailable, capped by m6d's cgroup
                                  * memory limit, for cpu */
    char gemm[64];               /* the CPU engine's GEMM, "LIBRARY ISA"
                                  * ("onednn avx512_core_bf16"); set by
                                  * m6d from gemm_describe (kernels.h),
                                  * "" unknown */
} cluster_facts;

/* Where a run's ranks go: node by node, in the order given (the
 * coordinator first, then the live workers by node id), each node taking
 * its next min(slots[i], what is left) ranks, so a node's local ranks are
 * contiguous: first[i] .. first[i] + count[i] - 1 (count 0: none). slots[i]
 * is how many ranks node i runs (its --devices; < 1 counts as 1).
 * Returns the number of nodes that take ranks (the nodes after them take
 * none) when the n nodes hold world ranks or more, else 0; *have (may be
 * NULL) is their slots in all. world >= 1. */
int cluster_ranks_place(const int *slots, int n, int world, int *first,
                        int *count, int *have);

/* The CPU threads each of a node's local ranks gets: its share of the
 * node's, node_share_split(total, local_ranks) (total: --threads, else
 * cpus_available). */
int cluster_rank_threads(int total, int local_ranks);

/* How a node reads its GPUs: count() the visible CUDA devices (0: none
 * or no CUDA), free_bytes(d) device d's free memory now (bytes). m6d sets
 * it from its engine (trainer_cuda_devices) before cluster_facts_get:
 * this library links no CUDA. Unset, every node is cpu. */
typedef struct {
    int (*count)(void);
    uint64_t (*free_bytes)(int device);
} cluster_gpus;
void cluster_set_gpus(const cluster_gpus *g);

/* Fill f for this machine; name overrides gethostname() when non-empty.
 * CUDA is reported when cluster_set_gpus' count sees a device.
 * measure_free 0: free_device_memory is left 0 (not measured) on CUDA,
 * where measuring it opens a CUDA context on every device (hundreds of
 * MiB each): a single m6d does not, a coordinator or worker does. */
void cluster_facts_get(cluster_facts *f, const char *name, int measure_free);
/* The free device memory now, as in cluster_facts (for heartbeats). */
uint64_t cluster_free_device_memory(const cluster_facts *f);

/* This node's id: 32 hex digits kept in STATE_DIR/node-id, made (random,
 * from getrandom) at the first start. 0, or -1 with err. */
int cluster_node_uuid(const char *state_dir, char out[33], char *err,
                      size_t errlen);

/* A node's secret: random bytes the coordinator issues a node id at its
 * first join (coordinator.h), kept in STATE_DIR/node-secret (mode 0600)
 * and presented at every later join; the coordinator keeps only its
 * SHA-256. */
#define CLUSTER_SECRET_LEN 32

/* The SHA-256 of n bytes at p, as 64 lowercase hex digits. */
void cluster_secret_hash(const void *p, size_t n, char hex[65]);

/* Read STATE_DIR/node-secret into out (CLUSTER_SECRET_LEN bytes): 0 read,
 * 1 none yet (no file), -1 with err (unreadable, the wrong size, or a mode
 * that lets others read it). */
int cluster_node_secret_load(const char *state_dir,
                             uint8_t out[CLUSTER_SECRET_LEN], char *err,
                             size_t errlen);
/* Write it (mode 0600, to a temporary name, fsync'd, then renamed). 0, or
 * -1 with err. */
int cluster_node_secret_save(const char *state_dir,
                             const uint8_t s[CLUSTER_SECRET_LEN], char *err,
                             size_t errlen);

/* The coordinator's own secret (its store client is rank 0): read
 * STATE_DIR/node-secret, or make one (getrandom) and save it there; its
 * hash into hex. 0, or -1 with err. */
int cluster_node_secret_ensure(const char *state_dir, char hex[65],
                               char *err, size_t errlen);

#endif /* M6_CLUSTER_H */
