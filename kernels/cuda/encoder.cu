/*
 * encoder.cu — token + position embedding, forward and backward, bf16.
 *
 * Backward without atomics: the host sorts the positions by token
 * (encoder_backward_plan, a counting sort, stable), then one block per
 * distinct token sums its positions' dout rows in position order in fp32 and
 * adds the sum to dwte once. dwpe: one thread per (t,c) sums over b in order.
 * Both are deterministic. The plan layout (ints):
 *   [0] nseg | seg_tok[N] | seg_start[N+1] | pos[N]
 */
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

/* ------------------------------------------------------------- kernels */

__global__ void encoder_forward_kernel(bf16 *out, const int32_t *inp,
                                       const bf16 *wte, const bf16 *wpe,
                                       int T, int C, size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    size_t bt = i / C;
    int c = (int)(i % C);
    int t = (int)(bt % T);
    int tok = inp[bt];
    out[i] = st(ld(wte[(size_t)tok * C + c]) + ld(wpe[(size_t)t * C + c]));
}

/* grid (at least nseg, ceil(C/blockDim)): one block column per distinct
 * token; columns past the plan's nseg (plan[0], read on the device, so
 * that a launch captured in a CUDA graph serves any plan) return. */
__global__ void encoder_backward_wte_kernel(bf16 *dwte, const bf16 *dout,
                                            const int32_t *plan, int N, int C)
{
    int seg = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C || seg >= plan[0])
        return;
    const int32_t *seg_tok = plan + 1, *seg_start = plan + 1 + N;
    const int32_t *pos = plan + 2 + 2 * (size_t)N;
    float s = 0.0f;
    for (int j = seg_start[seg]; j < seg_start[seg + 1]; j++)
        s += ld(dout[(size_t)pos[j] * C + c]);
    add_bf16(&dwte[(size_t)seg_tok[seg] * C + c], s);
}

/* one thread per (t,c) */
__global__ void encoder_backward_wpe_kernel(bf16 *dwpe, const bf16 *dout,
                                            int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C)
        return;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += ld(dout[(size_t)b * T * C + i]);
    add_bf16(&dwpe[i], s);
}

/* ------------------------------------------------------------- launchers */

void encoder_forward_cuda(bf16 *out, const int32_t *inp, const bf16 *wte,
                          const bf16 *wpe, int B, int T, int C,
                          cudaStream_t stream)
{
    size_t total = (size_t)B * T * C;
    const int bs = 256;
    encoder_forward_kernel<<<ceil_div(total, bs), bs, 0, stream>>>(
        out, inp, wte, wpe, T, C, total);
    CUDA_CHECK_LAUNCH();
}

int encoder_backward_plan(int32_t *plan, const int32_t *inp, int N, int V)
{
    int32_t *seg_tok = plan + 1, *seg_start = plan + 1 + N;
    int32_t *pos = plan + 2 + 2 * (size_t)N;
    int32_t *count = (int32_t *)calloc((size_t)V + 1, sizeof(int32_t));
    if (!count) {
        fprintf(stderr, "encoder_backward_plan: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < N; i++) {
        if (inp[i] < 0 || inp[i] >= V) {
            free(count);
            return -1;
        }
        count[inp[i] + 1]++;
    }
    /* count[v] becomes the start of token v's positions */
    for (int v = 0; v < V; v++)
        count[v + 1] += count[v];
    int nseg = 0;
    for (int v = 0; v < V; v++)
        if (count[v + 1] > count[v]) {
            seg_tok[nseg] = v;
            seg_start[nseg] = count[v];
            nseg++;
        }
    seg_start[nseg] = N;
    for (int i = 0; i < N; i++) /* stable: positions ascending per token */
        pos[count[inp[i]]++] = i;
    plan[0] = nseg;
    free(count);
    return nseg;
}

void encoder_backward_cuda(bf16 *dwte, bf16 *dwpe, const bf16 *dout,
                           const int32_t *plan, int nseg, int B, int T, int C,
                           cudaStream_t stream)
{
    int N = B * T;
    const int bs = 256;
    if (nseg < 0) /* the plan's own count, at most one per position */
        nseg = N;
    if (nseg > 0) {
        dim3 grid(nseg, ceil_div(C, bs));
        encoder_backward_wte_kernel<<<grid, bs, 0, stream>>>(dwte, dout, plan,
                                                             N, C);
        CUDA_CHECK_LAUNCH();
    }
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, bs), bs, 0,
                                  stream>>>(dwpe, dout, B, T, C);
    CUDA_CHECK_LAUNCH();
}
