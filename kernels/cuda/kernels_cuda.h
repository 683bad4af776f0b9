/*
 * kernels_cuda.h — the CUDA backend: every op of kernels.h in bf16 with fp32
 * accumulation, same argument order, plus a trailing cudaStream_t. All
 * pointers are device pointers unless named *_host. Shapes as in kernels.h
 * (B batch, T sequence, C channels, NH heads, hs = C/NH, V vocabulary,
 * N = B*T rows).
 *
 * Conventions (as kernels.h unless said otherwise)
 *  - Forward ops overwrite their outputs; backward ops ACCUMULATE (+=) into
 *    every gradient (bf16 read, fp32 add, bf16 write). The *_first
 *    variants of the backward ops WRITE (=) the activation gradient
 *    instead (dinp, dqkv: not read, so it needs no zeroing first) and
 *    still accumulate the weight gradients (a slot's gradient sums over
 *    the layers that share it and over the microbatches).
 *  - Where the CUDA op needs workspace it takes a `scratch` argument right
 *    after its outputs, sized by the *_scratch_floats() function named next
 *    to it (scratch.h: plain C, so that the planner asks the same ones).
 *    Scratch makes the reductions deterministic: partial sums per fixed row
 *    block, then a fixed-order sum. No op uses floating-point atomics, so two
 *    runs on the same inputs give bitwise identical results.
 *  - Nothing allocates except matmul's cuBLASLt workspace (once, lazily);
 *    callers pass every other buffer (scratch, attention's workspace).
 *  - C must be a multiple of 8 (16-byte rows for cuBLASLt and aligned bf16
 *    tensors); hs must be 16, 32, 64 or 128.
 *  - Every error (launch, cuBLASLt, unsupported shape) prints and exits
 *    (cuda_check.h).
 *
 * Differences from kernels.h, each for a reason:
 *  - attention keeps no (T,T) matrix between forward and backward: forward
 *    saves the log-sum-exp per row (flash-attention style) and backward
 *    recomputes the probabilities (the tensor-core path through a
 *    caller's workspace, the flash kernels without one).
 *  - cross-entropy works on a padded vocabulary Vp >= V (rows of Vp, the
 *    columns [V,Vp) are ignored in forward and get zero gradient); backward
 *    recomputes the softmax from the logits and WRITES dlogits, which may
 *    alias logits (the logits are not needed after it).
 *  - encoder_backward takes a token-bucket plan built on the host
 *    (encoder_backward_plan) instead of the tokens: a deterministic scatter
 *    without atomics.
 *  - AdamW updates the fp32 master copy and writes the bf16 working copy in
 *    the same pass; its grad_scale is a device pointer so global-norm
 *    clipping never waits for the host.
 */
#ifndef M6_KERNELS_CUDA_H
#define M6_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "kernels.h" /* moe_dims */
#include "scratch.h" /* scratch sizes, attention_impl_* (plain C) */

typedef __nv_bfloat16 bf16;

/* ---------------------------------------------------------------- embedding */

/* out (B,T,C) = wte[inp[b,t]] + wpe[t]. inp (B,T) int32 in [0,V). */
void encoder_forward_cuda(bf16 *out, const int32_t *inp, const bf16 *wte,
                          const bf16 *wpe, int B, int T, int C,
                          cudaStream_t stream);

/* Ints in a plan for N = B*T positions: encoder_plan_ints (scratch.h). */

/* Host: group the N positions of inp_host by token (counting sort, positions
 * ascending within a token) into plan_host (encoder_plan_ints(N) ints).
 * Returns the number of distinct tokens (segments), or -1 if a token is
 * outside [0,V). Copy the plan to the device for encoder_backward_cuda. */
int encoder_backward_plan(int32_t *plan_host, const int32_t *inp_host, int N,
                          int V);

/* dwte (V,C) += sum of dout over the positions of each token (fp32 sum in
 * position order, one add per token); dwpe (maxT,C) += sum over b of dout.
 * plan: device copy of encoder_backward_plan's output, nseg its return, or
 * -1 for a launch that serves any plan of B*T positions (a CUDA graph's:
 * B*T block columns, those past the plan's count return). */
