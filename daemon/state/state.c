/*
 * state.c — SQLite persistence for m6d (see state.h): opening and
 * migrating m6.db, the SQL helpers, step records held while another
 * process holds the write lock and waited writes, and the runs and phases
 * tables. The step records are state_records.c's, the nodes table
 * state_nodes.c's, the command log state_commands.c's; what they share is
 * state_internal.h.
 */
#include "state/state_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/threads.h"
#include "common/clock.h"
#include "common/crashpoint.h"
#include "common/durable.h"
#include "common/log.h"
#include "state/schema.h"

/* Held records and waited writes (below, "other writers"). */
static int begin_locked_(state *st, int busy_ms);
static int commit_locked_(state *st);
static void held_clear_locked_(state *st);
static void *flusher_main_(void *arg);
static double wait_s_(const state *st);

double state_now_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void state_copy_text_(char *dst, size_t cap, const unsigned char *src)
{
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* ------------------------------------------------------------ open/migrate */

/* Another connection holds the lock (SQLITE_BUSY, SQLITE_LOCKED and their
 * extended codes): a wait, not a failure. */
static int is_busy_(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

int state_exec_(state *st, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(st->db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        if (is_busy_(rc)) {  /* the caller holds or waits (held_write_) */
            st->busy_hit = 1;
            log_debug("sqlite.busy", "sql=\"%.60s\" msg=\"%s\"", sql,
                      msg ? msg : "?");
        } else {
            log_error("sqlite.error", "sql=\"%.60s\" msg=\"%s\"", sql,
                      msg ? msg : "?");
        }
        snprintf(st->last_error, sizeof st->last_error, "%s", msg ? msg : "?");
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int user_version_(state *st)
{
    sqlite3_stmt *s = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) ==
            SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    return v;
}

static int migrate_(state *st, char *err, size_t errlen)
{
    int v = user_version_(st);
    if (v < 0) {
        snprintf(err, errlen, "cannot read user_version: %s",
                 sqlite3_errmsg(st->db));
        return -1;
    }
    if (v > schema_n_migrations) {
        snprintf(err, errlen,
                 "database schema version %d is newer than this m6d (%d)", v,
                 schema_n_migrations);
        return -1;
    }
    for (int i = v; i < schema_n_migrations; i++) {
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", i + 1);
        if (state_exec_(st, "BEGIN IMMEDIATE") < 0) goto bad;
        if (state_exec_(st, schema_migrations[i].sql) < 0 || state_exec_(st, pragma) < 0) {
            state_exec_(st, "ROLLBACK");
            goto bad;
        }
        if (state_exec_(st, "COMMIT") < 0) goto bad;
        log_info("state.migrate", "file=%s user_version=%d",
                 schema_migrations[i].name, i + 1);
        continue;
    bad:
        snprintf(err, errlen, "migration %s failed: %s",
                 schema_migrations[i].name, sqlite3_errmsg(st->db));
        return -1;
    }
    return 0;
}

/* What to do about a damaged m6.db (check_intact_, state_open). */
static const char fix_[] = "m6d will not run on it: restore it from a "
    "backup, or salvage what SQLite can read with `sqlite3 DAMAGED.db "
    ".recover | sqlite3 NEW.db`, then start m6d on the new file";

/* SQLite's quick_check (every page and index entry well formed; linear in
 * the file's size) before anything runs on the database: a damaged m6.db
 * would otherwise serve half its runs and fail writes later, one by one.
 * 0, or -1 with err naming the file, SQLite's first complaint and what to
 * do. */
static int check_intact_(state *st, const char *path, char *err,
                         size_t errlen)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(st->db, "PRAGMA quick_check", -1, &q, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(q, 0);
        if (r && strcmp(r, "ok") == 0) {
            sqlite3_finalize(q);
            return 0;
        }
        snprintf(err, errlen, "%s: the state database is damaged (SQLite "
                 "quick_check: %.200s); %s", path, r ? r : "?", fix_);
    } else {
        snprintf(err, errlen, "%s: the state database is damaged or "
                 "unreadable (%s); %s", path, sqlite3_errmsg(st->db), fix_);
    }
    sqlite3_finalize(q);
    return -1;
}

/* st->reader, or NULL (logged) when SQLite cannot open one: the reads
 * then share st's connection. */
static void open_reader_(state *st, const char *path)
{
    state *r = calloc(1, sizeof *r);
    if (!r) return;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->held_cv, NULL);
    r->held_tail = &r->held_head;
    int rc = sqlite3_open_v2(path, &r->db,
                             SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, NULL);
    if (rc != SQLITE_OK) {
        log_warn("state.reader", "path=\"%s\" msg=\"%s\" (reads share the "
                 "writer's connection)", path,
                 r->db ? sqlite3_errmsg(r->db) : sqlite3_errstr(rc));
        state_close(r);
        return;
    }
    sqlite3_busy_timeout(r->db, 5000);
    st->reader = r;
}

/* Whether m6.db or one of its WAL files at path is there as something
 * other than a regular file (a FIFO, a directory...), which SQLite reports
 * only as "disk I/O error": 1 with err naming the file and what it is
 * (open_regular's words), else 0 (absent, regular, or not readable:
 * SQLite says why). */
static int not_regular_(const char *path, char *err, size_t errlen)
{
    static const char *const suffix[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        char p[PATH_MAX + 8], e[PATH_MAX + 128];
        snprintf(p, sizeof p, "%s%s", path, suffix[i]);
        int fd = open_regular(p, 0, NULL, e, sizeof e);
        if (fd >= 0) {
            close(fd);
        } else if (errno == EINVAL) {
            snprintf(err, errlen, "%s; m6d keeps its state DB there: move "
                     "it away (or remove it) and start m6d again", e);
            return 1;
        }
    }
    return 0;
}

state *state_open(const char *path, char *err, size_t errlen)
{
    state *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->held_cv, NULL);
    st->held_tail = &st->held_head;
    st->hold_limit_s = STATE_HOLD_LIMIT_DEFAULT_S;
    snprintf(st->path, sizeof st->path, "%s", path);
    if (not_regular_(path, err, errlen)) goto fail;
    int rc = sqlite3_open_v2(path, &st->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                 SQLITE_OPEN_FULLMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path,
                 st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        goto fail;
    }
    sqlite3_busy_timeout(st->db, DEFAULT_BUSY_MS);
    /* SQLite opens a file it may not write read-only, without a word */
    if (sqlite3_db_readonly(st->db, "main") == 1) {
        snprintf(err, errlen, "%s: m6d (uid %d) may not write it; check the "
                 "owner and mode of the file and of its directory", path,
                 (int)geteuid());
        goto fail;
    }
    if (state_exec_(st, "PRAGMA journal_mode = WAL") < 0 ||
        state_exec_(st, "PRAGMA synchronous = NORMAL") < 0 ||
        state_exec_(st, "PRAGMA foreign_keys = ON") < 0) {
        int ec = sqlite3_errcode(st->db);
        int damaged = ec == SQLITE_CORRUPT || ec == SQLITE_NOTADB;
        snprintf(err, errlen, "%s: %s%s%s", path, sqlite3_errmsg(st->db),
                 damaged ? "; " : "", damaged ? fix_ : "");
        goto fail;
    }
    if (check_intact_(st, path, err, errlen) < 0) goto fail;
    if (migrate_(st, err, errlen) < 0) goto fail;
    open_reader_(st, path);
    if (threads_start(&st->flusher, flusher_main_, st) != 0) {
        snprintf(err, errlen, "cannot start the state DB's flusher thread");
        goto fail;
    }
    st->flusher_started = 1;
    return st;
fail:
    state_close(st);
    return NULL;
}

