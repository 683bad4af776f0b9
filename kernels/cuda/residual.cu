/*
 * residual.cu — residual connection on bf16: out = a + b; the gradient flows
 * unchanged into both branches.
 */
#include "common.cuh"

__global__ void residual_forward_kernel(bf16 *out, const bf16 *a,
                                        const bf16 *b, size_t N)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N)
        out[i] = st(ld(a[i]) + ld(b[i]));
}

__global__ void residual_backward_kernel(bf16 *da, bf16 *db, const bf16 *dout,
                                         size_t N)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        float d = ld(dout[i]);
        add_bf16(&da[i], d);
        add_bf16(&db[i], d);
    }
}

void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t N,
                           cudaStream_t stream)
{
    const int bs = 256;
    residual_forward_kernel<<<ceil_div(N, bs), bs, 0, stream>>>(out, a, b, N);
    CUDA_CHECK_LAUNCH();
}

void residual_backward_cuda(bf16 *da, bf16 *db, const bf16 *dout, size_t N,
                            cudaStream_t stream)
{
    const int bs = 256;
    residual_backward_kernel<<<ceil_div(N, bs), bs, 0, stream>>>(da, db, dout,
                                                                 N);
    CUDA_CHECK_LAUNCH();
}
