/*
 * attention.cu — causal multi-head self-attention, flash-attention style
 * (Dao et al. 2022): the (T,T) score matrix never reaches global memory.
 * Math as kernels/cpu/attention.c, with scale = 1/sqrt(hs):
 *   forward   o_t = sum_{s<=t} p_ts v_s,  p_ts = exp(scale q_t.k_s - lse_t)
 *   backward  D_t = dout_t . o_t
 *             dp_ts = dout_t . v_s,  ds_ts = p_ts (dp_ts - D_t)
 *             dv_s += sum_t p_ts dout_t
 *             dk_s += scale sum_t ds_ts q_t,  dq_t += scale sum_s ds_ts k_s
 *
 * A straightforward tiled version on the fp32 CUDA cores, correctness first
 * (no tensor cores yet). One thread owns one row (a query in forward and
 * dq, a key in dk/dv) with its accumulators in registers; the rows it meets
 * are streamed through shared memory in tiles and read by all threads of the
 * block at once (broadcast). A thread's own row, when it lives in shared
 * memory, is padded to HS+1 floats so a warp's 32 rows fall in 32 banks.
 * Forward keeps a running max and sum per query (online softmax) and saves
 * lse_t = max + log(sum). Backward: a small kernel for D, one kernel for dk
 * and dv (parallel over keys), one for dq (parallel over queries). Each
 * output element is written by one thread: deterministic, no atomics.
 */
#include "common.cuh"

/* Tile sizes per head size: rows per block (threads) and rows per streamed
 * tile, chosen so the static shared memory stays under 48 KiB. */
template <int HS> struct attn_tiles {
    static constexpr int FWD_Q = 64;                      /* queries/block */
    static constexpr int FWD_K = HS <= 64 ? 64 : 32;      /* keys/tile */
    static constexpr int BWD_ROWS = HS <= 64 ? 64 : 32;   /* own rows/block */
    static constexpr int BWD_TILE = HS <= 64 ? 16 : 8;    /* streamed rows */
};

#define ATT_CHUNK 16 /* scores per online-softmax update in forward */

/* ------------------------------------------------------------- kernels */

/* grid (ceil(T/FWD_Q), NH, B), block FWD_Q threads: one query each */
template <int HS>
__global__ void attn_forward_kernel(bf16 *out, float *lse, const bf16 *qkv,
                                    int T, int C, int NH, float scale)
{
    constexpr int BQ = attn_tiles<HS>::FWD_Q, BK = attn_tiles<HS>::FWD_K;
    __shared__ float Ks[BK][HS], Vs[BK][HS];
    const int b = blockIdx.z, h = blockIdx.y;
    const int t = blockIdx.x * BQ + threadIdx.x;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bool valid = t < T;

    float q[HS], o[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) {
        q[i] = valid ? ld(base[(size_t)t * C3 + i]) * scale : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int tlast = min(T - 1, (int)blockIdx.x * BQ + BQ - 1);
    for (int k0 = 0; k0 <= tlast; k0 += BK) {
        __syncthreads(); /* previous tile fully used */
        for (int idx = threadIdx.x; idx < BK * HS; idx += BQ) {
            int r = idx / HS, i = idx % HS, key = k0 + r;
            bool in = key < T;
            Ks[r][i] = in ? ld(base[(size_t)key * C3 + C + i]) : 0.0f;
            Vs[r][i] = in ? ld(base[(size_t)key * C3 + 2 * C + i]) : 0.0f;
        }
        __syncthreads();
        /* keys k0 .. k0+kend-1 of this tile are visible to query t */
        const int kend = valid ? min(BK, t - k0 + 1) : 0;
        for (int kc = 0; kc < kend; kc += ATT_CHUNK) {
            float s[ATT_CHUNK];
            float cmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < ATT_CHUNK; j++) {
                float d = -INFINITY;
                if (kc + j < kend) {
                    d = 0.0f;
#pragma unroll
                    for (int i = 0; i < HS; i++)
                        d += q[i] * Ks[kc + j][i];
                }
                s[j] = d;
                cmax = fmaxf(cmax, d);
            }
            /* cmax is finite: key kc < kend is in the chunk */
            float mnew = fmaxf(m, cmax);
            float corr = expf(m - mnew); /* 0 on the first chunk */
            l *= corr;
#pragma unroll
            for (int i = 0; i < HS; i++)
                o[i] *= corr;
#pragma unroll
            for (int j = 0; j < ATT_CHUNK; j++) {
                if (kc + j < kend) {
                    float p = expf(s[j] - mnew);
                    l += p;
#pragma unroll
                    for (int i = 0; i < HS; i++)
                        o[i] += p * Vs[kc + j][i];
                }
            }
            m = mnew;
        }
    }
    if (valid) {
        float inv = 1.0f / l;
        bf16 *dst = out + ((size_t)b * T + t) * C + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++)
            dst[i] = st(o[i] * inv);
        lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    }
}

