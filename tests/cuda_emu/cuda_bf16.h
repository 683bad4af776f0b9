/*
 * cuda_bf16.h — bfloat16 for the CPU emulation of CUDA (tests/cuda_emu):
 * the type and the conversions kernels/cuda and tests/gpu use, with the
 * real header's results (float -> bf16 to nearest even; every NaN becomes
 * the canonical 0x7fff, as CUDA 13's __float2bfloat16_rn gives).
 */
#ifndef M6_EMU_CUDA_BF16_H
#define M6_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        r.x = 0x7fff;
    else
        r.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    return r;
}

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __float2bfloat16_rn(f);
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* M6_EMU_CUDA_BF16_H */
