/*
 * cgroup.c — this process's cgroup and its ancestors (cgroup.h).
 */
#include "common/cgroup.h"

#include <stdio.h>
#include <string.h>

/* Whether the comma list ctl (n bytes) names controller `name`. */
static int names_ctl_(const char *ctl, size_t n, const char *name)
{
    size_t nl = strlen(name);
    while (n > 0) {
        size_t k = 0;
        while (k < n && ctl[k] != ',')
            k++;
        if (k == nl && strncmp(ctl, name, nl) == 0)
            return 1;
        ctl += k < n ? k + 1 : k;
        n -= k < n ? k + 1 : k;
    }
    return 0;
}

int cgroup_self(const char *proc_cgroup, const char *v1_ctl, char *rel,
                size_t len)
{
    rel[0] = 0;
    FILE *f = fopen(proc_cgroup, "r");
    if (!f)
        return 0;
    char line[4096], path[4096] = "";
    int kind = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        if (v1_ctl && names_ctl_(c1 + 1, (size_t)(c2 - c1 - 1), v1_ctl)) {
            snprintf(path, sizeof path, "%s", c2 + 1);
            kind = 1;
            break;
        }
        if (strncmp(line, "0::", 3) == 0 && kind == 0) {
            snprintf(path, sizeof path, "%s", c2 + 1);
            kind = 2;
            if (!v1_ctl)
                break;
        }
    }
    fclose(f);
    if (kind == 0 || path[0] != '/' || strlen(path) >= len)
        return 0;
    snprintf(rel, len, "%s", strcmp(path, "/") == 0 ? "" : path);
    return kind;
}

int cgroup_parent(char *rel)
{
    if (rel[0] == 0)
        return 0;
    *strrchr(rel, '/') = 0;
    return 1;
}
