/*
 * err.h — errors of the daemon's core.
 *
 * m6_err: a code (what kind of failure, for the edge to map to a protocol
 * status and to the operator's next step) and a message naming the object
 * and the problem, on the heap, never cut.
 *
 * seterr_: printf into a caller's (char *err, size_t errlen) buffer, the way
 * the engine's functions return an error message.
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
