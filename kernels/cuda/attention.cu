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
#include "attention_mma.cuh"

#include <stdlib.h>
#include <string.h>

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
                                         int NH, float scale, int acc)
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
            float sc = 0.0f, dP = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                sc += Qs[j][i] * Ko[tid][i];
                dP += dOs[j][i] * Vo[tid][i];
            }
            float p = expf(sc * scale - Ls[j]);
            float ds = p * (dP - Ds[j]);
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
            put_bf16(&dst[C + i], dk[i] * scale, acc);
            put_bf16(&dst[2 * C + i], dv[i], acc);
        }
    }
}

/* grid (ceil(T/ROWS), NH, B), block ROWS threads: one query t each; streams
 * the keys s <= t through shared memory. */
template <int HS>
__global__ void attn_backward_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                        const bf16 *qkv, const float *lse,
                                        const float *Dd, int T, int C, int NH,
                                        float scale, int acc)
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
            float sc = 0.0f, dP = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                sc += Qo[tid][i] * Ks[j][i];
                dP += dOo[tid][i] * Vs[j][i];
            }
            float p = expf(sc * scale - lse_t);
            float ds = p * (dP - D_t);
#pragma unroll
            for (int i = 0; i < HS; i++)
                dq[i] += ds * Ks[j][i];
        }
    }
    if (valid) {
        bf16 *dst = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++)
            put_bf16(&dst[i], dq[i] * scale, acc);
    }
}

/* ------------------------------------- the flash kernels on tensor cores */

/* FlashAttention-2 (Dao 2023) on mma.sync m16n8k16 (attention_mma.cuh):
 * bf16 Q, K, V, dO; fp32 accumulators; a block of 4 warps owns 64 rows
 * (queries in forward and dq, keys in dk/dv), 16 per warp, whose operand
 * fragments stay in registers; the other side's rows stream through
 * shared memory in tiles that all 4 warps read. Shared tiles hold bf16
 * pairs as 32-bit words (rows padded by 8 bf16: the 8 row groups of a
 * fragment load fall in distinct banks).
 *  - forward: per key tile S = scale Q K^T, masked, online softmax on the
 *    accumulators (each thread owns 2 rows, 2 of 8 columns per tile; the
 *    row max and sum over the 4 lanes of a quad by shuffles), O rescaled,
 *    P packed to bf16 in registers as the A operand of O += P V; at the
 *    end O / l and lse = m + log l.
 *  - backward: D = rowsum(dO o O) (attn_backward_d_kernel); one kernel
 *    per key block (dK, dV: S^T = K Q^T and dP^T = V dO^T, P^T from the
 *    saved lse, dS^T = P^T (dP^T - D); dV += P^T dO, dK += dS^T Q) and
 *    one per query block (dQ += dS K, S and dP recomputed): each output
 *    element written by one thread, no atomics, deterministic.
 * Causal: tiles wholly above the diagonal are skipped (not loaded in
 * forward and dq, not computed by a warp whose rows they do not reach);
 * only tiles that straddle the diagonal or pass T are masked. */

template <int HS> struct tc_tiles {
    static_assert(HS % 16 == 0, "tensor-core attention: HS % 16 == 0");
    static constexpr int ROWS = 64;                 /* own rows per block */
    static constexpr int TILE = HS <= 64 ? 64 : 32; /* streamed rows, bwd */
    static constexpr int LDW = (HS + 8) / 2;        /* shared row, words */
};
#define TC_THREADS 128 /* 4 warps */

/* bf16 element (row, col) of a shared tile of bf16 pairs */
template <int LDW>
static __device__ __forceinline__ uint32_t tile_h_(const uint32_t (*s)[LDW],
                                                   int row, int col)
{
    return (s[row][col >> 1] >> ((col & 1) * 16)) & 0xffffu;
}

/* rows r0.. of a (T, *) bf16 matrix (row stride ld elements, HS columns
 * from p) into a shared tile of n rows; rows at or past T are zero */
template <int HS, int LDW>
static __device__ __forceinline__ void tile_load_(uint32_t (*s)[LDW],
                                                  const bf16 *p, size_t ld,
                                                  int r0, int n, int T)
{
    for (int i = threadIdx.x; i < n * (HS / 2); i += TC_THREADS) {
        int r = i / (HS / 2), w = i % (HS / 2), row = r0 + r;
        s[r][w] = row < T ? ld_bf16x2_(p + (size_t)row * ld + 2 * w) : 0u;
    }
}

