/*
 * cpus.c — CPUs this process may use (cpus.h).
 */
#include "common/cpus.h"
#include "common/cgroup.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The CPUs one cpu.max file allows; 0: no cap (max, absent, malformed). */
static long quota_cpus_(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char q[32] = "";
    long long period = 0, quota;
    int n = fscanf(f, "%31s %lld", q, &period);
    fclose(f);
    if (n != 2 || period <= 0 || strcmp(q, "max") == 0 ||
        sscanf(q, "%lld", &quota) != 1 || quota <= 0)
        return 0;
    return (long)((quota + period - 1) / period);
}

int cpus_available_at(const char *proc_cgroup, const char *cgroot,
                      int affinity)
{
    long n = affinity < 1 ? 1 : affinity;
    char rel[4096];
    if (cgroup_self(proc_cgroup, NULL, rel, sizeof rel) != 2)
        return (int)n;
    /* the cgroup, then each ancestor: /a/b, /a, "" (the root has no
     * cpu.max; harmless) */
    do {
        char path[8300];
        snprintf(path, sizeof path, "%s%s/cpu.max", cgroot, rel);
        long q = quota_cpus_(path);
        if (q > 0 && q < n)
            n = q;
    } while (cgroup_parent(rel));
    return (int)n;
}

int cpus_available(void)
{
    cpu_set_t set;
    long a = sched_getaffinity(0, sizeof set, &set) == 0
                 ? CPU_COUNT(&set)
                 : sysconf(_SC_NPROCESSORS_ONLN);
    return cpus_available_at("/proc/self/cgroup", "/sys/fs/cgroup",
                             a < 1 ? 1 : a > 1 << 20 ? 1 << 20 : (int)a);
}
