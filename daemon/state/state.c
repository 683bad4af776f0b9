/*
 * state.c — SQLite persistence for m6d (see state.h).
 */
#include "state/state.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "common/log.h"
#include "state/schema.h"

struct state {
    sqlite3 *db;
    pthread_mutex_t mu;
};

/* The SQLite check macro: logs the statement, file:line and SQLite's error. */
#define SQL_CHECK(st, call, want)                                             \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != (want)) {                                                  \
            log_error("sqlite.error", "call=\"%s\" at=%s:%d rc=%d msg=\"%s\"", \
                      #call, __FILE__, __LINE__, rc_, sqlite3_errmsg((st)->db)); \
            goto fail;                                                        \
        }                                                                     \
    } while (0)

static const char *const state_names[RUN_STATE_COUNT] = {
    "queued", "running", "paused", "completed", "failed", "stopped"};

const char *run_state_name(run_state s)
{
    return (unsigned)s < RUN_STATE_COUNT ? state_names[s] : "unknown";
}

int run_state_parse(const char *s)
{
    for (int i = 0; i < RUN_STATE_COUNT; i++)
        if (s && strcmp(s, state_names[i]) == 0) return i;
    return -1;
}

const char *phase_name(int phase) { return phase ? "real" : "pseudo"; }

int phase_parse(const char *s)
{
    if (s && strcmp(s, "pseudo") == 0) return 0;
    if (s && strcmp(s, "real") == 0) return 1;
    return -1;
}

