/*
 * state_records.c — a run's step records in m6.db: the metrics rows (one
 * per step, with its validation loss and placement), the events, and the
 * checkpoint rows; written as held records (state.c), read in pages.
 */
#include "state/state_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ----------------------------------------------------------------- metrics */

static double column_real_or_nan_(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN
                                                    : sqlite3_column_double(s, i);
}

static int64_t column_int_or_neg_(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? -1
                                                    : sqlite3_column_int64(s, i);
}

/* The metrics columns in the order metric_from_stmt_ reads them and
 * state_record_step binds them (after run). */
#define METRIC_COLS "step, phase, train_loss, val_loss, lr, tokens_per_s, " \
                    "grad_norm, resident_slots, offloaded_slots, "         \
                    "peak_device_bytes, h2d_gbps, d2h_gbps, "               \
                    "copy_hidden_fraction, moe_aux_loss, moe_z_loss, "       \
                    "moe_dropped_fraction, moe_load_min, moe_load_max, "     \
                    "moe_load_cv, moe_experts_empty, skipped, "             \
                    "skipped_total, offload_redo_steps, "                   \
                    "moe_step_tokens_min, moe_step_tokens_max, "           \
                    "moe_step_experts_empty, moe_step_dropped, "           \
                    "moe_experts_idle"

int state_record_step(state *st, int64_t run, const metric_row *m)
{
    /* A_REAL(NAN) stores NULL: the metrics that were not measured. */
    const stmt_ v[2] = {
        SQL_STMT(
            "INSERT OR REPLACE INTO metrics(run, " METRIC_COLS ") "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            A_INT(run), A_INT(m->step), A_TEXT(phase_name(m->phase)),
            A_REAL(m->train_loss), A_REAL(m->val_loss), A_REAL(m->lr),
            A_REAL(m->tokens_per_s), A_REAL(m->grad_norm),
            A_INT_OR_NULL(m->resident_slots), A_INT_OR_NULL(m->offloaded_slots),
            A_INT_OR_NULL(m->peak_device_bytes), A_REAL(m->h2d_gbps),
            A_REAL(m->d2h_gbps), A_REAL(m->copy_hidden_fraction),
            A_REAL(m->moe_aux_loss), A_REAL(m->moe_z_loss),
            A_REAL(m->moe_dropped_fraction), A_REAL(m->moe_load_min),
            A_REAL(m->moe_load_max), A_REAL(m->moe_load_cv),
            A_REAL(m->moe_experts_empty), A_INT(m->skipped),
            A_INT(m->skipped_total),
            A_INT_OR_NULL(m->offload_redo_steps),
            A_INT_OR_NULL(m->moe_step_tokens_min),
            A_INT_OR_NULL(m->moe_step_tokens_max),
            A_INT_OR_NULL(m->moe_step_experts_empty),
            A_INT_OR_NULL(m->moe_step_dropped),
            A_INT_OR_NULL(m->moe_experts_idle)),
        SQL_STMT(SET_PROGRESS_SQL, A_INT(m->step),
                 A_TEXT(phase_name(m->phase)), A_REAL(state_now_()), A_INT(run)),
    };
    return state_held_write_(st, __FILE__, __LINE__, v, 2, NULL);
}

int state_metrics_truncate(state *st, int64_t run, int64_t after_step)
{
    return SQL_WRITE(st, "DELETE FROM metrics WHERE run = ? AND step > ?",
                     A_INT(run), A_INT(after_step));
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
    m->resident_slots = (int)column_int_or_neg_(s, 7);
    m->offloaded_slots = (int)column_int_or_neg_(s, 8);
    m->peak_device_bytes = column_int_or_neg_(s, 9);
    m->h2d_gbps = column_real_or_nan_(s, 10);
    m->d2h_gbps = column_real_or_nan_(s, 11);
    m->copy_hidden_fraction = column_real_or_nan_(s, 12);
    m->moe_aux_loss = column_real_or_nan_(s, 13);
    m->moe_z_loss = column_real_or_nan_(s, 14);
    m->moe_dropped_fraction = column_real_or_nan_(s, 15);
    m->moe_load_min = column_real_or_nan_(s, 16);
    m->moe_load_max = column_real_or_nan_(s, 17);
    m->moe_load_cv = column_real_or_nan_(s, 18);
    m->moe_experts_empty = column_real_or_nan_(s, 19);
    m->skipped = (int)sqlite3_column_int64(s, 20);      /* NULL: 0 */
    m->skipped_total = sqlite3_column_int64(s, 21);
    m->offload_redo_steps = (int)column_int_or_neg_(s, 22);
    m->moe_step_tokens_min = column_int_or_neg_(s, 23);
    m->moe_step_tokens_max = column_int_or_neg_(s, 24);
    m->moe_step_experts_empty = column_int_or_neg_(s, 25);
    m->moe_step_dropped = column_int_or_neg_(s, 26);
    m->moe_experts_idle = column_int_or_neg_(s, 27);
}

