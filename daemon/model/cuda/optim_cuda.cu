/*
 * optim_cuda.cu — the CUDA model's optimizer state beyond AdamW: which
 * state a model keeps (gpt_cuda_create_optim), how its block is laid out,
 * and Adafactor's step (gpt_cuda_adafactor) over the device block.
 *
 * Adafactor keeps the CPU model's tensors and state layout (gpt.h
 * gpt_af_tensors owns both): v is the af layout, the globals' statistics
 * then each resident slot's, so that state moves between the two models
 * (checkpoints, the trainer's state regions) as one contiguous copy. Only
 * where the parameters lie differs: the globals' tensors at the device
 * layout's offsets (wte with Vp rows, of which the af tensor covers the
 * V real ones; the padded rows keep zero weights and are not updated).
 * The update of each tensor is kernels/cuda/adafactor.cu's.
 *
 * bf16 master weights (g->mbf) keep no fp32 copy: the block is m | v and
 * the bf16 params are the masters (kernels/cuda/adamw.cu and adafactor.cu
 * round them stochastically with the CPU model's keys).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* The Adafactor tensors of the device block: for each, where its
 * parameters and statistics lie and which step count it uses. */
typedef struct {
    size_t off;         /* element of the device parameter block */
    size_t v_off;       /* element of v (the af layout) */
    uint64_t sr_key;    /* bf16 masters: the CPU model's key, else 0 */
    int rows, cols, decay;
    int region;         /* 0 the globals, 1 + s resident slot s */
} af_tensor_;

struct af_plan_ {
    af_tensor_ *ts;
    int nt, n_res;
};

/* ------------------------------------------------------------- layout */

size_t gpt_cuda_af_off_(const gpt_cuda *g, const unsigned char *moe, int s)
{
    size_t n = g->af_glob;
    for (int k = 0; k < s; k++)
        n += g->af_kind[moe[k]];
    return n;
}

size_t gpt_cuda_opt_layout_(const gpt_cuda *g, float *opt, size_t n,
                            int n_res, const unsigned char *moe, float **m,
                            float **v)
{
    size_t nw = g->mbf ? 0 : n; /* bf16 masters: params are they */
    size_t nm = !g->af || g->af_m ? n : 0;
    size_t nv = g->af ? gpt_cuda_af_off_(g, moe, n_res) : n;
    if (m)
        *m = opt && nm ? opt + nw : NULL;
    if (v)
        *v = opt ? opt + nw + nm : NULL;
    return nw + nm + nv;
}

float *gpt_cuda_opt_master_(const gpt_cuda *g, float *opt)
{
    return g->mbf ? NULL : opt;
}

uint64_t gpt_cuda_sr_key_(const gpt_cuda *g, int region, size_t off)
{
    return g->mbf ? sr_span_key(g->sr_seed, region, off) : 0;
}

size_t gpt_cuda_state_offset(const gpt_cuda *g, int which, int s)
{
    if (which == 2 && g->af)
        return gpt_cuda_af_off_(g, g->slot_moe, s);
    if (which == 1 && g->af && !g->af_m)
        return 0;
    return g->n_global_cpu + g->slot_off[s];
}

/* ------------------------------------------------------------- setup */

int gpt_cuda_optim_init_(gpt_cuda *g, const gpt_optim *o,
                         const gpt_cuda_offload *off)
{
    if (o && o->master_bf16) {
        g->mbf = 1;
        g->sr_seed = o->sr_seed;
    }
    if (!o || !o->adafactor)
        return 0;
    /* offloaded slots: host Adafactor (gpt_cuda_offload.cu), no
     * speculation (gpt_offload_init refuses it) */
    g->af = 1;
    g->af_m = o->first_moment != 0;
    /* the scratch of the largest tensor serves every one */
    size_t most = 0;
    for (int region = -1; region <= (g->cfg.moe_experts > 0); region++) {
        int nt = gpt_af_tensors(&g->cfg, region, NULL, NULL);
        gpt_af_tensor *ts = nt > 0 ? (gpt_af_tensor *)malloc(
                                         (size_t)nt * sizeof *ts)
                                   : NULL;
        size_t *state = region < 0 ? &g->af_glob : &g->af_kind[region];
        if (!ts) {
            fprintf(stderr, "gpt_cuda_create: out of host memory\n");
            return -1;
        }
        gpt_af_tensors(&g->cfg, region, ts, state);
        for (int i = 0; i < nt; i++) {
            size_t n = (size_t)ts[i].rows * (ts[i].cols ? ts[i].cols : 1);
            most = n > most ? n : most;
        }
        free(ts);
    }
    if (g->cfg.moe_experts == 0)
        g->af_kind[1] = g->af_kind[0];
    size_t bytes = adafactor_scratch_doubles(most) * sizeof(double);
    if (cudaMalloc((void **)&g->af_scratch, bytes) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky */
        g->af_scratch = NULL;
        fprintf(stderr, "gpt_cuda_create: out of device memory for "
                        "Adafactor's scratch (%zu bytes)\n", bytes);
        return -1;
    }
    return 0;
}