static double now_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void copy_text_(char *dst, size_t cap, const unsigned char *src)
{
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* ------------------------------------------------------------ open/migrate */

static int exec_(state *st, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        log_error("sqlite.error", "sql=\"%.60s\" msg=\"%s\"", sql,
                  msg ? msg : "?");
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
        if (exec_(st, "BEGIN IMMEDIATE") < 0) goto bad;
        if (exec_(st, schema_migrations[i].sql) < 0 || exec_(st, pragma) < 0) {
            exec_(st, "ROLLBACK");
            goto bad;
        }
        if (exec_(st, "COMMIT") < 0) goto bad;
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

state *state_open(const char *path, char *err, size_t errlen)
{
    state *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    int rc = sqlite3_open_v2(path, &st->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                 SQLITE_OPEN_FULLMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path,
                 st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        goto fail;
    }
    sqlite3_busy_timeout(st->db, 5000);
    if (exec_(st, "PRAGMA journal_mode = WAL") < 0 ||
        exec_(st, "PRAGMA synchronous = NORMAL") < 0 ||
        exec_(st, "PRAGMA foreign_keys = ON") < 0) {
        snprintf(err, errlen, "%s: %s", path, sqlite3_errmsg(st->db));
        goto fail;
    }
    if (migrate_(st, err, errlen) < 0) goto fail;
    return st;
fail:
    state_close(st);
    return NULL;
}

void state_close(state *st)
{
    if (!st) return;
    if (st->db) sqlite3_close(st->db);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

int state_user_version(state *st)
{
    pthread_mutex_lock(&st->mu);
    int v = user_version_(st);
    pthread_mutex_unlock(&st->mu);
    return v;
}

/* -------------------------------------------------------------------- runs */

int64_t state_run_insert(state *st, const char *name, const char *spec,
                         int64_t total_steps, int phase)
{
    sqlite3_stmt *s = NULL;
    int64_t id = -1;
    double t = now_();
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "INSERT INTO runs(name, spec, state, phase, step, total_steps, "
        "created, updated) VALUES (?, ?, 'queued', ?, 0, ?, ?, ?)",
        -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_text(s, 1, name ? name : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, spec, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, phase_name(phase), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, total_steps);
    sqlite3_bind_double(s, 5, t);
    sqlite3_bind_double(s, 6, t);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    id = sqlite3_last_insert_rowid(st->db);
    if (!name || !*name) {
        char nm[64];
        snprintf(nm, sizeof nm, "run-%lld", (long long)id);
        sqlite3_finalize(s);
        s = NULL;
        SQL_CHECK(st, sqlite3_prepare_v2(st->db,
            "UPDATE runs SET name = ? WHERE id = ?", -1, &s, NULL), SQLITE_OK);
        sqlite3_bind_text(s, 1, nm, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 2, id);
        SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    }
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return id;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return -1;
}

static void row_from_stmt_(sqlite3_stmt *s, run_row *r, int with_spec)
{
    memset(r, 0, sizeof *r);
    r->id = sqlite3_column_int64(s, 0);
    copy_text_(r->name, sizeof r->name, sqlite3_column_text(s, 1));
    int stv = run_state_parse((const char *)sqlite3_column_text(s, 2));
    r->state = stv < 0 ? RUN_FAILED : (run_state)stv;
    r->phase = phase_parse((const char *)sqlite3_column_text(s, 3)) == 1;
    r->step = sqlite3_column_int64(s, 4);
    r->total_steps = sqlite3_column_int64(s, 5);
    r->created = sqlite3_column_double(s, 6);
    r->updated = sqlite3_column_double(s, 7);
    copy_text_(r->error, sizeof r->error, sqlite3_column_text(s, 8));
    if (with_spec) {
        const unsigned char *sp = sqlite3_column_text(s, 9);
        r->spec = strdup(sp ? (const char *)sp : "");
    }
}

#define RUN_COLS "id, name, state, phase, step, total_steps, created, " \
                 "updated, error"

int state_run_get(state *st, int64_t id, run_row *out)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT " RUN_COLS ", spec FROM runs WHERE id = ?", -1, &s, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        row_from_stmt_(s, out, 1);
        ret = out->spec ? 0 : -1;
    } else if (rc == SQLITE_DONE) {
        ret = 1;
    } else {
        SQL_CHECK(st, rc, SQLITE_ROW);
    }
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

void run_row_clear(run_row *r)
{
    free(r->spec);
    r->spec = NULL;
}

int state_run_find_name(state *st, const char *name, int64_t *id)
{
    sqlite3_stmt *s = NULL;
    int ret = -1, n = 0;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT id FROM runs WHERE name = ? ORDER BY id LIMIT 2", -1, &s,
        NULL), SQLITE_OK);
    sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n++ == 0) *id = sqlite3_column_int64(s, 0);
    }
    SQL_CHECK(st, rc, SQLITE_DONE);
    ret = n == 0 ? 1 : n == 1 ? 0 : 2;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_run_list(state *st, run_row **rows, int *n)
{
    sqlite3_stmt *s = NULL;
    run_row *v = NULL;
    int cnt = 0, cap = 0;
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT " RUN_COLS " FROM runs ORDER BY id", -1, &s, NULL), SQLITE_OK);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            run_row *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) goto fail;
            v = nv;
        }
        row_from_stmt_(s, &v[cnt++], 0);
    }
    SQL_CHECK(st, rc, SQLITE_DONE);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    *rows = v;
    *n = cnt;
    return 0;
fail:
    free(v);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return -1;
}

int state_run_ids(state *st, run_state rs, int64_t **ids, int *n)
{
    sqlite3_stmt *s = NULL;
    int64_t *v = NULL;
    int cnt = 0, cap = 0;
    *ids = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT id FROM runs WHERE state = ? ORDER BY id", -1, &s, NULL),
        SQLITE_OK);
    sqlite3_bind_text(s, 1, run_state_name(rs), -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) goto fail;
            v = nv;
        }
        v[cnt++] = sqlite3_column_int64(s, 0);
    }
    SQL_CHECK(st, rc, SQLITE_DONE);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    *ids = v;
    *n = cnt;
    return 0;
fail:
    free(v);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return -1;
}

