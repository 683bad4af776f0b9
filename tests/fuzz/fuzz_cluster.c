/*
 * fuzz_cluster.c — libFuzzer target: the coordinator's TCP port
 * (daemon/cluster/coordinator.c) behind its TLS (daemon/cluster/tls.h):
 * the node registry's NodeJoin, heartbeats and NodeLeave, and the
 * rendezvous store's StoreOpen, set, get and wait.
 *
 * The input is the plaintext one authenticated peer sends on one
 * connection once the TLS handshake (the real one, keyed by the token's
 * PSK) is done: its first frame and whatever follows. A coordinator
 * listens on loopback, on a libuv loop in a thread of its own, over a
 * state DB in a temp dir in which the coordinator's own node has a fixed
 * node id and secret (FUZZ_SELF_UUID, FUZZ_SELF_SECRET: the seed corpus's
 * StoreOpens, gen_cluster_corpus.py, carry them, so the fuzzer starts
 * past the first frame). Each input: connect, handshake, write the input
 * in chunks of varying size (1, 7, 64, 3, 4096 bytes, in turn, as TLS
 * records), then read what comes back until the coordinator closes the
 * connection or is silent for IDLE_MS.
 *
 * Beyond "no crash, no sanitizer report": the handshake must succeed, and
 * every reply must be one whole frame that decodes as m6.Response, with a
 * non-empty message when its status is not OK. A violation aborts.
 * Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <uv.h>

#include "cluster/coordinator.h"
#include "cluster/tls.h"
#include "common/log.h"
#include "fuzz_util.h"
#include "proto/frame.h"
#include "m6.pb-c.h"
#include "state/state.h"

#define FUZZ_SELF_UUID "f00d0000000000000000000000000001"
#define FUZZ_SELF_SECRET_BYTE 0x42
#define FUZZ_TOKEN "fuzz-token-0123456789abcdef"
enum { IDLE_MS = 20 };

static char dir_[512];
static state *st_;
static cluster_token token_;
static SSL_CTX *client_;
static uv_loop_t loop_;
static pthread_t thread_;
static int port_;

static void *loop_main_(void *arg)
{
    (void)arg;
    uv_run(&loop_, UV_RUN_DEFAULT);
    return NULL;
}

static void die_(const char *what)
{
    fprintf(stderr, "fuzz_cluster: %s\n", what);
    abort();
}

static void setup_(void)
{
    char err[600], path[700];
    signal(SIGPIPE, SIG_IGN);
    log_set_level(LOG_ERROR);  /* every refusal logs a warning */
    snprintf(dir_, sizeof dir_, "%s/fuzz-cluster.XXXXXX", fuzz_tmpdir());
    if (!mkdtemp(dir_)) die_("mkdtemp");
    snprintf(path, sizeof path, "%s/token", dir_);
    if (fuzz_write_file(path, FUZZ_TOKEN, strlen(FUZZ_TOKEN)) < 0 ||
        chmod(path, 0600) < 0 ||
        cluster_token_load(path, &token_, err, sizeof err) < 0)
        die_("token");
    snprintf(path, sizeof path, "%s/m6.db", dir_);
    if (!(st_ = state_open(path, err, sizeof err))) die_(err);
    uint8_t secret[CLUSTER_SECRET_LEN];
    char hex[65];
    memset(secret, FUZZ_SELF_SECRET_BYTE, sizeof secret);
    cluster_secret_hash(secret, sizeof secret, hex);
    cluster_facts f = {0};
    snprintf(f.hostname, sizeof f.hostname, "coordinator");
    snprintf(f.backend, sizeof f.backend, "cpu");
    if (cluster_self_register(st_, &f, FUZZ_SELF_UUID, hex, err,
                              sizeof err) < 0)
        die_(err);
    uv_loop_init(&loop_);
    cluster_coord_config cc = {.loop = &loop_, .st = st_,
                               .listen = "127.0.0.1:0", .token = &token_,
                               .timeout_ms = 2000};
    cluster_coord *co = cluster_coord_init(&cc, err, sizeof err);
    if (!co) die_(err);
    port_ = cluster_coord_port(co);
    if (!(client_ = cluster_tls_ctx(&token_, 0, err, sizeof err))) die_(err);
    if (pthread_create(&thread_, NULL, loop_main_, NULL) != 0) die_("thread");
    /* the loop thread runs for the process's life; the temp dir stays
     * for run.sh's scratch dir to take away */
}

static int connect_(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port_),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        die_("connect to the coordinator");
    int one = 1;  /* the small records go out at once, as m6d's do */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Every whole frame in buf[0..n) a Response with a message when not OK;
 * returns the bytes used. */
static size_t check_replies_(const uint8_t *buf, size_t n)
{
    size_t pos = 0;
    while (n - pos >= 4) {
        uint32_t len = (uint32_t)buf[pos] << 24 | (uint32_t)buf[pos + 1] << 16 |
                       (uint32_t)buf[pos + 2] << 8 | buf[pos + 3];
        if (len > M6_FRAME_MAX) die_("a reply frame over the limit");
        if (n - pos - 4 < len) break;
        M6__Response *r = m6__response__unpack(NULL, len, buf + pos + 4);
        if (!r) die_("a reply that does not decode as m6.Response");
        if (r->status != M6__STATUS__STATUS_OK &&
            !(r->message && r->message[0]))
            die_("a refusal without a message");
        m6__response__free_unpacked(r, NULL);
        pos += 4 + len;
    }
    return pos;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!client_) setup_();
    int fd = connect_();
    SSL *ssl = SSL_new(client_);
    if (!ssl || !SSL_set_fd(ssl, fd) || SSL_connect(ssl) != 1)
        die_("the TLS handshake with the token's PSK failed");
    static const size_t chunks[] = {1, 7, 64, 3, 4096};
    size_t off = 0;
    int ok = 1;
    for (unsigned i = 0; off < size && ok; i++) {
        size_t n = chunks[i % 5] < size - off ? chunks[i % 5] : size - off;
        ok = SSL_write(ssl, data + off, (int)n) == (int)n;  /* closed: stop */
        off += n;
    }
    /* the replies, until closed or silent */
    static uint8_t buf[M6_FRAME_MAX / 4];
    size_t have = 0;
    for (;;) {
        if (SSL_pending(ssl) == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, IDLE_MS) <= 0) break;
        }
        if (have == sizeof buf) break;  /* a store value of up to 1 MiB fits */
        int r = SSL_read(ssl, buf + have, (int)(sizeof buf - have));
        if (r <= 0) {
            int e = SSL_get_error(ssl, r);
            if (e == SSL_ERROR_WANT_READ) continue;
            break;
        }
        have += (size_t)r;
        size_t used = check_replies_(buf, have);
        memmove(buf, buf + used, have - used);
        have -= used;
    }
    ERR_clear_error();
    SSL_free(ssl);
    close(fd);
    return 0;
}
