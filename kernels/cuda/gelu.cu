/*
 * gelu.cu — GELU, tanh approximation, elementwise on bf16 (fp32 math).
 * Formulas in kernels/cpu/gelu.c. The model's forward usually gets GELU from
 * the cuBLASLt epilogue (matmul_forward_gelu_cuda); this kernel is the
 * standalone op and that epilogue's fallback. The backward is always here.
 */
#include "common.cuh"

#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ void gelu_forward_kernel(bf16 *out, const bf16 *inp, size_t N)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N)
        return;
    float x = ld(inp[i]);
    float u = GELU_K * (x + GELU_A * x * x * x);
    out[i] = st(0.5f * x * (1.0f + tanhf(u)));
}

/* acc: dinp += (else =, dinp not read) */
__global__ void gelu_backward_kernel(bf16 *dinp, const bf16 *inp,
                                     const bf16 *dout, size_t N, int acc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N)
        return;
    float x = ld(inp[i]);
    float u = GELU_K * (x + GELU_A * x * x * x);
    float th = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    float d = ld(dout[i]); /* read before the write: dinp may alias dout */
    dinp[i] = st(acc ? ld(dinp[i]) + grad * d : grad * d);
}

void gelu_forward_cuda(bf16 *out, const bf16 *inp, size_t N,
                       cudaStream_t stream)
{
    const int bs = 256;
    gelu_forward_kernel<<<ceil_div(N, bs), bs, 0, stream>>>(out, inp, N);
    CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                        size_t N, cudaStream_t stream)
{
    const int bs = 256;
    gelu_backward_kernel<<<ceil_div(N, bs), bs, 0, stream>>>(dinp, inp, dout,
                                                             N, 1);
    CUDA_CHECK_LAUNCH();
}

void gelu_backward_first_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                              size_t N, cudaStream_t stream)
{
    const int bs = 256;
    gelu_backward_kernel<<<ceil_div(N, bs), bs, 0, stream>>>(dinp, inp, dout,
                                                             N, 0);
    CUDA_CHECK_LAUNCH();
}
