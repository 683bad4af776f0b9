/*
 * moe_cuda.cu — the CUDA model's MoE block (gpt.h "MoE blocks"): the
 * dims of a microbatch at the pass's capacity, each MoE layer's saved
 * tensors, the block's forward (route, experts, aux and z losses) and
 * backward on the ops of kernels/cuda/moe.cu, and the router figures
 * (gpt_cuda_moe_facts, gpt_cuda_moe_counts). Called from gpt_cuda.cu's
 * layer forward and backward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* ------------------------------------------------------------- MoE */

/* The MoE dims of a microbatch of B sequences at the pass's capacity. */
static moe_dims moe_dims_(const gpt_cuda *g, int B)
{
    const model_config *c = &g->cfg;
    moe_dims d = {B * g->T, c->n_embd, c->moe_experts, c->moe_prototypes,
                  model_moe_hidden(c), 0, 0};
    double cf = g->moe_eval ? c->moe_eval_capacity_factor
                            : c->moe_capacity_factor;
    d.capacity = moe_capacity(cf, d.N, d.E, d.k);
    return d;
}

/* Layer l's MoE tensors (strides: the allocated B and rows). */
typedef struct {
    float *probs, *lse, *aux;
    int32_t *expert, *slot, *counts, *routed, *row_token, *dropped;
    bf16 *xe, *hpre, *hact, *ye;
} moe_saved_;

static moe_saved_ moe_saved_of_(const gpt_cuda *g, int layer)
{
    const acts_ *a = &g->a;
    /* the block's entry among the MoE blocks */
    size_t l = (size_t)gpt_cuda_moe_index(&g->cfg, layer);
    size_t N = (size_t)g->B * g->T, E = (size_t)g->cfg.moe_experts;
    size_t K = (size_t)g->cfg.moe_prototypes, C = (size_t)g->cfg.n_embd;
    size_t H = (size_t)model_moe_hidden(&g->cfg), R = a->moe_rows;
    return (moe_saved_){
        a->moe_probs + l * N * E, a->moe_lse + l * N * K, a->moe_aux + 2 * l,
        a->moe_expert + l * N * K, a->moe_slot + l * N * K,
        a->moe_counts + l * E, a->moe_routed + l * E,
        a->moe_row_token + l * R, a->moe_dropped + l,
        a->moe_xe + l * R * C, a->moe_hpre + l * R * H,
        a->moe_hact + l * R * H, a->moe_ye + l * R * C};
}

/* MoE block l forward: out (B*T,C) = the experts' combined output for x;
 * the layer's aux and z losses and dropped count left on the device. */
void gpt_cuda_moe_layer_forward_(gpt_cuda *g, int l, const bf16 *w,
                               const bf16 *x, bf16 *out, int B)
{
    moe_dims d = moe_dims_(g, B);
    g->moe_cap = d.capacity;
    g->moe_B = B;
    moe_saved_ m = moe_saved_of_(g, l);
    cudaStream_t st = g->stream;
    moe_route_cuda(m.probs, m.lse, m.expert, m.slot, m.counts, m.routed,
                   m.row_token, m.dropped, x, w + g->slot[SLOT_GATE_W].off,
                   w + g->slot[SLOT_GATE_B].off, &d, st);
    moe_forward_cuda(out, m.xe, m.hpre, m.hact, m.ye, x, m.probs, m.expert,
                     m.slot, m.row_token, w + g->slot[SLOT_FC_W].off,
                     w + g->slot[SLOT_FC_B].off, w + g->slot[SLOT_FCPROJ_W].off,
                     w + g->slot[SLOT_FCPROJ_B].off, &d, st);
    moe_aux_losses_cuda(m.aux, m.probs, m.lse, m.routed, &d, st);
}

/* MoE block l backward: d(x) into a->dln (written) from d(out) in
 * a->dres; the experts' and gate's gradients accumulate at dw. */
void gpt_cuda_moe_layer_backward_(gpt_cuda *g, int l, const bf16 *w, bf16 *dw,
                                const bf16 *x, int B)
{
    moe_dims d = moe_dims_(g, B);
    d.capacity = g->moe_cap;  /* that of the forward */
    moe_saved_ m = moe_saved_of_(g, l);
    const moe_saved_cuda sv = {m.probs, m.lse, m.expert, m.slot, m.routed,
                               m.row_token, m.xe, m.hpre, m.hact, m.ye};
    acts_ *a = &g->a;
    cudaStream_t st = g->stream;
    moe_backward_first_cuda(a->dln, dw + g->slot[SLOT_GATE_W].off,
                      dw + g->slot[SLOT_GATE_B].off,
                      dw + g->slot[SLOT_FC_W].off, dw + g->slot[SLOT_FC_B].off,
                      dw + g->slot[SLOT_FCPROJ_W].off,
                      dw + g->slot[SLOT_FCPROJ_B].off, a->moe_scratch,
                      a->dres, x, &sv, w + g->slot[SLOT_GATE_W].off, w + g->slot[SLOT_FC_W].off,
                      w + g->slot[SLOT_FCPROJ_W].off, g->moe_daux, g->moe_dz,
                      &d, st);
}

void gpt_cuda_set_moe_eval(gpt_cuda *g, int eval) { g->moe_eval = eval != 0; }

int gpt_cuda_moe_facts(gpt_cuda *g, double *aux_sum, double *z_sum,
                       long *dropped)
{
    int L = g->n_moe_layers; /* the MoE blocks' entries */
    if (g->cfg.moe_experts == 0)
        return -1;
    float *aux = (float *)malloc(2 * (size_t)L * sizeof(float));
    int32_t *dr = (int32_t *)malloc((size_t)L * sizeof(int32_t));
    if (!aux || !dr) {
        free(aux);
        free(dr);
        return -1;
    }
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(aux, g->a.moe_aux, 2 * (size_t)L * sizeof(float),
                          cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(dr, g->a.moe_dropped, (size_t)L * sizeof(int32_t),
                          cudaMemcpyDeviceToHost));
    *aux_sum = *z_sum = 0;
    *dropped = 0;
    for (int l = 0; l < L; l++) {
        *aux_sum += aux[2 * l];
        *z_sum += aux[2 * l + 1];
        *dropped += dr[l];
    }
    free(aux);
    free(dr);
    return 0;
}

int gpt_cuda_moe_counts(gpt_cuda *g, int32_t *counts)
{
    if (g->cfg.moe_experts == 0)
        return -1;
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(counts, g->a.moe_counts,
                          (size_t)g->n_moe_layers * g->cfg.moe_experts *
                              sizeof(int32_t),
                          cudaMemcpyDeviceToHost));
    return 0;
}