/* A fragments (16 rows x HS) of rows r0 + g, r0 + g + 8 of a global
 * (T, *) bf16 matrix, zero past T */
template <int HS>
static __device__ __forceinline__ void frag_rows_(uint32_t a[][4],
                                                  const bf16 *p, size_t ld,
                                                  int r0, int T)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        int col = kk * 16 + 2 * c;
        a[kk][0] = ra < T ? ld_bf16x2_(p + (size_t)ra * ld + col) : 0u;
        a[kk][1] = rb < T ? ld_bf16x2_(p + (size_t)rb * ld + col) : 0u;
        a[kk][2] = ra < T ? ld_bf16x2_(p + (size_t)ra * ld + col + 8) : 0u;
        a[kk][3] = rb < T ? ld_bf16x2_(p + (size_t)rb * ld + col + 8) : 0u;
    }
}

/* acc[j] (16 x 8, columns j*8..) = A (registers, 16 x HS) times the
 * transpose of NT*8 rows of a shared tile (its rows are B's columns) */
template <int HS, int NT, int LDW>
static __device__ __forceinline__ void mma_abt_(float acc[][4],
                                                const uint32_t a[][4],
                                                const uint32_t (*s)[LDW])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t b[2] = {s[j * 8 + g][kk * 8 + c],
                             s[j * 8 + g][kk * 8 + c + 4]};
            mma_16816_(acc[j], a[kk], b);
        }
    }
}

/* acc (16 x HS) += P (accumulator tiles p[0..NT), 16 x NT*8, packed to
 * bf16 as A operands) times NT*8 rows of a shared tile (16 x HS each) */
