/*
 * attention.cu — causal multi-head self-attention. Math as
 * kernels/cpu/attention.c, with scale = 1/sqrt(hs):
 *   forward   o_t = sum_{s<=t} p_ts v_s,  p_ts = exp(scale q_t.k_s - lse_t)
 *   backward  D_t = dout_t . o_t
 *             dp_ts = dout_t . v_s,  ds_ts = p_ts (dp_ts - D_t)
 *             dv_s += sum_t p_ts dout_t
 *             dk_s += scale sum_t ds_ts q_t,  dq_t += scale sum_s ds_ts k_s
 *
 * Two implementations of the same math. The flash kernels (flash-attention
 * style, Dao et al. 2022: the (T,T) score matrix never reaches global
 * memory): a tiled version on the fp32 CUDA cores, no workspace (long
 * sequences, and the baseline).
 * The tensor-core path (attention_gemm_*, below the kernels): cuBLASLt
 * batched GEMMs through a (T,T) workspace; gpt_cuda uses it where it fits
 * and cuBLASLt has an algorithm for each of its GEMMs (asked ahead by
 * attention_gemm_supported), the flash kernels elsewhere.
 *
 * The flash kernels: one thread owns one row (a query in forward and
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

/* D (B,NH,T) = rowwise dout . out, for both backward paths */
static void attn_backward_d_(float *Dd, const bf16 *dout, const bf16 *out,
                             int B, int T, int C, int NH, cudaStream_t stream)
{
    size_t warps = (size_t)B * T * NH;
    attn_backward_d_kernel<<<ceil_div(warps * 32, 256), 256, 0, stream>>>(
        Dd, dout, out, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
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

/* The same attention with its four products on cuBLASLt (tensor cores) as
 * strided batches, the (T,T) scores in a workspace (ldT = T rounded up to
 * 8, so that every row and every matrix stays 16-byte aligned):
 *   forward   S = scale Q K^T (fp32);  P = causal softmax of S (bf16), lse;
 *             O = P V
 *   backward  S again;  P = exp(S - lse) (bf16);  dV += P^T dO;
 *             dP = dO V^T (fp32);  dS = scale P (dP - D) (bf16, over P);
 *             dQ += dS K;  dK += dS^T Q
 * A batch runs over the heads of one sequence (stride hs) or, when there
 * are more sequences than heads, over the sequences of one head (stride
 * T x 3C): the larger of B and NH, so that a step makes as few cuBLASLt
 * calls as it can; as many batch items per pass as the workspace holds.
 * The masked upper triangle is computed and zeroed (2x the causal FLOPs):
 * still far faster than the fp32 cores for T >= a few hundred. The row
 * kernels read and write the workspace once per pass (memory bound). */

#define ATT_WS_CAP ((size_t)512 << 20) /* workspace bytes, at most */

static int att_ldT_(int T) { return (int)ceil_div((size_t)T, 8) * 8; }

/* workspace bytes of one batch item (one head of one sequence) */
static size_t att_item_bytes_(int T)
{
    return (size_t)T * att_ldT_(T) * (4 + 4 + 2);
}

/* P (rows, ldT) bf16 = the causal softmax of row r of S (rows, ldT) fp32
 * (scaled scores), query t = r % T: 0 past column t; lse of the row =
 * max + log(sum), at lse[(r / T) * lse_bs + t]. One warp per row. */
__global__ void attn_softmax_rows_kernel(bf16 *P, float *lse, const float *S,
                                         int T, int ldT, int rows,
                                         size_t lse_bs)
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
        lse[(size_t)(r / T) * lse_bs + t] = m + logf(l);
}

/* Backward, element (r, j) of rows x T, query t = r % T, 0 past column t,
 * with the row's lse and D at [(r / T) * lse_bs + t]:
 *   dP == NULL:  P = exp(S - lse)                        (bf16, into out)
 *   else:        dS = scale exp(S - lse) (dP - D)        (bf16, into out)
 * The probabilities are recomputed in fp32 from S for dS (not read back
 * from the bf16 P). */
__global__ void attn_probs_kernel(bf16 *out, const float *S, const float *dP,
                                  const float *lse, const float *Dd, int T,
                                  int ldT, size_t n, size_t lse_bs,
                                  float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    size_t r = i / T;
    int j = (int)(i % T), t = (int)(r % T);
    size_t at = r * ldT + j, row = (r / T) * lse_bs + t;
    float v = 0.0f;
    if (j <= t) {
        float p = expf(S[at] - lse[row]);
        v = dP ? scale * p * (dP[at] - Dd[row]) : p;
    }
    out[at] = st(v);
}

/* batch items per pass: as many as fit `bytes`, at least one */
static int att_items_(int T, int items, size_t bytes)
{
    size_t n = bytes / att_item_bytes_(T);
    return n < 1 ? 1 : n > (size_t)items ? items : (int)n;
}

/* The passes of a call: the batch runs over heads (by_head: `items` = NH,
 * `outers` = B sequences) or over sequences (items B, outers NH heads), in
 * groups of at most `group` items. */
typedef struct {
    int by_head, items, outers, group;
} att_sched_;

static att_sched_ att_sched_of_(int B, int NH, int T, size_t ws_bytes)
{
    if (ws_bytes < att_item_bytes_(T)) { /* a caller's bug */
        fprintf(stderr, "attention_gemm: workspace of %zu bytes, below one "
                        "head's %zu (T=%d)\n", ws_bytes, att_item_bytes_(T),
                T);
        exit(1);
    }
    att_sched_ sc;
    sc.by_head = NH >= B;
    sc.items = sc.by_head ? NH : B;
    sc.outers = sc.by_head ? B : NH;
    sc.group = att_items_(T, sc.items, ws_bytes);
    return sc;
}

/* One pass: items [i0, i0 + n) at outer index o; item i is head i of
 * sequence o (by_head) or head o of sequence i. Offsets in elements. */
typedef struct {
    size_t off3, offc;        /* item 0 in (B,T,3C) and (B,T,C) tensors */
    long long s3, sc;         /* item stride in those */
    size_t lse_off, lse_bs;   /* item 0's row 0 in (B,NH,T); item stride */
    float *S, *dP;            /* workspace (n, T, ldT) fp32 */
    bf16 *P;                  /* workspace (n, T, ldT) bf16 */
    int T, ldT, n, hs;
} att_pass_;

static att_pass_ att_pass_of_(void *ws, const att_sched_ *sc, int o, int i0,
                              int T, int C, int NH)
{
    att_pass_ a;
    int hs = C / NH, b = sc->by_head ? o : i0, h = sc->by_head ? i0 : o;
    a.off3 = (size_t)b * T * 3 * C + (size_t)h * hs;
    a.offc = (size_t)b * T * C + (size_t)h * hs;
    a.s3 = sc->by_head ? hs : (long long)T * 3 * C;
    a.sc = sc->by_head ? hs : (long long)T * C;
    a.lse_off = ((size_t)b * NH + h) * T;
    a.lse_bs = sc->by_head ? (size_t)T : (size_t)NH * T;
    a.T = T;
    a.ldT = att_ldT_(T);
    a.n = min(sc->group, sc->items - i0);
    a.hs = hs;
    size_t tt = (size_t)a.n * T * a.ldT;
    a.S = (float *)ws;
    a.dP = a.S + tt;
    a.P = (bf16 *)(a.dP + tt);
    return a;
}

/* How a call's GEMMs go: run on the stream, or (probe) only asked of
 * cuBLASLt, with no kernel launched; ok drops to 0 at the first GEMM that
 * has no algorithm, named in why. */
typedef struct {
    cudaStream_t stream;
    int probe, ok;
    char *why;
    size_t whylen;
} att_run_;

static void att_gemm_(att_run_ *r, const gemm_batched_args *g)
{
    if (!r->probe) {
        gemm_batched_cuda(g, r->stream);
        return;
    }
    if (!r->ok || gemm_batched_supported(g))
        return;
    r->ok = 0;
    snprintf(r->why, r->whylen, "cuBLASLt has no algorithm for the batched "
             "attention GEMM m=%d n=%d k=%d (ta=%d tb=%d, batch %d, D %s)",
             g->m, g->n, g->k, g->ta, g->tb, g->batch,
             g->d_f32 ? "fp32" : "bf16");
}

/* S (n; T queries x T keys, row-major, ld ldT) = alpha X Y^T, X and Y
 * (T, hs) slices of ld ldx, ldy, item strides sx, sy: column-major
 * S^T = op_T(Y) X. */
static void att_scores_(const att_pass_ *a, float *S, const bf16 *X, int ldx,
                        long long sx, const bf16 *Y, int ldy, long long sy,
                        float alpha, att_run_ *r)
{
    gemm_batched_args g = {1, 0, a->T, a->T, a->hs, Y, ldy, sy, X, ldx, sx,
                           S, a->ldT, (long long)a->T * a->ldT, 1, alpha,
                           0.0f, a->n};
    att_gemm_(r, &g);
}

/* Out (n; T x hs, ld ldo, stride so) = beta Out + W Y, W (T x T, ld ldT)
 * bf16 from the workspace, transposed when tw; Y (T, hs) of ld ldy,
 * stride sy: column-major Out^T = Y^T op(W)^T. */
static void att_apply_(const att_pass_ *a, bf16 *Out, int ldo, long long so,
                       const bf16 *W, int tw, const bf16 *Y, int ldy,
                       long long sy, float beta, att_run_ *r)
{
    gemm_batched_args g = {0, tw, a->hs, a->T, a->T, Y, ldy, sy, W, a->ldT,
                           (long long)a->T * a->ldT, Out, ldo, so, 0, 1.0f,
                           beta, a->n};
    att_gemm_(r, &g);
}

size_t attention_gemm_workspace_bytes(int B, int T, int C, int NH)
{
    if (C % NH || (C / NH) % 8)
        return 0; /* head slices must be 16-byte aligned */
    if (att_item_bytes_(T) > ATT_WS_CAP)
        return 0; /* long sequences (T > 7,326): the flash kernels */
    int items = B > NH ? B : NH;
    return (size_t)att_items_(T, items, ATT_WS_CAP) * att_item_bytes_(T);
}

static void att_forward_(bf16 *out, float *lse, void *ws, size_t ws_bytes,
                         const bf16 *qkv, int B, int T, int C, int NH,
                         att_run_ *r)
{
    cudaStream_t stream = r->stream;
    float scale = 1.0f / sqrtf((float)(C / NH));
    att_sched_ sc = att_sched_of_(B, NH, T, ws_bytes);
    for (int o = 0; o < sc.outers; o++)
    for (int i0 = 0; i0 < sc.items; i0 += sc.group) {
        att_pass_ a = att_pass_of_(ws, &sc, o, i0, T, C, NH);
        const bf16 *q = qkv + a.off3;
        att_scores_(&a, a.S, q, 3 * C, a.s3, q + C, 3 * C, a.s3, scale, r);
        int rows = a.n * T;
        if (!r->probe) {
            attn_softmax_rows_kernel<<<ceil_div((size_t)rows * 32, 256), 256,
                                       0, stream>>>(a.P, lse + a.lse_off, a.S,
                                                    T, a.ldT, rows, a.lse_bs);
            CUDA_CHECK_LAUNCH();
        }
        att_apply_(&a, out + a.offc, C, a.sc, a.P, 0, q + 2 * (size_t)C,
                   3 * C, a.s3, 0.0f, r);
    }
}

void attention_gemm_forward_cuda(bf16 *out, float *lse, void *ws,
                                 size_t ws_bytes, const bf16 *qkv, int B,
                                 int T, int C, int NH, cudaStream_t stream)
{
    att_run_ r = {stream, 0, 1, NULL, 0};
    att_forward_(out, lse, ws, ws_bytes, qkv, B, T, C, NH, &r);
}

static void att_backward_(bf16 *dqkv, float *scratch, void *ws,
                          size_t ws_bytes, const bf16 *dout, const bf16 *qkv,
                          const bf16 *out, const float *lse, int B, int T,
                          int C, int NH, att_run_ *r)
{
    cudaStream_t stream = r->stream;
    float scale = 1.0f / sqrtf((float)(C / NH));
    if (!r->probe)
        attn_backward_d_(scratch, dout, out, B, T, C, NH, stream);
    att_sched_ sc = att_sched_of_(B, NH, T, ws_bytes);
    for (int o = 0; o < sc.outers; o++)
    for (int i0 = 0; i0 < sc.items; i0 += sc.group) {
        att_pass_ a = att_pass_of_(ws, &sc, o, i0, T, C, NH);
        const bf16 *q = qkv + a.off3, *k = q + C, *v = q + 2 * (size_t)C;
        bf16 *dq = dqkv + a.off3, *dk = dq + C, *dv = dq + 2 * (size_t)C;
        const bf16 *dO = dout + a.offc;
        size_t n = (size_t)a.n * T * T;
        unsigned nb = (unsigned)ceil_div(n, 256);
        att_scores_(&a, a.S, q, 3 * C, a.s3, k, 3 * C, a.s3, scale, r);
        if (!r->probe) {
            attn_probs_kernel<<<nb, 256, 0, stream>>>(
                a.P, a.S, (const float *)NULL, lse + a.lse_off,
                (const float *)NULL, T, a.ldT, n, a.lse_bs, 0.0f);
            CUDA_CHECK_LAUNCH();
        }
        att_apply_(&a, dv, 3 * C, a.s3, a.P, 1, dO, C, a.sc, 1.0f, r);
        att_scores_(&a, a.dP, dO, C, a.sc, v, 3 * C, a.s3, 1.0f, r);
        if (!r->probe) {
            attn_probs_kernel<<<nb, 256, 0, stream>>>(
                a.P, a.S, a.dP, lse + a.lse_off, scratch + a.lse_off, T,
                a.ldT, n, a.lse_bs, scale);
            CUDA_CHECK_LAUNCH();
        }
        att_apply_(&a, dq, 3 * C, a.s3, a.P, 0, k, 3 * C, a.s3, 1.0f, r);
        att_apply_(&a, dk, 3 * C, a.s3, a.P, 1, q, 3 * C, a.s3, 1.0f, r);
    }
}

void attention_gemm_backward_cuda(bf16 *dqkv, float *scratch, void *ws,
                                  size_t ws_bytes, const bf16 *dout,
                                  const bf16 *qkv, const bf16 *out,
                                  const float *lse, int B, int T, int C,
                                  int NH, cudaStream_t stream)
{
    att_run_ r = {stream, 0, 1, NULL, 0};
    att_backward_(dqkv, scratch, ws, ws_bytes, dout, qkv, out, lse, B, T, C,
                  NH, &r);
}

int attention_gemm_supported(void *ws, size_t ws_bytes, const bf16 *qkv,
                             const bf16 *out, bf16 *dqkv, const bf16 *dout,
                             int B, int T, int C, int NH, char *why,
                             size_t whylen)
{
    att_run_ r = {0, 1, 1, why, whylen};
    for (int b = 1; b <= B && r.ok; b++) {
        att_forward_((bf16 *)out, NULL, ws, ws_bytes, qkv, b, T, C, NH, &r);
        att_backward_(dqkv, NULL, ws, ws_bytes, dout, qkv, out, NULL, b, T,
                      C, NH, &r);
    }
    return r.ok;
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
    attn_backward_d_(scratch, dout, out, B, T, C, NH, stream);
    switch (C / NH) {
    case 16: backward_<16>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 32: backward_<32>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 64: backward_<64>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    case 128: backward_<128>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, stream); break;
    default: bad_head_size_(C, NH);
    }
}
