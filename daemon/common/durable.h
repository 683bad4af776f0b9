/*
 * durable.h — writes that survive a crash: whole writes, fsync of a file
 * and of the directory that names it. Used for checkpoints (trainer.c) and
 * token shards (client/corpus). Errors name the path and the cause.
 */
#ifndef M6_DURABLE_H
#define M6_DURABLE_H

#include <stddef.h>

/* fsync a file by path / a directory by path. 0 or -1 (errno). */
int fsync_path(const char *path);

/* fsync the directory holding path (after a create or rename in it), so
 * the new name survives a crash. File systems that refuse fsync on a
 * directory (EINVAL, ENOTSUP) are not an error. 0, or -1 with err. */
int fsync_parent_dir(const char *path, char *err, size_t errlen);

/* Write all n bytes of buf to fd (retrying short writes and EINTR). 0, or
 * -1 with err naming path and the cause (ENOSPC said as disk full). */
int write_all_fd(int fd, const void *buf, size_t n, const char *path,
                 char *err, size_t errlen);

/* Write buf to path (created), fsync it. Bytes or -1 with err. */
long write_file_durable(const char *path, const void *buf, size_t len,
                        char *err, size_t errlen);

#endif /* M6_DURABLE_H */