void state_close(state *st)
{
    if (!st) return;
    if (st->flusher_started) {
        pthread_mutex_lock(&st->mu);
        st->closing = 1;
        pthread_cond_broadcast(&st->held_cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->flusher, NULL);
    }
    /* m6d stops with records held: wait for the lock (wait_s_) once more,
     * then say what is lost */
    double start = clock_mono_s();
    while (st->held_n && st->db) {
        int rc = begin_locked_(st, WAIT_SLICE_MS);
        if (rc == 0) rc = commit_locked_(st);
        if (rc != 1 || clock_mono_s() - start >= wait_s_(st)) break;
    }
    if (st->held_n) {
        log_error("state.lost", "db=%s records=%d msg=\"m6d stops while "
                  "m6.db is locked by another process or cannot be written "
                  "(%s): the step records held in memory are lost; the "
                  "run resumes from its last checkpoint\"", st->path,
                  st->held_n, st->last_error);
        held_clear_locked_(st);
    }
    state_close(st->reader);
    if (st->db) sqlite3_close(st->db);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->held_cv);
    free(st);
}

int state_user_version(state *st)
{
    pthread_mutex_lock(&st->mu);
    int v = user_version_(st);
    pthread_mutex_unlock(&st->mu);
    return v;
}

/* ------------------------------------------------------------ sql helpers */

/* The SQLite check: logs what failed (the statement), the caller's file:line
 * and SQLite's own error. Every helper below reports through it. */
static void sql_fail_(state *st, const char *sql, const char *file, int line,
                      int rc)
{
    if (is_busy_(rc)) {
        st->busy_hit = 1;
        log_debug("sqlite.busy", "sql=\"%.60s\" at=%s:%d", sql ? sql : "?",
                  file, line);
        snprintf(st->last_error, sizeof st->last_error, "%s",
                 sqlite3_errmsg(st->db));
        return;
    }
    log_error("sqlite.error", "sql=\"%s\" at=%s:%d rc=%d msg=\"%s\"",
              sql ? sql : "?", file, line, rc, sqlite3_errmsg(st->db));
    snprintf(st->last_error, sizeof st->last_error, "%s",
             sqlite3_errmsg(st->db));
}

