/*
 * clock.h — monotonic seconds for timing steps, copies and polls, and
 * deadlines for timed waits. Header-only
 * so the engine library (which does not link daemon/common) can use it too.
 */
#ifndef M6_CLOCK_H
#define M6_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds on CLOCK_MONOTONIC (arbitrary origin; differences only). */
static inline double clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Milliseconds on CLOCK_MONOTONIC (arbitrary origin, > 0 on Linux). */
static inline int64_t clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The time ms (>= 0) milliseconds from now on clock id: a deadline for
 * pthread_cond_timedwait on a condition variable of that clock. */
static inline struct timespec clock_deadline(clockid_t id, int ms)
{
    struct timespec dl;
    clock_gettime(id, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    return dl;
}

#endif /* M6_CLOCK_H */
