/*
 * moe.cu — the MoE feed-forward with expert prototyping (M6-T) on CUDA:
 * the ops of kernels.h's MoE section in bf16 with fp32 routing and
 * accumulation. Fixed-capacity dispatch (kernels_cuda.h): expert e's rows
 * are [e*cap, e*cap + counts[e]) of (E*cap)-row buffers and the rest are
 * zero, so the two expert GEMMs are strided-batched cuBLASLt calls over
 * the E experts with shapes known on the host: no device-to-host copy of
 * the counts, and a step stays capturable as a graph. Zero rows contribute
 * exact zeros to every weight gradient, so an expert that got no tokens
 * ends with an exact zero gradient, as on the CPU, whatever the buffers
 * held before (every row is written before it is read).
 *
 * Kernels first, launchers after (llm.c's layout). Deterministic: integer
 * counting for capacity, fixed-order loops for every float sum, no atomics.
 */
#include "common.cuh"

#define MOE_BS 256

/* ---------------------------------------------------------------- router */

/* One thread per (token, prototype): bias, top-1 on the logits (strict >:
 * ties to the lowest index), softmax in place, log-sum-exp. */
__global__ void moe_softmax_kernel(float *probs, float *lse, int32_t *expert,
                                   const bf16 *bg, int N, int E, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * k)
        return;
    int n = i / k, p = i % k, Ep = E / k;
    float *z = probs + (size_t)n * E + (size_t)p * Ep;
    const bf16 *b = bg ? bg + p * Ep : NULL;
    int best = 0;
    for (int e = 0; e < Ep; e++) {
        if (b)
            z[e] += ld(b[e]);
        if (z[e] > z[best])
            best = e;
    }
    float mx = z[best], s = 0.0f;
    for (int e = 0; e < Ep; e++) {
        z[e] = expf(z[e] - mx);
        s += z[e];
    }
    float inv = 1.0f / s;
    for (int e = 0; e < Ep; e++)
        z[e] *= inv;
    lse[i] = mx + logf(s);
    expert[i] = p * Ep + best;
}

/* One block per expert: the tokens that chose it, in token order, by a
 * block-wide prefix count over chunks of the tokens; the first `cap` get
 * rows e*cap + position, the rest slot -1. counts[e] = processed, routed[e]
 * = chosen. row_token of the unused rows is -1. */
__global__ void moe_capacity_kernel(int32_t *slot, int32_t *counts,
                                    int32_t *routed, int32_t *row_token,
                                    const int32_t *expert, int N, int E,
                                    int k, int cap)
{
    __shared__ int scan[MOE_BS];
    int e = blockIdx.x, p = e / (E / k), t = threadIdx.x;
    int base = 0;
    for (int n0 = 0; n0 < N; n0 += MOE_BS) {
        int n = n0 + t;
        int mine = n < N && expert[(size_t)n * k + p] == e;
        scan[t] = mine;
        __syncthreads();
        for (int o = 1; o < MOE_BS; o <<= 1) { /* inclusive Hillis-Steele */
            int v = t >= o ? scan[t - o] : 0;
            __syncthreads();
            scan[t] += v;
            __syncthreads();
        }
        if (mine) {
            int pos = base + scan[t] - 1;
            int32_t r = pos < cap ? e * cap + pos : -1;
            slot[(size_t)n * k + p] = r;
            if (r >= 0)
                row_token[r] = n;
        }
        base += scan[MOE_BS - 1];
        __syncthreads(); /* scan[] is rewritten by the next chunk */
    }
    for (int pos = base + t; pos < cap; pos += MOE_BS)
        row_token[e * cap + pos] = -1;
    if (t == 0) {
        routed[e] = base;
        counts[e] = base < cap ? base : cap;
    }
}

/* dropped[0] = sum over experts of routed - counts (one thread: E ints). */
__global__ void moe_dropped_kernel(int32_t *dropped, const int32_t *counts,
                                   const int32_t *routed, int E)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int s = 0;
        for (int e = 0; e < E; e++)
            s += routed[e] - counts[e];
        dropped[0] = s;
    }
}

/* ------------------------------------------------------------- experts */