/* Prepare sql and bind args (ended by ARG_END); NULL on error, logged. */
sqlite3_stmt *state_prepare_(state *st, const char *file, int line,
                              const char *sql, const arg_ *args)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
    for (int i = 0; rc == SQLITE_OK && args[i].kind != ARG_END; i++) {
        const arg_ *a = &args[i];
        if (a->kind == ARG_INT)
            rc = sqlite3_bind_int64(s, i + 1, a->i);
        else if (a->kind == ARG_REAL && !isnan(a->d))
            rc = sqlite3_bind_double(s, i + 1, a->d);
        else if (a->kind == ARG_TEXT && a->t)
            rc = sqlite3_bind_text(s, i + 1, a->t, -1, SQLITE_TRANSIENT);
        else
            rc = sqlite3_bind_null(s, i + 1);
    }
    if (rc != SQLITE_OK) {
        sql_fail_(st, sql, file, line, rc);
        sqlite3_finalize(s);
        return NULL;
    }
    return s;
}

/* Step s once: 1 a row, 0 done, -1 error (logged). */
int state_next_(state *st, const char *file, int line, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    sql_fail_(st, sqlite3_sql(s), file, line, rc);
    return -1;
}

/* Run one statement that returns no rows, with st->mu held by the caller.
 * Returns the number of rows it changed, or -1 (logged). */
int state_write_locked_(state *st, const char *file, int line,
                         const char *sql, const arg_ *args)
{
    sqlite3_stmt *s = state_prepare_(st, file, line, sql, args);
    if (!s) return -1;
    int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) sql_fail_(st, sql, file, line, rc);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? sqlite3_changes(st->db) : -1;
}

/* ------------------------------------------- other writers: held records */

static void held_free_(held_ *h)
{
    if (!h) return;
    for (int i = 0; i < h->n; i++)
        if (h->args[i].kind == ARG_TEXT) free((char *)h->args[i].t);
    free(h);
}

/* A copy of v, or NULL (out of memory). */
static held_ *held_new_(const stmt_ *v)
{
    int n = 0;
    while (v->args[n].kind != ARG_END) n++;
    held_ *h = calloc(1, sizeof *h + (size_t)(n + 1) * sizeof(arg_));
    if (!h) return NULL;
    h->sql = v->sql;
    for (int i = 0; i < n; i++) {
        h->args[i] = v->args[i];
        if (v->args[i].kind == ARG_TEXT && v->args[i].t &&
            !(h->args[i].t = strdup(v->args[i].t))) {
            h->n = i;
            held_free_(h);
            return NULL;
        }
        h->n = i + 1;
    }
    h->args[n].kind = ARG_END;
    return h;
}

static void held_clear_locked_(state *st)
{
    for (held_ *h = st->held_head, *next; h; h = next) {
        next = h->next;
        held_free_(h);
    }
    st->held_head = NULL;
    st->held_tail = &st->held_head;
    st->held_n = 0;
    st->held_since = 0;
}

/* ROLLBACK, keeping the cause (last_error, busy_hit): a ROLLBACK after a
 * failed COMMIT may fail too ("no transaction is active"). */
static void rollback_locked_(state *st)
{
    char cause[sizeof st->last_error];
    memcpy(cause, st->last_error, sizeof cause);
    int busy = st->busy_hit;
    if (sqlite3_get_autocommit(st->db) == 0) state_exec_(st, "ROLLBACK");
    memcpy(st->last_error, cause, sizeof cause);
    st->busy_hit = busy;
}

/* BEGIN IMMEDIATE, waiting busy_ms at most for another writer, then the
 * held records, in order. 0 (in the transaction), 1 busy, -1 error (no
 * transaction left open either way). */
static int begin_locked_(state *st, int busy_ms)
{
    st->busy_hit = 0;
    sqlite3_busy_timeout(st->db, busy_ms);
    if (state_exec_(st, "BEGIN IMMEDIATE") < 0) return st->busy_hit ? 1 : -1;
    for (held_ **p = &st->held_head; *p;) {
        held_ *h = *p;
        if (state_write_locked_(st, __FILE__, __LINE__, h->sql, h->args) < 0) {
            if (!st->busy_hit &&
                (sqlite3_errcode(st->db) & 0xff) == SQLITE_CONSTRAINT) {
                /* it can never be written (logged): drop it, not the rest */
                *p = h->next;
                if (st->held_tail == &h->next) st->held_tail = p;
                held_free_(h);
                st->held_n--;
                continue;
            }
            rollback_locked_(st);
            return st->busy_hit ? 1 : -1;
        }
        p = &h->next;
    }
    return 0;
}

/* COMMIT what begin_locked_ began: the held records are then written
 * (freed, logged). 0, 1 busy, -1 error (rolled back). */
