/*
 * sround.h — stochastic rounding to bf16 for bf16 master weights and its
 * counter-based random bits, header-only so that the CPU optimizers
 * (kernels/cpu/adamw.c, adafactor.c) and the CUDA ones (kernels/cuda/
 * adamw.cu, on the host and the device alike) use one rule and give the
 * same bits for the same (key, step, element). kernels.h "bf16 master
 * weights" says what the rounding is for and where the keys come from.
 */
#ifndef M6_SROUND_H
#define M6_SROUND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* host and device under nvcc; plain C (and the CUDA emulation) else */
#if defined(__CUDACC__)
#define SR_FN_ static inline __host__ __device__
#else
#define SR_FN_ static inline
#endif

/* splitmix64's output function (Steele, Lea & Flood 2014, "Fast
 * splittable pseudorandom number generators"): a bijection of 64 bits
 * whose every output bit depends on every input bit. */
SR_FN_ uint64_t sr_mix64_(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 32 well-mixed bits of (key, t, i): splitmix64's finaliser over the
 * three words folded in turn, with the golden-ratio increment of
 * splitmix64 between them. */
SR_FN_ uint32_t sr_bits(uint64_t key, uint64_t t, uint64_t i)
{
    uint64_t h = sr_mix64_(key + 0x9e3779b97f4a7c15ull);
    h = sr_mix64_(h ^ (t + 0x3c6ef372fe94f82aull));
    h = sr_mix64_(h ^ (i + 0xdaa66d2c7ddf743full));
    return (uint32_t)(h >> 32);
}

/* The key of a tensor's span: seed the run's, region -1 the globals or a
 * slot index, offset the tensor's first float in its region of gpt.h's
 * plain (CPU) layout, whichever backend holds it. Never 0 (0 means fp32
 * masters in a span). */
SR_FN_ uint64_t sr_span_key(uint64_t seed, int region, size_t offset)
{
    uint64_t k = sr_mix64_(sr_mix64_(seed ^ 0x5352ull /* "SR" */) ^
                           ((uint64_t)(int64_t)region << 40) ^
                           (uint64_t)offset);
    return k ? k : 1;
}

/* x rounded to bf16 stochastically with 16 random bits r (the low 16 of
 * r are used): r added to the low 16 bits of x's pattern, then those
 * truncated, which is rounding of the magnitude up with probability
 * (|x| - |down|) / ulp for r uniform. A bf16 value (low bits 0) stays
 * itself; NaN stays NaN (quieted); a magnitude within an ulp of FLT_MAX
 * may round to infinity. Returned widened to fp32. */
SR_FN_ float sr_round_bf16(float x, uint32_t r)
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

#undef SR_FN_
#endif
