/*
 * test_emu.cu — the CUDA emulation itself (tests/cuda_emu), against
 * hand-computed results: what the GPU tests on it rely on.
 *  - __syncthreads: a block reverses an array through shared memory (each
 *    thread reads what another wrote before the barrier);
 *  - __shfl_xor_sync: a butterfly sum over the warp equals the sum;
 *  - blockIdx, blockDim, gridDim, threadIdx in 3 dimensions: each thread
 *    writes its global linear index;
 *  - launch limits: 1025 threads, an empty grid and grid.y 65536 leave
 *    cudaErrorInvalidConfiguration and run nothing;
 *  - misuse is reported: half a warp at __syncthreads while the other half
 *    shuffles, a full-mask shuffle in a partial warp;
 *  - cuBLASLt: a matrix less aligned than the heuristic was told (default
 *    256 bytes) is refused; told its alignment, the GEMM runs, D by hand;
 *  - cudaMalloc memory is 256-byte aligned and starts as NaN, and so does
 *    __shared__ memory at each block's start; blocks run each once, not
 *    in index order;
 *  - __shfl_xor_sync with width 16 as PTX shfl.bfly;
 *  - stream order: a kernel runs after the copy queued before it;
 *  - stream capture: a copy in, a kernel and a copy out captured run
 *    nothing then; each launch of the graph runs them on the pinned
 *    input as it is at that launch, by hand; a sync of a capturing stream
 *    is a misuse.
 *  - two devices ($M6_EMU_DEVICES, set here): a current device per
 *    thread; an index past the last is refused; memory counted per
 *    device; a kernel launched on another device's stream, and an event
 *    recorded on another device's stream, are misuse and run nothing; a
 *    copy on another device's stream is allowed; while one thread
 *    captures in the thread-local mode, another thread may allocate and
 *    the capturing one may not, and the legacy stream (which would join
 *    the blocking stream's capture) is refused on every thread.
 * Exit 0 passed, 1 failed.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"
#include "cublasLt.h"
#include "cuda_bf16.h"

static int n_failed;

static void check_(int ok, const char *what)
{
    printf("  %-60s %s\n", what, ok ? "ok" : "FAIL");
    n_failed += !ok;
}

__global__ void reverse_kernel(int *out, const int *in, int n)
{
    __shared__ int buf[256];
    int t = threadIdx.x;
    buf[t] = in[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = buf[n - 1 - t];
}

__global__ void warp_sum_kernel(float *out, const float *in)
{
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void index_kernel(int *out)
{
    int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    int nthreads = blockDim.x * blockDim.y * blockDim.z;
    int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    out[block * nthreads + t] = block * nthreads + t;
}

/* half a warp at __syncthreads, the other half in a shuffle: on a GPU a
 * hang or garbage */