static int commit_locked_(state *st)
{
    if (state_exec_(st, "COMMIT") < 0) {
        rollback_locked_(st);
        return st->busy_hit ? 1 : -1;
    }
    if (st->held_n) {
        log_info("state.unheld", "db=%s records=%d held_s=%.1f msg=\"m6.db "
                 "is writable again: the records held in memory are "
                 "written\"", st->path, st->held_n, clock_mono_s() - st->held_since);
        held_clear_locked_(st);
    }
    return 0;
}

/* The statements v[0..n) in the open transaction; *changed the rows the
 * last one changed. 0, 1 busy, -1 error. */
static int run_stmts_locked_(state *st, const char *file, int line,
                             const stmt_ *v, int n, int *changed)
{
    for (int i = 0; i < n; i++)
        if ((*changed = state_write_locked_(st, file, line, v[i].sql,
                                      v[i].args)) < 0)
            return st->busy_hit ? 1 : -1;
    return 0;
}

/*
 * A step record (v[0..n), one transaction): written now when m6.db is free;
 * when another process holds its write lock (SQLITE_BUSY past HELD_TRY_MS),
 * or records are held already (they go first), held in memory, in order,
 * and written by the flusher thread once the lock goes. Training never
 * waits for the lock. 0 written or held, -1 another error (disk full: not
 * held; the caller keeps it owed, as before). *changed (may be NULL): the
 * rows the last statement changed when written now; -1 held.
 */
int state_held_write_(state *st, const char *file, int line, const stmt_ *v,
                       int n, int *changed)
{
    int ret = -1, dummy;
    if (!changed) changed = &dummy;
    *changed = -1;
    pthread_mutex_lock(&st->mu);
    if (!st->held_n) {
        int rc = begin_locked_(st, HELD_TRY_MS);
        if (rc == 0) {
            rc = run_stmts_locked_(st, file, line, v, n, changed);
            if (rc == 0) {
                crashpoint("commit");  /* rows written, not committed */
                rc = commit_locked_(st);
            }
            else rollback_locked_(st);
        }
        if (rc <= 0) {
            ret = rc;
            goto out;
        }
        *changed = -1;
    }
    held_ *first = NULL, **tail = &first;
    for (int i = 0; i < n; i++) {
        held_ *h = held_new_(&v[i]);
        if (!h) {
            for (held_ *x = first, *next; x; x = next) {
                next = x->next;
                held_free_(x);
            }
            snprintf(st->last_error, sizeof st->last_error, "out of memory "
                     "holding a record while m6.db is locked");
            log_error("state.held", "db=%s msg=\"%s\"", st->path,
                      st->last_error);
            goto out;
        }
        *tail = h;
        tail = &h->next;
    }
    *st->held_tail = first;
    st->held_tail = tail;
    st->held_n += n;
    double now = clock_mono_s();
    if (!st->held_since) st->held_since = now;
    if (now - st->busy_logged >= BUSY_LOG_EVERY_S) {
        st->busy_logged = now;
        log_warn("state.held", "db=%s records=%d held_s=%.1f limit_s=%.0f "
                 "msg=\"another process holds m6.db's write lock; step "
                 "records are held in memory and written once it is "
                 "released\"", st->path, st->held_n, now - st->held_since,
                 st->hold_limit_s);
    }
    pthread_cond_signal(&st->held_cv);
    ret = 0;
out:
    sqlite3_busy_timeout(st->db, DEFAULT_BUSY_MS);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* The flusher thread: while records are held, try every FLUSH_EVERY_MS
 * (FLUSH_TRY_MS each, mu let go between) to write them. */
static void *flusher_main_(void *arg)
{
    state *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->closing) {
        if (!st->held_n) {
            pthread_cond_wait(&st->held_cv, &st->mu);
            continue;
        }
        int rc = begin_locked_(st, FLUSH_TRY_MS);
        if (rc == 0) rc = commit_locked_(st);
        sqlite3_busy_timeout(st->db, DEFAULT_BUSY_MS);
        if (!st->held_n) continue;
        /* another error (disk full, logged): try again, less often */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ms = rc < 0 ? 1000 : FLUSH_EVERY_MS;
        ts.tv_nsec += ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&st->held_cv, &st->mu, &ts);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* state_thread_wait_limit's bound for this thread; < 0 none. */
static __thread double thread_wait_s_ = -1;

void state_thread_wait_limit(double seconds)
{
    thread_wait_s_ = seconds;
}

/* How long a waited write tries before it fails. */
static double wait_s_(const state *st)
{
    double w = st->hold_limit_s < WAIT_MAX_S ? st->hold_limit_s : WAIT_MAX_S;
    return thread_wait_s_ >= 0 && thread_wait_s_ < w ? thread_wait_s_ : w;
}

/*
 * A state change that its caller must know is in m6.db (a run inserted, a
 * state set, a command recorded): body (under mu, in one BEGIN IMMEDIATE
 * transaction after the held records) returns < 0 on error, else its
 * result. While another process holds the lock it is tried again in
 * WAIT_SLICE_MS slices, mu let go between (reads and step records go on),
 * for wait_s_ at most; then -1 with last_error saying the lock. Returns
 * body's result, or -1.
 */
static int waited_(state *st, int (*body)(state *, void *), void *arg)
{
    double start = clock_mono_s();
    for (;;) {
        int ret = -1;
        pthread_mutex_lock(&st->mu);
        int rc = begin_locked_(st, WAIT_SLICE_MS);
        if (rc == 0) {
            ret = body(st, arg);
            if (ret < 0) {
                rc = st->busy_hit ? 1 : -1;
                rollback_locked_(st);
            } else {
                rc = commit_locked_(st);
            }
        }
        sqlite3_busy_timeout(st->db, DEFAULT_BUSY_MS);
        double waited = clock_mono_s() - start;
        int give_up = rc == 1 && waited >= wait_s_(st);
        if (give_up) {
            snprintf(st->last_error, sizeof st->last_error, "database is "
                     "locked: another process has held m6.db's write lock "
                     "for %.0f s (end its transaction; `fuser %.100s` names "
                     "it)", waited, st->path);
            log_error("state.locked", "db=%s waited_s=%.1f msg=\"%s\"",
                      st->path, waited, st->last_error);
        }
        pthread_mutex_unlock(&st->mu);
        if (rc == 0) return ret;
        if (rc < 0 || give_up) return -1;
    }
}

typedef struct {
    const char *file;
    int line;
    const char *sql;
    const arg_ *args;
} one_write_;

static int one_write_body_(state *st, void *arg)
{
    one_write_ *w = arg;
    return state_write_locked_(st, w->file, w->line, w->sql, w->args);
}

/* One statement as a waited write: the rows it changed, or -1. */
int state_write_(state *st, const char *file, int line, const char *sql,
                  const arg_ *args)
{
    one_write_ w = {file, line, sql, args};
    return waited_(st, one_write_body_, &w);
}

/* Every row of the query, each put into an elem-sized slot by fill; takes
 * st->mu. 0 with *out malloc'd (NULL when there are no rows) and *n set, or
 * -1 with *out NULL and *n 0. */
int state_list_(state *st, const char *file, int line, void **out, int *n,
                 size_t elem, void (*fill)(sqlite3_stmt *, void *),
                 const char *sql, const arg_ *args)
{
    char *v = NULL;
    int cnt = 0, cap = 0, rc = -1;
    pthread_mutex_lock(&st->mu);
    sqlite3_stmt *s = state_prepare_(st, file, line, sql, args);
    while (s && (rc = state_next_(st, file, line, s)) == 1) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            char *nv = realloc(v, (size_t)cap * elem);
            if (!nv) {
                rc = -1;
                break;
            }
            v = nv;
        }
        fill(s, v + (size_t)cnt++ * elem);
    }
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    if (rc != 0) {
        free(v);
        v = NULL;
        cnt = 0;
    }
    *out = v;
    *n = cnt;
    return rc == 0 ? 0 : -1;
}