void encoder_backward_cuda(bf16 *dwte, bf16 *dwpe, const bf16 *dout,
                           const int32_t *plan, int nseg, int B, int T, int C,
                           cudaStream_t stream);

/* ---------------------------------------------------------------- layernorm */

/* out (N,C) bf16; mean, rstd (N) fp32; eps 1e-5, biased variance. The
 * layernorm ops use 128-bit accesses: every tensor 16-byte aligned (else a
 * message and exit; C is a multiple of 8). */
void layernorm_forward_cuda(bf16 *out, float *mean, float *rstd,
                            const bf16 *inp, const bf16 *weight,
                            const bf16 *bias, int N, int C,
                            cudaStream_t stream);

/* The residual add and the LayerNorm after it in one pass: res (N,C) =
 * a + b (bf16, as residual_forward_cuda; res may alias a or b), then out,
 * mean, rstd = layernorm_forward of res. */
void residual_layernorm_forward_cuda(bf16 *res, bf16 *out, float *mean,
                                     float *rstd, const bf16 *a,
                                     const bf16 *b, const bf16 *weight,
                                     const bf16 *bias, int N, int C,
                                     cudaStream_t stream);

/* scratch: layernorm_backward_scratch_floats (scratch.h) */

/* dinp (N,C) +=, dweight (C) +=, dbias (C) +=. */
void layernorm_backward_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                             float *scratch, const bf16 *dout,
                             const bf16 *inp, const bf16 *weight,
                             const float *mean, const float *rstd, int N,
                             int C, cudaStream_t stream);
/* The same with dinp (N,C) = (written, not read); dweight, dbias +=. */
void layernorm_backward_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                   float *scratch, const bf16 *dout,
                                   const bf16 *inp, const bf16 *weight,
                                   const float *mean, const float *rstd,
                                   int N, int C, cudaStream_t stream);

/* ------------------------------------------------------------------- matmul */

/* cuBLASLt handle and workspace of the calling thread's current device:
 * created on its first GEMM, or explicitly; fini frees every device's. */
void matmul_cuda_init(void);
void matmul_cuda_fini(void);

/* One cuBLASLt GEMM over a strided batch, column-major as cuBLAS: for each
 * i < batch, D_i (m,n; ldd) = alpha op(A_i) op(B_i) + beta D_i, with
 * X_i = X + i * sX elements. A is (m,k) when !ta, else stored (k,m); B is
 * (k,n) when !tb, else stored (n,k). A and B bf16; D bf16, or fp32 when
 * d_f32; fp32 compute. Each matrix's real alignment is stated to the
 * heuristic. Exits with a message when cuBLASLt has no algorithm. */
typedef struct {
    int ta, tb, m, n, k;
    const bf16 *A; int lda; long long sA;
    const bf16 *B; int ldb; long long sB;
    void *D; int ldd; long long sD;
    int d_f32;
    float alpha, beta;
    int batch;
} gemm_batched_args;
void gemm_batched_cuda(const gemm_batched_args *g, cudaStream_t stream);

/* 1 when cuBLASLt has an algorithm for g (as gemm_batched_cuda would make
 * it: same shapes, types, batch and pointer alignments), else 0. Runs
 * nothing; the answer is kept, so gemm_batched_cuda(g) then finds the
 * same. */
int gemm_batched_supported(const gemm_batched_args *g);

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL.
 * cuBLASLt, bf16 in/out, fp32 compute, bias fused as an epilogue. */
void matmul_forward_cuda(bf16 *out, const bf16 *inp, const bf16 *weight,
                         const bf16 *bias, int N, int C, int OC,
                         cudaStream_t stream);

/* pre (N,OC) = inp @ weight^T + bias; out (N,OC) = GELU(pre) (tanh
 * approximation): one GEMM with the GELU_AUX_BIAS epilogue (a plain GEMM
 * plus own kernels if cuBLASLt offers no algorithm for it). */
void matmul_forward_gelu_cuda(bf16 *out, bf16 *pre, const bf16 *inp,
                              const bf16 *weight, const bf16 *bias, int N,
                              int C, int OC, cudaStream_t stream);