/* D (B,NH,T) = rowwise dout . out; one warp per (b,t,h) */
__global__ void attn_backward_d_kernel(float *Dd, const bf16 *dout,
                                       const bf16 *out, int B, int T, int C,
                                       int NH)
{
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * NH)
        return;
    int hs = C / NH;
    size_t bt = w / NH;
    int h = (int)(w % NH);
    const bf16 *o = out + bt * C + (size_t)h * hs;
    const bf16 *d = dout + bt * C + (size_t)h * hs;
    float s = 0.0f;
    for (int i = lane; i < hs; i += 32)
        s += ld(o[i]) * ld(d[i]);
    s = warp_sum(s);
    if (lane == 0) {
        size_t b = bt / T, t = bt % T;
        Dd[(b * NH + h) * T + t] = s;
    }
}

/* grid (ceil(T/ROWS), NH, B), block ROWS threads: one key s each; streams
 * the queries t >= s through shared memory. */
template <int HS>
__global__ void attn_backward_dkv_kernel(bf16 *dqkv, const bf16 *dout,
                                         const bf16 *qkv, const float *lse,
                                         const float *Dd, int T, int C,
                                         int NH, float scale)
{
    constexpr int R = attn_tiles<HS>::BWD_ROWS, Q = attn_tiles<HS>::BWD_TILE;
    __shared__ float Ko[R][HS + 1], Vo[R][HS + 1];
    __shared__ float Qs[Q][HS], dOs[Q][HS], Ls[Q], Ds[Q];
    const int b = blockIdx.z, h = blockIdx.y, tid = threadIdx.x;
    const int s0 = blockIdx.x * R, s = s0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bf16 *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T;
    const float *D_bh = Dd + ((size_t)b * NH + h) * T;
    const bool valid = s < T;

    for (int idx = tid; idx < R * HS; idx += R) {
        int r = idx / HS, i = idx % HS, key = s0 + r;
        bool in = key < T;
        Ko[r][i] = in ? ld(base[(size_t)key * C3 + C + i]) : 0.0f;
        Vo[r][i] = in ? ld(base[(size_t)key * C3 + 2 * C + i]) : 0.0f;
    }
    float dk[HS], dv[HS];
#pragma unroll
    for (int i = 0; i < HS; i++)
        dk[i] = dv[i] = 0.0f;

    for (int t0 = s0; t0 < T; t0 += Q) {
        __syncthreads(); /* own rows loaded; previous tile fully used */
        for (int idx = tid; idx < Q * HS; idx += R) {
            int r = idx / HS, i = idx % HS, tq = t0 + r;
            bool in = tq < T;
            Qs[r][i] = in ? ld(base[(size_t)tq * C3 + i]) : 0.0f;
            dOs[r][i] = in ? ld(dbase[(size_t)tq * C + i]) : 0.0f;
        }
        if (tid < Q) {
            int tq = t0 + tid;
            Ls[tid] = tq < T ? lse_bh[tq] : 0.0f;
            Ds[tid] = tq < T ? D_bh[tq] : 0.0f;
        }
        __syncthreads();
        if (!valid)
            continue;
        for (int j = 0; j < Q; j++) {
            int tq = t0 + j;
            if (tq < s || tq >= T)
                continue;
            float sc = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                sc += Qs[j][i] * Ko[tid][i];
                dp += dOs[j][i] * Vo[tid][i];
            }
            float p = expf(sc * scale - Ls[j]);
            float ds = p * (dp - Ds[j]);
#pragma unroll
            for (int i = 0; i < HS; i++) {
                dv[i] += p * dOs[j][i];
                dk[i] += ds * Qs[j][i];
            }
        }
    }
    if (valid) {
        bf16 *dst = dqkv + ((size_t)b * T + s) * C3 + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) {
            add_bf16(&dst[C + i], dk[i] * scale);
            add_bf16(&dst[2 * C + i], dv[i]);
        }
    }
}

