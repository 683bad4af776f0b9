/*
 * cgroup.h — where this process sits in the cgroup tree, for the readers
 * of its limits (cpus.c's CPU quota, memlimit.c's memory limit): its
 * cgroup's path from /proc/self/cgroup and the walk up its ancestors.
 */
#ifndef M6_CGROUP_H
#define M6_CGROUP_H

#include <stddef.h>

/* The path of this process's cgroup below the mount point, read from
 * proc_cgroup (a /proc/self/cgroup-format file) into rel (len bytes): with
 * v1_ctl (e.g. "memory"), the cgroup v1 line whose controller list names
 * it ("4:cpu,memory:/a/b") wins; else the first cgroup v2 line
 * ("0::/a/b"). The root comes back as "", any other cgroup as "/a/b".
 * Returns 1 (v1 line), 2 (v2 line), or 0 with rel "" when the file is
 * unreadable, has no such line, or names a path that is not absolute. */
int cgroup_self(const char *proc_cgroup, const char *v1_ctl, char *rel,
                size_t len);

/* Steps rel (as cgroup_self gives it) to its parent: "/a/b" -> "/a" ->
 * "". Returns 0 when rel was already the root "", else 1; so
 * `do { ... } while (cgroup_parent(rel));` visits the cgroup, each
 * ancestor and the root. */
int cgroup_parent(char *rel);

#endif /* M6_CGROUP_H */
