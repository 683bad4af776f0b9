/*
 * weights_hash.h — FNV-1a over a float buffer's bytes, for the
 * data-parallel tests: equal hashes across ranks mean bitwise-equal
 * weights.
 */
#ifndef M6_TESTS_WEIGHTS_HASH_H
#define M6_TESTS_WEIGHTS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a (64-bit offset basis and prime) over the n floats' bytes. */
static inline uint64_t weights_hash(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

#endif /* M6_TESTS_WEIGHTS_HASH_H */
