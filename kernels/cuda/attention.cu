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
