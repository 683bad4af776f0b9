/*
 * cpus.h — how many CPUs this process may use: its affinity mask, capped by
 * the CPU quota of its cgroup (cgroup v2 cpu.max) and of every ancestor.
 *
 * nproc and OpenMP's default count the affinity mask only, so a run in a
 * container or a systemd unit with CPUQuota=150% would start as many
 * threads as the machine has cores and spin them against its own quota
 * (issue 20). The engine's default thread count is this figure.
 */
#ifndef M6_CPUS_H
#define M6_CPUS_H

/* CPUs in this process's affinity mask (sched_getaffinity; the online
 * count where that fails), capped by the cgroup quota: for the cgroup
 * named in /proc/self/cgroup's "0::" line and each ancestor up to the
 * cgroup2 root /sys/fs/cgroup, a cpu.max of "QUOTA PERIOD" (microseconds)
 * allows ceil(QUOTA / PERIOD) CPUs; "max", an absent or unreadable file, or
 * cgroup v1 set no cap. Always >= 1. */
int cpus_available(void);

/* cpus_available's rule on given inputs, for tests: proc_cgroup, the path
 * of a /proc/self/cgroup-format file; cgroot, the cgroup2 mount point;
 * affinity, the affinity mask's count. >= 1. */
int cpus_available_at(const char *proc_cgroup, const char *cgroot,
                      int affinity);

#endif /* M6_CPUS_H */