static void metric_fill_(sqlite3_stmt *s, void *elem)
{
    metric_from_stmt_(s, elem);
}

int state_metrics_page(state *st, int64_t run, int64_t after_step, int max,
                       metric_row **rows, int *n)
{
    void *v;
    /* On the reader connection: a page does not wait for, nor hold up, the
     * writer. LIMIT -1: no limit. The primary key (run, step) serves the
     * range. */
    int ret = SQL_LIST(st->reader ? st->reader : st, &v, n, sizeof **rows, metric_fill_,
                       "SELECT " METRIC_COLS " FROM metrics "
                       "WHERE run = ? AND step > ? ORDER BY step LIMIT ?",
                       A_INT(run), A_INT(after_step), A_INT(max < 0 ? -1 : max));
    *rows = v;
    return ret;
}

int state_metrics_list(state *st, int64_t run, int64_t after_step,
                       metric_row **rows, int *n)
{
    return state_metrics_page(st, run, after_step, -1, rows, n);
}

int state_metric_last(state *st, int64_t run, metric_row *out,
                      double *last_val)
{
    int ret = -1;
    *last_val = NAN;
    pthread_mutex_lock(&st->mu);
    sqlite3_stmt *s = SQL_PREPARE(st,
        "SELECT " METRIC_COLS " FROM metrics WHERE run = ? "
        "ORDER BY step DESC LIMIT 1", A_INT(run));
    int rc = s ? SQL_NEXT(st, s) : -1;
    if (rc == 0) ret = 1;
    if (rc != 1) goto out;
    metric_from_stmt_(s, out);
    sqlite3_finalize(s);
    s = SQL_PREPARE(st,
        "SELECT val_loss FROM metrics WHERE run = ? AND val_loss IS NOT NULL "
        "ORDER BY step DESC LIMIT 1", A_INT(run));
    if (!s) goto out;
    /* No row (or a failed step) leaves *last_val NAN; the row above stands. */
    if (sqlite3_step(s) == SQLITE_ROW) *last_val = sqlite3_column_double(s, 0);
    ret = 0;
out:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->mu);
    return ret;
}

/* ------------------------------------------------------------------ events */

int state_event(state *st, int64_t run, const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *detail = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!detail) return -1;
    va_start(ap, fmt);
    vsnprintf(detail, (size_t)len + 1, fmt, ap);  /* whole, never cut */
    va_end(ap);
    int rc = SQL_HOLD(st,
        "INSERT INTO events(run, time, kind, detail) VALUES (?, ?, ?, ?)",
        run > 0 ? A_INT(run) : A_NULL, A_REAL(state_now_()), A_TEXT(kind),
        A_TEXT(detail));
    free(detail);
    return rc;
}

static void event_fill_(sqlite3_stmt *s, void *elem)
{
    event_row *e = elem;
    e->id = sqlite3_column_int64(s, 0);
    e->time = sqlite3_column_double(s, 1);
    state_copy_text_(e->kind, sizeof e->kind, sqlite3_column_text(s, 2));
    const unsigned char *d = sqlite3_column_text(s, 3);
    e->detail = strdup(d ? (const char *)d : "");
}

void event_rows_free(event_row *rows, int n)
{
    for (int i = 0; rows && i < n; i++) free(rows[i].detail);
    free(rows);
}

int state_events_list(state *st, int64_t run, int64_t after_id, int max,
                      event_row **rows, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, event_fill_,
                       "SELECT id, time, kind, detail FROM events "
                       "WHERE run = ? AND id > ? ORDER BY id LIMIT ?",
                       A_INT(run), A_INT(after_id), A_INT(max));
    *rows = v;
    return ret;
}

/* ------------------------------------------------------------- checkpoints */

int state_checkpoint_add(state *st, int64_t run, int64_t step,
                         const char *path, int64_t bytes)
{
    return SQL_HOLD(st,
        "INSERT OR REPLACE INTO checkpoints(run, step, path, bytes, at) "
        "VALUES (?, ?, ?, ?, ?)",
        A_INT(run), A_INT(step), A_TEXT(path), A_INT(bytes),
        A_REAL(state_now_()));
}

int state_checkpoint_delete(state *st, int64_t run, int64_t step)
{
    return SQL_HOLD(st, "DELETE FROM checkpoints WHERE run = ? AND step = ?",
                    A_INT(run), A_INT(step));
}

static void ckpt_fill_(sqlite3_stmt *s, void *elem)
{
    ckpt_row *c = elem;
    c->step = sqlite3_column_int64(s, 0);
    state_copy_text_(c->path, sizeof c->path, sqlite3_column_text(s, 1));
    c->bytes = sqlite3_column_int64(s, 2);
}

int state_checkpoints_list(state *st, int64_t run, ckpt_row **rows, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, ckpt_fill_,
                       "SELECT step, path, bytes FROM checkpoints "
                       "WHERE run = ? ORDER BY step", A_INT(run));
    *rows = v;
    return ret;
}
