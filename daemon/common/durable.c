/*
 * durable.c — durable writes and non-blocking opens of regular files
 * (durable.h).
 */
#include "common/durable.h"

#include "common/err.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    /* close whatever fsync says: a failed fsync must not leak the fd */
    int rc = fsync(fd);
    int e = errno;
    const char *what = "fsync";
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
        what = "close";
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s: %s%s", path, what, strerror(e),
                 e == ENOSPC ? " (ENOSPC: disk full)" : "");
        errno = e;
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

void remove_temp_dir(const char *dir)
{
    int e = errno;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[PATH_MAX + 256];
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
    errno = e;
}

const char *file_kind_name(unsigned mode)
{
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

int open_regular(const char *path, int extra_flags, struct stat *st,
                 char *err, size_t errlen)
{
    /* O_NONBLOCK: opening a FIFO with no writer would block here */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
    if (fd < 0) {
        int e = errno;
        seterr_(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        seterr_(err, errlen, "%s: stat: %s", path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (st)
        *st = sb;  /* also when refused for its kind: the caller may say it */
    if (!S_ISREG(sb.st_mode)) {
        seterr_(err, errlen, "%s is %s, not a regular file", path,
                file_kind_name((unsigned)sb.st_mode));
        close(fd);
        errno = EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        seterr_(err, errlen, "%s: fcntl: %s", path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* "<path>.tmp-XXXXXX" into tmp; 0, or -1 with err when it does not fit */
static int temp_name_(const char *path, char *tmp, size_t tmplen, char *err,
                      size_t errlen)
{
    int n = snprintf(tmp, tmplen, "%s.tmp-XXXXXX", path);
    if (n < 0 || (size_t)n >= tmplen) {
        seterr_(err, errlen, "%s: path too long for a temporary name", path);
        return -1;
    }
    return 0;
}

int create_temp_beside(const char *path, unsigned mode, char *tmp,
                       size_t tmplen, char *err, size_t errlen)
{
    if (temp_name_(path, tmp, tmplen, err, errlen) != 0)
        return -1;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        seterr_(err, errlen, "%s: create: %s", tmp, strerror(errno));
        return -1;
    }
    if (fchmod(fd, (mode_t)mode) != 0) {
        seterr_(err, errlen, "%s: chmod: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    return fd;
}

FILE *create_temp_file_beside(const char *path, unsigned mode, char *tmp,
                              size_t tmplen, char *err, size_t errlen)
{
    int fd = create_temp_beside(path, mode, tmp, tmplen, err, errlen);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        seterr_(err, errlen, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
    }
    return f;
}

int create_temp_dir_beside(const char *path, unsigned mode, char *tmp,
                           size_t tmplen, char *err, size_t errlen)
{
    if (temp_name_(path, tmp, tmplen, err, errlen) != 0)
        return -1;
    if (!mkdtemp(tmp)) {
        seterr_(err, errlen, "%s: mkdir: %s", tmp, strerror(errno));
        return -1;
    }
    if (chmod(tmp, (mode_t)mode) != 0) {
        seterr_(err, errlen, "%s: chmod: %s", tmp, strerror(errno));
        rmdir(tmp);
        return -1;
    }
    return 0;
}