/* 1 when cuBLASLt has an algorithm for the fused epilogue that
 * matmul_forward_cuda (gelu 0: BIAS; bias must not be NULL) or
 * matmul_forward_gelu_cuda (gelu 1: GELU_AUX[_BIAS], pre the aux output)
 * would use on these tensors; 0 when that call would take the plain GEMM
 * plus the own bias / GELU kernels. Runs nothing; after a 0 the launchers
 * no longer warn (the caller is expected to have logged its choice). */
int matmul_forward_fused_supported(bf16 *out, bf16 *pre, const bf16 *inp,
                                   const bf16 *weight, const bf16 *bias,
                                   int N, int C, int OC, int gelu);

/* 1 when cuBLASLt has an algorithm for each plain GEMM of a matmul on
 * these tensors: the forward without epilogue (out = inp weight^T, also
 * the fallback of the epilogues) and the backward's dinp (skipped when
 * dinp is NULL) and dweight GEMMs. These have no other path: 0 names the
 * missing one in why (whylen bytes). Runs nothing. */
int matmul_plain_supported(const bf16 *out, const bf16 *inp,
                           const bf16 *weight, bf16 *dinp, bf16 *dweight,
                           const bf16 *dout, int N, int C, int OC,
                           char *why, size_t whylen);

/* Epilogues (a bias or a GELU of matmul_forward[_gelu]_cuda, the DGELU of
 * matmul_backward_dgelu_first_cuda) run so far in this process: *fused in
 * cuBLASLt's epilogue, *separate by the own bias / GELU kernels after a
 * plain GEMM. */
void matmul_cuda_paths(long *fused, long *separate);

/* scratch: matmul_backward_scratch_floats (scratch.h) */

/* dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) +=
 * column sums of dout (skipped when NULL; scratch may then be NULL).
 * dinp may be NULL. */
void matmul_backward_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                          float *scratch, const bf16 *dout, const bf16 *inp,
                          const bf16 *weight, int N, int C, int OC,
                          cudaStream_t stream);
/* The same with dinp (N,C) = dout @ weight (the GEMM's beta 0: dinp is
 * written, never read); dweight and dbias still +=. */
void matmul_backward_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                float *scratch, const bf16 *dout,
                                const bf16 *inp, const bf16 *weight, int N,
                                int C, int OC, cudaStream_t stream);

/* The backward of a matmul whose input is inp = GELU(pre) (N,C), through
 * the GELU: dinp (N,C) = (dout @ weight) * GELU'(pre), WRITTEN (the GELU's
 * input gradient; the output's, dout @ weight, is never stored); dweight
 * (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout (skipped when
 * NULL). One GEMM with cuBLASLt's DGELU epilogue (pre as its aux input,
 * fp32 product times GELU' rounded once); where cuBLASLt has no algorithm
 * for it, the plain GEMM into dinp and gelu_backward_first_cuda in place
 * (one more bf16 rounding). dinp must not alias pre. */
void matmul_backward_dgelu_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                      float *scratch, const bf16 *dout,
                                      const bf16 *inp, const bf16 *pre,
                                      const bf16 *weight, int N, int C,
                                      int OC, cudaStream_t stream);

/* 1 when cuBLASLt has an algorithm for the DGELU GEMM that
 * matmul_backward_dgelu_first_cuda would run on these tensors, 0 when it
 * would take the plain GEMM plus the own GELU backward. Runs nothing;
 * after a 0 the launchers no longer warn. */
int matmul_backward_dgelu_supported(bf16 *dinp, const bf16 *pre,
                                    const bf16 *dout, const bf16 *weight,
                                    int N, int C, int OC);

/* ---------------------------------------------------------------- attention */

/* Causal multi-head self-attention, flash style (no (T,T) matrix in global
 * memory). qkv (B,T,3C) as kernels.h; out (B,T,C); lse (B,NH,T) fp32: the
 * log-sum-exp of each row's scaled scores, saved for backward. Head size
 * C/NH of 16, 32, 64, 80 or 128 (else a message and exit). Runs the
 * tensor-core kernels where attention_impl_cuda says ATT_IMPL_TC, the
 * CUDA-core kernels otherwise. */