/* grid (ceil(T/ROWS), NH, B), block ROWS threads: one query t each; streams
 * the keys s <= t through shared memory. */
template <int HS>
__global__ void attn_backward_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                        const bf16 *qkv, const float *lse,
                                        const float *Dd, int T, int C, int NH,
                                        float scale)
{
    constexpr int R = attn_tiles<HS>::BWD_ROWS, K = attn_tiles<HS>::BWD_TILE;
    __shared__ float Qo[R][HS + 1], dOo[R][HS + 1];
    __shared__ float Ks[K][HS], Vs[K][HS];
    const int b = blockIdx.z, h = blockIdx.y, tid = threadIdx.x;
    const int t0 = blockIdx.x * R, t = t0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bf16 *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    const bool valid = t < T;

    for (int idx = tid; idx < R * HS; idx += R) {
        int r = idx / HS, i = idx % HS, tq = t0 + r;
        bool in = tq < T;
        Qo[r][i] = in ? ld(base[(size_t)tq * C3 + i]) : 0.0f;
        dOo[r][i] = in ? ld(dbase[(size_t)tq * C + i]) : 0.0f;
    }
    const float lse_t = valid ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    const float D_t = valid ? Dd[((size_t)b * NH + h) * T + t] : 0.0f;
    float dq[HS];
#pragma unroll
    for (int i = 0; i < HS; i++)
        dq[i] = 0.0f;

    const int tlast = min(T - 1, t0 + R - 1);
    for (int k0 = 0; k0 <= tlast; k0 += K) {
        __syncthreads();
        for (int idx = tid; idx < K * HS; idx += R) {
            int r = idx / HS, i = idx % HS, key = k0 + r;
            bool in = key < T;
            Ks[r][i] = in ? ld(base[(size_t)key * C3 + C + i]) : 0.0f;
            Vs[r][i] = in ? ld(base[(size_t)key * C3 + 2 * C + i]) : 0.0f;
        }
        __syncthreads();
        if (!valid)
            continue;
        for (int j = 0; j < K; j++) {
            if (k0 + j > t) /* keys ascend: the rest are in the future */
                break;
            float sc = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                sc += Qo[tid][i] * Ks[j][i];
                dp += dOo[tid][i] * Vs[j][i];
            }
            float p = expf(sc * scale - lse_t);
            float ds = p * (dp - D_t);
#pragma unroll
            for (int i = 0; i < HS; i++)
                dq[i] += ds * Ks[j][i];
        }
    }
    if (valid) {
        bf16 *dst = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++)
            add_bf16(&dst[i], dq[i] * scale);
    }
}

/* ------------------------------------------------- the tensor-core path */

/* The same attention with its four products on cuBLASLt (tensor cores),
 * one strided batch over a group of heads of one sequence b at a time,
 * the (T,T) scores in a workspace (ldT = T rounded up to 8, so that every
 * row and every head's matrix stays 16-byte aligned):
 *   forward   S = scale Q K^T (fp32);  P = causal softmax of S (bf16), lse;
 *             O = P V
 *   backward  S again;  P = exp(S - lse) (bf16);  dV += P^T dO;
 *             dP = dO V^T (fp32);  dS = scale P (dP - D) (bf16, over P);
 *             dQ += dS K;  dK += dS^T Q
 * The masked upper triangle is computed and zeroed (2x the causal FLOPs):
 * still far faster than the fp32 cores for T >= a few hundred. The row
 * kernels read and write the workspace once per pass (memory bound). */