/* -------------------------------------------------------------------- runs */

typedef struct {
    const char *name, *spec;
    int64_t total_steps;
    int phase;
    const run_summary *sum;
    int64_t id;
} run_insert_;

static int run_insert_body_(state *st, void *arg)
{
    run_insert_ *a = arg;
    double t = state_now_();
    const run_summary *u = a->sum;
    if (SQL_WRITE_LOCKED(st,
            "INSERT INTO runs(name, spec, state, phase, step, total_steps, "
            "created, updated, pseudo_steps, device_budget, backend, "
            "delink_policy, world_size, expert_parallel, precision, "
            "master_precision) VALUES (?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, ?, ?)",
            A_TEXT(a->name ? a->name : ""), A_TEXT(a->spec),
            A_TEXT(phase_name(a->phase)), A_INT(a->total_steps), A_REAL(t),
            A_REAL(t), u ? A_INT(u->pseudo_steps) : A_NULL,
            u ? A_INT(u->device_budget) : A_NULL,
            A_TEXT(u ? u->backend : NULL),
            A_TEXT(u ? u->delink_policy : NULL),
            u ? A_INT(u->world_size) : A_NULL,
            u ? A_INT(u->expert_parallel) : A_NULL,
            A_TEXT(u ? u->precision : NULL),
            A_TEXT(u ? u->master_precision : NULL)) < 0)
        return -1;
    a->id = sqlite3_last_insert_rowid(st->db);
    if (!a->name || !*a->name) {
        char nm[64];
        snprintf(nm, sizeof nm, "run-%lld", (long long)a->id);
        if (SQL_WRITE_LOCKED(st, "UPDATE runs SET name = ? WHERE id = ?",
                             A_TEXT(nm), A_INT(a->id)) < 0)
            return -1;
    }
    return 0;
}

