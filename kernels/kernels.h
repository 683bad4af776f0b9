/*
 * kernels.h — the compute interface of m6: every op of the GPT block, forward
 * and backward, declared once with its shapes.
 *
 * Notation (DESIGN.md §5): B batch, T sequence length, C channels (n_embd),
 * NH heads (C % NH == 0, head size hs = C/NH), V vocabulary, N = B*T rows.
 * All tensors are dense row-major float32 (the CPU reference, kernels/cpu/).
 * The CUDA backend (kernels/cuda/, kernels_cuda.h) implements the same ops with
 * the same argument order in bf16 with fp32 accumulation.
 *
 * Conventions
 *  - Forward ops overwrite their outputs.
 *  - Backward ops ACCUMULATE (+=) into every gradient they write (dinp, dweight,
 *    dbias, ...), so a shared parameter slot sums the gradient of every layer
 *    that uses it and residual streams sum their branches. Callers zero grads
 *    once per optimizer step (and activation grads once per microbatch).
 *  - Nothing here allocates or fails: sizes are the caller's responsibility.
 */
#ifndef M6_KERNELS_H
#define M6_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- embedding */

/* out (B,T,C) = wte[inp[b,t]] + wpe[t].  inp (B,T) int32 in [0,V); wte (V,C);
 * wpe (maxT,C) with T <= maxT. */
void encoder_forward(float *out, const int32_t *inp, const float *wte,
                     const float *wpe, int B, int T, int C);

/* dwte (V,C) += scatter of dout by token; dwpe (maxT,C) += sum over b of
 * dout[b,t]. dout (B,T,C). Deterministic (no atomics; fixed order). */
void encoder_backward(float *dwte, float *dwpe, const float *dout,
                      const int32_t *inp, int B, int T, int C);

/* ---------------------------------------------------------------- layernorm */

/* LayerNorm over the last dim (Ba et al. 2016), eps = 1e-5, biased variance.
 * inp, out (N,C); weight, bias (C); mean, rstd (N) saved for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C);

/* dinp (N,C) +=, dweight (C) +=, dbias (C) +=. dout, inp (N,C); mean, rstd (N)
 * from the forward. */
void layernorm_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, const float *mean,
                        const float *rstd, int N, int C);

/* ------------------------------------------------------------------- matmul */

/* out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC).  bias may be NULL.
 * GEMM through CBLAS sgemm. */
void matmul_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC);

/* dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (skipped when dbias is NULL).
 * dinp may be NULL (no input gradient wanted). */
void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC);

/* ---------------------------------------------------------------- attention */

/* Causal multi-head self-attention (Vaswani et al. 2017, §3.2.2).
 * qkv (B,T,3C) holds [q | k | v] per position, each (NH, hs) head-major.
 * out (B,T,C) = concat_h softmax(q k^T / sqrt(hs), causal) v.
 * att (B,NH,T,T) receives the post-softmax probabilities (zeros above the
 * diagonal) for backward. */
void attention_forward(float *out, float *att, const float *qkv,
                       int B, int T, int C, int NH);

/* dqkv (B,T,3C) += gradient w.r.t. qkv. dout (B,T,C); qkv and att from the
 * forward. scratch (B,NH,T,T) is caller-provided workspace (overwritten). */
void attention_backward(float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att,
                        int B, int T, int C, int NH);

/* --------------------------------------------------------------------- GELU */

/* out (N) = GELU(inp), tanh approximation (Hendrycks & Gimpel 2016, eq. in §2):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void gelu_forward(float *out, const float *inp, size_t N);

/* dinp (N) += GELU'(inp) * dout. */
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);

/* ----------------------------------------------------------------- residual */

/* out (N) = a + b. */
void residual_forward(float *out, const float *a, const float *b, size_t N);

/* da (N) += dout; db (N) += dout. */
void residual_backward(float *da, float *db, const float *dout, size_t N);

/* ------------------------------------------------- softmax + cross-entropy */

/* Fused softmax + cross-entropy over the vocabulary.
 * logits (N,V) in; probs (N,V) out (softmax, max-subtracted); losses (N) out
 * in nats: -log probs[i, targets[i]]. targets (N) int32 in [0,V). */
void softmax_crossentropy_forward(float *losses, float *probs,
                                  const float *logits, const int32_t *targets,
                                  int N, int V);

/* dlogits (N,V) += (probs - onehot(targets)) * dlosses[i].
 * dlosses (N): upstream gradient of each row's loss, typically 1/(B*T*accum). */
void softmax_crossentropy_backward(float *dlogits, const float *probs,
                                   const int32_t *targets,
                                   const float *dlosses, int N, int V);

/* -------------------------------------------------------------------- AdamW */

/* Sum of squares of grads (n), accumulated in double. The global norm for
 * clipping is sqrt of the sum over all parameter buffers. */
double grad_sumsq(const float *grads, size_t n);

/* One AdamW step (Loshchilov & Hutter 2019, Algorithm 2: decoupled weight
 * decay) over n parameters, in place:
 *   g = grads * grad_scale            (grad_scale folds global-norm clipping)
 *   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
 *   mhat = m / (1 - beta1^t);   vhat = v / (1 - beta2^t)
 *   params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params)
 * t >= 1 is the step count of these moments (bias correction). */
void adamw_update(float *params, const float *grads, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, long t);

#endif /* M6_KERNELS_H */
