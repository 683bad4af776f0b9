/*
 * cluster.c — addresses, the shared token, node facts and the node id
 * (see cluster.h).
 */
#include "cluster/cluster.h"
#include "common/durable.h"
#include "common/memlimit.h"
#include "common/node_share.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

/* path replaced whole by n bytes of buf, mode `mode`: written to a fresh
 * temporary name beside it (mkstemp, never a planted link), fsynced, then
 * renamed over it, so a crash leaves the old file or the new one, never
 * half of either. 0, or -1 with err naming path and the cause. */
static int replace_file_(const char *path, const void *buf, size_t n,
                         unsigned mode, char *err, size_t errlen)
{
    char tmp[4300];
    int fd = create_temp_beside(path, mode, tmp, sizeof tmp, err, errlen);
    if (fd < 0) return -1;
    int ok = write_all_fd(fd, buf, n, tmp, err, errlen) == 0;
    int e = 0;
    if (ok && fsync(fd) != 0) ok = 0, e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(tmp);
        if (e) snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- address */

int cluster_parse_addr(const char *text, int allow_zero, char *host,
                       size_t hostlen, int *port, char *err, size_t errlen)
{
    const char *colon, *h = text;
    size_t hl;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':') goto bad;
        h = text + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (!colon) goto bad;
        hl = (size_t)(colon - text);
        if (memchr(text, ':', hl)) goto bad;  /* a bare IPv6 address */
    }
    if (hl == 0 || hl >= hostlen) goto bad;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || p < (allow_zero ? 0 : 1) || p > 65535) {
        snprintf(err, errlen, "\"%s\": port must be %d..65535", text,
                 allow_zero ? 0 : 1);
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
bad:
    snprintf(err, errlen, "\"%s\": want HOST:PORT (an IPv6 host in "
             "brackets: [::1]:7070)", text);
    return -1;
}

/* ------------------------------------------------------------------ token */

static void sha256_(const void *p, size_t n, uint8_t out[32])
{
    unsigned len = 32;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
        memset(out, 0, 32);  /* cannot happen with OpenSSL's own sha256 */
}

/* HKDF-SHA256 of the token into t->psk (cluster.h). 0, or -1. */
static int derive_psk_(cluster_token *t)
{
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t n = CLUSTER_PSK_LEN;
    int ok = k && EVP_PKEY_derive_init(k) > 0 &&
             EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_salt(k, (const unsigned char *)CLUSTER_PSK_SALT,
                                         (int)strlen(CLUSTER_PSK_SALT)) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(k, t->raw, (int)t->len) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(k, (const unsigned char *)CLUSTER_PSK_INFO,
                                         (int)strlen(CLUSTER_PSK_INFO)) > 0 &&
             EVP_PKEY_derive(k, t->psk, &n) > 0 && n == CLUSTER_PSK_LEN;
    EVP_PKEY_CTX_free(k);
    return ok ? 0 : -1;
}

int cluster_token_load(const char *path, cluster_token *t, char *err,
                       size_t errlen)
{
    memset(t, 0, sizeof *t);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    int rc = -1;
    if (fstat(fd, &sb) < 0) {
        snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "token file %s is not a regular file", path);
        goto out;
    }
    if (sb.st_mode & S_IROTH) {
        snprintf(err, errlen, "token file %s has mode %04o, which lets every "
                 "user read the cluster's token: chmod 600 %s (or 640 for a "
                 "group)", path, (unsigned)(sb.st_mode & 07777), path);
        goto out;
    }
    uint8_t buf[CLUSTER_TOKEN_MAX + 2];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf) break;
    }
    if (n > 0 && buf[n - 1] == '\n') n--;
    if (n > 0 && buf[n - 1] == '\r') n--;
    if (n > CLUSTER_TOKEN_MAX) {
        snprintf(err, errlen, "token file %s: longer than %d bytes", path,
                 CLUSTER_TOKEN_MAX);
        goto out;
    }
    if (n < CLUSTER_TOKEN_MIN) {
        snprintf(err, errlen, "token file %s: the token is %zu bytes; want "
                 "at least %d (e.g. openssl rand -hex 32 > %s)", path, n,
                 CLUSTER_TOKEN_MIN, path);
        goto out;
    }
    memcpy(t->raw, buf, n);
    t->len = n;
    sha256_(t->raw, t->len, t->sha256);
    if (derive_psk_(t) < 0) {
        snprintf(err, errlen, "token file %s: cannot derive the TLS key "
                 "(OpenSSL's HKDF failed)", path);
        goto out;
    }
    rc = 0;
out:
    close(fd);
    return rc;
}

int cluster_token_matches(const cluster_token *t, const void *p, size_t n)
{
    uint8_t d[32];
    sha256_(p, n, d);
    return t->len > 0 && CRYPTO_memcmp(d, t->sha256, sizeof d) == 0;
}

/* ------------------------------------------------------------------ facts */

static cluster_gpus gpus_;  /* set once, before any thread reads it */

void cluster_set_gpus(const cluster_gpus *g)
{
    gpus_ = *g;
}

