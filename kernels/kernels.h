/*
 * kernels.h — the compute interface of m6: every op of the GPT block, forward
 * and backward, declared once with its shapes.
 *
 * Notation: B batch, T sequence length, C channels (n_embd),
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

#ifdef __cplusplus
extern "C" {
#endif

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

/* res (N,C) = a + b (residual_forward), then out = LayerNorm(res) as
 * layernorm_forward, in one pass over the rows. res may alias a or b. */
void residual_layernorm_forward(float *res, float *out, float *mean,
                                float *rstd, const float *a, const float *b,
                                const float *weight, const float *bias, int N,
                                int C);

/* dinp (N,C) +=, dweight (C) +=, dbias (C) +=. dout, inp (N,C); mean, rstd (N)
 * from the forward. */
void layernorm_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, const float *mean,
                        const float *rstd, int N, int C);

/* ------------------------------------------------------------------- matmul */

/* out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC).  bias may be NULL.
 * GEMMs through the CPU engine's one GEMM (see "GEMM library" below). */
void matmul_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC);

/* matmul_forward, then act (N,OC) = GELU(out) elementwise (gelu_forward),
 * in the same parallel region. act NULL: plain matmul_forward. */
void matmul_forward_gelu(float *out, float *act, const float *inp,
                         const float *weight, const float *bias, int N, int C,
                         int OC);

/* dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (skipped when dbias is NULL).
 * dinp may be NULL (no input gradient wanted). */
void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC);

/* matmul_backward with dinp (N,C) written, not added (its old contents,
 * NaN included, are not read): the first write of an input gradient needs
 * no zeroed buffer. dinp must not be NULL. dw_store 1: dweight is written
 * too (its old contents not read), for the first write of a weight
 * gradient since the step began (no zeroed buffer, no memset pass over
 * it); 0: added. dbias is added either way. */
void matmul_backward_first(float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC,
                           int dw_store);

/* matmul_backward of a layer whose input is act = GELU(pre), with the GELU
 * backward in the same parallel region:
 *   dact (N,C) = dout @ weight  (written, not added: scratch)
 *   dpre (N,C) = GELU'(pre) * dact  (written, not added)
 *   dweight (OC,C) += dout^T @ act  (dw_store 1: written, = dout^T @ act,
 *                                   as in matmul_backward_first)
 *   dbias (OC) += column sums of dout.
 * The same values as matmul_backward into a zeroed dact, then gelu_backward
 * into a zeroed dpre. */
void matmul_backward_gelu(float *dpre, float *dact, float *dweight,
                          float *dbias, const float *dout, const float *act,
                          const float *pre, const float *weight, int N, int C,
                          int OC, int dw_store);

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

/* attention_backward with dqkv (B,T,3C) written, not added: each (b,h)
 * task zeroes its own head slices first (no zeroed buffer needed, the
 * zeroing parallel). */