template <int HS, int NT, int LDW>
static __device__ __forceinline__ void mma_pb_(float acc[][4],
                                               const float p[][4],
                                               const uint32_t (*s)[LDW])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[4] = {pack_bf16x2_(p[2 * kk][0], p[2 * kk][1]),
                         pack_bf16x2_(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16x2_(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         pack_bf16x2_(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        const int k = kk * 16 + 2 * c;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) {
            const int n = d * 8 + g;
            uint32_t b[2] = {tile_h_<LDW>(s, k, n) |
                                 tile_h_<LDW>(s, k + 1, n) << 16,
                             tile_h_<LDW>(s, k + 8, n) |
                                 tile_h_<LDW>(s, k + 9, n) << 16};
            mma_16816_(acc[d], a, b);
        }
    }
}

/* grid (ceil(T/64), NH, B), 128 threads: 16 queries per warp */
template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attn_tc_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int C,
                       int NH, float scale)
{
    constexpr int BQ = tc_tiles<HS>::ROWS, BK = 64, LDW = tc_tiles<HS>::LDW;
    constexpr int NT = BK / 8, ND = HS / 8;
    __shared__ uint32_t Ks[BK][LDW], Vs[BK][LDW];
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int q0 = blockIdx.x * BQ, qw = q0 + warp * 16;
    const int row[2] = {qw + g, qw + g + 8};
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;

    uint32_t qa[HS / 16][4];
    frag_rows_<HS>(qa, base, C3, qw, T);
    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    const int klast = min(T - 1, q0 + BQ - 1); /* no later key is seen */
    for (int k0 = 0; k0 <= klast; k0 += BK) {
        __syncthreads(); /* the previous tile fully used */
        tile_load_<HS, LDW>(Ks, base + C, C3, k0, BK, T);
        tile_load_<HS, LDW>(Vs, base + 2 * (size_t)C, C3, k0, BK, T);
        __syncthreads();
        if (k0 > qw + 15)
            continue; /* above the diagonal for all of this warp's rows */
        float s[NT][4];
        mma_abt_<HS, NT, LDW>(s, qa, Ks);
        const bool edge = k0 + BK - 1 > qw || k0 + BK > T;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * c + (e & 1);
                float v = s[j][e] * scale;
                if (edge && (key > row[e >> 1] || key >= T))
                    v = -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            /* finite: the first tile holds key 0, seen by every row */
            float mnew = fmaxf(m[i], mx[i]);
            corr[i] = expf(m[i] - mnew); /* 0 on the first tile */
            m[i] = mnew;
            l[i] *= corr[i];
        }
#pragma unroll
        for (int d = 0; d < ND; d++) {
            o[d][0] *= corr[0]; o[d][1] *= corr[0];
            o[d][2] *= corr[1]; o[d][3] *= corr[1];
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = expf(s[j][e] - m[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
        mma_pb_<HS, NT, LDW>(o, s, Vs);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        /* each lane summed its own columns: the row's sum over the quad */
        float li = l[i] + __shfl_xor_sync(0xffffffffu, l[i], 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        if (row[i] >= T)
            continue;
        float inv = 1.0f / li;
        bf16 *dst = out + ((size_t)b * T + row[i]) * C + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            dst[d * 8 + 2 * c] = st(o[d][2 * i] * inv);
            dst[d * 8 + 2 * c + 1] = st(o[d][2 * i + 1] * inv);
        }
        if (c == 0)
            lse[((size_t)b * NH + h) * T + row[i]] = m[i] + logf(li);
    }
}

/* grid (ceil(T/64), NH, B), 128 threads: 16 keys per warp; streams the
 * queries t >= the block's first key */
template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attn_tc_backward_dkv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                            const float *lse, const float *Dd, int T, int C,
                            int NH, float scale, int acc)
{
    constexpr int BQ = tc_tiles<HS>::TILE, LDW = tc_tiles<HS>::LDW;
    constexpr int NT = BQ / 8, ND = HS / 8;
    __shared__ uint32_t Qs[BQ][LDW], dOs[BQ][LDW];
    __shared__ float Ls[BQ], Ds[BQ];
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int s0 = blockIdx.x * tc_tiles<HS>::ROWS, sw = s0 + warp * 16;
    const int key[2] = {sw + g, sw + g + 8};
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bf16 *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T;
    const float *D_bh = Dd + ((size_t)b * NH + h) * T;

    uint32_t ka[HS / 16][4], va[HS / 16][4];
    frag_rows_<HS>(ka, base + C, C3, sw, T);
    frag_rows_<HS>(va, base + 2 * (size_t)C, C3, sw, T);
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[d][e] = dv[d][e] = 0.0f;

    for (int t0 = s0; t0 < T; t0 += BQ) {
        __syncthreads();
        tile_load_<HS, LDW>(Qs, base, C3, t0, BQ, T);
        tile_load_<HS, LDW>(dOs, dbase, C, t0, BQ, T);
        for (int i = threadIdx.x; i < BQ; i += TC_THREADS) {
            Ls[i] = t0 + i < T ? lse_bh[t0 + i] : 0.0f;
            Ds[i] = t0 + i < T ? D_bh[t0 + i] : 0.0f;
        }
        __syncthreads();
        if (t0 + BQ - 1 < sw)
            continue; /* every query of the tile precedes these keys */
        float p[NT][4], ds[NT][4];
        mma_abt_<HS, NT, LDW>(p, ka, Qs);  /* S^T */
        mma_abt_<HS, NT, LDW>(ds, va, dOs); /* dP^T */
        const bool edge = t0 < sw + 15 || t0 + BQ > T;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = j * 8 + 2 * c + (e & 1), tq = t0 + col;
                float pr = expf(p[j][e] * scale - Ls[col]);
                if (edge && (tq < key[e >> 1] || tq >= T))
                    pr = 0.0f;
                p[j][e] = pr;
                ds[j][e] = pr * (ds[j][e] - Ds[col]);
            }
        mma_pb_<HS, NT, LDW>(dv, p, dOs);
        mma_pb_<HS, NT, LDW>(dk, ds, Qs);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (key[i] >= T)
            continue;
        bf16 *dst = dqkv + ((size_t)b * T + key[i]) * C3 + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int col = d * 8 + 2 * c + e;
                put_bf16(&dst[C + col], dk[d][2 * i + e] * scale, acc);
                put_bf16(&dst[2 * C + col], dv[d][2 * i + e], acc);
            }
    }
}

/* grid (ceil(T/64), NH, B), 128 threads: 16 queries per warp; streams the
 * keys s <= the block's last query */
