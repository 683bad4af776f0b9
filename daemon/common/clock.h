/*
 * clock.h — monotonic seconds for timing steps, copies and polls. Header-only
 * so the engine library (which does not link daemon/common) can use it too.
 */
#ifndef M6_CLOCK_H
#define M6_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC (arbitrary origin; differences only). */
static inline double clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif /* M6_CLOCK_H */