int64_t state_run_insert(state *st, const char *name, const char *spec,
                         int64_t total_steps, int phase,
                         const run_summary *sum)
{
    run_insert_ a = {name, spec, total_steps, phase, sum, -1};
    return waited_(st, run_insert_body_, &a) < 0 ? -1 : a.id;
}

static void row_from_stmt_(sqlite3_stmt *s, run_row *r, int with_spec)
{
    memset(r, 0, sizeof *r);
    r->id = sqlite3_column_int64(s, 0);
    state_copy_text_(r->name, sizeof r->name, sqlite3_column_text(s, 1));
    int stv = run_state_parse((const char *)sqlite3_column_text(s, 2));
    r->state = stv < 0 || !run_state_recorded((run_state)stv)
                   ? RUN_FAILED : (run_state)stv;
    r->phase = phase_parse((const char *)sqlite3_column_text(s, 3)) == 1;
    r->step = sqlite3_column_int64(s, 4);
    r->total_steps = sqlite3_column_int64(s, 5);
    r->created = sqlite3_column_double(s, 6);
    r->updated = sqlite3_column_double(s, 7);
    const unsigned char *er = sqlite3_column_text(s, 8);
    r->error = er ? strdup((const char *)er) : NULL;
    r->delink_step = sqlite3_column_type(s, 9) == SQLITE_NULL
                         ? -1 : sqlite3_column_int64(s, 9);
    /* the summary (0009): all four set at submit, or none */
    r->have_summary = sqlite3_column_type(s, 10) != SQLITE_NULL &&
                      sqlite3_column_type(s, 11) != SQLITE_NULL &&
                      sqlite3_column_type(s, 12) != SQLITE_NULL &&
                      sqlite3_column_type(s, 13) != SQLITE_NULL;
    if (r->have_summary) {
        r->pseudo_steps = sqlite3_column_int64(s, 10);
        r->device_budget = sqlite3_column_int64(s, 11);
        state_copy_text_(r->backend, sizeof r->backend, sqlite3_column_text(s, 12));
        state_copy_text_(r->delink_policy, sizeof r->delink_policy,
                   sqlite3_column_text(s, 13));
    }
    if (sqlite3_column_type(s, 14) != SQLITE_NULL) {
        r->lost.node_id = sqlite3_column_int64(s, 14);
        r->lost.rank = sqlite3_column_int(s, 15);
        r->lost.local_rank = sqlite3_column_int(s, 16);
        r->lost.ranks = sqlite3_column_int(s, 17);
    }
    if (sqlite3_column_type(s, 18) != SQLITE_NULL &&
        sqlite3_column_type(s, 19) != SQLITE_NULL) {
        r->world_size = sqlite3_column_int(s, 18);
        r->expert_parallel = sqlite3_column_int(s, 19);
    }
    if (sqlite3_column_type(s, 20) != SQLITE_NULL &&
        sqlite3_column_type(s, 21) != SQLITE_NULL) {
        state_copy_text_(r->precision, sizeof r->precision,
                         sqlite3_column_text(s, 20));
        state_copy_text_(r->master_precision, sizeof r->master_precision,
                         sqlite3_column_text(s, 21));
    }
    if (with_spec) {
        const unsigned char *sp = sqlite3_column_text(s, 22);
        r->spec = strdup(sp ? (const char *)sp : "");
    }
}

#define RUN_COLS "id, name, state, phase, step, total_steps, created, " \
                 "updated, error, delink_step, pseudo_steps, device_budget, " \
                 "backend, delink_policy, lost_node, lost_rank, " \
                 "lost_local_rank, lost_ranks, world_size, expert_parallel, " \
                 "precision, master_precision"

