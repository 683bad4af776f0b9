/*
 * file_store.h — test helper: an m6_store (daemon/dist/store.h) in a
 * directory, for several processes on one machine (the collectives tests,
 * the data-parallel trainer tests, bench/allreduce).
 *
 * One directory per run; each key is one file, its name the key with every
 * byte outside [A-Za-z0-9._-] written as %XX. A set writes a temporary file
 * and renames it over the key's name, so a reader sees the whole value or
 * nothing. get and wait poll (every 2 ms) until the key exists or the
 * timeout passes (M6_ECANCELLED naming the key and the time waited).
 */
#ifndef M6_TEST_FILE_STORE_H
#define M6_TEST_FILE_STORE_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/store.h"

typedef struct {
    char dir[512];
} file_store;

/* dir/<escaped key> into path; 0, or -1 when it does not fit. */
static inline int file_store_path_(const file_store *fs, const char *key,
                                   char *path, size_t len)
{
    int n = snprintf(path, len, "%s/", fs->dir);
    if (n < 0 || (size_t)n >= len)
        return -1;
    size_t o = (size_t)n;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        int ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                 (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
                 *p == '-';
        if (o + 4 >= len)
            return -1;
        if (ok)
            path[o++] = (char)*p;
        else
            o += (size_t)snprintf(path + o, len - o, "%%%02X", *p);
    }
    path[o] = 0;
    return 0;
}

static inline int file_store_set_(void *ctx, const char *key,
                                  const void *val, size_t len, m6_err *err)
{
    file_store *fs = ctx;
    char path[1024], tmp[1100];
    if (strlen(key) > M6_STORE_KEY_MAX ||
        file_store_path_(fs, key, path, sizeof path) != 0) {
        m6_err_set(err, M6_EINTERNAL, "file store: key '%s' too long", key);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%ld", fs->dir, (int)getpid(),
             (long)random());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        m6_err_set(err, M6_EINTERNAL, "file store: %s: %s", tmp,
                   strerror(errno));
        return -1;
    }
    const char *p = val;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w <= 0) {
            m6_err_set(err, M6_EINTERNAL, "file store: %s: %s", tmp,
                       strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        m6_err_set(err, M6_EINTERNAL, "file store: rename to %s: %s", path,
                   strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static inline double file_store_now_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wait until key's file exists: 0, or -1 with err. */
static inline int file_store_wait1_(file_store *fs, const char *key,
                                    char *path, size_t plen, double end,
                                    int timeout_ms, m6_err *err)
{
    if (file_store_path_(fs, key, path, plen) != 0) {
        m6_err_set(err, M6_EINTERNAL, "file store: key '%s' too long", key);
        return -1;
    }
    struct stat st;
    while (stat(path, &st) != 0) {
        if (file_store_now_() >= end) {
            m6_err_set(err, M6_ECANCELLED, "store key '%s' not set after "
                       "%d ms", key, timeout_ms);
            return -1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static inline int file_store_get_(void *ctx, const char *key, void **val,
                                  size_t *len, int timeout_ms, m6_err *err)
{
    file_store *fs = ctx;
    char path[1024];
    double end = file_store_now_() + timeout_ms / 1e3;
    if (file_store_wait1_(fs, key, path, sizeof path, end, timeout_ms,
                          err) != 0)
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        m6_err_set(err, M6_EINTERNAL, "file store: %s: %s", path,
                   strerror(errno));
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        m6_err_set(err, M6_EINTERNAL, "file store: %s: short read", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    *val = buf;
    *len = (size_t)n;
    return 0;
}

static inline int file_store_wait_(void *ctx, const char *const *keys,
                                   size_t n, int timeout_ms, m6_err *err)
{
    file_store *fs = ctx;
    char path[1024];
    double end = file_store_now_() + timeout_ms / 1e3;
    for (size_t i = 0; i < n; i++)
        if (file_store_wait1_(fs, keys[i], path, sizeof path, end,
                              timeout_ms, err) != 0)
            return -1;
    return 0;
}

/* The m6_store over fs (dir set, existing). */
static inline m6_store file_store_table(file_store *fs)
{
    m6_store st = {fs, file_store_set_, file_store_get_, file_store_wait_};
    return st;
}

#endif /* M6_TEST_FILE_STORE_H */