#define ATT_WS_CAP ((size_t)512 << 20) /* workspace bytes per head group */

static int att_ldT_(int T) { return (int)ceil_div((size_t)T, 8) * 8; }

/* workspace bytes of one head's pass */
static size_t att_head_bytes_(int T)
{
    return (size_t)T * att_ldT_(T) * (4 + 4 + 2);
}

/* heads per pass: as many as fit `bytes`, at least one */
static int att_heads_(int T, int NH, size_t bytes)
{
    size_t nh = bytes / att_head_bytes_(T);
    return nh < 1 ? 1 : nh > (size_t)NH ? NH : (int)nh;
}

/* a workspace smaller than one head's pass is a caller's bug */
static void att_check_ws_(size_t ws_bytes, int T)
{
    if (ws_bytes < att_head_bytes_(T)) {
        fprintf(stderr, "attention_gemm: workspace of %zu bytes, below one "
                        "head's %zu (T=%d)\n", ws_bytes, att_head_bytes_(T),
                T);
        exit(1);
    }
}

/* P (rows, ldT) bf16 = the causal softmax of row r of S (rows, ldT) fp32
 * (scaled scores), query t = r % T: 0 past column t; lse[r] = max +
 * log(sum). One warp per row. */
__global__ void attn_softmax_rows_kernel(bf16 *P, float *lse, const float *S,
                                         int T, int ldT, int rows)
{
    int r = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
    int lane = threadIdx.x % 32;
    if (r >= rows)
        return; /* the whole warp */
    int t = r % T;
    const float *s = S + (size_t)r * ldT;
    bf16 *p = P + (size_t)r * ldT;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        m = fmaxf(m, s[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j <= t; j += 32)
        l += expf(s[j] - m);
    l = warp_sum(l);
    float inv = 1.0f / l;
    for (int j = lane; j < T; j += 32)
        p[j] = st(j <= t ? expf(s[j] - m) * inv : 0.0f);
    if (lane == 0)
        lse[r] = m + logf(l);
}

/* Backward, element (r, j) of rows x T, query t = r % T, 0 past column t:
 *   dS == NULL:  P = exp(S - lse[r])                        (bf16, into P)
 *   else:        dS = scale exp(S - lse[r]) (dP - Dd[r])    (bf16, into dS)
 * The probabilities are recomputed in fp32 from S for dS (not read back
 * from the bf16 P). */
__global__ void attn_probs_kernel(bf16 *out, const float *S, const float *dP,
                                  const float *lse, const float *Dd, int T,
                                  int ldT, size_t n, float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    size_t r = i / T;
    int j = (int)(i % T), t = (int)(r % T);
    size_t at = r * ldT + j;
    float v = 0.0f;
    if (j <= t) {
        float p = expf(S[at] - lse[r]);
        v = dP ? scale * p * (dP[at] - Dd[r]) : p;
    }
    out[at] = st(v);
}

/* Pointers of one pass: sequence b, heads [h0, h0 + nh). */
typedef struct {
    const bf16 *q, *k, *v;    /* in qkv, ld 3C */
    float *S, *dP;            /* workspace (nh, T, ldT) fp32 */
    bf16 *P;                  /* workspace (nh, T, ldT) bf16 */
    int T, ldT, nh, hs, C;
} att_pass_;

static att_pass_ att_pass_of_(const bf16 *qkv, void *ws, int b, int h0,
                              int nh, int T, int C, int NH)
{
    att_pass_ a;
    int hs = C / NH;
    const bf16 *base = qkv + (size_t)b * T * 3 * C + (size_t)h0 * hs;
    a.q = base;
    a.k = base + C;
    a.v = base + 2 * (size_t)C;
    a.T = T;
    a.ldT = att_ldT_(T);
    a.nh = nh;
    a.hs = hs;
    a.C = C;
    size_t tt = (size_t)nh * T * a.ldT;
    a.S = (float *)ws;
    a.dP = a.S + tt;
    a.P = (bf16 *)(a.dP + tt);
    return a;
}

/* S (nh; T queries x T keys, row-major, ld ldT) = alpha X Y^T, X and Y
 * (T, hs) head slices of ld ldx, ldy: column-major S^T = op_T(Y) X. */
static void att_scores_(const att_pass_ *a, float *S, const bf16 *X, int ldx,
                        const bf16 *Y, int ldy, float alpha,
                        cudaStream_t stream)
{
    gemm_batched_args g = {1, 0, a->T, a->T, a->hs, Y, ldy, a->hs, X, ldx,
                           a->hs, S, a->ldT, (long long)a->T * a->ldT, 1,
                           alpha, 0.0f, a->nh};
    gemm_batched_cuda(&g, stream);
}

/* Out (nh; T x hs, ld ldo) = beta Out + W Y, W (T x T, ld ldT) bf16 from
 * the workspace, transposed when tw; Y (T, hs) of ld ldy: column-major
 * Out^T = Y^T op(W)^T. */
static void att_apply_(const att_pass_ *a, bf16 *Out, int ldo, const bf16 *W,
                       int tw, const bf16 *Y, int ldy, float beta,
                       cudaStream_t stream)
{
    gemm_batched_args g = {0, tw, a->hs, a->T, a->T, Y, ldy, a->hs, W, a->ldT,
                           (long long)a->T * a->ldT, Out, ldo, a->hs, 0, 1.0f,
                           beta, a->nh};
    gemm_batched_cuda(&g, stream);
}

size_t attention_gemm_workspace_bytes(int T, int C, int NH)
{
    if (C % NH || (C / NH) % 8)
        return 0; /* head slices must be 16-byte aligned */
    return (size_t)att_heads_(T, NH, ATT_WS_CAP) * att_head_bytes_(T);
}

void attention_gemm_forward_cuda(bf16 *out, float *lse, void *ws,
                                 size_t ws_bytes, const bf16 *qkv, int B,
                                 int T, int C, int NH, cudaStream_t stream)
{
    att_check_ws_(ws_bytes, T);
    int hs = C / NH, G = att_heads_(T, NH, ws_bytes);
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += G) {
            int nh = min(G, NH - h0);
            att_pass_ a = att_pass_of_(qkv, ws, b, h0, nh, T, C, NH);
            att_scores_(&a, a.S, a.q, 3 * C, a.k, 3 * C, scale, stream);
            int rows = nh * T;
            attn_softmax_rows_kernel<<<ceil_div((size_t)rows * 32, 256), 256,
                                       0, stream>>>(
                a.P, lse + ((size_t)b * NH + h0) * T, a.S, T, a.ldT, rows);
            CUDA_CHECK_LAUNCH();
            bf16 *o = out + (size_t)b * T * C + (size_t)h0 * hs;
            att_apply_(&a, o, C, a.P, 0, a.v, 3 * C, 0.0f, stream);
        }
}