int state_run_get(state *st, int64_t id, run_row *out)
{
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    sqlite3_stmt *s = SQL_PREPARE(st,
        "SELECT " RUN_COLS ", spec FROM runs WHERE id = ?", A_INT(id));
    int rc = s ? SQL_NEXT(st, s) : -1;
    if (rc == 1) {
        row_from_stmt_(s, out, 1);
        ret = out->spec ? 0 : -1;
    } else if (rc == 0) {
        ret = 1;
    }
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

void run_row_clear(run_row *r)
{
    free(r->spec);
    r->spec = NULL;
    free(r->error);
    r->error = NULL;
}

void run_rows_free(run_row *rows, int n)
{
    for (int i = 0; rows && i < n; i++) run_row_clear(&rows[i]);
    free(rows);
}

/* The SQL condition of a run that has not ended */
#define LIVE_SQL_ "state IN ('queued', 'running', 'paused')"

int state_run_find_name(state *st, const char *name, int64_t *id,
                        char *ids, size_t idslen)
{
    int ret = -1, n = 0, rc = -1, top = 0, cut = 0;
    size_t o = 0;
    if (idslen) ids[0] = 0;
    pthread_mutex_lock(&st->mu);
    /* live runs first: the first row answers unless another is as good
     * (both live, or both ended); those as good are listed */
    sqlite3_stmt *s = SQL_PREPARE(st,
        "SELECT id, " LIVE_SQL_ " FROM runs WHERE name = ? "
        "ORDER BY 2 DESC, id", A_TEXT(name));
    while (s && (rc = SQL_NEXT(st, s)) == 1) {
        int64_t rid = sqlite3_column_int64(s, 0);
        int live = sqlite3_column_int(s, 1);
        if (n == 0) *id = rid, top = live;
        if (live != top) continue;
        if (o + 24 < idslen)  /* room for one more id and ", ..." */
            o += (size_t)snprintf(ids + o, idslen - o, "%s%lld", n ? ", " : "",
                                  (long long)rid);
        else if (o < idslen && !cut++)
            o += (size_t)snprintf(ids + o, idslen - o, ", ...");
        n++;
    }
    if (rc == 0) ret = n == 0 ? 1 : n == 1 ? 0 : 2;
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

static void run_fill_(sqlite3_stmt *s, void *elem)
{
    row_from_stmt_(s, elem, 0);
}

int state_run_list(state *st, run_row **rows, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, run_fill_,
                       "SELECT " RUN_COLS " FROM runs ORDER BY id");
    *rows = v;
    return ret;
}

static void id_fill_(sqlite3_stmt *s, void *elem)
{
    *(int64_t *)elem = sqlite3_column_int64(s, 0);
}

int state_run_ids(state *st, run_state rs, int64_t **ids, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **ids, id_fill_,
                       "SELECT id FROM runs WHERE state = ? ORDER BY id",
                       A_TEXT(run_state_name(rs)));
    *ids = v;
    return ret;
}

typedef struct {
    int64_t id;
    const char *spec;
    const run_summary *sum;
    const char *kind, *detail, *before;
    int changed;
} run_spec_set_;

static int run_spec_set_body_(state *st, void *arg)
{
    run_spec_set_ *a = arg;
    const run_summary *u = a->sum;
    double t = state_now_();
    int n = SQL_WRITE_LOCKED(st, "UPDATE runs SET spec = ?, updated = ?, "
                             "pseudo_steps = ?, device_budget = ?, "
                             "backend = ?, delink_policy = ?, world_size = ?, "
                             "expert_parallel = ?, precision = ?, "
                             "master_precision = ?, spec_before = ? "
                             "WHERE id = ?",
                             A_TEXT(a->spec), A_REAL(t),
                             A_INT(u->pseudo_steps), A_INT(u->device_budget),
                             A_TEXT(u->backend), A_TEXT(u->delink_policy),
                             A_INT(u->world_size), A_INT(u->expert_parallel),
                             A_TEXT(u->precision), A_TEXT(u->master_precision),
                             A_TEXT(a->before), A_INT(a->id));
    if (n < 0)
        return -1;
    a->changed = n;
    if (n && SQL_WRITE_LOCKED(st, "INSERT INTO events(run, time, kind, "
                              "detail) VALUES (?, ?, ?, ?)", A_INT(a->id),
                              A_REAL(t), A_TEXT(a->kind),
                              A_TEXT(a->detail)) < 0)
        return -1;
    return 0;
}

int state_run_set_spec(state *st, int64_t id, const char *spec,
                       const run_summary *sum, const char *kind,
                       const char *detail, const char *before)
{
    run_spec_set_ a = {id, spec, sum, kind, detail, before, 0};
    if (waited_(st, run_spec_set_body_, &a) < 0)
        return -1;
    return a.changed ? 0 : 1;
}

int state_run_settle_spec(state *st, int64_t id)
{
    return SQL_WRITE(st, "UPDATE runs SET spec_before = NULL WHERE id = ?",
                     A_INT(id)) < 0 ? -1 : 0;
}

static void unsettled_fill_(sqlite3_stmt *s, void *elem)
{
    run_unsettled *u = elem;
    u->id = sqlite3_column_int64(s, 0);
    const unsigned char *t = sqlite3_column_text(s, 1);
    u->spec_before = strdup(t ? (const char *)t : "");
}

int state_run_unsettled(state *st, run_unsettled **rows, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, unsettled_fill_,
                       "SELECT id, spec_before FROM runs WHERE spec_before "
                       "IS NOT NULL ORDER BY id");
    *rows = v;
    return ret;
}

int state_run_set_state(state *st, int64_t id, run_state rs, const char *error)
{
    int changed = SQL_WRITE(st,
        "UPDATE runs SET state = ?, error = ?, updated = ? WHERE id = ?",
        A_TEXT(run_state_name(rs)), A_TEXT(error), A_REAL(state_now_()), A_INT(id));
    return changed < 0 ? -1 : changed ? 0 : 1;
}

