/*
 * cpu_math.h — small inline helpers shared by the CPU reference kernels
 * (internal; not part of the kernels.h interface).
 *
 * sum_ and dot_ keep 8 interleaved partial sums (one 8-float vector),
 * added in a fixed order: vectorised without -ffast-math, and the result
 * depends on nothing but the input.
 * exp_ is a branch-free expf (Cody-Waite range reduction, degree-7 Taylor
 * polynomial, 2^n built from the exponent bits) that the compiler can
 * vectorise; glibc expf/tanhf are scalar calls and dominated GELU and the
 * softmaxes. Error <= 2 ulp on [-87.3, 88.3]; inputs outside are clamped
 * (so exp_(-inf) is 1.2e-38, not 0). NaN in gives NaN out. Loops calling
 * it vectorise only with -fno-trapping-math (see kernels/meson.build).
 */
#ifndef M6_CPU_MATH_H
#define M6_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* 8 floats in GCC's (and clang's) vector extension: lane j of an
 * accumulator adds the elements i = j mod 8 in order, as the scalar loops
 * `acc[j] += a[i + j]` would, but the compiler keeps it in one register
 * (the array form vectorised badly: shuffles on every add with AVX-512,
 * 3-5x slower). The baseline build splits each op into two SSE ops.
 * Loads go through memcpy (no alignment assumed). */
typedef float f8_ __attribute__((vector_size(32)));

#define F8_LOAD_(v, p) memcpy(&(v), (p), sizeof(f8_))

/* the lanes added in a fixed order: ((0+1)+(2+3)) + ((4+5)+(6+7)) */
#define F8_HSUM_(v)                                                     \
    ((((v)[0] + (v)[1]) + ((v)[2] + (v)[3])) +                          \
     (((v)[4] + (v)[5]) + ((v)[6] + (v)[7])))

static inline float sum_(const float *a, int n)
{
    f8_ acc = {0}, x;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        F8_LOAD_(x, a + i);
        acc += x;
    }
    float s = F8_HSUM_(acc);
    for (; i < n; i++)
        s += a[i];
    return s;
}

static inline float dot_(const float *a, const float *b, int n)
{
    f8_ acc = {0}, x, y;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        F8_LOAD_(x, a + i);
        F8_LOAD_(y, b + i);
        acc += x * y;
    }
    float s = F8_HSUM_(acc);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* max of a[0..n), n >= 1, in 8 interleaved lanes (vectorises without
 * -ffast-math); a NaN element is skipped, as in a plain `a > m` loop */
static inline float max_(const float *a, int n)
{
    float m[8];
    int i = 0;
    for (int j = 0; j < 8; j++)
        m[j] = a[0];
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = a[i + j] > m[j] ? a[i + j] : m[j];
    float r = m[0];
    for (int j = 1; j < 8; j++)
        r = m[j] > r ? m[j] : r;
    for (; i < n; i++)
        r = a[i] > r ? a[i] : r;
    return r;
}

static inline float exp_(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    /* n from xn, x without a NaN (a NaN fails the compare), so that the
     * int conversion below is defined; a NaN x stays in r, and so in the
     * result. For every other x, xn == x. */
    float xn = x > -87.3f ? x : -87.3f;
    /* x = n ln2 + r, |r| <= ln2/2; n by round-to-nearest via 1.5*2^23 */
    float t = xn * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693145751953125f;          /* ln2 high bits */
    r = r - n * 1.428606765330187045e-06f;         /* ln2 low bits */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* M6_SIMD_CLONES on a function with a vectorisable loop: GCC (or clang)
 * builds it for AVX-512, AVX2 and the baseline ISA and picks one at load
 * time (an ifunc), so the loop runs 16 or 8 floats wide where the CPU has
 * them; the kernels are built for the baseline (SSE2, 4 wide) otherwise.
 * kernels/meson.build builds with -ffp-contract=off, so no clone fuses a
 * multiply-add: every clone gives the same bits. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(M6_NO_SIMD_CLONES)
#define M6_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define M6_SIMD_CLONES
#endif

/* GELU, tanh approximation, and its derivative (the formulas: gelu.c);
 * shared by gelu.c and the GELU epilogues of matmul.c. */
#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

static inline float gelu_(float x)
{
    float u = GELU_K * (x + GELU_A * x * x * x);
    return x / (1.0f + exp_(-2.0f * u));
}

static inline float gelu_grad_(float x)
{
    float u = GELU_K * (x + GELU_A * x * x * x);
    float e = exp_(-2.0f * u);
    float s = 1.0f / (1.0f + e);        /* 1 - s = e s, without cancellation */
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    return s + 2.0f * x * s * (e * s) * du;
}

#endif /* M6_CPU_MATH_H */
