/*
 * data.c — reading token shards (llm.c layout), the trainer's input. See
 * data.h for the format; shards are written by client/corpus (`m6ctl data
 * prepare`).
 *
 * Every check here runs in release builds; every error names the file.
 */
#include "train/data.h"

#include "common/durable.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Shards are read as they are, uint16/int32: little-endian hosts. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.c reads llm.c shards directly and needs a little-endian host"
#endif

#define HEADER_BYTES ((size_t)SHARD_HEADER_INTS * sizeof(int32_t))

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
static __thread char *glob_failed_path_;  /* malloc'd; NULL none */
static __thread int glob_failed_errno_;

static int glob_error_(const char *path, int eerrno)
{
    free(glob_failed_path_);
    glob_failed_path_ = strdup(path);
    glob_failed_errno_ = eerrno;
    return 1;  /* stop: GLOB_ERR semantics */
}

/* Shards already scanned by this process, with their largest token id:
 * m6d checks a spec's corpus at submit and again when the run starts (and
 * at each restart of the trainer), so a large corpus is read once, not
 * each time. The key is the file's identity and version (device, inode,
 * size, mtime and ctime to the nanosecond): a shard rewritten since is
 * read again, even one whose mtime was put back (touch -r), since that
 * changes the ctime. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
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
           e->mtime.tv_nsec == st->st_mtim.tv_nsec &&
           e->ctime.tv_sec == st->st_ctim.tv_sec &&
           e->ctime.tv_nsec == st->st_ctim.tv_nsec;
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
                                 st->st_mtim, st->st_ctim, max_token};
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

/* path as an error message shows it: whole, except for the *_buf forms
 * (shorten set), whose caller's buffer has a fixed size: there a long path
 * loses the middle, so the shard's name and the problem after it still
 * fit. buf: SHOWN_PATH bytes. */
enum { SHOWN_PATH = 200 };
static const char *shown_path_(const char *path, char *buf, int shorten)
{
    size_t n = strlen(path);
    if (!shorten || n < SHOWN_PATH)
        return path;
    const char *tail = path + n - (SHOWN_PATH - 40);
    snprintf(buf, SHOWN_PATH, "%.32s...%s", path, tail);
    return buf;
}

/* err for the first token >= vocab_size in buf (there is one), buf holding
 * the tokens from index base of the shard named name (shown_path_); note
 * (may be "") is appended. */
static void bad_token_(m6_err *err, const char *name,
                       const uint16_t *buf, size_t base, int vocab_size,
                       const char *note)
{
    size_t j = 0;
    while (buf[j] < vocab_size) j++;
    m6_err_set(err, M6_EDATA, "%s: token %u at index %zu >= vocab_size %d%s",
               name, (unsigned)buf[j], base + j, vocab_size, note);
}

/* Every token of a shard < vocab_size, read with pread in 1 MiB chunks
 * rather than through the mapping: faulting a large mapping in holds the
 * process's mmap lock, which stalls m6d's other threads (the control
 * socket) whenever they grow their heaps, and read() is faster anyway.
 * name: the shard as messages show it (shown_path_). */
static int check_token_range_(int fd, const struct stat *st, const char *name,
                              size_t n, int vocab_size, m6_err *err)
{
    enum { CHUNK = 1 << 19 };  /* tokens per read */
    long known = scanned_max_(st);
    if (known >= 0 && known < vocab_size) return 0;
    uint16_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) {
        m6_err_set(err, M6_EINTERNAL, "%s: out of memory", name);
        return -1;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int rc = 0;
    unsigned file_max = 0;
    for (size_t k0 = 0; k0 < n && rc == 0;) {
        size_t m = n - k0 < CHUNK ? n - k0 : CHUNK;
        if (pread_tokens_(fd, k0, buf, m) != 0) {
            m6_err_set(err, M6_EDATA, "%s: read: %s", name,
                       errno ? strerror(errno) : "file shrank while reading");
            free(buf);
            return -1;
        }
        unsigned mx = max_token_(buf, m);
        if (mx >= (unsigned)vocab_size) {
            bad_token_(err, name, buf, k0, vocab_size, "");
            rc = -1;
        }
        file_max = mx > file_max ? mx : file_max;
        k0 += m;
    }
    free(buf);
    if (rc == 0) scanned_put_(st, file_max);
    return rc;
}

/* err (M6_ENOFILE) for a set that could not be opened because the process
 * (EMFILE) or the system (ENFILE) has no file descriptor left, with the
 * limit that was hit: a run holds one descriptor per shard (data.h), so a
 * corpus of many small shards meets RLIMIT_NOFILE although every file in
 * it is fine. What to do about it is the edge's to say (by the code).
 * what: the file or directory being opened, and how far the set got. */
