/*
 * corpus.c — `m6ctl data prepare`: a text corpus (files, directories, .gz/.dz)
 * through the byte-level tokenizer into token shards, and the shard writer
 * (corpus.h). The daemon only reads shards (daemon/train/data.c).
 *
 * Every check here runs in release builds; every error names the file.
 */
#include "client/corpus/corpus.h"

#include "common/durable.h"
#include "common/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

/* Shards are written as they are read, uint16/int32: little-endian hosts. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "corpus.c writes llm.c shards directly and needs a little-endian host"
#endif

#define HEADER_BYTES ((size_t)SHARD_HEADER_INTS * sizeof(int32_t))
#define DEFAULT_SHARD_TOKENS ((size_t)100 * 1000 * 1000)
#define BINARY_PROBE 8192

/* ------------------------------------------------------------------------ */
/* Writing shards: to path.tmp, fsync, rename, fsync the directory           */
/* ------------------------------------------------------------------------ */

static void fill_header_(int32_t hdr[SHARD_HEADER_INTS], size_t n)
{
    memset(hdr, 0, HEADER_BYTES);
    hdr[0] = SHARD_MAGIC;
    hdr[1] = SHARD_VERSION;
    hdr[2] = (int32_t)n;
}

/* An open shard being written: tokens are streamed after a placeholder header,
 * and the header is written for real when the shard is finished. */
typedef struct {
    char path[4096], tmp[4096 + 16];
    int fd;
    size_t n;
} shard_out_;

static int shard_begin_(shard_out_ *o, const char *path, char *err,
                        size_t errlen)
{
    o->fd = -1;
    o->n = 0;
    if (strlen(path) >= sizeof o->path) {
        seterr_(err, errlen, "%s: path too long", path);
        return -1;
    }
    strcpy(o->path, path);
    o->fd = create_temp_beside(path, 0644, o->tmp, sizeof o->tmp, err, errlen);
    if (o->fd < 0)
        return -1;
    int32_t hdr[SHARD_HEADER_INTS];
    fill_header_(hdr, 0);
    hdr[0] = 0;  /* not a valid shard until finished */
    if (write_all_fd(o->fd, hdr, HEADER_BYTES, o->tmp, err, errlen) != 0) {
        close(o->fd);
        unlink(o->tmp);
        o->fd = -1;
        return -1;
    }
    return 0;
}

static void shard_abort_(shard_out_ *o)
{
    if (o->fd >= 0) {
        close(o->fd);
        unlink(o->tmp);
        o->fd = -1;
    }
}

static int shard_append_(shard_out_ *o, const uint16_t *tok, size_t n,
                         char *err, size_t errlen)
{
    if (write_all_fd(o->fd, tok, n * sizeof *tok, o->tmp, err, errlen) != 0) {
        shard_abort_(o);
        return -1;
    }
    o->n += n;
    return 0;
}

static int shard_finish_(shard_out_ *o, char *err, size_t errlen)
{
    int32_t hdr[SHARD_HEADER_INTS];
    fill_header_(hdr, o->n);
    if (lseek(o->fd, 0, SEEK_SET) != 0) {
        seterr_(err, errlen, "%s: seek: %s", o->tmp, strerror(errno));
        shard_abort_(o);
        return -1;
    }
    if (write_all_fd(o->fd, hdr, HEADER_BYTES, o->tmp, err, errlen) != 0) {
        shard_abort_(o);
        return -1;
    }
    if (fsync(o->fd) != 0) {
        seterr_(err, errlen, "%s: fsync: %s%s", o->tmp, strerror(errno),
                errno == ENOSPC ? " (ENOSPC: disk full)" : "");
        shard_abort_(o);
        return -1;
    }
    int rc = close(o->fd);
    o->fd = -1;
    if (rc != 0) {
        seterr_(err, errlen, "%s: close: %s", o->tmp, strerror(errno));
        unlink(o->tmp);
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        seterr_(err, errlen, "%s: rename to %s: %s", o->tmp, o->path,
                strerror(errno));
        unlink(o->tmp);
        return -1;
    }
    return fsync_parent_dir(o->path, err, errlen);
}