/* xe (E*cap, C): the token's row, or zeros for an unused row. */
__global__ void moe_gather_kernel(bf16 *xe, const bf16 *x,
                                  const int32_t *row_token, int rows, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * C)
        return;
    int r = (int)(i / C), c = (int)(i % C);
    int n = row_token[r];
    xe[i] = n >= 0 ? x[(size_t)n * C + c] : st(0.0f);
}

/* In place over (E*cap, W) rows of a GEMM's output: + bias (E, W) of the
 * row's expert, then GELU into act when act is not NULL; unused rows are
 * set to zero (in both). */
__global__ void moe_bias_gelu_kernel(bf16 *pre, bf16 *act, const bf16 *bias,
                                     const int32_t *row_token, int rows,
                                     int cap, int W)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * W)
        return;
    int r = (int)(i / W), w = (int)(i % W), e = r / cap;
    float x = 0.0f;
    if (row_token[r] >= 0)
        x = ld(pre[i]) + ld(bias[(size_t)e * W + w]);
    pre[i] = st(x);
    if (act) {
        float xr = ld(pre[i]); /* GELU of the stored (rounded) value */
        float u = 0.7978845608028654f * (xr + 0.044715f * xr * xr * xr);
        act[i] = st(0.5f * xr * (1.0f + tanhf(u)));
    }
}

/* out (N,C) (+)= each token's sum over its k expert rows of rows (the
 * prototypes in order, a dropped one (slot -1) skipped), each row scaled
 * by its gate probs[n, expert[n,p]] (probs NULL: by 1, exactly); add 0
 * writes out (not read), else adds to it. The forward's combine
 * (ye -> out, gated) and the backward's scatter (dxe -> dx, ungated). */
__global__ void moe_token_sum_kernel(bf16 *out, const bf16 *rows,
                                     const float *probs,
                                     const int32_t *expert,
                                     const int32_t *slot, int N, int C,
                                     int E, int k, int add)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C)
        return;
    int n = (int)(i / C), c = (int)(i % C);
    float s = 0.0f;
    for (int p = 0; p < k; p++) {
        int r = slot[(size_t)n * k + p];
        if (r < 0)
            continue;
        float g = probs ? probs[(size_t)n * E + expert[(size_t)n * k + p]]
                        : 1.0f;
        s += g * ld(rows[(size_t)r * C + c]);
    }
    out[i] = st(add ? ld(out[i]) + s : s);
}

/* ------------------------------------------------------------- losses */

/* One block: aux (Switch, averaged over prototypes) and z (ST-MoE) into
 * out[0], out[1]. Thread e sums expert e's probabilities over the tokens
 * in order; the block sums are fixed-order trees: deterministic. */
__global__ void moe_aux_kernel(float *out, const float *probs,
                               const float *lse, const int32_t *routed, int N,
                               int E, int k)
{
    float a = 0.0f, z = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float P = 0.0f;
        for (int n = 0; n < N; n++)
            P += probs[(size_t)n * E + e];
        a += ((float)routed[e] / N) * (P / N);
    }
    for (int i = threadIdx.x; i < N * k; i += blockDim.x)
        z += lse[i] * lse[i];
    a = block_sum(a);
    z = block_sum(z);
    if (threadIdx.x == 0) {
        out[0] = a * (float)(E / k) / k;
        out[1] = z / ((float)N * k);
    }
}

/* ------------------------------------------------------------ backward */

/* dye (E*cap, C) = gate * dout[token] on used rows, zero on the others. */
__global__ void moe_dye_kernel(bf16 *dye, const bf16 *dout,
                               const float *probs, const int32_t *row_token,
                               int rows, int cap, int C, int E)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * C)
        return;
    int r = (int)(i / C), c = (int)(i % C), n = row_token[r];
    float v = 0.0f;
    if (n >= 0)
        v = probs[(size_t)n * E + r / cap] * ld(dout[(size_t)n * C + c]);
    dye[i] = st(v);
}

/* One warp per (token, prototype): dgate = <dout[n], ye[slot]>, then, in
 * lane 0, the prototype's router gradient: d/dprobs = dgate at the chosen
 * expert + daux Ep f_e / (k N); softmax backward; + the z-loss's
 * 2 dz lse p / (N k). dlogits (N,E) bf16, every element written. */
