/*
 * data.c — token shards (llm.c layout) and `data prepare`, the byte-level
 * tokenizer that turns a text corpus into shards. See data.h for the format.
 *
 * Every check here runs in release builds; every error names the file.
 */
#include "train/data.h"

#include "common/err.h"
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

/* Shards are read as they are, uint16/int32: little-endian hosts. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.c reads llm.c shards directly and needs a little-endian host"
#endif

#define HEADER_BYTES ((size_t)SHARD_HEADER_INTS * sizeof(int32_t))
#define DEFAULT_SHARD_TOKENS ((size_t)100 * 1000 * 1000)
#define BINARY_PROBE 8192

/* ------------------------------------------------------------------------ */
/* Reading shards                                                            */
/* ------------------------------------------------------------------------ */

void token_set_close(token_set *ts)
{
    if (!ts) return;
    for (int i = 0; i < ts->n_shards; i++) {
        if (ts->fds && ts->fds[i] >= 0) close(ts->fds[i]);
        if (ts->paths) free(ts->paths[i]);
    }
    free(ts->n_tokens);
    free(ts->fds);
    free(ts->paths);
    memset(ts, 0, sizeof *ts);
}

/* The directory a glob could not read, and why (glob's errfunc has no user
 * pointer: per thread). */
static __thread char glob_failed_path_[1024];
static __thread int glob_failed_errno_;

static int glob_error_(const char *path, int eerrno)
{
    snprintf(glob_failed_path_, sizeof glob_failed_path_, "%s", path);
    glob_failed_errno_ = eerrno;
    return 1;  /* stop: GLOB_ERR semantics */
}

/* Shards already scanned by this process, with their largest token id:
 * m6d checks a spec's corpus at submit and again when the run starts (and
 * at each restart of the trainer), so a large corpus is read once, not
 * each time. The key is the file's identity and version (device, inode,
 * size, mtime to the nanosecond): a shard rewritten since is read again. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    unsigned max_token;
} scanned_;
enum { SCANNED_MAX = 4096 };
static scanned_ scanned_tab_[SCANNED_MAX];
static int scanned_n_, scanned_next_;
static pthread_mutex_t scanned_mu_ = PTHREAD_MUTEX_INITIALIZER;

static int same_file_(const scanned_ *e, const struct stat *st)
{
    return e->dev == st->st_dev && e->ino == st->st_ino &&
           e->size == st->st_size && e->mtime.tv_sec == st->st_mtim.tv_sec &&
           e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* The largest token id of a shard scanned before, or -1. */
static long scanned_max_(const struct stat *st)
{
    long mx = -1;
    pthread_mutex_lock(&scanned_mu_);
    for (int k = 0; k < scanned_n_; k++)
        if (same_file_(&scanned_tab_[k], st)) mx = scanned_tab_[k].max_token;
    pthread_mutex_unlock(&scanned_mu_);
    return mx;
}

static void scanned_put_(const struct stat *st, unsigned max_token)
{
    pthread_mutex_lock(&scanned_mu_);
    int k = 0;
    while (k < scanned_n_ && !same_file_(&scanned_tab_[k], st)) k++;
    if (k == scanned_n_) {  /* new: append, or replace round-robin */
        if (scanned_n_ < SCANNED_MAX) k = scanned_n_++;
        else k = scanned_next_++ % SCANNED_MAX;
    }
    scanned_tab_[k] = (scanned_){st->st_dev, st->st_ino, st->st_size,
                                 st->st_mtim, max_token};
    pthread_mutex_unlock(&scanned_mu_);
}

/* Tokens [off, off+m) of an open shard into buf, with pread (EINTR
 * retried). 0, or -1 with errno set, 0 when the file ended first. */
