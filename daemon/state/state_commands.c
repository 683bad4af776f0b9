/*
 * state_commands.c — the command log of m6.db (each operator command
 * recorded before it is acknowledged, marked applied at the boundary that
 * takes it) and state_commit_run, the run's state, event, progress and
 * commands in one transaction.
 */
#include "state/state_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crashpoint.h"
#include "common/log.h"

/* ---------------------------------------------------------------- commands */

/* ROLLBACK after a failure, keeping the failure's message (ROLLBACK after a
 * failed COMMIT may fail too), with st->mu held. */
static void rollback_keep_(state *st)
{
    char cause[sizeof st->last_error];
    memcpy(cause, st->last_error, sizeof cause);
    state_exec_(st, "ROLLBACK");
    memcpy(st->last_error, cause, sizeof cause);
}

int64_t state_command_add(state *st, int64_t run, const char *kind,
                          int applied, int64_t step)
{
    int64_t id = -1;
    double t = state_now_();
    pthread_mutex_lock(&st->mu);
    /* this commit, and the WAL frames before it, reach the disk before
     * the reply: a power loss keeps the command too */
    if (state_exec_(st, "PRAGMA synchronous = FULL") < 0) goto out;
    if (SQL_WRITE_LOCKED(st,
            "INSERT INTO commands(run, kind, state, created, applied, step) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            A_INT(run), A_TEXT(kind), A_TEXT(applied ? "applied" : "pending"),
            A_REAL(t), applied ? A_REAL(t) : A_NULL,
            applied ? A_INT(step) : A_NULL) == 1)
        id = sqlite3_last_insert_rowid(st->db);
    state_exec_(st, "PRAGMA synchronous = NORMAL");
out:
    pthread_mutex_unlock(&st->mu);
    return id;
}

static void command_fill_(sqlite3_stmt *s, void *elem)
{
    command_row *c = elem;
    c->id = sqlite3_column_int64(s, 0);
    c->run = sqlite3_column_int64(s, 1);
    state_copy_text_(c->kind, sizeof c->kind, sqlite3_column_text(s, 2));
}

int state_commands_pending(state *st, int64_t run, command_row **rows,
                           int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, command_fill_,
                       "SELECT id, run, kind FROM commands WHERE run = ? AND "
                       "state = 'pending' ORDER BY id", A_INT(run));
    *rows = v;
    return ret;
}

static int mark_locked_(state *st, int64_t run, int64_t upto, int64_t step,
                        int kinds)
{
    static const char *const sql[] = {
        "UPDATE commands SET state = 'applied', applied = ?, step = ? "
        "WHERE run = ? AND state = 'pending' AND id <= ?",
        "UPDATE commands SET state = 'applied', applied = ?, step = ? "
        "WHERE run = ? AND state = 'pending' AND id <= ? AND kind = 'delink'",
        "UPDATE commands SET state = 'applied', applied = ?, step = ? "
        "WHERE run = ? AND state = 'pending' AND id <= ? AND kind != 'delink'",
    };
    return SQL_WRITE_LOCKED(st, sql[kinds >= 0 && kinds <= 2 ? kinds : 0],
        A_REAL(state_now_()), A_INT(step), A_INT(run), A_INT(upto)) < 0 ? -1 : 0;
}

int state_commands_mark(state *st, int64_t run, int64_t upto, int64_t step)
{
    pthread_mutex_lock(&st->mu);
    int rc = mark_locked_(st, run, upto, step, STATE_CMD_ALL);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int state_command_drop(state *st, int64_t id)
{
    return SQL_WRITE(st, "DELETE FROM commands WHERE id = ?", A_INT(id)) < 0
               ? -1 : 0;
}

int state_commit_run(state *st, int64_t run, const state_commit *c)
{
    int ok = 0;
    double t = state_now_();
    pthread_mutex_lock(&st->mu);
    if (state_exec_(st, "BEGIN IMMEDIATE") < 0) goto out;
    ok = (!c->set_state ||
          SQL_WRITE_LOCKED(st, "UPDATE runs SET state = ?, error = ?, "
                           "updated = ? WHERE id = ?",
                           A_TEXT(run_state_name(c->state)), A_TEXT(c->error),
                           A_REAL(t), A_INT(run)) >= 0) &&
         (!c->delink ||
          (SQL_WRITE_LOCKED(st, "INSERT OR REPLACE INTO phases(run, phase, "
                            "from_step, at) VALUES (?, ?, ?, ?)", A_INT(run),
                            A_TEXT(phase_name(1)), A_INT(c->step),
                            A_REAL(t)) >= 0 &&
           SQL_WRITE_LOCKED(st, "UPDATE runs SET delink_step = ?, step = ?, "
                            "phase = ?, updated = ? WHERE id = ?",
                            A_INT(c->step), A_INT(c->step),
                            A_TEXT(phase_name(1)), A_REAL(t),
                            A_INT(run)) >= 0)) &&
         (!c->event_kind ||
          SQL_WRITE_LOCKED(st, "INSERT INTO events(run, time, kind, detail) "
                           "VALUES (?, ?, ?, ?)", A_INT(run), A_REAL(t),
                           A_TEXT(c->event_kind),
                           A_TEXT(c->event_detail)) >= 0) &&
         (c->cmd_upto <= 0 ||
          mark_locked_(st, run, c->cmd_upto, c->step, c->cmd_kinds) == 0) &&
         (crashpoint("commit"), 1) &&
         state_exec_(st, "COMMIT") == 0;
    if (!ok)
        rollback_keep_(st);
out:
    pthread_mutex_unlock(&st->mu);
    return ok ? 0 : -1;
}
