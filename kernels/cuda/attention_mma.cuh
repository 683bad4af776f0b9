/*
 * attention_mma.cuh — the warp-wide tensor-core product the flash kernels
 * of attention.cu are built on: PTX mma.sync.m16n8k16 with bf16 inputs
 * and fp32 accumulators (sm_80 and later; m6 builds for sm_90), and the
 * bf16 packing its registers use. On the CPU emulation (tests/cuda_emu)
 * the same call runs ::emu::mma_m16n8k16_bf16, which follows the PTX ISA's
 * documented register layout, so that code indexing fragment elements by
 * position (masking, softmax on the accumulators) is tested there too.
 *
 * Register layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type"), lane = 4 g + c (g = groupID 0..7, c = 0..3):
 *   A (16 x 16, row-major), 4 x .b32 each two bf16 (low half first):
 *     a[0] = A[g][2c..2c+1]      a[1] = A[g+8][2c..2c+1]
 *     a[2] = A[g][2c+8..2c+9]    a[3] = A[g+8][2c+8..2c+9]
 *   B (16 x 8, k x n, "col"), 2 x .b32:
 *     b[0] = B[2c..2c+1][g]      b[1] = B[2c+8..2c+9][g]
 *   C and D (16 x 8 fp32):
 *     d[0..1] = D[g][2c..2c+1]   d[2..3] = D[g+8][2c..2c+1]
 * So two neighbouring 16 x 8 accumulator tiles (columns 0-7, 8-15) are,
 * packed to bf16 pairs, exactly the A operand of the next product over
 * those 16 columns (FlashAttention-2's P V without a trip through shared
 * memory).
 */
#ifndef M6_ATTENTION_MMA_CUH
#define M6_ATTENTION_MMA_CUH

#include <stdint.h>
#include <string.h>

/* d (16x8 fp32) += a (16x16 bf16) b (16x8 bf16), warp-wide: every lane of
 * a full warp calls it together (as mma.sync.aligned requires). */
static __device__ __forceinline__ void mma_16816_(float d[4],
                                                  const uint32_t a[4],
                                                  const uint32_t b[2])
{
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                   "r"(b[1]));
#elif !defined(__CUDACC__)
    ::emu::mma_m16n8k16_bf16(d, a, b);
#endif
}

/* the 16 bits of a bf16 */
static __device__ __forceinline__ uint32_t bf16_bits_(bf16 h)
{
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* two floats as a bf16 pair (lo in the low half), rounded to nearest */
static __device__ __forceinline__ uint32_t pack_bf16x2_(float lo, float hi)
{
    return bf16_bits_(__float2bfloat16_rn(lo)) |
           bf16_bits_(__float2bfloat16_rn(hi)) << 16;
}

/* p[0], p[1] (4-byte aligned) as one bf16 pair */
static __device__ __forceinline__ uint32_t ld_bf16x2_(const bf16 *p)
{
#if defined(__CUDACC__)
    return *reinterpret_cast<const uint32_t *>(p);
#else
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
#endif
}

#endif /* M6_ATTENTION_MMA_CUH */
