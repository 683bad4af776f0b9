/*
 * durable.c — durable writes (durable.h).
 */
#include "common/durable.h"

#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int write_all_fd(int fd, const void *buf, size_t n, const char *path,
                 char *err, size_t errlen)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            seterr_(err, errlen, "%s: write: %s%s", path, strerror(errno),
                    errno == ENOSPC ? " (ENOSPC: disk full)" : "");
            return -1;
        }
        if (w == 0) {
            seterr_(err, errlen, "%s: write returned 0 (disk full?)", path);
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

long write_file_durable(const char *path, const void *buf, size_t len,
                        char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (write_all_fd(fd, buf, len, path, err, errlen) != 0) {
        close(fd);
        return -1;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        snprintf(err, errlen, "%s: fsync: %s", path, strerror(errno));
        return -1;
    }
    return (long)len;
}

int fsync_parent_dir(const char *path, char *err, size_t errlen)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t len = (size_t)(slash - path);
        if (len >= sizeof dir) {
            seterr_(err, errlen, "%s: path too long", path);
            return -1;
        }
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        seterr_(err, errlen, "%s: open directory: %s", dir, strerror(errno));
        return -1;
    }
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    /* Some file systems refuse fsync on directories; that is not data loss. */
    if (rc != 0 && e != EINVAL && e != ENOTSUP) {
        seterr_(err, errlen, "%s: fsync directory: %s", dir, strerror(e));
        return -1;
    }
    return 0;
}
