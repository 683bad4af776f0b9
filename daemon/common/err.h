/*
 * err.h — errors of the daemon's core.
 *
 * m6_err: a code (what kind of failure, for the edge to map to a protocol
 * status and to the operator's next step) and a message naming the object
 * and the problem, on the heap, never cut. The data, checkpoint and trainer
 * errors travel as one from where they happen to where they are shown
 * (functions take an m6_err *err: m6_err_set fills it, m6_err_prefix puts
 * the caller's context before it, the caller frees it). The operator's
 * next step is not part of it: control/advice.h adds it, by code.
 *
 * seterr_: printf into a caller's (char *err, size_t errlen) buffer, as the
 * functions whose messages hold no path still do (the spec, the planner,
 * the backends).
 *
 * Header-only (static inline), so the engine library (m6core) needs no link
 * to daemon/common.
 */
#ifndef M6_ERR_H
#define M6_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* What went wrong. The control handlers map each code to one protocol
 * Status and add the operator's next step by code (handlers.c). */
typedef enum {
    M6_OK = 0,
    M6_ENOTFOUND,  /* no such object (a run id or name) */
    M6_EBADSTATE,  /* the object's state does not allow it (pause a
                    * paused run, resume a stopped one) */
    M6_EINVALID,   /* bad input: a spec key or value, data that fails */
    M6_EINTERNAL,  /* m6d's own failure: the state DB, memory, a limit */
    M6_ECANCELLED, /* the caller went away (or m6d stops) first */
    M6_EDATA,      /* a run's shard cannot be read as it was checked
                    * (truncated, rewritten, a bad token): the run pauses;
                    * a command it refuses answers as M6_EBADSTATE does */
    M6_ENOFILE,    /* ... m6d ran out of file descriptors opening them */
    M6_ENOCKPT,    /* no checkpoint of a run loads (the run starts over
                    * from step 0 when resumed) */
    M6_ECKPTGONE,  /* a run's recorded checkpoint directories are gone and
                    * no older one loads: it stays paused, its rows kept,
                    * until they are back or the operator starts it over */
    M6_ESUBMITFD,  /* m6d ran out of file descriptors checking a spec's
                    * data at submit: nothing is queued, the data may be
                    * fine */
} m6_code;

typedef struct {
    m6_code code;
    char *msg;  /* never NULL after m6_err_make */
    int owned;  /* msg is malloc'd (0: the static "out of memory") */
} m6_err;

/* An error (or, with M6_OK, a success's reply text) from printf format
 * arguments; free with m6_err_free. */
static inline m6_err m6_err_make(m6_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline m6_err m6_err_make(m6_code code, const char *fmt, ...)
{
    static char oom[] = "out of memory";
    m6_err e = {code, NULL, 1};
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && (e.msg = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(e.msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (!e.msg) {
        e = (m6_err){M6_EINTERNAL, oom, 0};
    }
    return e;
}

static inline void m6_err_free(m6_err *e)
{
    if (e->owned) free(e->msg);
    e->msg = NULL;
    e->owned = 0;
}

/* No error yet: the state an m6_err out-parameter starts in. */
#define M6_ERR_NONE ((m6_err){M6_OK, NULL, 0})

/* Set *e (freeing what it held; e may be NULL: nothing is done) to a new
 * error of code from printf format arguments, never cut. */
static inline void m6_err_set(m6_err *e, m6_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void m6_err_set(m6_err *e, m6_code code, const char *fmt, ...)
{
    if (!e) return;
    static char oom[] = "out of memory";
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && (msg = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    m6_err_free(e);
    *e = msg ? (m6_err){code, msg, 1} : (m6_err){M6_EINTERNAL, oom, 0};
}

/* Put "<prefix>: " before e's message (e keeps its code); e NULL or
 * without a message: nothing is done. */
static inline void m6_err_prefix(m6_err *e, const char *prefix)
{
    if (!e || !e->msg) return;
    m6_err old = *e;
    *e = M6_ERR_NONE;
    m6_err_set(e, old.code, "%s: %s", prefix, old.msg);
    if (e->code == M6_EINTERNAL && old.code != M6_EINTERNAL && !e->owned)
        e->code = old.code;  /* out of memory: keep the kind */
    m6_err_free(&old);
}

/* e's message, or "" when it has none. */
static inline const char *m6_err_msg(const m6_err *e)
{
    return e && e->msg ? e->msg : "";
}

/* Does nothing when err is NULL or errlen is 0; the message is truncated to
 * fit. */
static inline void seterr_(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void seterr_(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

#endif /* M6_ERR_H */