void attention_forward_cuda(bf16 *out, float *lse, const bf16 *qkv, int B,
                            int T, int C, int NH, cudaStream_t stream);

/* scratch: attention_backward_scratch_floats (scratch.h) */

/* dqkv (B,T,3C) +=. dout (B,T,C); qkv, out and lse from the forward;
 * scratch of attention_backward_scratch_floats floats. Deterministic. */
void attention_backward_cuda(bf16 *dqkv, float *scratch, const bf16 *dout,
                             const bf16 *qkv, const bf16 *out,
                             const float *lse, int B, int T, int C, int NH,
                             cudaStream_t stream);
/* The same with dqkv (B,T,3C) = (written, not read): every element of dq,
 * dk and dv is stored once, by the thread or GEMM that owns its row. */
void attention_backward_first_cuda(bf16 *dqkv, float *scratch,
                                   const bf16 *dout, const bf16 *qkv,
                                   const bf16 *out, const float *lse, int B,
                                   int T, int C, int NH, cudaStream_t stream);

/* The two implementations behind those, same arguments and results:
 * _tc_: FlashAttention-2 on the tensor cores (mma.sync m16n8k16, bf16
 * operands, fp32 accumulators), head size 32, 64, 80 or 128 only;
 * _core_: on the fp32 CUDA cores, head size 16, 32, 64, 80 or 128 (the
 * reference fallback). Any T >= 1, any B and NH. */
void attention_tc_forward_cuda(bf16 *out, float *lse, const bf16 *qkv, int B,
                               int T, int C, int NH, cudaStream_t stream);
void attention_tc_backward_cuda(bf16 *dqkv, float *scratch, const bf16 *dout,
                                const bf16 *qkv, const bf16 *out,
                                const float *lse, int B, int T, int C,
                                int NH, cudaStream_t stream);
void attention_core_forward_cuda(bf16 *out, float *lse, const bf16 *qkv,
                                 int B, int T, int C, int NH,
                                 cudaStream_t stream);
void attention_core_backward_cuda(bf16 *dqkv, float *scratch,
                                  const bf16 *dout, const bf16 *qkv,
                                  const bf16 *out, const float *lse, int B,
                                  int T, int C, int NH, cudaStream_t stream);

/* Which attention a (B,T,C) model with NH heads runs, from $M6_ATTENTION
 * (read once; unknown values: a message and the default):
 *   unset or "tc"  ATT_IMPL_TC where the head size is 32, 64, 80 or 128,
 *                  else ATT_IMPL_GEMM
 *   "core"         ATT_IMPL_CORE: the CUDA-core kernels, no GEMM path
 *   "gemm"         ATT_IMPL_GEMM (the previous default)
 * ATT_IMPL_GEMM: the caller may take the cuBLASLt path below where it fits;
 * attention_forward_cuda and attention_backward_cuda then run the CUDA-core
 * kernels. */
int attention_impl_cuda(int C, int NH); /* ATT_IMPL_*: scratch.h */

/* The same attention (same arguments, results and lse) with its products
 * on cuBLASLt's tensor cores, batched over the heads of a sequence or the
 * sequences of a head (the larger of NH and B): S = scale Q K^T in fp32
 * and the causal softmax P in bf16 go through a workspace ws of ws_bytes
 * (10 bytes per score: as many (sequence, head) items per pass as fit, at
 * least one, else it exits). attention_gemm_workspace_bytes: the size that
 * gpt_cuda allocates (items up to 512 MiB), 0 when the head size is not a
 * multiple of 8 (its slices would not be 16-byte aligned) or one item's
 * pass would pass 512 MiB (T > 7,326): use the kernels above then, which
 * need no workspace. The backward's scratch is as above. */
/* attention_gemm_workspace_bytes: scratch.h */
void attention_gemm_forward_cuda(bf16 *out, float *lse, void *ws,
                                 size_t ws_bytes, const bf16 *qkv, int B,
                                 int T, int C, int NH, cudaStream_t stream);