int state_run_set_state(state *st, int64_t id, run_state rs, const char *error)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "UPDATE runs SET state = ?, error = ?, updated = ? WHERE id = ?", -1,
        &s, NULL), SQLITE_OK);
    sqlite3_bind_text(s, 1, run_state_name(rs), -1, SQLITE_STATIC);
    if (error)
        sqlite3_bind_text(s, 2, error, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, 2);
    sqlite3_bind_double(s, 3, now_());
    sqlite3_bind_int64(s, 4, id);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = sqlite3_changes(st->db) ? 0 : 1;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

static int set_progress_locked_(state *st, int64_t id, int64_t step, int phase)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "UPDATE runs SET step = ?, phase = ?, updated = ? WHERE id = ?", -1,
        &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, step);
    sqlite3_bind_text(s, 2, phase_name(phase), -1, SQLITE_STATIC);
    sqlite3_bind_double(s, 3, now_());
    sqlite3_bind_int64(s, 4, id);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    return ret;
}

int state_run_set_progress(state *st, int64_t id, int64_t step, int phase)
{
    pthread_mutex_lock(&st->mu);
    int ret = set_progress_locked_(st, id, step, phase);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* ------------------------------------------------------------------ phases */

int state_phase_set(state *st, int64_t run, int phase, int64_t from_step)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "INSERT OR REPLACE INTO phases(run, phase, from_step, at) "
        "VALUES (?, ?, ?, ?)", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_text(s, 2, phase_name(phase), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, from_step);
    sqlite3_bind_double(s, 4, now_());
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_phase_get(state *st, int64_t run, int phase, int64_t *from_step)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT from_step FROM phases WHERE run = ? AND phase = ?", -1, &s,
        NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_text(s, 2, phase_name(phase), -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *from_step = sqlite3_column_int64(s, 0);
        ret = 0;
    } else {
        SQL_CHECK(st, rc, SQLITE_DONE);
        ret = 1;
    }
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_phase_delete(state *st, int64_t run, int phase)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "DELETE FROM phases WHERE run = ? AND phase = ?", -1, &s, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_text(s, 2, phase_name(phase), -1, SQLITE_STATIC);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* ----------------------------------------------------------------- metrics */

static void bind_real_or_null_(sqlite3_stmt *s, int i, double v)
{
    if (isnan(v))
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_double(s, i, v);
}

static double column_real_or_nan_(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN
                                                    : sqlite3_column_double(s, i);
}

int state_record_step(state *st, int64_t run, const metric_row *m)
{
    sqlite3_stmt *s = NULL;
    int ret = -1, in_tx = 0;
    pthread_mutex_lock(&st->mu);
    if (exec_(st, "BEGIN IMMEDIATE") < 0) goto fail;
    in_tx = 1;
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "INSERT OR REPLACE INTO metrics(run, step, phase, train_loss, val_loss,"
        " lr, tokens_per_s, grad_norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", -1,
        &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int64(s, 2, m->step);
    sqlite3_bind_text(s, 3, phase_name(m->phase), -1, SQLITE_STATIC);
    bind_real_or_null_(s, 4, m->train_loss);
    bind_real_or_null_(s, 5, m->val_loss);
    bind_real_or_null_(s, 6, m->lr);
    bind_real_or_null_(s, 7, m->tokens_per_s);
    bind_real_or_null_(s, 8, m->grad_norm);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    if (set_progress_locked_(st, run, m->step, m->phase) < 0) goto fail;
    if (exec_(st, "COMMIT") < 0) goto fail;
    ret = 0;
    in_tx = 0;
fail:
    if (in_tx) exec_(st, "ROLLBACK");
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_metrics_truncate(state *st, int64_t run, int64_t after_step)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "DELETE FROM metrics WHERE run = ? AND step > ?", -1, &s, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int64(s, 2, after_step);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = sqlite3_changes(st->db);
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

static void metric_from_stmt_(sqlite3_stmt *s, metric_row *m)
{
    m->step = sqlite3_column_int64(s, 0);
    m->phase = phase_parse((const char *)sqlite3_column_text(s, 1)) == 1;
    m->train_loss = column_real_or_nan_(s, 2);
    m->val_loss = column_real_or_nan_(s, 3);
    m->lr = column_real_or_nan_(s, 4);
    m->tokens_per_s = column_real_or_nan_(s, 5);
    m->grad_norm = column_real_or_nan_(s, 6);
}

#define METRIC_COLS "step, phase, train_loss, val_loss, lr, tokens_per_s, " \
                    "grad_norm"

int state_metrics_list(state *st, int64_t run, int64_t after_step,
                       metric_row **rows, int *n)
{
    sqlite3_stmt *s = NULL;
    metric_row *v = NULL;
    int cnt = 0, cap = 0;
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT " METRIC_COLS " FROM metrics WHERE run = ? AND step > ? "
        "ORDER BY step", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int64(s, 2, after_step);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            metric_row *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) goto fail;
            v = nv;
        }
        metric_from_stmt_(s, &v[cnt++]);
    }
    SQL_CHECK(st, rc, SQLITE_DONE);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    *rows = v;
    *n = cnt;
    return 0;
