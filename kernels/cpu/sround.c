/*
 * sround.c — stochastic rounding to bf16 for bf16 master weights and its
 * counter-based random bits (kernels.h "bf16 master weights"). The
 * optimizers (adamw.c, adafactor.c) call these per element when a span
 * has an sr_key.
 */
#include <string.h>
#include "kernels.h"

/* splitmix64's output function (Steele, Lea & Flood 2014, "Fast
 * splittable pseudorandom number generators"): a bijection of 64 bits
 * whose every output bit depends on every input bit. */
static inline uint64_t mix64_(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t sr_bits(uint64_t key, uint64_t t, uint64_t i)
{
    /* each word folded in after a full mix of the ones before it, with
     * the golden-ratio increment of splitmix64 between them */
    uint64_t h = mix64_(key + 0x9e3779b97f4a7c15ull);
    h = mix64_(h ^ (t + 0x3c6ef372fe94f82aull));
    h = mix64_(h ^ (i + 0xdaa66d2c7ddf743full));
    return (uint32_t)(h >> 32);
}

uint64_t sr_span_key(uint64_t seed, int region, size_t offset)
{
    uint64_t k = mix64_(mix64_(seed ^ 0x5352ull /* "SR" */) ^
                        ((uint64_t)(int64_t)region << 40) ^ (uint64_t)offset);
    return k ? k : 1;
}

float sr_round_bf16(float x, uint32_t r)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quieted, kept */
        u = (u | 0x00400000u) & 0xffff0000u;
    else if ((u & 0x7f800000u) != 0x7f800000u) /* finite */
        u = (u + (r & 0xffffu)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