void attention_gemm_backward_cuda(bf16 *dqkv, float *scratch, void *ws,
                                  size_t ws_bytes, const bf16 *dout,
                                  const bf16 *qkv, const bf16 *out,
                                  const float *lse, int B, int T, int C,
                                  int NH, cudaStream_t stream);
/* The same with dqkv = (beta 0 in the GEMMs that make dq, dk, dv). */
void attention_gemm_backward_first_cuda(bf16 *dqkv, float *scratch, void *ws,
                                        size_t ws_bytes, const bf16 *dout,
                                        const bf16 *qkv, const bf16 *out,
                                        const float *lse, int B, int T, int C,
                                        int NH, cudaStream_t stream);

/* 1 when cuBLASLt has an algorithm for every batched GEMM (fp32 scores,
 * bf16 products, the heads interleaved in qkv) that
 * attention_gemm_forward_cuda and attention_gemm_backward_cuda make with
 * these tensors, for every microbatch size 1..B (the passes differ in
 * batch and alignment); 0 with the first missing GEMM named in why
 * (whylen bytes) when one has none: use the flash kernels then. Runs
 * nothing; the answers are kept, so the calls take the same path. */
int attention_gemm_supported(void *ws, size_t ws_bytes, const bf16 *qkv,
                             const bf16 *out, bf16 *dqkv, const bf16 *dout,
                             int B, int T, int C, int NH, char *why,
                             size_t whylen);

/* --------------------------------------------------------------------- GELU */

void gelu_forward_cuda(bf16 *out, const bf16 *inp, size_t N,
                       cudaStream_t stream);
/* dinp (N) += GELU'(inp) * dout. dinp may alias dout. */
void gelu_backward_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                        size_t N, cudaStream_t stream);
/* dinp (N) = GELU'(inp) * dout (written, not read); dinp may alias dout
 * (in place). */
void gelu_backward_first_cuda(bf16 *dinp, const bf16 *inp, const bf16 *dout,
                              size_t N, cudaStream_t stream);

/* ----------------------------------------------------------------- residual */

/* out = a + b (out may alias a or b). */
void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t N,
                           cudaStream_t stream);
/* da += dout; db += dout. */
void residual_backward_cuda(bf16 *da, bf16 *db, const bf16 *dout, size_t N,
                            cudaStream_t stream);

/* ------------------------------------------------- softmax + cross-entropy */

/* logits (N,Vp) bf16, the first V columns valid; losses (N) fp32 in nats;
 * probs (N,Vp) bf16 written when not NULL (zeros in the padding). */
void softmax_crossentropy_forward_cuda(float *losses, bf16 *probs,
                                       const bf16 *logits,
                                       const int32_t *targets, int N, int V,
                                       int Vp, cudaStream_t stream);

/* dlogits (N,Vp) = (softmax(logits) - onehot(targets)) * dlosses[i] for the
 * first V columns, 0 in the padding. WRITES (no +=); dlogits may alias
 * logits. dlosses (N) fp32. */
void softmax_crossentropy_backward_cuda(bf16 *dlogits, const bf16 *logits,
                                        const int32_t *targets,
                                        const float *dlosses, int N, int V,
                                        int Vp, cudaStream_t stream);

/* The fused classifier: for each row i of logits (N,Vp) bf16 (the first V
 * columns valid, the padding never read), in one kernel: losses[i] (fp32,
 * nats) as softmax_crossentropy_forward_cuda, and dlogits = (softmax -
 * onehot(targets[i])) * dloss written IN PLACE over the row's logits, 0 in
 * [V,Vp): forward + backward of the loss when every row's dloss is the
 * same (the mean loss's 1/(B T), times any loss scale). targets in
 * [0,V). */
void softmax_crossentropy_fused_cuda(float *losses, bf16 *logits,
                                     const int32_t *targets, float dloss,
                                     int N, int V, int Vp,
                                     cudaStream_t stream);

/* out[0] = mean of x (n), fp32, deterministic (one block, fixed order). */
void mean_cuda(float *out, const float *x, int n, cudaStream_t stream);

/* x[i] = value for i < n. */
void fill_cuda(float *x, float value, size_t n, cudaStream_t stream);

