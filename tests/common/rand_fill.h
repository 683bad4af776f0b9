/*
 * rand_fill.h — the CPU op tests' seeded random inputs: a splitmix64
 * stream of uniform floats, buffers filled from it (with an optional
 * double copy holding exactly the same values), and zeroed allocations
 * that fail the test when memory runs out. Include after <cmocka.h>.
 */
#ifndef M6_TESTS_RAND_FILL_H
#define M6_TESTS_RAND_FILL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* the stream's state: one per test program, set by rng_seed */
static uint64_t rng_state_;

static inline void rng_seed(uint64_t s) { rng_state_ = s; }

/* splitmix64 -> uniform float in [lo, hi) */
static inline float rng_float(float lo, float hi)
{
    uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

static inline int rng_int(int n) { return (int)(rng_float(0.0f, 1.0f) * n) % n; }

/* fill f with floats in [lo,hi) and d with the same values in double */
static inline void fill(float *f, double *d, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        f[i] = rng_float(lo, hi);
        if (d)
            d[i] = f[i];
    }
}

/* n zeroed floats (doubles); the test fails if calloc does */
static inline float *falloc(size_t n)
{
    float *p = calloc(n, sizeof *p);
    assert_non_null(p);
    return p;
}
static inline double *dalloc(size_t n)
{
    double *p = calloc(n, sizeof *p);
    assert_non_null(p);
    return p;
}

#endif /* M6_TESTS_RAND_FILL_H */