template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attn_tc_backward_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                           const float *lse, const float *Dd, int T, int C,
                           int NH, float scale, int acc)
{
    constexpr int BK = tc_tiles<HS>::TILE, LDW = tc_tiles<HS>::LDW;
    constexpr int NT = BK / 8, ND = HS / 8;
    __shared__ uint32_t Ks[BK][LDW], Vs[BK][LDW];
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int q0 = blockIdx.x * tc_tiles<HS>::ROWS, qw = q0 + warp * 16;
    const int row[2] = {qw + g, qw + g + 8};
    const size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bf16 *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    float lr[2], Dr[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        size_t at = ((size_t)b * NH + h) * T + row[i];
        lr[i] = row[i] < T ? lse[at] : 0.0f;
        Dr[i] = row[i] < T ? Dd[at] : 0.0f;
    }
    uint32_t qa[HS / 16][4], da[HS / 16][4];
    frag_rows_<HS>(qa, base, C3, qw, T);
    frag_rows_<HS>(da, dbase, C, qw, T);
    float dq[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

    const int klast = min(T - 1, q0 + tc_tiles<HS>::ROWS - 1);
    for (int k0 = 0; k0 <= klast; k0 += BK) {
        __syncthreads();
        tile_load_<HS, LDW>(Ks, base + C, C3, k0, BK, T);
        tile_load_<HS, LDW>(Vs, base + 2 * (size_t)C, C3, k0, BK, T);
        __syncthreads();
        if (k0 > qw + 15)
            continue;
        float p[NT][4], ds[NT][4];
        mma_abt_<HS, NT, LDW>(p, qa, Ks);  /* S */
        mma_abt_<HS, NT, LDW>(ds, da, Vs); /* dP */
        const bool edge = k0 + BK - 1 > qw || k0 + BK > T;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int s = k0 + j * 8 + 2 * c + (e & 1), i = e >> 1;
                float pr = expf(p[j][e] * scale - lr[i]);
                if (edge && (s > row[i] || s >= T))
                    pr = 0.0f;
                ds[j][e] = pr * (ds[j][e] - Dr[i]);
            }
        mma_pb_<HS, NT, LDW>(dq, ds, Ks);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (row[i] >= T)
            continue;
        bf16 *dst = dqkv + ((size_t)b * T + row[i]) * C3 + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            put_bf16(&dst[d * 8 + 2 * c], dq[d][2 * i] * scale, acc);
            put_bf16(&dst[d * 8 + 2 * c + 1], dq[d][2 * i + 1] * scale, acc);
        }
    }
}

/* ------------------------------------------------- the cuBLASLt path   */

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

/* ATT_WS_CAP, att_ldT_, att_item_bytes_, att_items_: scratch.h */

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

/* acc 1: dqkv +=; 0: dqkv = (each element is one GEMM's: beta 0) */
static void att_backward_(bf16 *dqkv, float *scratch, void *ws,
                          size_t ws_bytes, const bf16 *dout, const bf16 *qkv,
                          const bf16 *out, const float *lse, int B, int T,
                          int C, int NH, int acc, att_run_ *r)
{
    const float beta = acc ? 1.0f : 0.0f;
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
        att_apply_(&a, dv, 3 * C, a.s3, a.P, 1, dO, C, a.sc, beta, r);
        att_scores_(&a, a.dP, dO, C, a.sc, v, 3 * C, a.s3, 1.0f, r);
        if (!r->probe) {
            attn_probs_kernel<<<nb, 256, 0, stream>>>(
                a.P, a.S, a.dP, lse + a.lse_off, scratch + a.lse_off, T,
                a.ldT, n, a.lse_bs, scale);
            CUDA_CHECK_LAUNCH();
        }
        att_apply_(&a, dq, 3 * C, a.s3, a.P, 0, k, 3 * C, a.s3, beta, r);
        att_apply_(&a, dk, 3 * C, a.s3, a.P, 1, q, 3 * C, a.s3, beta, r);
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
                  NH, 1, &r);
}

void attention_gemm_backward_first_cuda(bf16 *dqkv, float *scratch, void *ws,
                                        size_t ws_bytes, const bf16 *dout,
                                        const bf16 *qkv, const bf16 *out,
                                        const float *lse, int B, int T, int C,
                                        int NH, cudaStream_t stream)
{
    att_run_ r = {stream, 0, 1, NULL, 0};
    att_backward_(dqkv, scratch, ws, ws_bytes, dout, qkv, out, lse, B, T, C,
                  NH, 0, &r);
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
                      C, NH, 1, &r);
    }
    return r.ok;
}