void gpt_cuda_optim_drop_plan_(gpt_cuda *g)
{
    if (!g->af_plan)
        return;
    free(g->af_plan->ts);
    free(g->af_plan);
    g->af_plan = NULL;
}

void gpt_cuda_optim_fini_(gpt_cuda *g)
{
    gpt_cuda_optim_drop_plan_(g);
    if (g->af_scratch)
        CUDA_CHECK(cudaFree(g->af_scratch));
    g->af_scratch = NULL;
}

/* The plan of the current state: the globals' af tensors at the device
 * layout's offsets (tensor i of the globals is glob[i]), then each
 * resident slot's at its place (the slot layouts are gpt.h's). NULL out
 * of host memory (a message). */
static struct af_plan_ *af_plan_(gpt_cuda *g)
{
    if (g->af_plan && g->af_plan->n_res == g->n_res)
        return g->af_plan;
    gpt_cuda_optim_drop_plan_(g);
    int nk[3];
    gpt_af_tensor *tab[3] = {NULL, NULL, NULL};
    struct af_plan_ *p = (struct af_plan_ *)calloc(1, sizeof *p);
    for (int k = 0; k < 3; k++) {
        int region = k == 0 ? -1 : k == 1 ? 0 : g->cfg.moe_experts > 0;
        nk[k] = gpt_af_tensors(&g->cfg, region, NULL, NULL);
        tab[k] = nk[k] > 0 ? (gpt_af_tensor *)malloc((size_t)nk[k] *
                                                     sizeof *tab[k])
                           : NULL;
        if (tab[k])
            gpt_af_tensors(&g->cfg, region, tab[k], NULL);
    }
    int nt = nk[0];
    for (int s = 0; s < g->n_res; s++)
        nt += nk[1 + g->slot_moe[s]];
    if (p)
        p->ts = (af_tensor_ *)malloc((size_t)nt * sizeof *p->ts);
    if (!p || !p->ts || !tab[0] || !tab[1] || !tab[2]) {
        fprintf(stderr, "gpt_cuda_adafactor: out of host memory\n");
        for (int k = 0; k < 3; k++)
            free(tab[k]);
        if (p)
            free(p->ts);
        free(p);
        return NULL;
    }
    int n = 0;
    for (int r = 0; r <= g->n_res; r++) {
        int k = r ? 1 + g->slot_moe[r - 1] : 0;
        size_t base = r ? g->n_global + g->slot_off[r - 1] : 0;
        size_t vbase = r ? gpt_cuda_af_off_(g, g->slot_moe, r - 1) : 0;
        for (int i = 0; i < nk[k]; i++, n++) {
            const gpt_af_tensor *a = &tab[k][i];
            p->ts[n] = (af_tensor_){r ? base + a->offset : g->glob[i].off,
                                    vbase + a->state_off,
                                    gpt_cuda_sr_key_(g, r - 1, a->offset),
                                    a->rows, a->cols, a->decay, r};
        }
    }
    for (int k = 0; k < 3; k++)
        free(tab[k]);
    p->nt = nt;
    p->n_res = g->n_res;
    g->af_plan = p;
    return p;
}

/* ------------------------------------------------------------- step */

int gpt_cuda_adafactor(gpt_cuda *g, const struct adafactor_hparams *h,
                       float weight_decay, float max_norm)
{
    if (!g->af) {
        fprintf(stderr, "gpt_cuda_adafactor: the model keeps AdamW's state "
                        "(made without Adafactor); nothing updated\n");
        return -1;
    }
    gpt_cuda_flush_(g);
    struct af_plan_ *p = af_plan_(g);
    if (!p)
        return -1;
    /* the norm as gpt_cuda_adamw (the offloaded slots' part from the
     * host), the clip scale from it on the device */
    float *red = g->a.red, *sc = red + grad_sumsq_scratch_floats();
    float host_scale = gpt_cuda_norm_sumsq_(g, max_norm);
    grad_clip_scale_cuda(sc + RED_SCALE, sc + RED_SUMSQ, max_norm, g->stream);
    adafactor_hparams_cuda hc = {h->lr, h->beta1, h->clip_threshold, h->eps1,
                                 h->eps2, h->scale_parameter};
    float *r_at = g->v;
    for (int k = 0; k < p->nt; k++) {
        const af_tensor_ *t = &p->ts[k];
        long step = (t->region ? g->adam_t_slot[t->region - 1]
                               : g->adam_t_global) + 1;
        float *r = r_at + t->v_off;
        adafactor_tensor_step_cuda x = {
            g->master ? g->master + t->off : NULL, g->params + t->off,
            g->grads + t->off, g->m ? g->m + t->off : NULL, r,
            t->cols ? r + t->rows : NULL, t->rows, t->cols,
            adafactor_beta2(step, h->decay_rate),
            t->decay ? weight_decay : 0.0f, t->sr_key, step};
        adafactor_update_cuda(&x, &hc, sc + RED_SCALE, g->af_scratch,
                              g->stream);
    }
    g->adam_t_global++;
    for (int s = 0; s < g->n_res; s++)
        g->adam_t_slot[s]++;
    if (g->n_res < g->S)
        gpt_offload_adafactor(g, h, weight_decay, host_scale);
    return 0;
}