static void no_fd_error_(m6_err *err, int e, const char *what)
{
    if (e == ENFILE) {
        m6_err_set(err, M6_ENOFILE,
                   "too many open files in the system (fs.file-max): %s", what);
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
    m6_err_set(err, M6_ENOFILE, "too many open files (limit %s): %s", lim,
               what);
}

/* Check one shard and keep it open; fills slot i of ts. 0, -1, or
 * TOKEN_SET_ENOFILE (no file descriptor left to open it). */
static int shard_open_(token_set *ts, int i, const char *path, int vocab_size,
                       m6_err *err, int shorten)
{
    char shown[SHOWN_PATH];
    const char *name = shown_path_(path, shown, shorten);  /* in messages */
    /* a FIFO matched by the glob must not block the caller: open_regular
     * opens without blocking and refuses what is not a regular file */
    struct stat st = {0};
    char why[64];
    int fd = open_regular(path, 0, &st, why, sizeof why);
    if (fd < 0) {
        int e = errno;
        if (e == EINVAL) {  /* the wrong kind (st says which); the message
                             * names the shard as shown, why the whole path */
            m6_err_set(err, M6_EDATA, "%s is %s, not a regular file", name,
                       file_kind_name(st.st_mode));
            return -1;
        }
        if (e == EMFILE || e == ENFILE) {
            m6_err w = M6_ERR_NONE;
            m6_err_set(&w, M6_ENOFILE, "%s: open: shard %d of %d", name,
                       i + 1, ts->n_shards);
            no_fd_error_(err, e, w.msg);
            m6_err_free(&w);
            return TOKEN_SET_ENOFILE;
        }
        m6_err_set(err, M6_EDATA, "%s: open: %s", name, strerror(e));
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size < HEADER_BYTES) {
        m6_err_set(err, M6_EDATA,
                   "%s: too short for a shard header (%zu bytes, header "
                   "is %zu)",
                   name, size, HEADER_BYTES);
        goto fail;
    }
    int32_t hdr[3];
    if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
        m6_err_set(err, M6_EDATA, "%s: cannot read the header: %s", name,
                   strerror(errno ? errno : EIO));
        goto fail;
    }
    if (hdr[0] != SHARD_MAGIC) {
        m6_err_set(err, M6_EDATA, "%s: bad magic %d (want %d)", name, hdr[0],
                   SHARD_MAGIC);
        goto fail;
    }
    if (hdr[1] != SHARD_VERSION) {
        m6_err_set(err, M6_EDATA, "%s: bad version %d (want %d)", name, hdr[1],
                   SHARD_VERSION);
        goto fail;
    }
    if (hdr[2] < 0) {
        m6_err_set(err, M6_EDATA,
                   "%s: bad token count %d in header", name, hdr[2]);
        goto fail;
    }
    size_t n = (size_t)hdr[2];
    size_t held = (size - HEADER_BYTES) / sizeof(uint16_t);
    if (size < HEADER_BYTES + n * sizeof(uint16_t)) {
        m6_err_set(err, M6_EDATA,
                   "%s: truncated: header says %zu tokens, file holds %zu",
                   name, n, held);
        goto fail;
    }
    if (size != HEADER_BYTES + n * sizeof(uint16_t)) {
        m6_err_set(err, M6_EDATA,
                   "%s: size mismatch: header says %zu tokens (%zu bytes "
                   "after the header), the file has %zu bytes after it",
                   name, n, n * sizeof(uint16_t), size - HEADER_BYTES);
        goto fail;
    }
    if (vocab_size < 65536 &&
        check_token_range_(fd, &st, name, n, vocab_size, err) != 0)
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

static int open_(token_set *ts, const char *pattern, int vocab_size,
                 m6_err *err, int shorten)
{
    memset(ts, 0, sizeof *ts);
    if (vocab_size < 1 || vocab_size > 65536) {
        m6_err_set(err, M6_EINVALID,
                   "%s: vocab_size %d out of range [1, 65536]",
                   pattern, vocab_size);
        return -1;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    free(glob_failed_path_);
    glob_failed_path_ = NULL;
    int rc = glob(pattern, GLOB_ERR, glob_error_, &g);  /* sorted by name */
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0) ||
        (rc == GLOB_ABORTED && glob_failed_errno_ == ENOENT)) {
        m6_err_set(err, M6_EDATA, "no files match '%s'%s%s%s", pattern,
                   glob_failed_path_ ? " (no directory " : "",
                   glob_failed_path_ ? glob_failed_path_ : "",
                   glob_failed_path_ ? ")" : "");
        globfree(&g);
        return -1;
    }
    if (rc != 0) {
        int e = glob_failed_errno_;
        if (rc == GLOB_ABORTED && glob_failed_path_ &&
            (e == EMFILE || e == ENFILE)) {
            m6_err w = M6_ERR_NONE;
            m6_err_set(&w, M6_ENOFILE, "'%s': cannot read directory %s",
                       pattern, glob_failed_path_);
            no_fd_error_(err, e, w.msg);
            m6_err_free(&w);
            globfree(&g);
            return TOKEN_SET_ENOFILE;
        }
        if (rc == GLOB_ABORTED && glob_failed_path_)
            m6_err_set(err, M6_EDATA, "'%s': cannot read directory %s: %s",
                       pattern, glob_failed_path_, strerror(e));
        else
            m6_err_set(err, M6_EDATA, "'%s': glob failed (%s)", pattern,
                       rc == GLOB_NOSPACE ? "out of memory" : "read error");
        globfree(&g);
        return -1;
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        m6_err_set(err, M6_EDATA, "'%s': too many shards", pattern);
        globfree(&g);
        return -1;
    }
    int n = (int)g.gl_pathc;
    ts->n_tokens = calloc((size_t)n, sizeof *ts->n_tokens);
    ts->fds = malloc((size_t)n * sizeof *ts->fds);
    ts->paths = calloc((size_t)n, sizeof *ts->paths);
    if (!ts->n_tokens || !ts->fds || !ts->paths) {
        m6_err_set(err, M6_EINTERNAL, "'%s': out of memory", pattern);
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
            m6_err_set(err, M6_EINTERNAL, "%s: out of memory", g.gl_pathv[i]);
            goto fail;
        }
        if ((rc = shard_open_(ts, i, g.gl_pathv[i], vocab_size, err,
                              shorten)) != 0)
            goto fail;
    }
    globfree(&g);
    if (ts->total == 0) {
        m6_err_set(err, M6_EDATA,
                   "'%s': the %d matching shard(s) hold no tokens",
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

int token_set_open(token_set *ts, const char *pattern, int vocab_size,
                   m6_err *err)
{
    return open_(ts, pattern, vocab_size, err, 0);
}

/* Copy e's message into err (cut to errlen) and free e. */
static void to_buf_(m6_err *e, char *err, size_t errlen)
{
    seterr_(err, errlen, "%s", m6_err_msg(e));
    m6_err_free(e);
}

int token_set_open_buf(token_set *ts, const char *pattern, int vocab_size,
                       char *err, size_t errlen)
{
    m6_err e = M6_ERR_NONE;
    int rc = open_(ts, pattern, vocab_size, &e, 1);
    if (rc != 0) to_buf_(&e, err, errlen);
    return rc;
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
                       size_t m, m6_err *err, int shorten)
{
    char shown[SHOWN_PATH];
    const char *path = shown_path_(ts->paths[s], shown, shorten);
    if (pread_tokens_(ts->fds[s], off, buf, m) != 0) {
        if (errno) {
            m6_err_set(err, M6_EDATA, "%s: read: %s", path, strerror(errno));
            return -1;
        }
        struct stat st;
        size_t now = 0;
        if (fstat(ts->fds[s], &st) == 0 && (size_t)st.st_size > HEADER_BYTES)
            now = ((size_t)st.st_size - HEADER_BYTES) / sizeof *buf;
        m6_err_set(err, M6_EDATA, "%s: truncated while in use: now %zu "
                   "tokens, was %zu", path, now, ts->n_tokens[s]);
        return -1;
    }
    if (ts->vocab_size < 65536 &&
        max_token_(buf, m) >= (unsigned)ts->vocab_size) {
        bad_token_(err, path, buf, off, ts->vocab_size,
                   " (the shard changed while in use)");
        return -1;
    }
    return 0;
}

static int read_(const token_set *ts, size_t pos, uint16_t *buf, size_t n,
                 m6_err *err, int shorten)
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
        if (shard_read_(ts, s, off, buf, m, err, shorten) != 0) return -1;
        buf += m;
        off += m;
        n -= m;
    }
    return 0;
}

int token_set_read(const token_set *ts, size_t pos, uint16_t *buf, size_t n,
                   m6_err *err)
{
    return read_(ts, pos, buf, n, err, 0);
}

int token_set_read_buf(const token_set *ts, size_t pos, uint16_t *buf,
                       size_t n, char *err, size_t errlen)
{
    m6_err e = M6_ERR_NONE;
    int rc = read_(ts, pos, buf, n, &e, 1);
    if (rc != 0) to_buf_(&e, err, errlen);
    return rc;
}

int token_set_at(const token_set *ts, size_t i)
{
    uint16_t tok;
    m6_err e = M6_ERR_NONE;
    int rc = token_set_read(ts, i, &tok, 1, &e);
    m6_err_free(&e);
    return rc == 0 ? tok : -1;
}