void attention_gemm_backward_cuda(bf16 *dqkv, float *scratch, void *ws,
                                  size_t ws_bytes, const bf16 *dout,
                                  const bf16 *qkv, const bf16 *out,
                                  const float *lse, int B, int T, int C,
                                  int NH, cudaStream_t stream)
{
    att_check_ws_(ws_bytes, T);
    int hs = C / NH, G = att_heads_(T, NH, ws_bytes);
    float scale = 1.0f / sqrtf((float)hs);
    size_t warps = (size_t)B * T * NH;
    attn_backward_d_kernel<<<ceil_div(warps * 32, 256), 256, 0, stream>>>(
        scratch, dout, out, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
    for (int b = 0; b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += G) {
            int nh = min(G, NH - h0);
            att_pass_ a = att_pass_of_(qkv, ws, b, h0, nh, T, C, NH);
            size_t off = (size_t)b * T * 3 * C + (size_t)h0 * hs;
            bf16 *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * (size_t)C;
            const bf16 *dO = dout + (size_t)b * T * C + (size_t)h0 * hs;
            const float *lse_g = lse + ((size_t)b * NH + h0) * T;
            const float *D_g = scratch + ((size_t)b * NH + h0) * T;
            size_t n = (size_t)nh * T * T;
            unsigned nb = (unsigned)ceil_div(n, 256);
            att_scores_(&a, a.S, a.q, 3 * C, a.k, 3 * C, scale, stream);
            attn_probs_kernel<<<nb, 256, 0, stream>>>(
                a.P, a.S, (const float *)NULL, lse_g, (const float *)NULL, T,
                a.ldT, n, 0.0f);
            CUDA_CHECK_LAUNCH();
            att_apply_(&a, dv, 3 * C, a.P, 1, dO, C, 1.0f, stream);
            att_scores_(&a, a.dP, dO, C, a.v, 3 * C, 1.0f, stream);
            attn_probs_kernel<<<nb, 256, 0, stream>>>(a.P, a.S, a.dP, lse_g,
                                                      D_g, T, a.ldT, n, scale);
            CUDA_CHECK_LAUNCH();
            att_apply_(&a, dq, 3 * C, a.P, 0, a.k, 3 * C, 1.0f, stream);
            att_apply_(&a, dk, 3 * C, a.P, 1, a.q, 3 * C, 1.0f, stream);
        }
}

/* ------------------------------------------------------------- launchers */

static void bad_head_size_(int C, int NH)
{
    fprintf(stderr, "attention: head size C/NH = %d/%d not supported "
                    "(need 16, 32, 64 or 128)\n", C, NH);
    exit(1);
}

template <int HS>
static void forward_(bf16 *out, float *lse, const bf16 *qkv, int B, int T,
                     int C, int NH, cudaStream_t stream)
{
    constexpr int BQ = attn_tiles<HS>::FWD_Q;
    dim3 grid(ceil_div(T, BQ), NH, B);
    attn_forward_kernel<HS><<<grid, BQ, 0, stream>>>(
        out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)HS));
    CUDA_CHECK_LAUNCH();
}

