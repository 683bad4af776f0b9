/*
 * memlimit.h — host memory this process may still use: MemAvailable of
 * /proc/meminfo, capped by the room left under the memory limit of its
 * cgroup and of every ancestor (cgroup v2 memory.max, v1
 * memory.limit_in_bytes).
 *
 * MemAvailable counts the whole machine, so an m6d in a container or a
 * systemd unit with MemoryMax=3G would admit a run that needs 4 GiB and be
 * OOM-killed while setting it up. The admission checks use this figure
 * (offload_check, the trainer's plan, the node's free memory on the CPU
 * backend).
 */
#ifndef M6_MEMLIMIT_H
#define M6_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

/* The figure and what bound it. */
typedef struct {
    uint64_t avail;     /* bytes: min(MemAvailable, limit - usage over the
                         * cgroup and its ancestors); UINT64_MAX unknown */
    uint64_t meminfo;   /* MemAvailable in bytes; UINT64_MAX unknown */
    int cgroup_binds;   /* 1: a cgroup limit, not MemAvailable, is avail */
    uint64_t limit;     /* when cgroup_binds: that cgroup's limit ... */
    uint64_t usage;     /* ... and its usage, bytes */
    char file[512];     /* ... and its limit file (memory.max or
                         * memory.limit_in_bytes) */
} host_mem;

/* host_mem_at on this process: /proc/meminfo, /proc/self/cgroup, the
 * cgroup2 mount /sys/fs/cgroup and the v1 memory controller's mount
 * /sys/fs/cgroup/memory. */
void host_mem_available(host_mem *out);

/* The rule on given inputs, for tests: meminfo, a /proc/meminfo-format
 * file; proc_cgroup, a /proc/self/cgroup-format file; cgroot, the cgroup2
 * mount point; cgroot_v1, the v1 memory controller's mount point. A
 * "N:...memory...:/path" line (v1) is read under cgroot_v1
 * (memory.limit_in_bytes, memory.usage_in_bytes), else the "0::/path" line
 * under cgroot (memory.max, memory.current); for the cgroup and each
 * ancestor with a limit, the room is limit - usage (0 when over). "max",
 * a v1 limit of 2^62 bytes or more (v1's "no limit" is near 2^63), absent,
 * unreadable or malformed files set no limit. */
void host_mem_at(const char *meminfo, const char *proc_cgroup,
                 const char *cgroot, const char *cgroot_v1, host_mem *out);

/* Field `key` of a /proc/meminfo-format file (meminfo), e.g. "MemTotal",
 * in bytes (the file gives kB); UINT64_MAX when the file is unreadable or
 * has no such field. */
uint64_t host_mem_meminfo(const char *meminfo, const char *key);

/* One clause naming what binds, for refusals: "only 2.90 GiB available
 * (MemAvailable)" or "m6d's cgroup allows 2.90 GiB (memory.max 3.00 GiB,
 * 0.10 GiB in use: /sys/fs/cgroup/.../memory.max)". Returns buf. */
const char *host_mem_describe(const host_mem *m, char *buf, size_t len);

#endif /* M6_MEMLIMIT_H */
