/*
 * memlimit.c — host memory this process may still use (memlimit.h).
 */
#include "common/memlimit.h"
#include "common/cgroup.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* v1's "no limit" is LONG_MAX rounded down to a page; anything this large
 * is no limit either. */
#define NO_LIMIT_ ((uint64_t)1 << 62)

/* One number from a cgroup file: 1 read, 0 "max", absent or malformed. */
static int read_u64_(const char *path, uint64_t *v)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char s[32] = "";
    int n = fscanf(f, "%31s", s);
    fclose(f);
    unsigned long long x;
    char end;
    if (n != 1 || s[0] < '0' || s[0] > '9' ||
        sscanf(s, "%llu%c", &x, &end) != 1)
        return 0;
    *v = (uint64_t)x;
    return 1;
}

uint64_t host_mem_meminfo(const char *meminfo, const char *key)
{
    FILE *f = fopen(meminfo, "re");
    if (!f)
        return UINT64_MAX;
    char line[256];
    uint64_t v = UINT64_MAX;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, kl) == 0 && line[kl] == ':' &&
            sscanf(line + kl + 1, "%llu", &kb) == 1) {
            v = (uint64_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

void host_mem_at(const char *meminfo, const char *proc_cgroup,
                 const char *cgroot, const char *cgroot_v1, host_mem *out)
{
    memset(out, 0, sizeof *out);
    out->meminfo = out->avail = host_mem_meminfo(meminfo, "MemAvailable");
    char rel[4096];
    int kind = cgroup_self(proc_cgroup, "memory", rel, sizeof rel);
    if (kind == 0)
        return;
    int v1 = kind == 1;
    const char *root = v1 ? cgroot_v1 : cgroot;
    const char *lim_name = v1 ? "memory.limit_in_bytes" : "memory.max";
    const char *use_name = v1 ? "memory.usage_in_bytes" : "memory.current";
    /* the cgroup, then each ancestor: /a/b, /a, "" (the root) */
    do {
        char lim_path[8300], use_path[8300];
        snprintf(lim_path, sizeof lim_path, "%s%s/%s", root, rel, lim_name);
        snprintf(use_path, sizeof use_path, "%s%s/%s", root, rel, use_name);
        uint64_t lim, use = 0;
        if (read_u64_(lim_path, &lim) && lim < NO_LIMIT_) {
            read_u64_(use_path, &use);
            uint64_t room = use < lim ? lim - use : 0;
            if (room < out->avail) {
                out->avail = room;
                out->cgroup_binds = 1;
                out->limit = lim;
                out->usage = use;
                snprintf(out->file, sizeof out->file, "%.511s", lim_path);
            }
        }
    } while (cgroup_parent(rel));
}

void host_mem_available(host_mem *out)
{
    host_mem_at("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup",
                "/sys/fs/cgroup/memory", out);
}

static const char *gib_(char *b, size_t n, uint64_t v)
{
    snprintf(b, n, "%.2f GiB", (double)v / (1024.0 * 1024 * 1024));
    return b;
}

const char *host_mem_describe(const host_mem *m, char *buf, size_t len)
{
    char a[32], l[32], u[32];
    const char *base = strrchr(m->file, '/');
    if (m->cgroup_binds)
        snprintf(buf, len, "m6d's cgroup allows %s (%s %s, %s in use: %s)",
                 gib_(a, sizeof a, m->avail), base ? base + 1 : m->file,
                 gib_(l, sizeof l, m->limit), gib_(u, sizeof u, m->usage),
                 m->file);
    else
        snprintf(buf, len, "only %s available (MemAvailable)",
                 gib_(a, sizeof a, m->avail));
    return buf;
}