/* -------------------------------------------------------------------- AdamW */

/* scratch: grad_sumsq_scratch_floats (scratch.h) */

/* out[0] = sum of squares of grads (n), fp32, deterministic. */
void grad_sumsq_cuda(float *out, float *scratch, const bf16 *grads, size_t n,
                     cudaStream_t stream);

/* scale[0] = max_norm / sqrt(sumsq[0]) when that norm exceeds max_norm > 0,
 * else 1: the grad_scale of global-norm clipping, computed on the device. */
void grad_clip_scale_cuda(float *scale, const float *sumsq, float max_norm,
                          cudaStream_t stream);

/* AdamW as kernels.h over n parameters: updates master (fp32), m, v in place
 * and writes params = bf16(master) in the same pass. grads bf16.
 * grad_scale: device pointer to one float, or NULL for 1. */
void adamw_update_cuda(float *master, bf16 *params, const bf16 *grads,
                       float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay,
                       const float *grad_scale, long t, cudaStream_t stream);

/* Multi-tensor AdamW: one launch over a list of tensors of a block.
 * A tensor is numel elements at element offset off of master, params,
 * grads, m and v; decay: the weight decay applies (the 2-D weights, as the
 * per-tensor path passes wd or 0); region: the index of its step count in
 * adamw_multi_cuda's t[] (the globals and each slot count their own). */
typedef struct {
    size_t off, numel;
    int decay, region;
    /* 0: fp32 master weights (master[off..] updated, params = bf16 of
     * it). Else bf16 master weights (optimizer.master bf16): the tensor's
     * master IS params (master not read nor written), and each new value
     * is rounded to bf16 stochastically, element i at step t by
     * sr_round_bf16(x, sr_bits(sr_key, t, i)) (kernels/sround.h, the CPU
     * optimizers' rule: sr_key = sr_span_key of the tensor's place in
     * gpt.h's plain layout gives the CPU's bits). */
    uint64_t sr_key;
} adamw_tensor_cuda;

/* regions per launch (their bias corrections go by value); more regions
 * take one launch per ADAMW_MULTI_REGIONS */
#define ADAMW_MULTI_REGIONS 64

typedef struct adamw_multi_plan adamw_multi_plan;

/* A plan for nt tensors (ts, copied to the device; regions in
 * [0, n_regions), non-decreasing along ts). Synchronous (one cudaMemcpy).
 * Returns NULL, with a message on stderr naming what is wrong, for no
 * tensors, a region out of range or out of order, or out of memory. */
adamw_multi_plan *adamw_multi_plan_create(const adamw_tensor_cuda *ts,
                                          int nt, int n_regions);
/* Frees a plan (its device table: synchronous); NULL is a no-op. */
void adamw_multi_plan_destroy(adamw_multi_plan *p);

/* adamw_update_cuda over every tensor of plan p, in one launch (per
 * ADAMW_MULTI_REGIONS regions): t[n_regions] the step counts (host), wd
 * applied to decay tensors only, and the gradient scaled by global-norm
 * clipping computed in the kernel from sumsq (device pointer to the sum
 * of squares of all the gradients; max_norm <= 0: no clipping), exactly
 * as grad_clip_scale_cuda; sumsq NULL: scale 1. Elements outside the
 * tensors (padding) are not touched. Same bits as adamw_update_cuda with
 * grad_clip_scale_cuda's scale. */
void adamw_multi_cuda(const adamw_multi_plan *p, float *master, bf16 *params,
                      const bf16 *grads, float *m, float *v, const long *t,
                      float lr, float beta1, float beta2, float eps,
                      float weight_decay, const float *sumsq, float max_norm,
                      cudaStream_t stream);

/* adamw_multi_cuda with the step's values read from device memory, for a
 * launch that a CUDA graph replays at every step (issue 18, item 4): args
 * (device, adamw_multi_args_floats(p) floats, filled by
 * adamw_multi_args_fill and copied there before the kernel runs) holds
 * lr, beta1, beta2, eps, weight_decay, max_norm and each region's two bias
 * corrections. One launch whatever the number of regions. Same bits as
 * adamw_multi_cuda with the same values. */
