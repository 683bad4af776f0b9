/*
 * gelu.cu — GELU, tanh approximation, elementwise on bf16 (fp32 math).
 * Formulas in kernels/cpu/gelu.c. The model's forward usually gets GELU from
 * the cuBLASLt epilogue (matmul_forward_gelu_cuda) and its backward from
 * the DGELU epilogue (matmul_backward_dgelu_first_cuda); these kernels are
 * the standalone ops and those epilogues' fallbacks. Each thread takes 8
 * elements with one 128-bit load per operand when every pointer is
 * 16-byte aligned, else (and for the tail of N) one at a time.
 */
#include "common.cuh"

#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f
#define GELU_BS 256                  /* threads per block, 8 elements each */

static __device__ __forceinline__ float gelu_(float x)
{
    float u = GELU_K * (x + GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

static __device__ __forceinline__ float gelu_grad_(float x)
{
    float u = GELU_K * (x + GELU_A * x * x * x);
    float th = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

__global__ void gelu_forward_kernel(bf16 *out, const bf16 *inp, size_t N,
                                    int vec)
{
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N)
        return;
    if (vec && i0 + 8 <= N) {
        bf16x8 x = ld8(inp + i0), y;
#pragma unroll
        for (int j = 0; j < 8; j++)
            y.v[j] = st(gelu_(ld(x.v[j])));
        st8(out + i0, y);
        return;
    }
    for (size_t i = i0; i < N && i < i0 + 8; i++)
        out[i] = st(gelu_(ld(inp[i])));
}

/* acc: dinp += (else =, dinp not read). Each thread reads its elements of
 * dout before it writes dinp: dinp may alias dout. */
__global__ void gelu_backward_kernel(bf16 *dinp, const bf16 *inp,
                                     const bf16 *dout, size_t N, int acc,
                                     int vec)
{
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N)
        return;
    if (vec && i0 + 8 <= N) {
        bf16x8 x = ld8(inp + i0), d = ld8(dout + i0), o;
        if (acc)
            o = ld8(dinp + i0);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = gelu_grad_(ld(x.v[j])) * ld(d.v[j]);
            o.v[j] = st(acc ? ld(o.v[j]) + v : v);
        }
        st8(dinp + i0, o);
        return;
    }
    for (size_t i = i0; i < N && i < i0 + 8; i++) {
        float v = gelu_grad_(ld(inp[i])) * ld(dout[i]);
        dinp[i] = st(acc ? ld(dinp[i]) + v : v);
    }
}

void gelu_forward_cuda(bf16 *out, const bf16 *inp, size_t N,
                       cudaStream_t stream)
{
    if (N == 0)
        return;
    gelu_forward_kernel<<<ceil_div(N, 8 * GELU_BS), GELU_BS, 0, stream>>>(
        out, inp, N, aligned16(out, inp));
    CUDA_CHECK_LAUNCH();
}

static void backward_(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                      size_t N, int acc, cudaStream_t stream)
{
    if (N == 0)
        return;
    gelu_backward_kernel<<<ceil_div(N, 8 * GELU_BS), GELU_BS, 0, stream>>>(
        dinp, inp, dout, N, acc, aligned16(dinp, inp, dout));
    CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                        size_t N, cudaStream_t stream)
{
    backward_(dinp, inp, dout, N, 1, stream);
}

void gelu_backward_first_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                              size_t N, cudaStream_t stream)
{
    backward_(dinp, inp, dout, N, 0, stream);
}