template <int HS>
static void backward_(bf16 *dqkv, const float *Dd, const bf16 *dout,
                      const bf16 *qkv, const float *lse, int B, int T, int C,
                      int NH, cudaStream_t stream)
{
    constexpr int R = attn_tiles<HS>::BWD_ROWS;
    dim3 grid(ceil_div(T, R), NH, B);
    float scale = 1.0f / sqrtf((float)HS);
    attn_backward_dkv_kernel<HS><<<grid, R, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale);
    CUDA_CHECK_LAUNCH();
    attn_backward_dq_kernel<HS><<<grid, R, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale);
    CUDA_CHECK_LAUNCH();
}

void attention_forward_cuda(bf16 *out, float *lse, const bf16 *qkv, int B,
                            int T, int C, int NH, cudaStream_t stream)
{
    if (C % NH)
        bad_head_size_(C, NH);
    switch (C / NH) {
    case 16: forward_<16>(out, lse, qkv, B, T, C, NH, stream); break;
    case 32: forward_<32>(out, lse, qkv, B, T, C, NH, stream); break;
    case 64: forward_<64>(out, lse, qkv, B, T, C, NH, stream); break;
    case 128: forward_<128>(out, lse, qkv, B, T, C, NH, stream); break;
    default: bad_head_size_(C, NH);
    }
}

size_t attention_backward_scratch_floats(int B, int T, int NH)
{
    return (size_t)B * NH * T;
}

void attention_backward_cuda(bf16 *dqkv, float *scratch, const bf16 *dout,
                             const bf16 *qkv, const bf16 *out,
                             const float *lse, int B, int T, int C, int NH,
                             cudaStream_t stream)
{
    if (C % NH)
        bad_head_size_(C, NH);
    size_t warps = (size_t)B * T * NH;
    attn_backward_d_kernel<<<ceil_div(warps * 32, 256), 256, 0, stream>>>(
        scratch, dout, out, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
    switch (C / NH) {
    case 16: backward_<16>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 32: backward_<32>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 64: backward_<64>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 128: backward_<128>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    default: bad_head_size_(C, NH);
    }
}