int shard_write(const char *path, const uint16_t *tokens, size_t n, char *err,
                size_t errlen)
{
    if (n > (size_t)INT32_MAX) {
        seterr_(err, errlen, "%s: %zu tokens do not fit a shard (max %d)", path,
                n, INT32_MAX);
        return -1;
    }
    shard_out_ o;
    if (shard_begin_(&o, path, err, errlen) != 0) return -1;
    if (n > 0 && shard_append_(&o, tokens, n, err, errlen) != 0) return -1;
    return shard_finish_(&o, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* data prepare: collecting the input files                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    char **paths;
    size_t n, cap;
    /* (dev, ino) of every file and directory taken: open addressing */
    struct { dev_t dev; ino_t ino; int used; } *seen;
    size_t seen_cap, seen_n;
    size_t skipped;   /* not regular files */
    size_t duplicates;  /* regular files met again under another name */
} file_list_;

static size_t inode_hash_(dev_t d, ino_t i)
{
    uint64_t h = 1469598103934665603ULL;
    h = (h ^ (uint64_t)d) * 1099511628211ULL;
    h = (h ^ (uint64_t)i) * 1099511628211ULL;
    return (size_t)(h ^ (h >> 29));
}

/* 1: newly seen, 0: seen before, -1: out of memory */
static int seen_add_(file_list_ *fl, dev_t dev, ino_t ino)
{
    if (2 * (fl->seen_n + 1) > fl->seen_cap) {
        size_t cap = fl->seen_cap ? 2 * fl->seen_cap : 256;
        __typeof__(fl->seen) s = calloc(cap, sizeof *s);
        if (!s) return -1;
        for (size_t k = 0; k < fl->seen_cap; k++) {
            if (!fl->seen[k].used) continue;
            size_t h = inode_hash_(fl->seen[k].dev, fl->seen[k].ino) & (cap - 1);
            while (s[h].used) h = (h + 1) & (cap - 1);
            s[h] = fl->seen[k];
        }
        free(fl->seen);
        fl->seen = s;
        fl->seen_cap = cap;
    }
    size_t h = inode_hash_(dev, ino) & (fl->seen_cap - 1);
    while (fl->seen[h].used) {
        if (fl->seen[h].dev == dev && fl->seen[h].ino == ino) return 0;
        h = (h + 1) & (fl->seen_cap - 1);
    }
    fl->seen[h].dev = dev;
    fl->seen[h].ino = ino;
    fl->seen[h].used = 1;
    fl->seen_n++;
    return 1;
}

static void file_list_free_(file_list_ *fl)
{
    for (size_t k = 0; k < fl->n; k++) free(fl->paths[k]);
    free(fl->paths);
    free(fl->seen);
    memset(fl, 0, sizeof *fl);
}

static int cmp_name_(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Add path (following symlinks): a regular file once per inode, a directory
 * walked in byte order of names. */
/* depth 0: a path the user named (must exist); deeper: found in a walk,
 * where a dangling symlink is skipped and counted. */
static int collect_(file_list_ *fl, const char *path, int depth, char *err,
                    size_t errlen)
{
    struct stat st, lst;
    if (stat(path, &st) != 0) {
        if (depth > 0 && (errno == ENOENT || errno == ELOOP) &&
            lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
            fl->skipped++;  /* a dangling symlink, or a loop of them */
            return 0;
        }
        seterr_(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int fresh = seen_add_(fl, st.st_dev, st.st_ino);
    if (fresh < 0) {
        seterr_(err, errlen, "%s: out of memory", path);
        return -1;
    }
    if (!fresh) {  /* a second name (symlink, hard link) or a loop */
        if (S_ISREG(st.st_mode)) fl->duplicates++;
        return 0;
    }

    if (S_ISREG(st.st_mode)) {
        if (fl->n == fl->cap) {
            size_t cap = fl->cap ? 2 * fl->cap : 64;
            char **p = realloc(fl->paths, cap * sizeof *p);
            if (!p) {
                seterr_(err, errlen, "%s: out of memory", path);
                return -1;
            }
            fl->paths = p;
            fl->cap = cap;
        }
        if (!(fl->paths[fl->n] = strdup(path))) {
            seterr_(err, errlen, "%s: out of memory", path);
            return -1;
        }
        fl->n++;
        return 0;
    }
    if (!S_ISDIR(st.st_mode) && depth == 0) {
        /* named: a FIFO, socket or device is refused as everywhere else
         * (open_regular's words), not skipped */
        int fd = open_regular(path, 0, NULL, err, errlen);
        if (fd < 0) return -1;
        close(fd);  /* a regular file since the stat */
        seterr_(err, errlen, "%s: changed while being listed", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {  /* fifo, socket, device: never read */
        fl->skipped++;
        return 0;
    }

    DIR *d = opendir(path);
    if (!d) {
        seterr_(err, errlen, "%s: opendir: %s", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) { rc = -1; break; }
            names = p;
        }
        if (!(names[n] = strdup(de->d_name))) { rc = -1; break; }
        n++;
        errno = 0;
    }
    if (rc == 0 && errno != 0) {
        seterr_(err, errlen, "%s: readdir: %s", path, strerror(errno));
        rc = -2;
    }
    closedir(d);
    if (rc == -1) seterr_(err, errlen, "%s: out of memory", path);
    if (rc == 0) {
        qsort(names, n, sizeof *names, cmp_name_);
        size_t plen = strlen(path);
        int has_slash = plen > 0 && path[plen - 1] == '/';
        for (size_t k = 0; k < n && rc == 0; k++) {
            size_t len = plen + 1 + strlen(names[k]) + 1;
            char *child = malloc(len);
            if (!child) {
                seterr_(err, errlen, "%s: out of memory", path);
                rc = -1;
                break;
            }
            snprintf(child, len, "%s%s%s", path, has_slash ? "" : "/", names[k]);
            rc = collect_(fl, child, depth + 1, err, errlen);
            free(child);
        }
    }
    for (size_t k = 0; k < n; k++) free(names[k]);
    free(names);
    return rc == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* data prepare: reading one file (plain or gzip)                            */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *path;
    int fd;       /* plain */
    gzFile gz;    /* .gz */
} reader_;

static int ends_with_(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int reader_open_(reader_ *r, const char *path, char *err, size_t errlen)
{
    r->path = path;
    r->gz = NULL;
    r->fd = open_regular(path, 0, NULL, err, errlen);  /* no FIFO hang */
    if (r->fd < 0) return -1;
    /* .dz: dictzip (dictd's dictionaries), gzip with a chunk index */
    if (ends_with_(path, ".gz") || ends_with_(path, ".dz")) {
        r->gz = gzdopen(r->fd, "rb");
        if (!r->gz) {
            seterr_(err, errlen, "%s: gzdopen: out of memory", path);
            close(r->fd);
            return -1;
        }
        r->fd = -1;  /* owned by gz now */
        gzbuffer(r->gz, 1 << 17);
    }
    return 0;
}

static void reader_close_(reader_ *r)
{
    if (r->gz) gzclose(r->gz);
    if (r->fd >= 0) close(r->fd);
    r->gz = NULL;
    r->fd = -1;
}

/* Read up to n bytes, fewer only at end of file. Returns bytes or -1. */
/* zlib prefixes its messages with the stream's name, "<fd:3>" for gzdopen:
 * drop it (we name the file ourselves). */
static const char *gz_message_(const char *msg)
{
    if (msg && msg[0] == '<') {
        const char *p = strstr(msg, ">: ");
        if (p) return p + 3;
    }
    return msg;
}

static long reader_read_(reader_ *r, unsigned char *buf, size_t n, char *err,
                         size_t errlen)
{
    size_t got = 0;
    while (got < n) {
        if (r->gz) {
            size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
            int k = gzread(r->gz, buf + got, (unsigned)want);
            if (k < 0) {
                int zerr;
                const char *msg = gz_message_(gzerror(r->gz, &zerr));
                seterr_(err, errlen, "%s: gzip: %s", r->path,
                        zerr == Z_ERRNO ? strerror(errno) : msg);
                return -1;
            }
            if (k == 0) {
                /* gzread reports a truncated stream as EOF plus an error */
                int zerr;
                const char *msg = gz_message_(gzerror(r->gz, &zerr));
                if (zerr != Z_OK && zerr != Z_STREAM_END) {
                    seterr_(err, errlen, "%s: gzip: %s", r->path, msg);
                    return -1;
                }
                break;
            }
            got += (size_t)k;
        } else {
            ssize_t k = read(r->fd, buf + got, n - got);
            if (k < 0) {
                if (errno == EINTR) continue;
                seterr_(err, errlen, "%s: read: %s", r->path, strerror(errno));
                return -1;
            }
            if (k == 0) break;
            got += (size_t)k;
        }
    }
    return (long)got;
}

/* ------------------------------------------------------------------------ */
/* data prepare: the shard streams                                           */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *out_dir, *prefix;
    size_t cap;          /* tokens per shard */
    shard_out_ cur;
    int open;
    size_t n_shards, tokens;
} stream_;

static int stream_put_(stream_ *s, const unsigned char *bytes, size_t n,
                       char *err, size_t errlen)
{
    uint16_t tok[4096];
    while (n > 0) {
        if (s->open && s->cur.n == s->cap) {
            s->open = 0;
            if (shard_finish_(&s->cur, err, errlen) != 0) return -1;
            s->n_shards++;
        }
        if (!s->open) {
            char path[4096];
            int len = snprintf(path, sizeof path, "%s/%s_%06zu.bin", s->out_dir,
                               s->prefix, s->n_shards);
            if (len < 0 || (size_t)len >= sizeof path) {
                seterr_(err, errlen, "%s: path too long", s->out_dir);
                return -1;
            }
            if (shard_begin_(&s->cur, path, err, errlen) != 0) return -1;
            s->open = 1;
        }
        size_t room = s->cap - s->cur.n;
        size_t k = n < room ? n : room;
        if (k > sizeof tok / sizeof tok[0]) k = sizeof tok / sizeof tok[0];
        for (size_t j = 0; j < k; j++) tok[j] = byte_token(bytes[j]);
        if (shard_append_(&s->cur, tok, k, err, errlen) != 0) {
            s->open = 0;
            return -1;
        }
        s->tokens += k;
        bytes += k;
        n -= k;
    }
    return 0;
}

static int stream_close_(stream_ *s, char *err, size_t errlen)
{
    if (!s->open) return 0;
    s->open = 0;
    if (shard_finish_(&s->cur, err, errlen) != 0) return -1;
    s->n_shards++;
    return 0;
}

/* After an error: drop the open shard and every shard this run finished. */
static void stream_discard_(stream_ *s)
{
    if (s->open) shard_abort_(&s->cur);
    s->open = 0;
    for (size_t k = 0; k < s->n_shards; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s_%06zu.bin", s->out_dir, s->prefix, k);
        unlink(path);
    }
}

/* ------------------------------------------------------------------------ */
/* data prepare                                                              */
/* ------------------------------------------------------------------------ */

static volatile sig_atomic_t prepare_interrupted_;

void data_prepare_interrupt(void) { prepare_interrupted_ = 1; }

/* mkdir -p; *top is the length of the shortest prefix of dir made here (0:
 * none was): it and every directory below it on the way to dir are new. */
static int mkdir_p_(const char *dir, size_t *top, char *err, size_t errlen)
{
    *top = 0;
    char buf[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof buf) {
        seterr_(err, errlen, "'%s': bad output directory name", dir);
        return -1;
    }
    memcpy(buf, dir, len + 1);
    for (size_t k = 1; k <= len; k++) {
        if (buf[k] != '/' && buf[k] != '\0') continue;
        char c = buf[k];
        buf[k] = '\0';
        if (mkdir(buf, 0755) == 0) {
            if (!*top) *top = k;
        } else if (errno != EEXIST) {
            seterr_(err, errlen, "%s: mkdir: %s", buf, strerror(errno));
            return -1;
        }
        buf[k] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        seterr_(err, errlen, "%s: not a directory", dir);
        return -1;
    }
    return 0;
}

/* After a failure: remove what mkdir_p_(dir) made, deepest first, down to
 * its prefix of length top (none if top is 0). rmdir only, its errors
 * ignored: the deepest may not exist (mkdir_p_ failed on the way), and a
 * directory that is not empty stays, and so do those above it. */
static void rmdir_made_(const char *dir, size_t top)
{
    char buf[4096];
    size_t len = strlen(dir);
    if (top == 0 || len >= sizeof buf) return;
    memcpy(buf, dir, len + 1);
    for (size_t k = len; k >= top; k--) {
        if ((buf[k] != '/' && buf[k] != '\0') || buf[k - 1] == '/') continue;
        buf[k] = '\0';
        (void)rmdir(buf);
    }
}

/* Shards of an earlier run would mix with ours under a glob: refuse. */
static int check_no_shards_(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        seterr_(err, errlen, "%s: opendir: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if ((!strncmp(nm, "train_", 6) || !strncmp(nm, "val_", 4)) &&
            ends_with_(nm, ".bin")) {
            seterr_(err, errlen,
                    "%s: already holds shards (%s); remove them or choose "
                    "another directory", dir, nm);
            rc = -1;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* Size of a file's content: st_size for plain files, one decompressing pass
 * for .gz (the trailer's size field is only mod 2^32). Also tells whether the
 * first BINARY_PROBE bytes hold a NUL. */
static int measure_(const char *path, unsigned char *buf, size_t buflen,
                    size_t *size, int *binary, char *err, size_t errlen)
{
    reader_ r;
    if (reader_open_(&r, path, err, errlen) != 0) return -1;
    long k = reader_read_(&r, buf, BINARY_PROBE, err, errlen);
    if (k < 0) { reader_close_(&r); return -1; }
    *binary = memchr(buf, 0, (size_t)k) != NULL;
    size_t total = (size_t)k;
    if (!*binary && (size_t)k == BINARY_PROBE) {
        if (r.gz) {
            while ((k = reader_read_(&r, buf, buflen, err, errlen)) > 0)
                total += (size_t)k;
            if (k < 0) { reader_close_(&r); return -1; }
        } else {
            struct stat st;
            if (fstat(r.fd, &st) != 0) {
                seterr_(err, errlen, "%s: stat: %s", path, strerror(errno));
                reader_close_(&r);
                return -1;
            }
            total = (size_t)st.st_size;
        }
    }
    reader_close_(&r);
    *size = total;
    return 0;
}

int data_prepare(const char *out_dir, const char *const *inputs, int n_inputs,
                 double val_fraction, size_t shard_tokens, prepare_stats *st,
                 void (*progress)(const char *file, size_t bytes, void *ud),
                 void *ud, char *err, size_t errlen)
{
    prepare_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!out_dir || !*out_dir) {
        seterr_(err, errlen, "data prepare: no output directory");
        return -1;
    }
    if (n_inputs <= 0 || !inputs) {
        seterr_(err, errlen, "data prepare: no input files");
        return -1;
    }
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        seterr_(err, errlen, "data prepare: val_fraction %g out of range [0, 1)",
                val_fraction);
        return -1;
    }
    prepare_interrupted_ = 0;
    if (shard_tokens == 0) shard_tokens = DEFAULT_SHARD_TOKENS;
    if (shard_tokens > (size_t)INT32_MAX) shard_tokens = (size_t)INT32_MAX;

    file_list_ fl;
    memset(&fl, 0, sizeof fl);
    for (int i = 0; i < n_inputs; i++)
        if (collect_(&fl, inputs[i], 0, err, errlen) != 0) {
            file_list_free_(&fl);
            return -1;
        }
    st->skipped = st->special = fl.skipped;
    st->duplicates = fl.duplicates;
    size_t made_top = 0;
    if (mkdir_p_(out_dir, &made_top, err, errlen) != 0 ||
        check_no_shards_(out_dir, err, errlen) != 0) {
        rmdir_made_(out_dir, made_top);
        file_list_free_(&fl);
        return -1;
    }

    size_t buflen = 1 << 20;
    unsigned char *buf = malloc(buflen);
    if (!buf) {
        seterr_(err, errlen, "data prepare: out of memory");
        rmdir_made_(out_dir, made_top);
        file_list_free_(&fl);
        return -1;
    }
    stream_ train = { .out_dir = out_dir, .prefix = "train", .cap = shard_tokens };
    stream_ val = { .out_dir = out_dir, .prefix = "val", .cap = shard_tokens };
    int rc = 0;

    for (size_t f = 0; f < fl.n && rc == 0; f++) {
        const char *path = fl.paths[f];
        size_t size;
        int binary;
        if (measure_(path, buf, buflen, &size, &binary, err, errlen) != 0) {
            rc = -1;
            break;
        }
        if (binary) {
            st->skipped++;
            if (st->binary++ == 0) {
                const char *base = strrchr(path, '/');
                snprintf(st->binary_example, sizeof st->binary_example, "%s",
                         base ? base + 1 : path);
            }
            continue;
        }
        size_t n_val = (size_t)((double)size * val_fraction);
        size_t n_train = size - n_val;

        reader_ r;
        if (reader_open_(&r, path, err, errlen) != 0) { rc = -1; break; }
        size_t done = 0;
        for (;;) {
            if (prepare_interrupted_) {
                seterr_(err, errlen, "data prepare: interrupted while reading %s",
                        path);
                rc = -1;
                break;
            }
            long k = reader_read_(&r, buf, buflen, err, errlen);
            if (k < 0) { rc = -1; break; }
            if (k == 0) break;
            size_t kk = (size_t)k;
            if (done + kk > size) {
                seterr_(err, errlen, "%s: file grew while being read "
                        "(expected %zu bytes)", path, size);
                rc = -1;
                break;
            }
            size_t to_train = done < n_train ? n_train - done : 0;
            if (to_train > kk) to_train = kk;
            if (to_train &&
                stream_put_(&train, buf, to_train, err, errlen) != 0) {
                rc = -1;
                break;
            }
            if (kk > to_train &&
                stream_put_(&val, buf + to_train, kk - to_train, err, errlen) != 0) {
                rc = -1;
                break;
            }
            done += kk;
        }
        reader_close_(&r);
        if (rc == 0 && done != size) {
            seterr_(err, errlen, "%s: file shrank while being read "
                    "(expected %zu bytes, read %zu)", path, size, done);
            rc = -1;
        }
        if (rc != 0) break;
        st->files++;
        if (progress) progress(path, size, ud);
    }

    if (rc == 0 && train.tokens == 0) {
        seterr_(err, errlen, "data prepare: no text in the inputs "
                "(%zu file(s) read, %zu skipped as binary or special)",
                st->files, st->skipped);
        rc = -1;
    }
    if (rc == 0 && val_fraction > 0 && val.tokens == 0) {
        seterr_(err, errlen, "data prepare: val_fraction %g left no validation "
                "tokens (%zu train tokens); raise it or add text",
                val_fraction, train.tokens);
        rc = -1;
    }
    if (rc == 0) rc = stream_close_(&train, err, errlen);
    if (rc == 0) rc = stream_close_(&val, err, errlen);
    if (rc != 0) {
        stream_discard_(&train);
        stream_discard_(&val);
        rmdir_made_(out_dir, made_top);  /* leave no empty dirs behind */
    }
    st->train_tokens = train.tokens;
    st->val_tokens = val.tokens;
    st->train_shards = rc == 0 ? train.n_shards : 0;
    st->val_shards = rc == 0 ? val.n_shards : 0;
    free(buf);
    file_list_free_(&fl);
    return rc;
}