enum {
    MT_ARG_LR, MT_ARG_BETA1, MT_ARG_BETA2, MT_ARG_EPS, MT_ARG_WD,
    MT_ARG_MAX_NORM, MT_ARG_BC /* bc1[n_regions], then bc2[n_regions],
                                * then each region's step count t (for
                                * the stochastic rounding) as the bits of
                                * two floats, low word first */
};
size_t adamw_multi_args_floats(const adamw_multi_plan *p);
/* Host: args (adamw_multi_args_floats(p) floats) for step counts
 * t[n_regions]; the bias corrections 1 - beta^t computed in double and
 * rounded to float, as adamw_multi_cuda does. */
void adamw_multi_args_fill(const adamw_multi_plan *p, float *args,
                           const long *t, float lr, float beta1, float beta2,
                           float eps, float weight_decay, float max_norm);
void adamw_multi_dev_cuda(const adamw_multi_plan *p, float *master,
                          bf16 *params, const bf16 *grads, float *m, float *v,
                          const float *args, const float *sumsq,
                          cudaStream_t stream);

/* grads[i] = bf16(grads[i] / d) for i < n, in fp32 (one more bf16
 * rounding): pseudo.grad_scale mean's division of a shared slot's
 * gradient by the layers that share it. */
void grad_div_cuda(bf16 *grads, size_t n, float d, cudaStream_t stream);

/* params (n) = bf16(master): the working copy after loading fp32 weights. */
void copy_to_bf16_cuda(bf16 *params, const float *master, size_t n,
                       cudaStream_t stream);

/* dst (n, fp32) = src (n, bf16), exact: data parallelism's fp32 copy of
 * the bf16 gradients (gpt_cuda_grads_f32). */
void copy_to_f32_cuda(float *dst, const bf16 *src, size_t n,
                      cudaStream_t stream);

/* ---------------------------------------------------------------- Adafactor */

/* Adafactor's hyperparameters of a step (kernels.h adafactor_hparams,
 * without grad_scale: the CUDA path reads the clip scale from the device). */
typedef struct {
    float lr, beta1, clip_threshold, eps1, eps2;
    int scale_parameter;
} adafactor_hparams_cuda;

/* One tensor's Adafactor step: cols > 0 a rows x cols row-major matrix
 * with its factored second moment r (rows) and c (cols); cols 0 a vector
 * of rows elements, r (rows) its second moment, c unused. master (fp32),
 * params (bf16 working copy, written), grads (bf16) and m (fp32 first
 * moment, NULL without one) at the tensor's first element. beta2 the
 * step's (adafactor_beta2 of the tensor's step count); weight_decay the
 * tensor's (0: none). */
typedef struct {
    float *master;
    bf16 *params;
    const bf16 *grads;
    float *m, *r, *c;
    int rows, cols;
    float beta2, weight_decay;
    /* 0: fp32 master weights. Else bf16 master weights: master NULL, the
     * bf16 params are the masters (read for RMS(params) too) and each new
     * value is rounded by sr_round_bf16(x, sr_bits(sr_key, t, i))
     * (kernels/sround.h, the CPU's rule), t the tensor's step count. */
    uint64_t sr_key;
    long t;
} adafactor_tensor_step_cuda;

/* Doubles of scratch adafactor_update_cuda needs for a tensor of numel
 * elements (a buffer for the largest serves every tensor of a stream). */
size_t adafactor_scratch_doubles(size_t numel);

/* One Adafactor step of tensor x (kernels.h's formula, the CPU reference
 * adafactor_update_spans): its second moment, the update clipped at
 * h->clip_threshold, the first moment, decoupled weight decay, master and
 * bf16 copy. The gradient is multiplied by grad_scale[0] (device pointer,
 * e.g. grad_clip_scale_cuda's; NULL: 1). Reductions in double in a fixed
 * order (deterministic); queued on stream (five launches), scratch
 * (device, adafactor_scratch_doubles(numel)) in use until they are done. */
void adafactor_update_cuda(const adafactor_tensor_step_cuda *x,
                           const adafactor_hparams_cuda *h,
                           const float *grad_scale, double *scratch,
                           cudaStream_t stream);