__global__ void divergent_barrier_kernel(float *out)
{
    float v = 1.0f;
    if (threadIdx.x < 16)
        __syncthreads();
    else
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

__global__ void partial_warp_shuffle_kernel(float *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

/* shared memory read before any thread wrote it: NaN in every block */
__global__ void shared_unwritten_kernel(float *out)
{
    __shared__ float acc[32];
    if (threadIdx.x == 0)
        out[blockIdx.x] = acc[5];
    __syncthreads();
    acc[threadIdx.x] = 1.0f; /* what a previous block leaves behind */
}

/* mma.sync m16n8k16 (bf16, fp32): one warp loads A (16x16) and B (16x8)
 * from row-major fp32 matrices into its registers by the PTX ISA's layout
 * (lane = 4 g + c: a[0] = A[g][2c..], a[1] = A[g+8][2c..], a[2] =
 * A[g][2c+8..], a[3] = A[g+8][2c+8..]; b[0] = B[2c..2c+1][g], b[1] =
 * B[2c+8..][g]) and writes D = A B + 1 back by the accumulator layout
 * (d[0..1] = D[g][2c..], d[2..3] = D[g+8][2c..]). */
static uint32_t bf_bits_(float f) /* exact for the small integers here */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u >> 16;
}

__global__ void mma_kernel(float *D, const float *A, const float *B)
{
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    uint32_t a[4], b[2];
    for (int r = 0; r < 4; r++) {
        int row = g + 8 * (r & 1), col = 2 * c + 8 * (r >> 1);
        a[r] = bf_bits_(A[row * 16 + col]) |
               bf_bits_(A[row * 16 + col + 1]) << 16;
    }
    for (int r = 0; r < 2; r++) {
        int k = 2 * c + 8 * r;
        b[r] = bf_bits_(B[k * 8 + g]) | bf_bits_(B[(k + 1) * 8 + g]) << 16;
    }
    float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    ::emu::mma_m16n8k16_bf16(d, a, b);
    for (int i = 0; i < 4; i++)
        D[(g + 8 * (i / 2)) * 8 + 2 * c + (i & 1)] = d[i];
}

__global__ void mma_half_warp_kernel(float *D)
{
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    ::emu::mma_m16n8k16_bf16(d, a, b);
    D[threadIdx.x] = d[0];
}

static int run_counter_;

/* the order blocks run in: order[b] = how many blocks ran before b */
__global__ void block_order_kernel(int *order)
{
    if (threadIdx.x == 0)
        order[blockIdx.x] = run_counter_++;
}

/* __shfl_xor_sync with width 16: a lane whose partner lies past the end of
 * its own segment keeps its value; one before it reads the partner */
__global__ void shfl_width_kernel(int *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 16, 16);
}

__global__ void count_kernel(int *out)
{
    out[0]++;
}

__global__ void add_one_kernel(int *out, const int *in, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = in[i] + 1;
}

/* D (2x2) = A B on the emulated cuBLASLt, A placed `offset` bytes into a
 * cudaMalloc block; tell_a: the A alignment stated to the heuristic (0:
 * none, the default 256). 1 when it ran with D right (A = [1 2; 3 4], B =
 * [5 6; 7 8], column-major), 0 when it was refused as a misuse, -1 when
 * it ran wrong. */
static int lt_gemm_2x2_(cudaStream_t s, int offset, uint32_t tell_a)
{
    const float fa[4] = {1, 3, 2, 4}, fb[4] = {5, 7, 6, 8};
    const float want[4] = {19, 43, 22, 50};
    __nv_bfloat16 ha[4], hb[4], hd[4];
    for (int i = 0; i < 4; i++) {
        ha[i] = __float2bfloat16_rn(fa[i]);
        hb[i] = __float2bfloat16_rn(fb[i]);
    }
    char *blk;
    __nv_bfloat16 *b, *d;
    cudaMalloc((void **)&blk, 512);
    cudaMalloc((void **)&b, sizeof hb);
    cudaMalloc((void **)&d, sizeof hd);
    __nv_bfloat16 *a = (__nv_bfloat16 *)(blk + offset);
    cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice);
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 2, 2, 2);
    cublasLtMatmulPreferenceCreate(&pref);
    if (tell_a)
        cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &tell_a,
            sizeof tell_a);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasLtMatmulAlgoGetHeuristic(h, op, l, l, l, l, pref, 1, &res, &nres);
    float alpha = 1.0f, beta = 0.0f;
    long e0 = mock_errors();
    int rc = nres == 1 ? cublasLtMatmul(h, op, &alpha, a, l, b, l, &beta, d,
                                        l, d, l, &res.algo, NULL, 0, s)
                       : -1;
    int out;
    if (rc != CUBLAS_STATUS_SUCCESS) {
        out = mock_errors() > e0 ? 0 : -1;
    } else {
        cudaMemcpyAsync(hd, d, sizeof hd, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        out = 1;
        for (int i = 0; i < 4; i++)
            if (__bfloat162float(hd[i]) != want[i])
                out = -1;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    cudaFree(blk); cudaFree(b); cudaFree(d);
    return out;
}

/* another thread's cudaMemset (the legacy stream) of 4 bytes at *out:
 * whether it was refused (a misuse counted) */
static void *memset_elsewhere_(void *arg)
{
    void **p = (void **)arg;
    long e0 = mock_errors();
    cudaMemset(p[0], 0, 4);
    *(long *)p[1] = mock_errors() - e0;
    return NULL;
}

/* another thread's cudaMalloc: its error (0 success) */
static void *malloc_elsewhere_(void *out)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 256);
    if (e == cudaSuccess)
        cudaFree(p);
    *(cudaError_t *)out = e;
    return NULL;
}