/* ------------------------------------------------------------- launchers */

static void bad_head_size_(int C, int NH)
{
    fprintf(stderr, "attention: head size C/NH = %d/%d not supported "
                    "(need 16, 32, 64, 80 or 128)\n", C, NH);
    exit(1);
}

static int tc_head_size_(int hs)
{
    return attention_tc_head_size(hs);
}

/* $M6_ATTENTION, read once (attention_impl_parse, scratch.h) */
static int impl_env_(void)
{
    static int impl = -1;
    if (impl < 0) {
        const char *e = getenv("M6_ATTENTION");
        int unknown;
        impl = attention_impl_parse(e, &unknown);
        if (unknown)
            fprintf(stderr, "attention: M6_ATTENTION=%s unknown (tc, core "
                            "or gemm): tc\n", e);
    }
    return impl;
}

int attention_impl_cuda(int C, int NH)
{
    return attention_impl_of(impl_env_(), C, NH);
}

template <int HS>
static void core_forward_(bf16 *out, float *lse, const bf16 *qkv, int B,
                          int T, int C, int NH, cudaStream_t stream)
{
    constexpr int BQ = attn_tiles<HS>::FWD_Q;
    dim3 grid(ceil_div(T, BQ), NH, B);
    attn_forward_kernel<HS><<<grid, BQ, 0, stream>>>(
        out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)HS));
    CUDA_CHECK_LAUNCH();
}

template <int HS>
static void core_backward_(bf16 *dqkv, const float *Dd, const bf16 *dout,
                           const bf16 *qkv, const float *lse, int B, int T,
                           int C, int NH, int acc, cudaStream_t stream)
{
    constexpr int R = attn_tiles<HS>::BWD_ROWS;
    dim3 grid(ceil_div(T, R), NH, B);
    float scale = 1.0f / sqrtf((float)HS);
    attn_backward_dkv_kernel<HS><<<grid, R, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale, acc);
    CUDA_CHECK_LAUNCH();
    attn_backward_dq_kernel<HS><<<grid, R, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale, acc);
    CUDA_CHECK_LAUNCH();
}

template <int HS>
static void tc_forward_(bf16 *out, float *lse, const bf16 *qkv, int B, int T,
                        int C, int NH, cudaStream_t stream)
{
    dim3 grid(ceil_div(T, tc_tiles<HS>::ROWS), NH, B);
    attn_tc_forward_kernel<HS><<<grid, TC_THREADS, 0, stream>>>(
        out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)HS));
    CUDA_CHECK_LAUNCH();
}

template <int HS>
static void tc_backward_(bf16 *dqkv, const float *Dd, const bf16 *dout,
                         const bf16 *qkv, const float *lse, int B, int T,
                         int C, int NH, int acc, cudaStream_t stream)
{
    dim3 grid(ceil_div(T, tc_tiles<HS>::ROWS), NH, B);
    float scale = 1.0f / sqrtf((float)HS);
    attn_tc_backward_dkv_kernel<HS><<<grid, TC_THREADS, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale, acc);
    CUDA_CHECK_LAUNCH();
    attn_tc_backward_dq_kernel<HS><<<grid, TC_THREADS, 0, stream>>>(
        dqkv, dout, qkv, lse, Dd, T, C, NH, scale, acc);
    CUDA_CHECK_LAUNCH();
}

void attention_core_forward_cuda(bf16 *out, float *lse, const bf16 *qkv,
                                 int B, int T, int C, int NH,
                                 cudaStream_t stream)
{
    if (NH <= 0 || C % NH)
        bad_head_size_(C, NH);
    switch (C / NH) {
    case 16: core_forward_<16>(out, lse, qkv, B, T, C, NH, stream); break;
    case 32: core_forward_<32>(out, lse, qkv, B, T, C, NH, stream); break;
    case 64: core_forward_<64>(out, lse, qkv, B, T, C, NH, stream); break;
    case 80: core_forward_<80>(out, lse, qkv, B, T, C, NH, stream); break;
    case 128: core_forward_<128>(out, lse, qkv, B, T, C, NH, stream); break;
    default: bad_head_size_(C, NH);
    }
}

