/*
 * state_internal.h — what the state module's files share, private to
 * daemon/state/: the connection (struct state), the bound values and
 * statements of the SQL helpers and their macros (SQL_WRITE, SQL_HOLD,
 * SQL_LIST, ...), and the helpers the files call in one another. state.c
 * owns opening, migrating, the SQL helpers, held records and waited writes,
 * and the runs and phases tables; state_records.c the step records
 * (metrics, events, checkpoints); state_nodes.c the nodes table;
 * state_commands.c the command log and the run's commits. state.h is the
 * interface.
 */
#ifndef M6_STATE_STATE_INTERNAL_H
#define M6_STATE_STATE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <sqlite3.h>

#include "state/state.h"

typedef struct held_ held_;

struct state {
    sqlite3 *db;
    pthread_mutex_t mu;
    char last_error[256];  /* SQLite's message for the latest failure */
    char path[1024];       /* m6.db, for messages */
    /* Another process holding m6.db's write lock (a `sqlite3` shell in a
     * BEGIN IMMEDIATE) makes a write SQLITE_BUSY. Step records (metrics
     * rows, events, checkpoint rows, progress) are then held here, in
     * order, and written in one transaction once the lock is free: by the
     * flusher thread, or by the next write (every write writes the held
     * records first, so m6.db keeps their order). Guarded by mu. */
    held_ *held_head, **held_tail;
    int held_n;
    double held_since;     /* monotonic seconds of the oldest held; 0 none */
    double hold_limit_s;   /* state_set_hold_limit */
    int busy_hit;          /* the latest statement met SQLITE_BUSY/LOCKED */
    double busy_logged;    /* monotonic time of the last busy warning */
    pthread_t flusher;
    pthread_cond_t held_cv;
    int flusher_started, closing;
    /* A second, read-only connection for the long reads of clients (pages
     * of metrics): WAL lets it read while db writes, and its own mutex
     * keeps such a read from holding up the requests and steps that use
     * db. NULL: reads use db. */
    struct state *reader;
};

enum {
    DEFAULT_BUSY_MS = 5000, /* the connection's busy timeout otherwise */
    HELD_TRY_MS = 100,      /* a step record's own try, nothing held */
    FLUSH_TRY_MS = 0,       /* each try of the flusher thread (no wait) */
    FLUSH_EVERY_MS = 50,    /* ... this often while records are held */
    WAIT_SLICE_MS = 100,    /* a waited write's tries, mu let go between */
    WAIT_MAX_S = 30,        /* (below m6ctl's RECV_TIMEOUT_S, 45 s)
                             * a waited write gives up after this (or the
                             * hold limit, if shorter) */
    BUSY_LOG_EVERY_S = 30,  /* the "records held" warning, at most */
};

/*
 * One value for a '?' parameter, written as a compound literal so that each
 * argument converts to the field's type as it would in an assignment:
 * A_INT(id), A_REAL(state_now_()), A_TEXT(name), A_NULL. A_TEXT(NULL) binds NULL,
 * and so does A_REAL(NAN) (a metric that was not measured).
 */
typedef struct {
    enum { ARG_END = 0, ARG_NULL, ARG_INT, ARG_REAL, ARG_TEXT } kind;
    int64_t i;
    double d;
    const char *t;
} arg_;
#define A_INT(v)  ((arg_){.kind = ARG_INT, .i = (v)})
#define A_REAL(v) ((arg_){.kind = ARG_REAL, .d = (v)})
#define A_TEXT(v) ((arg_){.kind = ARG_TEXT, .t = (v)})
#define A_NULL    ((arg_){.kind = ARG_NULL})
/* A count or size that may be unknown: negative stores NULL. */
#define A_INT_OR_NULL(v) ((v) < 0 ? A_NULL : A_INT(v))

/* One statement of a write: its SQL (a string literal) and values. */
typedef struct {
    const char *sql;
    const arg_ *args;  /* ended by ARG_END */
} stmt_;

/* A statement held while m6.db is locked, its values copied (a text
 * value points at the record's own copy). */
struct held_ {
    held_ *next;
    const char *sql;   /* a string literal */
    int n;
    arg_ args[];       /* n values, then ARG_END */
};

/* Callers name the statement and its values; file:line are the caller's. */
#define SQL_ARGS(...) ((const arg_[]){__VA_ARGS__ __VA_OPT__(,) {0}})
#define SQL_PREPARE(st, sql, ...) \
    state_prepare_((st), __FILE__, __LINE__, (sql), SQL_ARGS(__VA_ARGS__))
#define SQL_NEXT(st, s) state_next_((st), __FILE__, __LINE__, (s))
#define SQL_WRITE(st, sql, ...) \
    state_write_((st), __FILE__, __LINE__, (sql), SQL_ARGS(__VA_ARGS__))
#define SQL_WRITE_LOCKED(st, sql, ...) \
    state_write_locked_((st), __FILE__, __LINE__, (sql), SQL_ARGS(__VA_ARGS__))
/* A step record of one statement (held_write_). */
#define SQL_STMT(sql, ...) ((stmt_){(sql), SQL_ARGS(__VA_ARGS__)})
#define SQL_HOLD(st, sql, ...) \
    state_held_write_((st), __FILE__, __LINE__, &SQL_STMT(sql, __VA_ARGS__), 1, NULL)
/* The same, *changed set as held_write_'s. */
#define SQL_HOLD_CHANGED(st, changed, sql, ...)                            \
    state_held_write_((st), __FILE__, __LINE__, &SQL_STMT(sql, __VA_ARGS__), 1, \
                (changed))

#define SQL_LIST(st, out, n, elem, fill, sql, ...)                  \
    state_list_((st), __FILE__, __LINE__, (out), (n), (elem), (fill), (sql), \
          SQL_ARGS(__VA_ARGS__))

/* A run's progress (step, phase name, updated, id): state.c's
 * state_run_set_progress and state_records.c's step record write it. */
#define SET_PROGRESS_SQL \
    "UPDATE runs SET step = ?, phase = ?, updated = ? WHERE id = ?"

/* ---- state.c's helpers, for the other files */

/* Wall-clock seconds (CLOCK_REALTIME): the tables' timestamps. */
double state_now_(void);
/* src (a column's text; NULL: "") into dst[cap], truncated. */
void state_copy_text_(char *dst, size_t cap, const unsigned char *src);
/* Run sql (no values, no rows) on st->db: 0, or -1 (logged). */
int state_exec_(state *st, const char *sql);
/* The SQL helpers behind the macros above (file:line: the caller's):
 * prepare and bind (NULL on error, logged); step once (1 row, 0 done, -1
 * error); one statement with st->mu held, or as a waited write (rows
 * changed, or -1); n statements as one step record, held while another
 * process holds the write lock (see state.c); every row of a query. */
sqlite3_stmt *state_prepare_(state *st, const char *file, int line,
                             const char *sql, const arg_ *args);
int state_next_(state *st, const char *file, int line, sqlite3_stmt *s);
int state_write_locked_(state *st, const char *file, int line,
                        const char *sql, const arg_ *args);
int state_write_(state *st, const char *file, int line, const char *sql,
                 const arg_ *args);
int state_held_write_(state *st, const char *file, int line, const stmt_ *v,
                      int n, int *changed);
int state_list_(state *st, const char *file, int line, void **out, int *n,
                size_t elem, void (*fill)(sqlite3_stmt *, void *),
                const char *sql, const arg_ *args);

#endif /* M6_STATE_STATE_INTERNAL_H */
