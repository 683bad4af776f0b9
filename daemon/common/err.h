/*
 * err.h — seterr_: printf into a caller's (char *err, size_t errlen) buffer,
 * the way the engine's functions return an error message. Header-only (static
 * inline), so the engine library (m6core) needs no link to daemon/common.
 */
#ifndef M6_ERR_H
#define M6_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

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