void attention_backward_first(float *dqkv, float *scratch, const float *dout,
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

/* dlogits (N,V) = (probs - onehot(targets)) * dlosses[i], written, not
 * added: the same values as softmax_crossentropy_backward into a zeroed
 * buffer, in one pass per row. */
void softmax_crossentropy_backward_first(float *dlogits, const float *probs,
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

/* grad_sumsq of nb buffers (bufs[b] of ns[b] floats) in one parallel
 * region; *out = the buffers' sums added in order b = 0..nb-1: bitwise
 * grad_sumsq(bufs[0]) + grad_sumsq(bufs[1]) + ... Returns 0, or -1 (out
 * of memory for the nb * 64 partial sums; *out untouched). */
int grad_sumsq_many(double *out, const float *const *bufs, const size_t *ns,
                    int nb);

/* One AdamW span: n parameters with their gradients and moments, their
 * weight decay and step count t >= 1. */
typedef struct {
    float *params;
    const float *grads;
    float *m, *v;
    size_t n;
    float weight_decay;
    long t;
    /* 0: fp32 master weights, params updated in fp32. Else bf16 masters:
     * params hold bf16 values (widened to fp32) and each new value is
     * rounded to bf16 stochastically, element i by
     * sr_bits(sr_key, t, sr_base + i) (sr_round_bf16). sr_base: the
     * span's first element in the tensor its key names (0: the span is
     * that tensor; a rank's experts, part of the whole model's tensor,
     * are rounded as the whole model rounds them). */
    uint64_t sr_key;
    uint64_t sr_base;
} adamw_span;

/* adamw_update on each of spans[0..ns) in one parallel region (no barrier
 * between spans): bitwise the same as ns adamw_update calls. */
void adamw_update_spans(const adamw_span *spans, int ns, float lr,
                        float beta1, float beta2, float eps, float grad_scale);

/* ---------------------------------------------------------------- Adafactor */

/* Adafactor (Shazeer & Stern 2018, arXiv 1804.04235, Algorithms 4 and 5)
 * with an explicit learning rate and decoupled weight decay, over spans of
 * one matrix or one vector each. Per span at its step count t >= 1:
 *   g     = grads * grad_scale        (grad_scale folds global-norm clipping)
 *   b2    = 1 - t^-decay_rate         (adafactor_beta2; 0 at t = 1)
 *   matrix (rows x cols), g2 = g^2 + eps1:
 *     r = b2 r + (1-b2) mean_j g2     (rows: each row's mean)
 *     c = b2 c + (1-b2) mean_i g2     (cols: each column's mean)
 *     vhat[i,j] = r[i] c[j] / mean(r) (the paper's R C^T / 1^T R, with
 *                                      sums; the same value from means)
 *   vector (rows elements): r = b2 r + (1-b2) g2;  vhat = r
 *   U = g / sqrt(vhat);  u = U / max(1, RMS(U) / clip_threshold)
 *   beta1 > 0: m = beta1 m + (1-beta1) u;  u = m   (no bias correction)
 *   alpha = lr, or with scale_parameter lr * max(eps2, RMS(params)) (the
 *           paper's relative scale; RMS of the weights before this step)
 *   params -= alpha * u + lr * weight_decay * params
 * Reductions in double; r, c, m, params fp32. */
typedef struct adafactor_hparams {
    float lr, beta1, decay_rate, clip_threshold, eps1, eps2;
    int scale_parameter;
    float grad_scale;
} adafactor_hparams;

/* One Adafactor span. cols > 0: a rows x cols row-major matrix, r (rows)
 * and c (cols) its factored second moment; cols 0: a vector of rows
 * elements, r (rows) its second moment, c unused. m (rows * max(cols, 1))
 * the first moment, NULL when beta1 is 0. t >= 1. */
typedef struct {
    float *params;
    const float *grads;
    float *m, *r, *c;
    int rows, cols;
    float weight_decay;
    long t;
    uint64_t sr_key;    /* as adamw_span's: 0 fp32 masters, else bf16 ones
                         * rounded stochastically */
} adafactor_span;

/* beta2 at step t >= 1: 1 - t^-decay_rate (the paper's increasing
 * decay). */
float adafactor_beta2(long t, float decay_rate);

/* One Adafactor step of each of spans[0..ns) in one parallel region, each
 * span by one thread (bitwise the same for any thread count). Returns 0,
 * or -1 when out of memory for the column sums (nothing updated). */
int adafactor_update_spans(const adafactor_span *spans, int ns,
                           const adafactor_hparams *h);

/* ------------------------------------------------- bf16 master weights */

/* Stochastic rounding of optimizer updates to bf16 master weights
 * (optimizer.master bf16): a weight that must stay a bf16 value takes its
 * fp32 update and is rounded to one of the two bf16 values around it, up
 * with probability (x - down) / (up - down), so E[sr(x)] = x and updates
 * far below bf16's resolution (2^-8 relative) still move the weights on
 * average; round-to-nearest would drop every one of them.
 *
 * The random bits are a counter-based hash, no generator state: the bits
 * of element i of a span at step t are sr_bits(key, t, i), the span's key
 * derived from the run's seed and the parameter's place in the model
 * (gpt.c), so an update is the same on any thread count and after a
 * resume (the step counts are in the checkpoint). fp32 weights become
 * bf16 masters by gemm_bf16_round (to nearest): the initial weights and
 * init.from's. */

/* sr_bits, sr_span_key, sr_round_bf16: sround.h, header-only (the CUDA
 * optimizers use the same rule on the device). */
#include "sround.h"

/* ------------------------------------------------ mixture of experts (MoE) */

/* Expert prototyping (M6-T: Yang et al. 2021, arXiv 2105.15082, §3): the E
 * experts of a layer are split into k prototypes of Ep = E/k experts; every
 * prototype routes every token top-1 among its own experts (Switch
 * Transformer: Fedus et al. 2021, arXiv 2101.03961, §2.1), and the layer's
 * output is the sum over prototypes of the chosen expert's output scaled by
 * its router probability. k = 1 is plain Switch routing. Prototype p holds
 * the global experts [p*Ep, (p+1)*Ep).
 *
 * Each expert is a GELU MLP of hidden size H:
 *   y_e(x) = W2_e gelu(W1_e x + b1_e) + b2_e,  W1 (E,H,C), b1 (E,H),
 *   W2 (E,C,H), b2 (E,C)
 * and the router one linear gate: logits (N,E) = x @ Wg^T + bg, Wg (E,C),
 * bg (E), softmaxed within each prototype's Ep logits, in fp32.
 *
 * Capacity: each expert processes at most `capacity` tokens of the N of
 * the microbatch (moe_capacity); tokens past it, in token order, get
 * nothing from that prototype (the residual stream carries them).
 *
 * Routing group: the tokens over which capacity is counted and the
 * balancing loss's fractions are taken, N_group (0: N, the microbatch).
 * An expert-parallel group of P ranks may route its P microbatches as one
 * of P*N tokens (spec model.moe.capacity_scope "group"): rank i's tokens
 * then follow those of ranks 0..i-1 (moe_route_plan's `before`), and
 * routed and the probability sums are the group's (moe_balance_loss,
 * moe_router_backward) -- exactly one microbatch of P*N tokens.
 *
 * Dispatch: the processed (token, prototype) pairs are laid out expert by
 * expert (rows offset[e] .. offset[e+1]-1 of the dispatch buffers, tokens in
 * order within an expert: a stable permutation), so every expert's MLP is
 * two dense GEMMs over contiguous rows. R = offset[E] <= N*k rows. */
typedef struct {
    int N;         /* tokens (rows of x) */
    int C;         /* channels */
    int E;         /* experts, all prototypes */
    int k;         /* prototypes; k divides E */
    int H;         /* expert hidden size */
    int capacity;  /* tokens per expert, moe_capacity() of N_group */
    int N_group;   /* tokens routed together (see above); 0: N */
} moe_dims;

/* The tokens routed together: N_group, or N when it is 0. */
static inline int moe_route_tokens(const moe_dims *d)
{
    return d->N_group > 0 ? d->N_group : d->N;
}

/* ceil(capacity_factor * N / (E/k)), at least 1 and at most N: the tokens
 * each expert of a prototype takes of a microbatch of N (Switch
 * Transformer §2.2, per prototype). capacity_factor 0: dropless, N (a
 * prototype routes a token to one of its experts, so no expert is offered
 * more). The one rule: the CPU kernels, the CUDA model and its activation
 * layout all ask it (header-only, so the planner needs no CPU kernels). */
static inline int moe_capacity(double capacity_factor, int N, int E, int k)
{
    if (capacity_factor <= 0)
        return N;
    double x = capacity_factor * ((double)N / (double)(E / k));
    int c = x >= (double)N ? N : (int)x;
    if ((double)c < x && c < N)
        c++;  /* the ceiling, without libm */
    return c < 1 ? 1 : c;
}

/* Router and dispatch plan.
 * In: x (N,C), wg (E,C), bg (E) (may be NULL).
 * Out: probs (N,E) softmax within each prototype (fp32); lse (N,k) the
 * log-sum-exp of each prototype's logits (for the z-loss); expert (N,k) the
 * global index of token n's top-1 expert in prototype p (exact ties go to
 * the lowest index); slot (N,k) its dispatch row, -1 when dropped; counts
 * (E) tokens processed by each expert (<= capacity); routed (E) tokens whose
 * top-1 is e, before capacity; offset (E+1) first dispatch row of each
 * expert (offset[E] = R); row_token (N*k) the token of each dispatch row
 * (first R used).
 * Returns the number of dropped (token, prototype) pairs. Never fails. */
int moe_route(float *probs, float *lse, int32_t *expert, int32_t *slot,
              int32_t *counts, int32_t *routed, int32_t *offset,
              int32_t *row_token, const float *x, const float *wg,
              const float *bg, const moe_dims *d);

/* moe_route's two halves, for a routing group of several ranks.
 * moe_route_top1: probs, lse, expert and routed as moe_route writes them
 * (the softmaxes and top-1 choices: nothing about capacity).
 * moe_route_plan: capacity and the dispatch plan from expert: slot,
 * counts, offset and row_token as moe_route writes them; before (E, or
 * NULL: zeros) counts the pairs that the group's earlier ranks routed to
 * each expert, which take its capacity first: a pair is kept when
 * before[e] plus the pairs routed to e before it here is under
 * d->capacity. Returns the number of dropped pairs. Never fails. */
void moe_route_top1(float *probs, float *lse, int32_t *expert,
                    int32_t *routed, const float *x, const float *wg,
                    const float *bg, const moe_dims *d);
int moe_route_plan(int32_t *slot, int32_t *counts, int32_t *offset,
                   int32_t *row_token, const int32_t *expert,
                   const int32_t *before, const moe_dims *d);

/* Experts and combine, from moe_route's plan.
 * out (N,C) = sum over p of probs[n, expert[n,p]] * y_{expert[n,p]}(x[n])
 * for the pairs not dropped (0 for a token dropped by every prototype).
 * Saved for backward (first R rows used): xe (N*k,C) gathered inputs, hpre
 * (N*k,H) W1 x + b1, hact (N*k,H) its GELU, ye (N*k,C) expert outputs.
 * An expert with no tokens is skipped. Overwrites out. */
void moe_forward(float *out, float *xe, float *hpre, float *hact, float *ye,
                 const float *x, const float *probs, const int32_t *expert,
                 const int32_t *slot, const int32_t *offset,
                 const int32_t *row_token, const float *w1, const float *b1,
                 const float *w2, const float *b2, const moe_dims *d);

/* The router's auxiliary losses of one layer, in fp32 from doubles:
 *  aux = (1/k) sum_p Ep sum_{e in p} f_e P_e     (Switch Transformer §2.2,
 *        eq. 4, averaged over prototypes), f_e = routed[e] / N the fraction
 *        of tokens whose top-1 is e, P_e = mean over tokens of probs[:,e];
 *        1 for uniform routing and probabilities, -> Ep when collapsed;
 *  z   = (1/(N k)) sum_{n,p} lse[n,p]^2          (ST-MoE: Zoph et al. 2022,
 *        arXiv 2202.08906, §3.1, eq. 5, per prototype). */
void moe_aux_losses(float *aux, float *z, const float *probs, const float *lse,
                    const int32_t *routed, const moe_dims *d);

/* The pieces of moe_aux_losses, for a routing group of several ranks.
 * moe_prob_sums: psum (E) = sum over this microbatch's N tokens of
 * probs[:,e], in double, tokens in order. moe_balance_loss: aux from
 * routed and psum taken over the routing group's moe_route_tokens(d)
 * tokens (f_e = routed[e] / N_group, P_e = psum[e] / N_group; a group sums
 * its ranks' routed and psum first). moe_z_loss: z of this microbatch. */
void moe_prob_sums(double *psum, const float *probs, const moe_dims *d);
float moe_balance_loss(const int32_t *routed, const double *psum,
                       const moe_dims *d);
float moe_z_loss(const float *lse, const moe_dims *d);

/* Backward of moe_route + moe_forward + the auxiliary losses, for
 *   loss = <dout, out> + daux * aux + dz * z
 * (daux, dz: the gradient of the training loss w.r.t. this layer's aux and
 * z values, i.e. their coefficients). f_e in aux counts tokens and has no
 * gradient (as in Switch); the gradient reaches the router through the
 * gate scaling of every processed pair, P_e and the z-loss. In a routing
 * group (N_group > N) routed is the group's and f_e its fraction; the
 * gradient is this microbatch's share, scaled as the microbatch's own
 * losses are (an average over the group's ranks gives the gradient of one
 * microbatch of N_group tokens).
 * Accumulates (+=) into dx (N,C), dwg (E,C), dbg (E) (may be NULL), dw1,
 * db1, dw2, db2 (shapes of the weights). An expert with no tokens gets no
 * contribution (an exact zero when the caller zeroed its gradient), and no
 * scratch row it did not write is read.
 * Scratch (overwritten; contents on entry never matter): dye (N*k,C), dh1
 * (N*k,H), dh2 (N*k,H), dxe (N*k,C), dlogits (N,E). The rest are the
 * forward's inputs and saved values. */
void moe_backward(float *dx, float *dwg, float *dbg, float *dw1, float *db1,
                  float *dw2, float *db2, float *dye, float *dh1, float *dh2,
                  float *dxe, float *dlogits, const float *dout, const float *x,
                  const float *probs, const float *lse, const int32_t *expert,
                  const int32_t *slot, const int32_t *routed,
                  const int32_t *offset, const float *xe, const float *hpre, const float *hact,
                  const float *ye, const float *wg, const float *w1,
                  const float *w2, float daux, float dz, const moe_dims *d);

/* The steps moe_forward and moe_backward are made of, for a layer whose
 * experts are spread over ranks (expert parallelism moves the dispatch
 * rows between the gather and the experts, and back before the combine).
 * Each step computes exactly what it does inside the two, in the same
 * order. */

/* The dispatch gather: row r of xe (R,C) = row row_token[r] of x. */
void moe_gather(float *xe, const float *x, const int32_t *row_token, int R,
                int C);

/* The MLPs of nE experts over their rows: expert e takes rows offset[e] ..
 * offset[e+1]-1 of xe (offset has nE+1 entries, offset[0] = 0); weights
 * w1 (nE,H,C), b1 (nE,H), w2 (nE,C,H), b2 (nE,C) of those experts. Writes
 * hpre, hact (rows,H) and ye (rows,C); an expert without rows is skipped. */
void moe_experts_forward(float *hpre, float *hact, float *ye, const float *xe,
                         const int32_t *offset, int nE, const float *w1,
                         const float *b1, const float *w2, const float *b2,
                         int C, int H);

/* out (N,C) = sum over p of probs[n, expert[n,p]] * ye[slot[n,p]] (0 for a
 * token dropped by every prototype). Overwrites out. */
void moe_combine(float *out, const float *ye, const float *probs,
                 const int32_t *expert, const int32_t *slot,
                 const moe_dims *d);

/* The combine's backward: dye[slot[n,p]] = gate * dout[n] for every
 * processed pair; dlogits (N,E) zeroed, then the gates' gradients
 * <dout[n], ye[slot]> added at (n, expert[n,p]) (d/dprobs, before the
 * softmax: moe_router_backward finishes it). */
void moe_combine_backward(float *dye, float *dlogits, const float *dout,
                          const float *ye, const float *probs,
                          const int32_t *expert, const int32_t *slot,
                          const moe_dims *d);

/* The experts' backward over their rows (as moe_experts_forward): dxe
 * (rows,C) and the scratch dh1, dh2 (rows,H) overwritten (rows
 * offset[nE]); accumulates (+=) into dw1, db1, dw2, db2 of those nE
 * experts; an expert without rows gets nothing. */
void moe_experts_backward(float *dxe, float *dh1, float *dh2, float *dw1,
                          float *db1, float *dw2, float *db2,
                          const float *dye, const float *xe,
                          const float *hpre, const float *hact,
                          const float *w1, const float *w2,
                          const int32_t *offset, int nE, int C, int H);

/* dx[n] += dxe[slot[n,p]] over the processed pairs, prototypes in order. */
void moe_scatter_add(float *dx, const float *dxe, const int32_t *slot,
                     const moe_dims *d);

/* The router's backward from moe_combine_backward's dlogits (finished in
 * place: the auxiliary and z losses' terms, then each prototype's
 * softmax): accumulates into dx (N,C), dwg (E,C), dbg (E) (may be NULL). */
void moe_router_backward(float *dx, float *dwg, float *dbg, float *dlogits,
                         const float *x, const float *probs, const float *lse,
                         const int32_t *routed, const float *wg, float daux,
                         float dz, const moe_dims *d);

/* ------------------------------------------------------------- GEMM library */

/* The precision of the CPU engine's GEMMs. GEMM_FP32: inputs as stored.
 * GEMM_BF16: both inputs (weights and activations) rounded to bf16
 * (gemm_bf16_round), products summed in fp32, fp32 out; every other op
 * (layernorm, softmax, GELU, loss, residual sums, AdamW and its state,
 * the master weights) stays fp32 whatever the precision, as on the CUDA
 * backend. The rule lives in kernels/cpu/gemm.c alone: the kernels call
 * one GEMM, which reads the setting below. */
typedef enum { GEMM_FP32 = 0, GEMM_BF16 = 1, GEMM_N_PRECISIONS } gemm_precision;

/* "fp32", "bf16" ("?" out of range): the names device.precision and the
 * logs use. */
const char *gemm_precision_name(gemm_precision p);

/* The precision of every CPU kernel's GEMMs, for the whole process
 * (OpenMP workers and nested regions included: one setting, not one per
 * thread). gemm_set_precision sets the one outside any pass (GEMM_FP32 at
 * start; for benchmarks and tests that call kernels directly) and returns
 * the previous one; set it between kernels, never while one runs.
 *
 * A pass (the CPU trainer's forward and backward, an evaluation) runs
 * between gemm_precision_enter(p) and gemm_precision_leave(): the GEMMs
 * are in p throughout, whatever other threads do. Passes in the same
 * precision may overlap (several ranks of one m6d, --devices N); one in
 * another precision waits in gemm_precision_enter until the last is out,
 * and after it the precision outside passes holds again. Ranks of one run
 * share its precision, so no rank waits on another's. */
gemm_precision gemm_set_precision(gemm_precision p);
gemm_precision gemm_get_precision(void);
void gemm_precision_enter(gemm_precision p);
void gemm_precision_leave(void);

/* x rounded to bf16 (8 significant bits; to nearest, ties to even; NaN
 * stays NaN, overflow gives infinity), returned as a float: the rounding
 * of GEMM inputs in GEMM_BF16. */
float gemm_bf16_round(float x);

/* What multiplies in the CPU kernels (kernels/cpu/gemm.c decides; every
 * GEMM of matmul, attention and the MoE experts goes through it). */
typedef struct {
    const char *library;  /* "onednn", or "loops" when built without one */
    char version[24];     /* the library's, "2.6.3"; "none" for loops */
    const char *isa;      /* the instruction set oneDNN dispatches to, in
                           * oneDNN's names ("avx2", "avx512_core",
                           * "avx512_core_bf16", ...); "none" for loops or
                           * oneDNN's reference (non-JIT) code */
    int bf16_native;      /* 1: the ISA has bf16 instructions
                           * (avx512_core_bf16 and up); 0: GEMM_BF16 is
                           * emulated with fp32 instructions (same values,
                           * slower) */
} gemm_info;

/* Fills *info; static strings, cheap, thread-safe. */
void gemm_describe(gemm_info *info);

/* Runs each GEMM shape class of the kernels (NN, NT, TN, with and without
 * accumulation, engine-sized and tail-heavy shapes, strided operands) on
 * the GEMM the kernels use in precision p, twice, against a
 * double-precision loop (on the inputs rounded to bf16 for GEMM_BF16):
 * every element within p's tolerance of its scale (sum over k of
 * |alpha a b| + |beta c|; GEMM_TOL_F32 and GEMM_TOL_BF16 in gemm.c say
 * how they were chosen) and the two runs bitwise equal. 0, or -1 with why (what failed, the
 * library, its version and ISA). Takes tens of milliseconds (40 measured
 * on a loaded 2-core machine; 170 for a process's first call, which also
 * JIT-compiles oneDNN's kernels); runs an OpenMP region. */
int gemm_selfcheck(gemm_precision p, char *why, size_t len);

/* gemm_selfcheck's verdict for precision p, run once per process and
 * precision (thread-safe): 0 when the CPU engine may train in p, -1 with
 * why when it must refuse. */
int gemm_ready(gemm_precision p, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* M6_KERNELS_H */