__global__ void moe_router_backward_kernel(bf16 *dlogits, const bf16 *dout,
                                           const bf16 *ye, const float *probs,
                                           const float *lse,
                                           const int32_t *expert,
                                           const int32_t *slot,
                                           const int32_t *routed, float daux,
                                           float dz, int N, int C, int E,
                                           int k)
{
    int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (w >= N * k)
        return; /* whole warps leave together: N*k is per warp */
    int n = w / k, p = w % k, Ep = E / k;
    int r = slot[w];
    float dg = 0.0f;
    if (r >= 0)
        for (int c = lane; c < C; c += 32)
            dg += ld(dout[(size_t)n * C + c]) * ld(ye[(size_t)r * C + c]);
    dg = warp_sum(dg);
    if (lane != 0)
        return;
    const float *pr = probs + (size_t)n * E + (size_t)p * Ep;
    int chosen = r >= 0 ? expert[w] - p * Ep : -1;
    float aux_scale = daux * (float)Ep / ((float)k * N);
    float dot = 0.0f;
    for (int e = 0; e < Ep; e++) {
        float d = aux_scale * ((float)routed[p * Ep + e] / N) +
                  (e == chosen ? dg : 0.0f);
        dot += pr[e] * d;
    }
    float zl = 2.0f * dz / ((float)N * k) * lse[w];
    for (int e = 0; e < Ep; e++) {
        float d = aux_scale * ((float)routed[p * Ep + e] / N) +
                  (e == chosen ? dg : 0.0f);
        dlogits[(size_t)n * E + p * Ep + e] = st(pr[e] * (d - dot + zl));
    }
}

/* dh (E*cap, H) *= GELU'(hpre), in place (unused rows: hpre = dh = 0). */
__global__ void moe_gelu_backward_kernel(bf16 *dh, const bf16 *hpre,
                                         size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = ld(hpre[i]);
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dh[i] = st(grad * ld(dh[i]));
}

/* dbias (E, W) += column sums of d (E*cap, W) over each expert's cap rows,
 * rows in order (one thread per (e, w)). */
__global__ void moe_bias_backward_kernel(bf16 *dbias, const bf16 *d, int E,
                                         int cap, int W)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)E * W)
        return;
    int e = (int)(i / W), w = (int)(i % W);
    float s = 0.0f;
    for (int r = 0; r < cap; r++)
        s += ld(d[((size_t)e * cap + r) * W + w]);
    dbias[i] = st(ld(dbias[i]) + s);
}


/* ------------------------------------------------------------ launchers */

static unsigned grid_(size_t n) { return (unsigned)ceil_div(n, MOE_BS); }

/* For each expert e < E: D_e (m,n col-major) = op(A_e) op(B_e) + beta D_e,
 * strides in elements. */
static void experts_gemm_(int ta, int tb, int m, int n, int kk, const bf16 *A,
                          int lda, long long sA, const bf16 *B, int ldb,
                          long long sB, bf16 *D, int ldd, long long sD,
                          float beta, int E, cudaStream_t stream)
{
    gemm_batched_args g = {ta, tb, m, n, kk, A, lda, sA, B, ldb, sB,
                           D, ldd, sD, 0, 1.0f, beta, E};
    gemm_batched_cuda(&g, stream);
}

void moe_route_cuda(float *probs, float *lse, int32_t *expert, int32_t *slot,
                    int32_t *counts, int32_t *routed, int32_t *row_token,
                    int32_t *dropped, const bf16 *x, const bf16 *wg,
                    const bf16 *bg, const moe_dims *d, cudaStream_t stream)
{
    const int N = d->N, C = d->C, E = d->E, k = d->k;
    /* logits (N,E) fp32: column-major (E,N) = Wg (E,C) x^T */
    gemm_batched_args g = {1, 0, E, N, C, wg, C, 0, x, C, 0, probs, E, 0,
                           1, 1.0f, 0.0f, 1};
    gemm_batched_cuda(&g, stream);
    moe_softmax_kernel<<<grid_((size_t)N * k), MOE_BS, 0, stream>>>(
        probs, lse, expert, bg, N, E, k);
    CUDA_CHECK_LAUNCH();
    moe_capacity_kernel<<<E, MOE_BS, 0, stream>>>(slot, counts, routed,
                                                  row_token, expert, N, E, k,
                                                  d->capacity);
    CUDA_CHECK_LAUNCH();
    moe_dropped_kernel<<<1, 32, 0, stream>>>(dropped, counts, routed, E);
    CUDA_CHECK_LAUNCH();
}

