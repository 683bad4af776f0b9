/*
 * durable.h — files m6 writes and reads on its own terms: writes that
 * survive a crash (whole writes, fsync of a file and of the directory that
 * names it; checkpoints, token shards) and opens that never block on what
 * is not a regular file (a FIFO, a device, a socket given where a file
 * belongs). Errors name the path and the cause.
 */
#ifndef M6_DURABLE_H
#define M6_DURABLE_H

#include <stddef.h>
#include <stdio.h>

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

/* Open path read-only (O_CLOEXEC | extra_flags) without blocking, and
 * only if it is a regular file: a FIFO, a character or block device, a
 * socket or a directory is refused with err naming the path and what it is
 * ("is a FIFO, not a regular file"), so that a FIFO given as init.from or
 * a checkpoint does not hang the thread that reads it. The returned fd is
 * in blocking mode again. st (may be NULL) receives its fstat, also when
 * it is refused for its kind (EINVAL). The fd, or
 * -1 with err and errno (ENOENT, EACCES... from open(2); EINVAL for a file
 * of the wrong kind). */
struct stat;
int open_regular(const char *path, int extra_flags, struct stat *st,
                 char *err, size_t errlen);

/* Create a new temporary file beside path, named "<path>.tmp-XXXXXX"
 * (mkstemp: a fresh random name, O_EXCL, never following a symbolic link
 * someone planted under a predictable name), with mode (fchmod; mkstemp
 * makes 0600). The name goes to tmp (tmplen bytes, >= strlen(path) + 12).
 * The fd (O_RDWR | O_CLOEXEC), or -1 with err naming path and the cause. */
int create_temp_beside(const char *path, unsigned mode, char *tmp,
                       size_t tmplen, char *err, size_t errlen);

/* mkdtemp beside path: a new directory "<path>.tmp-XXXXXX" with mode, its
 * name in tmp (tmplen >= strlen(path) + 12). 0, or -1 with err. */
int create_temp_dir_beside(const char *path, unsigned mode, char *tmp,
                           size_t tmplen, char *err, size_t errlen);

/* create_temp_beside as a stdio stream opened for writing ("w"). The
 * stream, or NULL with err (the temporary file removed again). */
FILE *create_temp_file_beside(const char *path, unsigned mode, char *tmp,
                              size_t tmplen, char *err, size_t errlen);

/* Best effort: remove a flat temporary directory (create_temp_dir_beside,
 * then files and no subdirectories): its entries, then itself. errno is
 * kept for the caller. */
void remove_temp_dir(const char *dir);

/* The kind of file mode is, in words ("a FIFO", "a directory", "a
 * socket", "a character device", "a block device", "a symbolic link", "a
 * regular file"), for error messages. */
const char *file_kind_name(unsigned mode);

#endif /* M6_DURABLE_H */