static int pread_tokens_(int fd, size_t off, uint16_t *buf, size_t m)
{
    size_t want = m * sizeof *buf, got = 0;
    while (got < want) {
        ssize_t r = pread(fd, (char *)buf + got, want - got,
                          (off_t)(HEADER_BYTES + off * sizeof *buf + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* The largest of buf[0..m) (a plain loop: it vectorises). */
static unsigned max_token_(const uint16_t *buf, size_t m)
{
    unsigned mx = 0;
    for (size_t j = 0; j < m; j++) mx = buf[j] > mx ? buf[j] : mx;
    return mx;
}

/* path as an error message shows it: a long one loses the middle, so the
 * shard's name and the problem after it still fit the message (status
 * keeps 512 bytes). buf: SHOWN_PATH bytes. */
enum { SHOWN_PATH = 200 };
static const char *shown_path_(const char *path, char *buf)
{
    size_t n = strlen(path);
    if (n < SHOWN_PATH)
        return path;
    const char *tail = path + n - (SHOWN_PATH - 40);
    snprintf(buf, SHOWN_PATH, "%.32s...%s", path, tail);
    return buf;
}

/* err for the first token >= vocab_size in buf (there is one), buf holding
 * the tokens from index base of the shard named name (shown_path_); note
 * (may be "") is appended. */
static void bad_token_(char *err, size_t errlen, const char *name,
                       const uint16_t *buf, size_t base, int vocab_size,
                       const char *note)
{
    size_t j = 0;
    while (buf[j] < vocab_size) j++;
    seterr_(err, errlen, "%s: token %u at index %zu >= vocab_size %d%s", name,
            (unsigned)buf[j], base + j, vocab_size, note);
}

/* Every token of a shard < vocab_size, read with pread in 1 MiB chunks
 * rather than through the mapping: faulting a large mapping in holds the
 * process's mmap lock, which stalls m6d's other threads (the control
 * socket) whenever they grow their heaps, and read() is faster anyway.
 * name: the shard as messages show it (shown_path_). */
static int check_token_range_(int fd, const struct stat *st, const char *name,
                              size_t n, int vocab_size, char *err,
                              size_t errlen)
{
    enum { CHUNK = 1 << 19 };  /* tokens per read */
    long known = scanned_max_(st);
    if (known >= 0 && known < vocab_size) return 0;
    uint16_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) {
        seterr_(err, errlen, "%s: out of memory", name);
        return -1;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int rc = 0;
    unsigned file_max = 0;
    for (size_t k0 = 0; k0 < n && rc == 0;) {
        size_t m = n - k0 < CHUNK ? n - k0 : CHUNK;
        if (pread_tokens_(fd, k0, buf, m) != 0) {
            seterr_(err, errlen, "%s: read: %s", name,
                    errno ? strerror(errno) : "file shrank while reading");
            free(buf);
            return -1;
        }
        unsigned mx = max_token_(buf, m);
        if (mx >= (unsigned)vocab_size) {
            bad_token_(err, errlen, name, buf, k0, vocab_size, "");
            rc = -1;
        }
        file_max = mx > file_max ? mx : file_max;
        k0 += m;
    }
    free(buf);
    if (rc == 0) scanned_put_(st, file_max);
    return rc;
}

/* err for a set that could not be opened because the process (EMFILE) or
 * the system (ENFILE) has no file descriptor left, with the limit that was
 * hit and what to do: a run holds one descriptor per shard (data.h), so a
 * corpus of many small shards meets RLIMIT_NOFILE although every file in
 * it is fine. what: the file or directory being opened, and how far the
 * set got. */
static void no_fd_error_(char *err, size_t errlen, int e, const char *what)
{
    static const char fix[] = "a run keeps every shard open: raise m6d's "
        "open-file limit (ulimit -n, LimitNOFILE= under systemd) or use "
        "fewer, larger shards (m6ctl data prepare --shard-tokens)";
    if (e == ENFILE) {
        seterr_(err, errlen, "too many open files in the system (fs.file-max): "
                "%s; %s", what, fix);
        return;
    }
    struct rlimit rl;
    char lim[32] = "?";
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof lim, "unlimited");
        else
            snprintf(lim, sizeof lim, "%llu", (unsigned long long)rl.rlim_cur);
    }
    seterr_(err, errlen, "too many open files (limit %s): %s; %s", lim, what,
            fix);
}

/* Check one shard and keep it open; fills slot i of ts. 0, -1, or
 * TOKEN_SET_ENOFILE (no file descriptor left to open it). */
static int shard_open_(token_set *ts, int i, const char *path, int vocab_size,
                       char *err, size_t errlen)
{
    char shown[SHOWN_PATH];
    const char *name = shown_path_(path, shown);  /* in messages */
    /* O_NONBLOCK: a FIFO matched by the glob must not block the caller;
     * fstat then refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE) {
            char what[1200];
            snprintf(what, sizeof what, "%.1000s: open: shard %d of %d",
                     name, i + 1, ts->n_shards);
            no_fd_error_(err, errlen, e, what);
            return TOKEN_SET_ENOFILE;
        }
        seterr_(err, errlen, "%s: open: %s", name, strerror(e));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr_(err, errlen, "%s: stat: %s", name, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr_(err, errlen, "%s: not a regular file", name);
        goto fail;
    }
    size_t size = (size_t)st.st_size;
    if (size < HEADER_BYTES) {
        seterr_(err, errlen,
                "%s: too short for a shard header (%zu bytes, header is %zu)",
                name, size, HEADER_BYTES);
        goto fail;
    }
    int32_t hdr[3];
    if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
        seterr_(err, errlen, "%s: cannot read the header: %s", name,
                strerror(errno ? errno : EIO));
        goto fail;
    }
    if (hdr[0] != SHARD_MAGIC) {
        seterr_(err, errlen, "%s: bad magic %d (want %d)", name, hdr[0],
                SHARD_MAGIC);
        goto fail;
    }
    if (hdr[1] != SHARD_VERSION) {
        seterr_(err, errlen, "%s: bad version %d (want %d)", name, hdr[1],
                SHARD_VERSION);
        goto fail;
    }
    if (hdr[2] < 0) {
        seterr_(err, errlen, "%s: bad token count %d in header", name, hdr[2]);
        goto fail;
    }
    size_t n = (size_t)hdr[2];
    size_t held = (size - HEADER_BYTES) / sizeof(uint16_t);
    if (size < HEADER_BYTES + n * sizeof(uint16_t)) {
        seterr_(err, errlen, "%s: truncated: header says %zu tokens, file holds %zu",
                name, n, held);
        goto fail;
    }
    if (size != HEADER_BYTES + n * sizeof(uint16_t)) {
        seterr_(err, errlen,
                "%s: size mismatch: header says %zu tokens, file holds %zu "
                "(%zu bytes after the header)",
                name, n, held, size - HEADER_BYTES);
        goto fail;
    }
    if (vocab_size < 65536 &&
        check_token_range_(fd, &st, name, n, vocab_size, err, errlen) != 0)
        goto fail;
    /* training reads windows at random offsets: no readahead past them */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    ts->fds[i] = fd;
    ts->n_tokens[i] = n;
    ts->total += n;
    return 0;
fail:
    close(fd);
    return -1;
}

int token_set_open(token_set *ts, const char *pattern, int vocab_size,
                   char *err, size_t errlen)
{
    memset(ts, 0, sizeof *ts);
    if (vocab_size < 1 || vocab_size > 65536) {
        seterr_(err, errlen, "%s: vocab_size %d out of range [1, 65536]",
                pattern, vocab_size);
        return -1;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    glob_failed_path_[0] = 0;
    int rc = glob(pattern, GLOB_ERR, glob_error_, &g);  /* sorted by name */
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0) ||
        (rc == GLOB_ABORTED && glob_failed_errno_ == ENOENT)) {
        seterr_(err, errlen, "no files match '%s'%s%s%s", pattern,
                glob_failed_path_[0] ? " (no directory " : "",
                glob_failed_path_, glob_failed_path_[0] ? ")" : "");
        globfree(&g);
        return -1;
    }
    if (rc != 0) {
        int e = glob_failed_errno_;
        if (rc == GLOB_ABORTED && glob_failed_path_[0] &&
            (e == EMFILE || e == ENFILE)) {
            char what[1200];
            snprintf(what, sizeof what, "'%.500s': cannot read directory %.500s",
                     pattern, glob_failed_path_);
            no_fd_error_(err, errlen, e, what);
            globfree(&g);
            return TOKEN_SET_ENOFILE;
        }
        if (rc == GLOB_ABORTED && glob_failed_path_[0])
            seterr_(err, errlen, "'%s': cannot read directory %s: %s", pattern,
                    glob_failed_path_, strerror(e));
        else
            seterr_(err, errlen, "'%s': glob failed (%s)", pattern,
                    rc == GLOB_NOSPACE ? "out of memory" : "read error");
        globfree(&g);
        return -1;
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        seterr_(err, errlen, "'%s': too many shards", pattern);
        globfree(&g);
        return -1;
    }
    int n = (int)g.gl_pathc;
    ts->n_tokens = calloc((size_t)n, sizeof *ts->n_tokens);
    ts->fds = malloc((size_t)n * sizeof *ts->fds);
    ts->paths = calloc((size_t)n, sizeof *ts->paths);
    if (!ts->n_tokens || !ts->fds || !ts->paths) {
        seterr_(err, errlen, "'%s': out of memory", pattern);
        globfree(&g);
        token_set_close(ts);
        return -1;
    }
    for (int i = 0; i < n; i++) ts->fds[i] = -1;
    ts->n_shards = n;
    ts->vocab_size = vocab_size;
    for (int i = 0; i < n; i++) {
        ts->paths[i] = strdup(g.gl_pathv[i]);
        if (!ts->paths[i]) {
            seterr_(err, errlen, "%s: out of memory", g.gl_pathv[i]);
            goto fail;
        }
        if ((rc = shard_open_(ts, i, g.gl_pathv[i], vocab_size, err,
                              errlen)) != 0)
            goto fail;
    }
    globfree(&g);
    if (ts->total == 0) {
        seterr_(err, errlen, "'%s': the %d matching shard(s) hold no tokens",
                pattern, n);
        token_set_close(ts);
        return -1;
    }
    return 0;
fail:
    globfree(&g);
    token_set_close(ts);
    return rc == TOKEN_SET_ENOFILE ? rc : -1;
}

/* Shard holding global index *i; *i becomes the index within it.
 * Indices at or past total wrap around (the set is read as a ring). */
static int locate_(const token_set *ts, size_t *i)
{
    *i %= ts->total;
    int s = 0;
    while (*i >= ts->n_tokens[s]) {
        *i -= ts->n_tokens[s];
        s++;
    }
    return s;
}

/* Read tokens [off, off+m) of shard s into buf and check them. A short
 * read means the file lost tokens since it was checked: say how many it
 * holds now. */
static int shard_read_(const token_set *ts, int s, size_t off, uint16_t *buf,
                       size_t m, char *err, size_t errlen)
{
    char shown[SHOWN_PATH];
    const char *path = shown_path_(ts->paths[s], shown);  /* in messages */
    if (pread_tokens_(ts->fds[s], off, buf, m) != 0) {
        if (errno) {
            seterr_(err, errlen, "%s: read: %s", path, strerror(errno));
            return -1;
        }
        struct stat st;
        size_t now = 0;
        if (fstat(ts->fds[s], &st) == 0 && (size_t)st.st_size > HEADER_BYTES)
            now = ((size_t)st.st_size - HEADER_BYTES) / sizeof *buf;
        seterr_(err, errlen, "%s: truncated while in use: now %zu tokens, "
                "was %zu", path, now, ts->n_tokens[s]);
        return -1;
    }
    if (ts->vocab_size < 65536 &&
        max_token_(buf, m) >= (unsigned)ts->vocab_size) {
        bad_token_(err, errlen, path, buf, off, ts->vocab_size,
                   " (the shard changed while in use)");
        return -1;
    }
    return 0;
}

int token_set_read(const token_set *ts, size_t pos, uint16_t *buf, size_t n,
                   char *err, size_t errlen)
{
    if (n == 0) return 0;
    size_t off = pos;
    int s = locate_(ts, &off);
    while (n > 0) {
        while (off >= ts->n_tokens[s]) {  /* next non-empty shard, wrapping */
            off = 0;
            s = (s + 1) % ts->n_shards;
        }
        size_t m = ts->n_tokens[s] - off < n ? ts->n_tokens[s] - off : n;
        if (shard_read_(ts, s, off, buf, m, err, errlen) != 0) return -1;
        buf += m;
        off += m;
        n -= m;
    }
    return 0;
}

int token_set_at(const token_set *ts, size_t i)
{
    uint16_t tok;
    char err[8];
    return token_set_read(ts, i, &tok, 1, err, sizeof err) == 0 ? tok : -1;
}

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
    char path[4096], tmp[4100];
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
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path);
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        seterr_(err, errlen, "%s: create: %s", o->tmp, strerror(errno));
        return -1;
    }
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
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        seterr_(err, errlen, "%s: open: %s", path, strerror(errno));
        return -1;
    }
    if (ends_with_(path, ".gz")) {
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