void moe_forward_cuda(bf16 *out, bf16 *xe, bf16 *hpre, bf16 *hact, bf16 *ye,
                      const bf16 *x, const float *probs,
                      const int32_t *expert, const int32_t *slot,
                      const int32_t *row_token, const bf16 *w1,
                      const bf16 *b1, const bf16 *w2, const bf16 *b2,
                      const moe_dims *d, cudaStream_t stream)
{
    const int N = d->N, C = d->C, E = d->E, k = d->k, H = d->H;
    const int cap = d->capacity, rows = E * cap;
    moe_gather_kernel<<<grid_((size_t)rows * C), MOE_BS, 0, stream>>>(
        xe, x, row_token, rows, C);
    CUDA_CHECK_LAUNCH();
    /* hpre_e (cap,H) = xe_e W1_e^T: column-major (H,cap) = W1_e xe_e^T */
    experts_gemm_(1, 0, H, cap, C, w1, C, (long long)H * C, xe, C,
                  (long long)cap * C, hpre, H, (long long)cap * H, 0.0f, E,
                  stream);
    moe_bias_gelu_kernel<<<grid_((size_t)rows * H), MOE_BS, 0, stream>>>(
        hpre, hact, b1, row_token, rows, cap, H);
    CUDA_CHECK_LAUNCH();
    /* ye_e (cap,C) = hact_e W2_e^T */
    experts_gemm_(1, 0, C, cap, H, w2, H, (long long)C * H, hact, H,
                  (long long)cap * H, ye, C, (long long)cap * C, 0.0f, E,
                  stream);
    moe_bias_gelu_kernel<<<grid_((size_t)rows * C), MOE_BS, 0, stream>>>(
        ye, (bf16 *)NULL, b2, row_token, rows, cap, C);
    CUDA_CHECK_LAUNCH();
    moe_token_sum_kernel<<<grid_((size_t)N * C), MOE_BS, 0, stream>>>(
        out, ye, probs, expert, slot, N, C, E, k, 0);
    CUDA_CHECK_LAUNCH();
}

void moe_aux_losses_cuda(float *out, const float *probs, const float *lse,
                         const int32_t *routed, const moe_dims *d,
                         cudaStream_t stream)
{
    moe_aux_kernel<<<1, MOE_BS, 0, stream>>>(out, probs, lse, routed, d->N,
                                             d->E, d->k);
    CUDA_CHECK_LAUNCH();
}

size_t moe_backward_scratch_bytes(const moe_dims *d)
{
    size_t rows = (size_t)d->E * d->capacity;
    size_t bf = rows * d->C * 2 + rows * d->H + (size_t)d->N * d->E;
    size_t mm = matmul_backward_scratch_floats(d->N, d->E);
    /* bf16 buffers first, then the fp32 column-sum scratch, 256-aligned */
    return ceil_div(bf * sizeof(bf16), 256) * 256 + mm * sizeof(float);
}

/* The backward of the experts' linear layer out = in W^T + b, each of the
 * E experts on its block of cap rows: in (E*cap, K), W (E, M, K), dout
 * (E*cap, M). din = dout W (written), dW += dout^T in, db (E, M) += the
 * column sums of dout. */
static void experts_linear_backward_(bf16 *din, bf16 *dw, bf16 *db,
                                     const bf16 *dout, const bf16 *in,
                                     const bf16 *w, int E, int cap, int K,
                                     int M, cudaStream_t stream)
{
    experts_gemm_(0, 0, K, cap, M, w, K, (long long)M * K, dout, M,
                  (long long)cap * M, din, K, (long long)cap * K, 0.0f, E,
                  stream);
    experts_gemm_(0, 1, K, M, cap, in, K, (long long)cap * K, dout, M,
                  (long long)cap * M, dw, K, (long long)M * K, 1.0f, E,
                  stream);
    moe_bias_backward_kernel<<<grid_((size_t)E * M), MOE_BS, 0, stream>>>(
        db, dout, E, cap, M);
    CUDA_CHECK_LAUNCH();
}