/* ---------------------------------------------------- mixture of experts */

/* The MoE ops of kernels.h (expert prototyping, M6-T) with fixed-capacity
 * dispatch: expert e's rows are [e*cap, e*cap + counts[e]) of buffers of
 * rows = E*cap (cap = d->capacity), the other rows zero, so the expert
 * MLPs are strided-batched GEMMs over E with host-known shapes (no copy of
 * the counts to the host). Router and softmax in fp32; routing decisions,
 * counts and drops as the CPU op's on the same logits. C, H and E must be
 * multiples of 8 (16-byte rows for cuBLASLt). */

/* logits = x Wg^T + bg in fp32, softmax per prototype into probs (N,E);
 * lse (N,k); expert, slot (N,k) (slot: a dispatch row or -1); counts,
 * routed (E); row_token (rows): the token of each row, -1 unused; dropped
 * (1): the dropped (token, prototype) pairs. bg may be NULL. */
void moe_route_cuda(float *probs, float *lse, int32_t *expert, int32_t *slot,
                    int32_t *counts, int32_t *routed, int32_t *row_token,
                    int32_t *dropped, const bf16 *x, const bf16 *wg,
                    const bf16 *bg, const moe_dims *d, cudaStream_t stream);

/* out (N,C) = sum over p of gate * y_expert(x); saves xe, ye (rows,C),
 * hpre, hact (rows,H). Overwrites out. */
void moe_forward_cuda(bf16 *out, bf16 *xe, bf16 *hpre, bf16 *hact, bf16 *ye,
                      const bf16 *x, const float *probs,
                      const int32_t *expert, const int32_t *slot,
                      const int32_t *row_token, const bf16 *w1,
                      const bf16 *b1, const bf16 *w2, const bf16 *b2,
                      const moe_dims *d, cudaStream_t stream);

/* out[0] = aux, out[1] = z (fp32, device), as moe_aux_losses. */
void moe_aux_losses_cuda(float *out, const float *probs, const float *lse,
                         const int32_t *routed, const moe_dims *d,
                         cudaStream_t stream);

/* Bytes of moe_backward_cuda's scratch (256-byte aligned base). */
size_t moe_backward_scratch_bytes(const moe_dims *d);

/* What moe_route_cuda and moe_forward_cuda saved, which the backward
 * reads (shapes as there): probs (N,E), lse, expert, slot (N,k), routed
 * (E), row_token (rows), xe, ye (rows,C), hpre, hact (rows,H). */
typedef struct {
    const float *probs, *lse;
    const int32_t *expert, *slot, *routed, *row_token;
    const bf16 *xe, *hpre, *hact, *ye;
} moe_saved_cuda;

/* As moe_backward (kernels.h): += into dx, dwg, dbg (may be NULL), dw1,
 * db1, dw2, db2, for loss = <dout, out> + daux aux + dz z; sv the
 * forward's saved tensors. */
void moe_backward_cuda(bf16 *dx, bf16 *dwg, bf16 *dbg, bf16 *dw1, bf16 *db1,
                       bf16 *dw2, bf16 *db2, void *scratch, const bf16 *dout,
                       const bf16 *x, const moe_saved_cuda *sv,
                       const bf16 *wg, const bf16 *w1, const bf16 *w2,
                       float daux, float dz, const moe_dims *d,
                       cudaStream_t stream);
/* The same with dx (N,C) written, not read (the experts' part stored,
 * then the router's added): the first write of the block's input
 * gradient, no memset before it. The weight gradients still +=. */
void moe_backward_first_cuda(bf16 *dx, bf16 *dwg, bf16 *dbg, bf16 *dw1, bf16 *db1,
                       bf16 *dw2, bf16 *db2, void *scratch, const bf16 *dout,
                       const bf16 *x, const moe_saved_cuda *sv,
                       const bf16 *wg, const bf16 *w1, const bf16 *w2,
                       float daux, float dz, const moe_dims *d,
                       cudaStream_t stream);

#endif /* M6_KERNELS_CUDA_H */