void attention_tc_forward_cuda(bf16 *out, float *lse, const bf16 *qkv, int B,
                               int T, int C, int NH, cudaStream_t stream)
{
    if (NH <= 0 || C % NH || !tc_head_size_(C / NH))
        bad_head_size_(C, NH);
    switch (C / NH) {
    case 32: tc_forward_<32>(out, lse, qkv, B, T, C, NH, stream); break;
    case 64: tc_forward_<64>(out, lse, qkv, B, T, C, NH, stream); break;
    case 80: tc_forward_<80>(out, lse, qkv, B, T, C, NH, stream); break;
    case 128: tc_forward_<128>(out, lse, qkv, B, T, C, NH, stream); break;
    }
}

void attention_forward_cuda(bf16 *out, float *lse, const bf16 *qkv, int B,
                            int T, int C, int NH, cudaStream_t stream)
{
    if (attention_impl_cuda(C, NH) == ATT_IMPL_TC)
        attention_tc_forward_cuda(out, lse, qkv, B, T, C, NH, stream);
    else
        attention_core_forward_cuda(out, lse, qkv, B, T, C, NH, stream);
}

/* the CUDA-core backward; acc 1: dqkv +=, 0: dqkv = */
static void core_backward_acc_(bf16 *dqkv, float *scratch, const bf16 *dout,
                               const bf16 *qkv, const bf16 *out,
                               const float *lse, int B, int T, int C, int NH,
                               int acc, cudaStream_t stream)
{
    if (NH <= 0 || C % NH)
        bad_head_size_(C, NH);
    attn_backward_d_(scratch, dout, out, B, T, C, NH, stream);
    switch (C / NH) {
    case 16: core_backward_<16>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 32: core_backward_<32>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 64: core_backward_<64>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 80: core_backward_<80>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 128: core_backward_<128>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    default: bad_head_size_(C, NH);
    }
}

/* the tensor-core backward; acc 1: dqkv +=, 0: dqkv = */
static void tc_backward_acc_(bf16 *dqkv, float *scratch, const bf16 *dout,
                             const bf16 *qkv, const bf16 *out,
                             const float *lse, int B, int T, int C, int NH,
                             int acc, cudaStream_t stream)
{
    if (NH <= 0 || C % NH || !tc_head_size_(C / NH))
        bad_head_size_(C, NH);
    attn_backward_d_(scratch, dout, out, B, T, C, NH, stream);
    switch (C / NH) {
    case 32: tc_backward_<32>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 64: tc_backward_<64>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 80: tc_backward_<80>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    case 128: tc_backward_<128>(dqkv, scratch, dout, qkv, lse, B, T, C, NH, acc, stream); break;
    }
}

void attention_core_backward_cuda(bf16 *dqkv, float *scratch,
                                  const bf16 *dout, const bf16 *qkv,
                                  const bf16 *out, const float *lse, int B,
                                  int T, int C, int NH, cudaStream_t stream)
{
    core_backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 1,
                       stream);
}

void attention_tc_backward_cuda(bf16 *dqkv, float *scratch, const bf16 *dout,
                                const bf16 *qkv, const bf16 *out,
                                const float *lse, int B, int T, int C,
                                int NH, cudaStream_t stream)
{
    tc_backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 1,
                     stream);
}

/* attention_backward_cuda (acc 1) and attention_backward_first_cuda (0) */
static void backward_acc_(bf16 *dqkv, float *scratch, const bf16 *dout,
                          const bf16 *qkv, const bf16 *out, const float *lse,
                          int B, int T, int C, int NH, int acc,
                          cudaStream_t stream)
{
    if (attention_impl_cuda(C, NH) == ATT_IMPL_TC)
        tc_backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, acc,
                         stream);
    else
        core_backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH,
                           acc, stream);
}

void attention_backward_cuda(bf16 *dqkv, float *scratch, const bf16 *dout,
                             const bf16 *qkv, const bf16 *out,
                             const float *lse, int B, int T, int C, int NH,
                             cudaStream_t stream)
{
    backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 1, stream);
}

void attention_backward_first_cuda(bf16 *dqkv, float *scratch,
                                   const bf16 *dout, const bf16 *qkv,
                                   const bf16 *out, const float *lse, int B,
                                   int T, int C, int NH, cudaStream_t stream)
{
    backward_acc_(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 0, stream);
}