static void moe_backward_(bf16 *dx, bf16 *dwg, bf16 *dbg, bf16 *dw1, bf16 *db1,
                          bf16 *dw2, bf16 *db2, void *scratch,
                          const bf16 *dout, const bf16 *x,
                          const moe_saved_cuda *sv, const bf16 *wg,
                          const bf16 *w1, const bf16 *w2, float daux, float dz,
                          const moe_dims *d, int first, cudaStream_t stream)
{
    const float *probs = sv->probs, *lse = sv->lse;
    const int32_t *expert = sv->expert, *slot = sv->slot;
    const int32_t *routed = sv->routed, *row_token = sv->row_token;
    const bf16 *xe = sv->xe, *hpre = sv->hpre, *hact = sv->hact, *ye = sv->ye;
    const int N = d->N, C = d->C, E = d->E, k = d->k, H = d->H;
    const int cap = d->capacity, rows = E * cap;
    bf16 *dye = (bf16 *)scratch;           /* (rows, C) */
    bf16 *dh = dye + (size_t)rows * C;     /* (rows, H) */
    bf16 *dxe = dh + (size_t)rows * H;     /* (rows, C) */
    bf16 *dlogits = dxe + (size_t)rows * C; /* (N, E) */
    size_t bf = (size_t)rows * C * 2 + (size_t)rows * H + (size_t)N * E;
    float *colsum = (float *)((char *)scratch +
                              ceil_div(bf * sizeof(bf16), 256) * 256);

    moe_dye_kernel<<<grid_((size_t)rows * C), MOE_BS, 0, stream>>>(
        dye, dout, probs, row_token, rows, cap, C, E);
    CUDA_CHECK_LAUNCH();
    moe_router_backward_kernel<<<grid_((size_t)N * k * 32), MOE_BS, 0,
                                 stream>>>(dlogits, dout, ye, probs, lse,
                                           expert, slot, routed, daux, dz, N,
                                           C, E, k);
    CUDA_CHECK_LAUNCH();
    /* ye = hact W2^T + b2: dh = dye W2, dW2 += dye^T hact, db2 += sums */
    experts_linear_backward_(dh, dw2, db2, dye, hact, w2, E, cap, H, C,
                             stream);
    moe_gelu_backward_kernel<<<grid_((size_t)rows * H), MOE_BS, 0, stream>>>(
        dh, hpre, (size_t)rows * H);
    CUDA_CHECK_LAUNCH();
    /* hpre = xe W1^T + b1: dxe = dh W1, dW1 += dh^T xe, db1 += sums */
    experts_linear_backward_(dxe, dw1, db1, dh, xe, w1, E, cap, C, H, stream);
    moe_token_sum_kernel<<<grid_((size_t)N * C), MOE_BS, 0, stream>>>(
        dx, dxe, (const float *)NULL, expert, slot, N, C, E, k, !first);
    CUDA_CHECK_LAUNCH();
    /* logits = x Wg^T + bg */
    matmul_backward_cuda(dx, dwg, dbg, colsum, dlogits, x, wg, N, C, E,
                         stream);
}

void moe_backward_cuda(bf16 *dx, bf16 *dwg, bf16 *dbg, bf16 *dw1, bf16 *db1,
                       bf16 *dw2, bf16 *db2, void *scratch, const bf16 *dout,
                       const bf16 *x, const moe_saved_cuda *sv,
                       const bf16 *wg, const bf16 *w1, const bf16 *w2,
                       float daux, float dz, const moe_dims *d,
                       cudaStream_t stream)
{
    moe_backward_(dx, dwg, dbg, dw1, db1, dw2, db2, scratch, dout, x, sv, wg,
                  w1, w2, daux, dz, d, 0, stream);
}

void moe_backward_first_cuda(bf16 *dx, bf16 *dwg, bf16 *dbg, bf16 *dw1, bf16 *db1,
                       bf16 *dw2, bf16 *db2, void *scratch, const bf16 *dout,
                       const bf16 *x, const moe_saved_cuda *sv,
                       const bf16 *wg, const bf16 *w1, const bf16 *w2,
                       float daux, float dz, const moe_dims *d,
                       cudaStream_t stream)
{
    moe_backward_(dx, dwg, dbg, dw1, db1, dw2, db2, scratch, dout, x, sv, wg,
                  w1, w2, daux, dz, d, 1, stream);
}