void cluster_facts_get(cluster_facts *f, const char *name, int measure_free)
{
    memset(f, 0, sizeof *f);
    if (name && *name)
        snprintf(f->hostname, sizeof f->hostname, "%s", name);
    else if (gethostname(f->hostname, sizeof f->hostname - 1) != 0)
        snprintf(f->hostname, sizeof f->hostname, "localhost");
    uint64_t total = host_mem_meminfo("/proc/meminfo", "MemTotal");
    f->memory = total == UINT64_MAX ? 0 : total; /* 0: unknown */
    snprintf(f->backend, sizeof f->backend, "cpu");
    f->devices = 1;
    int n = gpus_.count ? gpus_.count() : 0;
    if (n > 0) {
        snprintf(f->backend, sizeof f->backend, "cuda");
        f->devices = n;
    }
    if (measure_free || strcmp(f->backend, "cpu") == 0)
        f->free_device_memory = cluster_free_device_memory(f);
}

uint64_t cluster_free_device_memory(const cluster_facts *f)
{
    if (strcmp(f->backend, "cuda") == 0 && gpus_.free_bytes) {
        uint64_t sum = 0;  /* over the devices this node's ranks use */
        for (int d = 0; d < f->devices; d++)
            sum += gpus_.free_bytes(d);
        return sum;
    }
    host_mem m;  /* MemAvailable, capped by m6d's cgroup memory limit */
    host_mem_available(&m);
    return m.avail == UINT64_MAX ? 0 : m.avail;
}

/* ---------------------------------------------------------------- node id */

static int is_uuid_(const char *s)
{
    if (strlen(s) != 32) return 0;
    for (int i = 0; i < 32; i++)
        if (!strchr("0123456789abcdef", s[i])) return 0;
    return 1;
}

int cluster_node_uuid(const char *state_dir, char out[33], char *err,
                      size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/node-id", state_dir);
    FILE *f = fopen(path, "re");
    if (f) {
        char buf[64] = "";
        int ok = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        buf[strcspn(buf, "\r\n")] = 0;
        if (ok && is_uuid_(buf)) {
            memcpy(out, buf, 33);
            return 0;
        }
        snprintf(err, errlen, "%s: not a node id (32 hex digits); remove it "
                 "to make a new one (the coordinator then sees a new node)",
                 path);
        return -1;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    /* written to a temporary name, then renamed: never half a node id */
    char line[40];
    int n = snprintf(line, sizeof line, "%s\n", out);
    return replace_file_(path, line, (size_t)n, 0640, err, errlen);
}

/* ------------------------------------------------------------ node secret */

void cluster_secret_hash(const void *p, size_t n, char hex[65])
{
    uint8_t d[32];
    sha256_(p, n, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

int cluster_node_secret_load(const char *state_dir,
                             uint8_t out[CLUSTER_SECRET_LEN], char *err,
                             size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/node-secret", state_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) return 1;
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    uint8_t buf[CLUSTER_SECRET_LEN + 1];
    ssize_t n = -1;
    int rc = -1;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
    } else if (sb.st_mode & 0077) {
        snprintf(err, errlen, "%s has mode %04o: the node's secret must be "
                 "readable by m6d's user only (chmod 600 %s)", path,
                 (unsigned)(sb.st_mode & 07777), path);
    } else if ((n = read(fd, buf, sizeof buf)) != CLUSTER_SECRET_LEN) {
        snprintf(err, errlen, "%s: %s", path, n < 0 ? strerror(errno)
                 : "not a node secret (the wrong size); remove it and the "
                   "node-id file to join as a new node");
    } else {
        memcpy(out, buf, CLUSTER_SECRET_LEN);
        rc = 0;
    }
    OPENSSL_cleanse(buf, sizeof buf);
    close(fd);
    return rc;
}

int cluster_node_secret_save(const char *state_dir,
                             const uint8_t s[CLUSTER_SECRET_LEN], char *err,
                             size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/node-secret", state_dir);
    return replace_file_(path, s, CLUSTER_SECRET_LEN, 0600, err, errlen);
}

int cluster_node_secret_ensure(const char *state_dir, char hex[65],
                               char *err, size_t errlen)
{
    uint8_t s[CLUSTER_SECRET_LEN];
    int r = cluster_node_secret_load(state_dir, s, err, errlen);
    if (r < 0) return -1;
    if (r == 1) {
        if (getrandom(s, sizeof s, 0) != (ssize_t)sizeof s) {
            snprintf(err, errlen, "getrandom: %s", strerror(errno));
            return -1;
        }
        if (cluster_node_secret_save(state_dir, s, err, errlen) < 0)
            return -1;
    }
    cluster_secret_hash(s, sizeof s, hex);
    OPENSSL_cleanse(s, sizeof s);
    return 0;
}

int cluster_ranks_place(const int *slots, int n, int world, int *first,
                        int *count, int *have)
{
    int next = 0, total = 0, used = 0;
    for (int i = 0; i < n; i++) {
        int k = slots[i] < 1 ? 1 : slots[i];
        total += k;
        int take = world - next < k ? world - next : k;
        if (take < 0) take = 0;
        first[i] = next;
        count[i] = take;
        next += take;
        if (take > 0) used = i + 1;
    }
    if (have) *have = total;
    return next >= world ? used : 0;
}

int cluster_rank_threads(int total, int local_ranks)
{
    return node_share_split(total, local_ranks);
}