fail:
    free(v);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return -1;
}

int state_metric_last(state *st, int64_t run, metric_row *out,
                      double *last_val)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    *last_val = NAN;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT " METRIC_COLS " FROM metrics WHERE run = ? "
        "ORDER BY step DESC LIMIT 1", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        ret = 1;
        goto fail;
    }
    SQL_CHECK(st, rc, SQLITE_ROW);
    metric_from_stmt_(s, out);
    sqlite3_finalize(s);
    s = NULL;
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT val_loss FROM metrics WHERE run = ? AND val_loss IS NOT NULL "
        "ORDER BY step DESC LIMIT 1", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    if (sqlite3_step(s) == SQLITE_ROW) *last_val = sqlite3_column_double(s, 0);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* ------------------------------------------------------------------ events */

int state_event(state *st, int64_t run, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "INSERT INTO events(run, time, kind, detail) VALUES (?, ?, ?, ?)", -1,
        &s, NULL), SQLITE_OK);
    if (run > 0)
        sqlite3_bind_int64(s, 1, run);
    else
        sqlite3_bind_null(s, 1);
    sqlite3_bind_double(s, 2, now_());
    sqlite3_bind_text(s, 3, kind, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 4, detail, -1, SQLITE_TRANSIENT);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* ------------------------------------------------------------- checkpoints */

int state_checkpoint_add(state *st, int64_t run, int64_t step,
                         const char *path, int64_t bytes)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "INSERT OR REPLACE INTO checkpoints(run, step, path, bytes, at) "
        "VALUES (?, ?, ?, ?, ?)", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_text(s, 3, path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 4, bytes);
    sqlite3_bind_double(s, 5, now_());
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_checkpoint_delete(state *st, int64_t run, int64_t step)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "DELETE FROM checkpoints WHERE run = ? AND step = ?", -1, &s, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int64(s, 2, step);
    SQL_CHECK(st, sqlite3_step(s), SQLITE_DONE);
    ret = 0;
fail:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

int state_checkpoints_list(state *st, int64_t run, ckpt_row **rows, int *n)
{
    sqlite3_stmt *s = NULL;
    ckpt_row *v = NULL;
    int cnt = 0, cap = 0;
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    SQL_CHECK(st, sqlite3_prepare_v2(st->db,
        "SELECT step, path, bytes FROM checkpoints WHERE run = ? ORDER BY step",
        -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 8;
            ckpt_row *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) goto fail;
            v = nv;
        }
        v[cnt].step = sqlite3_column_int64(s, 0);
        copy_text_(v[cnt].path, sizeof v[cnt].path, sqlite3_column_text(s, 1));
        v[cnt].bytes = sqlite3_column_int64(s, 2);
        cnt++;
    }
    SQL_CHECK(st, rc, SQLITE_DONE);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    *rows = v;
    *n = cnt;
    return 0;
fail:
    free(v);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return -1;
}
