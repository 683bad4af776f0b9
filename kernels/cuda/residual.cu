/*
 * residual.cu — residual connection on bf16: out = a + b; the gradient flows
 * unchanged into both branches. Each thread takes 8 elements with 128-bit
 * loads and stores when every pointer is 16-byte aligned, else (and for
 * the tail of N) one at a time; it reads its elements before it writes
 * them, so out may alias a or b.
 */
#include "common.cuh"

#define RES_BS 256  /* threads per block, 8 elements each */

__global__ void residual_forward_kernel(bf16 *out, const bf16 *a,
                                        const bf16 *b, size_t N, int vec)
{
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N)
        return;
    if (vec && i0 + 8 <= N) {
        bf16x8 x = ld8(a + i0), y = ld8(b + i0), z;
#pragma unroll
        for (int j = 0; j < 8; j++)
            z.v[j] = st(ld(x.v[j]) + ld(y.v[j]));
        st8(out + i0, z);
        return;
    }
    for (size_t i = i0; i < N && i < i0 + 8; i++)
        out[i] = st(ld(a[i]) + ld(b[i]));
}

__global__ void residual_backward_kernel(bf16 *da, bf16 *db, const bf16 *dout,
                                         size_t N, int vec)
{
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N)
        return;
    if (vec && i0 + 8 <= N) {
        bf16x8 d = ld8(dout + i0), x = ld8(da + i0), y = ld8(db + i0);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float g = ld(d.v[j]);
            x.v[j] = st(ld(x.v[j]) + g);
            y.v[j] = st(ld(y.v[j]) + g);
        }
        st8(da + i0, x);
        st8(db + i0, y);
        return;
    }
    for (size_t i = i0; i < N && i < i0 + 8; i++) {
        float d = ld(dout[i]);
        add_bf16(&da[i], d);
        add_bf16(&db[i], d);
    }
}

void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t N,
                           cudaStream_t stream)
{
    if (N == 0)
        return;
    residual_forward_kernel<<<ceil_div(N, 8 * RES_BS), RES_BS, 0, stream>>>(
        out, a, b, N, aligned16(out, a, b));
    CUDA_CHECK_LAUNCH();
}

void residual_backward_cuda(bf16 *da, bf16 *db, const bf16 *dout, size_t N,
                            cudaStream_t stream)
{
    if (N == 0)
        return;
    residual_backward_kernel<<<ceil_div(N, 8 * RES_BS), RES_BS, 0, stream>>>(
        da, db, dout, N, aligned16(da, db, dout));
    CUDA_CHECK_LAUNCH();
}