int main(void)
{
    setenv("M6_EMU_DEVICES", "2", 1); /* read at the first device call */
    mock_start(7, 2, 20); /* misuse counted, not fatal; random latencies */
    cudaStream_t s;
    cudaStreamCreate(&s);

    printf("__syncthreads: 3 blocks of 256 reverse their slice\n");
    const int n = 256, nb = 3;
    int h_in[nb * n], h_out[nb * n], *d_in, *d_out;
    for (int i = 0; i < nb * n; i++)
        h_in[i] = i * 7 + 1;
    cudaMalloc(&d_in, sizeof h_in);
    cudaMalloc(&d_out, sizeof h_out);
    cudaMemcpyAsync(d_in, h_in, sizeof h_in, cudaMemcpyHostToDevice, s);
    reverse_kernel<<<nb, n, 0, s>>>(d_out, d_in, n);
    cudaMemcpyAsync(h_out, d_out, sizeof h_out, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    int ok = 1;
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < n; t++)
            ok &= h_out[b * n + t] == h_in[b * n + n - 1 - t];
    check_(ok, "out[b][t] = in[b][n-1-t] (copy, kernel, copy in order)");

    printf("__shfl_xor_sync: butterfly sums of 2 blocks of 64\n");
    float h_f[128], h_g[128], *d_f, *d_g;
    for (int i = 0; i < 128; i++)
        h_f[i] = (float)(i % 37);
    cudaMalloc(&d_f, sizeof h_f);
    cudaMalloc(&d_g, sizeof h_g);
    cudaMemcpy(d_f, h_f, sizeof h_f, cudaMemcpyHostToDevice);
    warp_sum_kernel<<<2, 64>>>(d_g, d_f);
    cudaMemcpy(h_g, d_g, sizeof h_g, cudaMemcpyDeviceToHost);
    ok = 1;
    for (int w = 0; w < 4; w++) {
        float want = 0;
        for (int i = 0; i < 32; i++)
            want += h_f[w * 32 + i];
        for (int i = 0; i < 32; i++)
            ok &= h_g[w * 32 + i] == want;
    }
    check_(ok, "every lane holds its warp's sum");

    printf("indices: grid (2,3,2) of blocks (4,2,3)\n");
    const int total = 2 * 3 * 2 * 4 * 2 * 3;
    int h_idx[total], *d_idx;
    cudaMalloc(&d_idx, sizeof h_idx);
    index_kernel<<<dim3(2, 3, 2), dim3(4, 2, 3), 0, s>>>(d_idx);
    cudaMemcpyAsync(h_idx, d_idx, sizeof h_idx, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    ok = 1;
    for (int i = 0; i < total; i++)
        ok &= h_idx[i] == i;
    check_(ok, "each thread wrote its own linear index, once");

    printf("shared memory and block order\n");
    float h_sh[4], *d_sh;
    cudaMalloc(&d_sh, sizeof h_sh);
    shared_unwritten_kernel<<<4, 32, 0, s>>>(d_sh);
    cudaMemcpyAsync(h_sh, d_sh, sizeof h_sh, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    check_(isnan(h_sh[0]) && isnan(h_sh[1]) && isnan(h_sh[2]) &&
           isnan(h_sh[3]), "__shared__ unwritten reads NaN in every block");
    int h_ord[64], *d_ord;
    cudaMalloc(&d_ord, sizeof h_ord);
    block_order_kernel<<<64, 32, 0, s>>>(d_ord);
    cudaMemcpyAsync(h_ord, d_ord, sizeof h_ord, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    int in_order = 1, seen[64] = {0}, perm = 1;
    for (int b = 0; b < 64; b++) {
        in_order &= h_ord[b] == b;
        perm &= h_ord[b] >= 0 && h_ord[b] < 64 && !seen[h_ord[b]]++;
    }
    check_(perm && !in_order, "64 blocks each run once, not in index order");
    int h_w[32], *d_w;
    cudaMalloc(&d_w, sizeof h_w);
    shfl_width_kernel<<<1, 32, 0, s>>>(d_w);
    cudaMemcpyAsync(h_w, d_w, sizeof h_w, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    check_(h_w[4] == 4 && h_w[20] == 4 && h_w[0] == 0 && h_w[31] == 15,
           "xor 16, width 16: lane 4 keeps 4, lane 20 reads lane 4");
    cudaFree(d_sh); cudaFree(d_ord); cudaFree(d_w);

    printf("launch limits\n");
    int *d_c, h_c = 0;
    cudaMalloc(&d_c, sizeof(int));
    cudaMemset(d_c, 0, sizeof(int));
    cudaGetLastError();
    count_kernel<<<1, 1025, 0, s>>>(d_c);
    check_(cudaGetLastError() == cudaErrorInvalidConfiguration,
           "1025 threads per block: cudaErrorInvalidConfiguration");
    count_kernel<<<0, 32, 0, s>>>(d_c);
    check_(cudaGetLastError() == cudaErrorInvalidConfiguration,
           "empty grid: cudaErrorInvalidConfiguration");
    count_kernel<<<dim3(1, 65536), 1, 0, s>>>(d_c);
    check_(cudaGetLastError() == cudaErrorInvalidConfiguration,
           "grid.y 65536: cudaErrorInvalidConfiguration");
    count_kernel<<<1, 1, 0, s>>>(d_c);
    check_(cudaGetLastError() == cudaSuccess, "a valid launch: cudaSuccess");
    cudaMemcpyAsync(&h_c, d_c, sizeof(int), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    check_(h_c == 1, "only the valid launch ran");

    printf("misuse reported\n");
    long e0 = mock_errors();
    divergent_barrier_kernel<<<1, 32, 0, s>>>(d_f);
    cudaStreamSynchronize(s);
    check_(mock_errors() > e0,
           "half a warp at __syncthreads, half in a shuffle: an error");
    long e1 = mock_errors();
    partial_warp_shuffle_kernel<<<1, 48, 0, s>>>(d_f);
    cudaStreamSynchronize(s);
    check_(mock_errors() > e1,
           "full-mask shuffle in a warp of 16 lanes: an error");

    printf("mma.sync m16n8k16\n");
    {
        float hA[256], hB[128], hD[128];
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 16; k++)
                hA[i * 16 + k] = (float)((i * 3 + k * 7) % 11 - 5);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++)
                hB[k * 8 + n] = (float)((k + 5 * n) % 7 - 3);
        float *dA, *dB, *dD;
        cudaMalloc(&dA, sizeof hA);
        cudaMalloc(&dB, sizeof hB);
        cudaMalloc(&dD, sizeof hD);
        cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
        mma_kernel<<<1, 32, 0, s>>>(dD, dA, dB);
        cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost);
        int ok = 1;
        for (int i = 0; i < 16; i++)
            for (int n = 0; n < 8; n++) {
                int want = 1;
                for (int k = 0; k < 16; k++)
                    want += (int)hA[i * 16 + k] * (int)hB[k * 8 + n];
                ok &= hD[i * 8 + n] == (float)want;
            }
        check_(ok, "D = A B + C by the documented fragment layout");
        long e2 = mock_errors();
        mma_half_warp_kernel<<<1, 16, 0, s>>>(dD);
        cudaStreamSynchronize(s);
        check_(mock_errors() > e2, "mma.sync in a warp of 16 lanes: an error");
        cudaFree(dA); cudaFree(dB); cudaFree(dD);
    }

    printf("memory\n");
    float *d_nan, h_nan[4];
    cudaMalloc(&d_nan, sizeof h_nan);
    cudaMemcpy(h_nan, d_nan, sizeof h_nan, cudaMemcpyDeviceToHost);
    check_(isnan(h_nan[0]) && isnan(h_nan[3]), "cudaMalloc memory reads NaN");
    check_((uintptr_t)d_nan % 256 == 0 && (uintptr_t)d_c % 256 == 0,
           "cudaMalloc pointers are 256-byte aligned");

    printf("cuBLASLt alignment\n");
    check_(lt_gemm_2x2_(s, 64, 0) == 0,
           "A 64-aligned, heuristic told nothing (256): matmul refused");
    check_(lt_gemm_2x2_(s, 64, 64) == 1,
           "A 64-aligned, heuristic told 64: D = A B, by hand");
    check_(lt_gemm_2x2_(s, 0, 0) == 1,
           "A from cudaMalloc, heuristic told nothing: D = A B");

    printf("stream capture\n");
    {
        enum { N = 100 };
        int *h_x, *h_y, *d_x, *d_y;
        cudaMallocHost(&h_x, N * sizeof(int));
        cudaMallocHost(&h_y, N * sizeof(int));
        cudaMalloc(&d_x, N * sizeof(int));
        cudaMalloc(&d_y, N * sizeof(int));
        for (int i = 0; i < N; i++)
            h_x[i] = h_y[i] = -7;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        cudaStreamIsCapturing(s, &cs);
        cudaMemcpyAsync(d_x, h_x, N * sizeof(int), cudaMemcpyHostToDevice, s);
        add_one_kernel<<<2, 64, 0, s>>>(d_y, d_x, N);
        cudaMemcpyAsync(h_y, d_y, N * sizeof(int), cudaMemcpyDeviceToHost, s);
        long e3 = mock_errors();
        cudaStreamSynchronize(s);
        check_(mock_errors() > e3, "sync of a capturing stream: an error");
        (void)cudaGetLastError();
        cudaStreamEndCapture(s, &graph);
        cudaGraphInstantiate(&exec, graph, 0);
        cudaDeviceSynchronize();
        check_(cs == cudaStreamCaptureStatusActive,
               "cudaStreamIsCapturing during capture: active");
        check_(h_y[0] == -7 && h_y[N - 1] == -7, "nothing ran at capture");
        int ok = 1;
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < N; i++)
                h_x[i] = 10 * i + r;
            cudaGraphLaunch(exec, s);
            cudaStreamSynchronize(s);
            for (int i = 0; i < N; i++)
                ok &= h_y[i] == 10 * i + r + 1;
        }
        check_(ok, "3 launches: each y = x + 1 on that launch's x");
        cudaGraphDestroy(graph);
        for (int i = 0; i < N; i++)
            h_x[i] = 5;
        cudaGraphLaunch(exec, s); /* the instance outlives the graph */
        cudaStreamSynchronize(s);
        check_(h_y[0] == 6 && h_y[N - 1] == 6,
               "a launch after cudaGraphDestroy: y = x + 1");
        cudaGraphExecDestroy(exec);
        cudaFreeHost(h_x); cudaFreeHost(h_y);
        cudaFree(d_x); cudaFree(d_y);
    }

    printf("two devices\n");
    {
        enum { N = 64 };
        int nd = 0, cur = -1;
        cudaGetDeviceCount(&nd);
        check_(nd == 2, "M6_EMU_DEVICES=2: cudaGetDeviceCount 2");
        check_(cudaSetDevice(2) == cudaErrorInvalidDevice &&
                   cudaGetDevice(&cur) == cudaSuccess && cur == 0,
               "cudaSetDevice(2): cudaErrorInvalidDevice, device 0 kept");
        (void)cudaGetLastError();
        size_t free0, free1, tot, free0b;
        cudaMemGetInfo(&free0, &tot);
        cudaSetDevice(1);
        cudaStream_t s1;
        cudaStreamCreate(&s1);
        int *d_x, *d_y, h_y[N], h_x[N];
        cudaMalloc(&d_x, N * sizeof(int));
        cudaMalloc(&d_y, N * sizeof(int));
        cudaMemGetInfo(&free1, &tot);
        cudaSetDevice(0);
        cudaMemGetInfo(&free0b, &tot);
        check_(free0b == free0 && free1 == tot - 2 * 256,
               "cudaMalloc on device 1 counts on device 1 alone");
        for (int i = 0; i < N; i++)
            h_x[i] = 3 * i;
        /* a copy may use another device's stream */
        long e0 = mock_errors();
        cudaMemcpyAsync(d_x, h_x, sizeof h_x, cudaMemcpyHostToDevice, s1);
        cudaStreamSynchronize(s1);
        check_(mock_errors() == e0, "a copy on device 1's stream from device 0");
        add_one_kernel<<<1, N, 0, s1>>>(d_y, d_x, N);
        cudaStreamSynchronize(s1);
        cudaMemcpyAsync(h_y, d_y, sizeof h_y, cudaMemcpyDeviceToHost, s1);
        cudaStreamSynchronize(s1);
        check_(mock_errors() > e0 && h_y[0] == -1 && h_y[N - 1] == -1,
               "a kernel on device 1's stream with device 0 current: an "
               "error, nothing written");
        (void)cudaGetLastError();
        cudaEvent_t ev0;
        cudaEventCreate(&ev0);
        long e1 = mock_errors();
        cudaEventRecord(ev0, s1);
        check_(mock_errors() > e1, "device 0's event recorded on device 1's "
                                   "stream: an error");
        (void)cudaGetLastError();
        cudaSetDevice(1);
        cudaMemsetAsync(d_y, 0, sizeof h_y, s1);
        add_one_kernel<<<1, N, 0, s1>>>(d_y, d_x, N);
        cudaMemcpyAsync(h_y, d_y, sizeof h_y, cudaMemcpyDeviceToHost, s1);
        cudaStreamSynchronize(s1);
        int ok = 1;
        for (int i = 0; i < N; i++)
            ok &= h_y[i] == 3 * i + 1;
        check_(ok, "with device 1 current its kernel runs once: y = x + 1");
        cudaFree(d_x); cudaFree(d_y);
        cudaStreamDestroy(s1);
        cudaEventDestroy(ev0);
        cudaSetDevice(0);
    }

    printf("thread-local capture\n");
    {
        cudaGraph_t graph;
        cudaError_t other = cudaErrorInvalidValue; /* until the thread says */
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        pthread_t th;
        pthread_create(&th, NULL, malloc_elsewhere_, &other);
        pthread_join(th, NULL);
        check_(other == cudaSuccess, "another thread allocates meanwhile");
        long refused = 0;
        void *args[2] = {d_nan, &refused};
        pthread_create(&th, NULL, memset_elsewhere_, args);
        pthread_join(th, NULL);
        check_(refused > 0, "another thread's legacy-stream memset: an "
                            "error (it would join the capture)");
        long e0 = mock_errors();
        void *p = NULL;
        cudaMalloc(&p, 256);
        check_(mock_errors() > e0, "the capturing thread's cudaMalloc: an "
                                   "error");
        (void)cudaGetLastError();
        cudaStreamEndCapture(s, &graph);
        cudaGraphDestroy(graph);
    }

    cudaFree(d_in); cudaFree(d_out); cudaFree(d_f); cudaFree(d_g);
    cudaFree(d_idx); cudaFree(d_c); cudaFree(d_nan);
    cudaStreamDestroy(s);
    mock_stop();
    printf("test_emu: %s\n", n_failed ? "FAILED" : "all checks passed");
    return n_failed ? 1 : 0;
}
