/*
 * paths.c — default state dir and socket path (see paths.h).
 */
#include "common/paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fits_(int n, size_t len) { return n >= 0 && (size_t)n < len ? 0 : -1; }

int paths_state_dir(char *buf, size_t len)
{
    const char *m6 = getenv("M6_STATE_DIR");
    if (m6 && *m6) return fits_(snprintf(buf, len, "%s", m6), len);
    const char *sd = getenv("STATE_DIRECTORY");
    if (sd && *sd) {
        size_t n = strcspn(sd, ":");
        return fits_(snprintf(buf, len, "%.*s", (int)n, sd), len);
    }
    const char *x = getenv("XDG_STATE_HOME");
    if (x && *x) return fits_(snprintf(buf, len, "%s/m6", x), len);
    const char *home = getenv("HOME");
    if (!home || !*home) return -1;
    return fits_(snprintf(buf, len, "%s/.local/state/m6", home), len);
}

int paths_socket_in(const char *state_dir, char *buf, size_t len)
{
    return fits_(snprintf(buf, len, "%s/m6d.sock", state_dir), len);
}

int paths_client_socket(char *buf, size_t len)
{
    const char *env = getenv("M6_SOCKET");
    if (env && *env) return fits_(snprintf(buf, len, "%s", env), len);
    char dir[4096];
    if (paths_state_dir(dir, sizeof dir) == 0 &&
        paths_socket_in(dir, buf, len) == 0 && access(buf, F_OK) == 0)
        return 0;
    if (access(M6_SYSTEM_SOCKET, F_OK) == 0)
        return fits_(snprintf(buf, len, "%s", M6_SYSTEM_SOCKET), len);
    if (paths_state_dir(dir, sizeof dir) == 0)
        return paths_socket_in(dir, buf, len);
    return -1;
}

int paths_mkdir_p(const char *path, mode_t mode)
{
    char tmp[4096];
    if (fits_(snprintf(tmp, sizeof tmp, "%s", path), sizeof tmp) < 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, mode) < 0 && errno != EEXIST ? -1 : 0;
}