int state_run_set_state_held(state *st, int64_t id, run_state rs,
                             const char *error)
{
    return SQL_HOLD(st,
        "UPDATE runs SET state = ?, error = ?, updated = ? WHERE id = ?",
        A_TEXT(run_state_name(rs)), A_TEXT(error), A_REAL(state_now_()), A_INT(id));
}

int state_run_set_lost(state *st, int64_t id, const run_lost *l)
{
    int on = l && l->node_id > 0;
    return SQL_HOLD(st,
        "UPDATE runs SET lost_node = ?, lost_rank = ?, lost_local_rank = ?, "
        "lost_ranks = ?, updated = ? WHERE id = ?",
        on ? A_INT(l->node_id) : A_NULL, on ? A_INT(l->rank) : A_NULL,
        on ? A_INT(l->local_rank) : A_NULL, on ? A_INT(l->ranks) : A_NULL,
        A_REAL(state_now_()), A_INT(id));
}

int state_run_set_delink(state *st, int64_t id, int64_t step)
{
    int changed;
    int rc = SQL_HOLD_CHANGED(st, &changed,
        "UPDATE runs SET delink_step = ?, updated = ? WHERE id = ?",
        A_INT_OR_NULL(step), A_REAL(state_now_()), A_INT(id));
    return rc < 0 ? -1 : changed == 0 ? 1 : 0;
}

int state_run_set_progress(state *st, int64_t id, int64_t step, int phase)
{
    return SQL_HOLD(st, SET_PROGRESS_SQL, A_INT(step),
                    A_TEXT(phase_name(phase)), A_REAL(state_now_()), A_INT(id));
}

/* ------------------------------------------------------------------ phases */

int state_phase_set(state *st, int64_t run, int phase, int64_t from_step)
{
    return SQL_HOLD(st,
        "INSERT OR REPLACE INTO phases(run, phase, from_step, at) "
        "VALUES (?, ?, ?, ?)",
        A_INT(run), A_TEXT(phase_name(phase)), A_INT(from_step),
        A_REAL(state_now_()));
}

int state_phase_get(state *st, int64_t run, int phase, int64_t *from_step)
{
    pthread_mutex_lock(&st->mu);
    sqlite3_stmt *s = SQL_PREPARE(st,
        "SELECT from_step FROM phases WHERE run = ? AND phase = ?",
        A_INT(run), A_TEXT(phase_name(phase)));
    int rc = s ? SQL_NEXT(st, s) : -1;
    if (rc == 1) *from_step = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return rc == 1 ? 0 : rc == 0 ? 1 : -1;
}

int state_phase_delete(state *st, int64_t run, int phase)
{
    return SQL_WRITE(st, "DELETE FROM phases WHERE run = ? AND phase = ?",
                     A_INT(run), A_TEXT(phase_name(phase))) < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------ errors */

void state_last_error(state *st, char *buf, size_t len)
{
    pthread_mutex_lock(&st->mu);
    snprintf(buf, len, "%s", st->last_error[0] ? st->last_error : "unknown error");
    pthread_mutex_unlock(&st->mu);
}

/* ------------------------------------------------------------ held records */

void state_set_hold_limit(state *st, double seconds)
{
    pthread_mutex_lock(&st->mu);
    st->hold_limit_s = seconds > 0 ? seconds : STATE_HOLD_LIMIT_DEFAULT_S;
    pthread_mutex_unlock(&st->mu);
}

int state_held(state *st, double *age_s)
{
    pthread_mutex_lock(&st->mu);
    int n = st->held_n;
    if (age_s) *age_s = n ? clock_mono_s() - st->held_since : 0;
    pthread_mutex_unlock(&st->mu);
    return n;
}

int state_hold_overdue(state *st, char *msg, size_t len)
{
    pthread_mutex_lock(&st->mu);
    double age = st->held_n ? clock_mono_s() - st->held_since : 0;
    int over = st->held_n && age >= st->hold_limit_s;
    if (!over && st->held_n >= STATE_HELD_MAX) {
        over = 1;
        snprintf(msg, len, "m6.db has been locked by another process for "
                 "%.0f s and %d step records are held in memory, the most "
                 "m6d holds (%d): they are written once it is released: end "
                 "the other writer's transaction (`fuser %s` names it), "
                 "then `m6ctl resume`", age, st->held_n, STATE_HELD_MAX,
                 st->path);
    } else if (over)
        snprintf(msg, len, "m6.db has been locked by another process for "
                 "%.0f s (the hold limit, m6d --db-hold-limit, is %.0f s); "
                 "%d step records are held in memory and are written once "
                 "it is released: end the other writer's transaction "
                 "(`fuser %s` names it), then `m6ctl resume`", age,
                 st->hold_limit_s, st->held_n, st->path);
    pthread_mutex_unlock(&st->mu);
    return over;
}
