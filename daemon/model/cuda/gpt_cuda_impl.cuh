/*
 * gpt_cuda_impl.cuh — internal to the CUDA model: the gpt_cuda struct and
 * the helpers its files call in one another: gpt_cuda.cu (layout, memory,
 * passes, optimizer), moe_cuda.cu (the MoE block), graphs_cuda.cu (the
 * step queue, CUDA graphs), state_cuda.cu (state in and out, reslot).
 * The offload runtime (daemon/offload/cuda/gpt_cuda_offload.cu) sees the
 * struct too; the model sees the runtime only through gpt_offload.h.
 * Not part of the C interface.
 */
#ifndef M6_GPT_CUDA_IMPL_CUH
#define M6_GPT_CUDA_IMPL_CUH

#include <pthread.h>
#include <string.h>
#include <stdint.h>
#include "common.cuh"
#include "model/cuda/gpt_cuda.h"
#include "model/gpt.h"
#include "model/cuda/act_layout.h"
#include "kernels.h"       /* adafactor_hparams: a host Adafactor job's */
#include "offload_host.h"  /* the host jobs' loops; bf16 bits <-> fp32 */

#define PAD 16      /* elements: region padding, as gpt.c */
#define VPAD GPT_CUDA_VPAD  /* vocabulary padding (act_layout.h) */

/* Tensor indices (SLOT_*, GLOB_*): the CPU model's, so that the two
 * layouts agree by construction (state moves between them slot by slot). */

typedef struct tensor_ {
    size_t off, numel;
    int two_d;          /* weight decay applies; random init */
} tensor_;

/* Activations (bf16 unless marked f32), per-layer ones (L, B, T, ...) */
typedef struct {
    bf16 *encoded;                      /* (B,T,C) */
    bf16 *ln1, *qkv, *atty, *res2;      /* (L,B,T,C|3C|C|C) */
    bf16 *ln2, *fch, *fchg, *res3;      /* (L,B,T,C|4C|4C|C) */
    bf16 *lnf;                          /* (B,T,C) */
    bf16 *logits;                       /* (B,T,Vp); dlogits in place */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  /* f32 (L,B,T) */
    float *lnf_mean, *lnf_rstd;         /* f32 (B,T) */
    float *lse;                         /* f32 (L,B,NH,T) */
    float *losses, *dlosses;            /* f32 (B,T) */
    bf16 *dres, *dln, *datty, *dlnf;    /* (B,T,C) */
    bf16 *dqkv;                         /* (B,T,3C) */
    bf16 *dfch, *dfchg;                 /* (B,T,4C); dfchg 0 bytes, unused
                                         * (matmul_backward_dgelu_first) */
    float *scratch;                     /* f32 op workspace */
    void *att_ws;                       /* attention_gemm workspace, or
                                         * NULL: the flash kernels */
    size_t att_ws_bytes;
    float *red;                         /* f32 sumsq partials + scalars */
    int32_t *inp, *tgt, *plan;          /* (B,T), (B,T), encoder plan */
    /* MoE blocks (kernels_cuda.h "mixture of experts"; sizes 0 for a
     * dense model, and fch, fchg, dfch, dfchg 0 for an MoE one). Per
     * layer l, N = B*T tokens and R = E * the largest capacity rows: */
    float *moe_probs, *moe_lse;         /* f32 (L,N,E), (L,N,k) */
    int32_t *moe_expert, *moe_slot;     /* (L,N,k) */
    int32_t *moe_counts, *moe_routed;   /* (L,E) */
    int32_t *moe_row_token;             /* (L,R) */
    int32_t *moe_dropped;               /* (L) */
    bf16 *moe_xe, *moe_hpre, *moe_hact, *moe_ye;  /* (L,R,C|H|H|C) */
    void *moe_scratch;                  /* moe_backward_cuda's, one layer */
    float *moe_aux;                     /* f32 (L,2): aux, z */
    size_t moe_rows;                    /* R: per-layer row stride */
} acts_;

/* scalars at the end of red */
enum { RED_LOSS, RED_SUMSQ, RED_SCALE, RED_NSCALARS };

/* ------------------------------------------------------------ offloading */

/* One offloaded slot on the host (n elements each: its kind's size). */
typedef struct {
    size_t n;                      /* elements of the slot (its kind's) */
    int kind;                      /* 0 dense, 1 MoE (g->kind[kind]) */
    const struct tensor_ *ts;      /* its kind's tensors (g->kind[]) */
    int nt;                        /* how many */
    float *master, *m, *v, *gacc;  /* one pageable block: master|m|v|gacc;
                                    * master NULL with bf16 masters (wbf is
                                    * it), m NULL with Adafactor without a
                                    * first moment, v Adafactor's af layout
                                    * (af_kind floats, rounded up to 16),
                                    * gacc NULL with streamed gradients */
    uint16_t *wbf, *gbf;           /* bf16 bits: working copy | landing
                                    * (streamed: a pool buffer while the
                                    * slot holds one, else NULL) */
    int pinned;                    /* wbf/gbf from cudaHostAlloc */
    int accum_jobs, adam_jobs;     /* host jobs queued or running */
    int touched;                   /* this step's gradient has landed */
    int g_in_bf;                   /* ... only in gbf (its one drain: gacc
                                    * not written; gbf held until AdamW) */
    int sumsq_done;                /* ssq is of the final gradient */
    int updated;                   /* AdamW queued this step (early) */
    int pending;                   /* an early update waits for the slot's
                                    * whole gradient (counted in adam_jobs
                                    * until queued or skipped) */
    int gbf_release;               /* streamed: give gbf back when the
                                    * update queued on it is done */
    double *ssq;                   /* [chunks] per-chunk sums of squares */
    /* the allocations (master/m/v and wbf swap between them) and the
     * speculative update's second buffers (offload.speculative) */
    float *blk;                    /* master|m|v|gacc as allocated */
    float *alt;                    /* second master|m|v, or NULL */
    float *master2, *m2, *v2;      /* the second buffers now */
    uint16_t *pin, *pin2;          /* wbf|gbf as allocated; second wbf */
    uint16_t *wbf2;                /* the second bf16 copy now */
    int pinned2;                   /* pin2 from cudaHostAlloc */
    int spec;                      /* speculative AdamW queued this step,
                                    * not yet kept or redone */
    long spec_t;                   /* adam_t_slot before it */
    cudaEvent_t d2h_start, drained;
} hslot_;

/* A staging buffer on the device and the events of its last use. */
typedef struct {
    bf16 *w, *dw;                  /* slot_size each (while staging_on) */
    cudaEvent_t freed;             /* compute stream: last kernel done */
    cudaEvent_t drained;           /* drain stream: gradient copied out */
} stage_;

/* An interval of the current pass (positions inclusive). */
typedef struct {
    int slot, first, last, has_bwd, final;
} piv_;

/* Event timing of one fetch and of the compute stream's wait for it, read
 * back later (ring) so the host never blocks on them. */
typedef struct {
    cudaEvent_t h2d_a, h2d_b, wait_a, wait_b;
    int wait;                      /* wait_a/b recorded */
} timing_;
#define TIMING_RING 256

enum { JOB_ACCUM, JOB_ADAM, JOB_SUMSQ, JOB_TO_BF16, JOB_ADAFACTOR };
typedef struct {
    int kind, slot;
    size_t i0, i1;                 /* element range of the slot */
    int first;                     /* ACCUM: gacc = grad (else +=) */
    int final;                     /* ACCUM: then sumsq of the range */
    int adam;                      /* ACCUM: then AdamW of the range */
    int from_bf;                   /* the gradient is gbf's, not gacc's
                                    * (ACCUM: first and final, so gacc is
                                    * not written) */
    float lr, beta1, beta2, eps, wd, scale;
    long t;
    int spec;                      /* ADAM / ACCUM+adam: write the second
                                    * buffers (speculative) */
    adafactor_hparams af;          /* ADAFACTOR (a whole slot: i0 0, i1 n;
                                    * grad_scale the clip) */
} hjob_;

typedef struct {
    int enabled;                   /* made by gpt_cuda_create_offload */
    int n_staging, n_threads;
    int device;                    /* CUDA device of the model */
    hslot_ *hs;                    /* [S - n_res]: slot n_res + i */
    stage_ *stg;                   /* [n_staging] */
    cudaStream_t copy, drain;      /* fetches; gradient drains */
    int staging_on;                /* staging buffers allocated */
    size_t chunk;                  /* elements per host job */
    /* the current pass */
    piv_ *iv;                      /* [2L] */
    int *at_pos;                   /* [2L] interval of a position or -1 */
    int n_iv, next_fetch;          /* intervals; the next to fetch */
    int n_left;                    /* intervals issued to their end */
    /* this step */
    int early;                     /* no clipping: update when final */
    int speculative;               /* second buffers made (the plan) */
    int speculate;                 /* this step: clipped, speculative */
    uint64_t spec_steps, redo_steps, spec_restores;
    size_t spec_bytes, spec_pinned_bytes;
    float lr, beta1, beta2, eps, wd;
    int af_early;                  /* early updates are Adafactor's: */
    adafactor_hparams af_h;        /* ... these (grad_scale 1) */
    /* host threads */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    hjob_ *q;
    int q_head, q_n, q_cap, running, quit;
    pthread_t *th;
    /* statistics */
    timing_ ring[TIMING_RING];
    long ring_n;                   /* records made; ring_read: read */
    long ring_read;
    long ring_base;                /* ring_n when the pass began */
    uint64_t h2d_bytes, d2h_bytes;
    double h2d_ms, d2h_ms, stall_ms, accum_s, adam_s;
    size_t pinned_bytes, host_bytes;
    int warned_pin;
    /* streamed gradients (gpt_cuda_offload.n_grad_bufs > 0): the landing
     * buffers, slot_size bf16 each, a slot holding one from its drain to
     * the end of its update */
    int n_gbufs;
    uint16_t *gpool;               /* n_gbufs * slot_size, as allocated */
    int gpool_pinned;
    uint16_t **gfree;              /* [n_gbufs] the free ones */
    int n_gfree;
    int gbuf_peak;                 /* most out at once */
    uint64_t skips;                /* early updates skipped: the slot's
                                    * gradient not finite */
} offload_rt_;

/* The pinned staging of a step's k-th queued microbatch: its tokens,
 * targets and encoder plan (B * T, B * T, encoder_plan_ints(B * T) ints)
 * and its mean loss, in one page-locked block starting at inp. */
typedef struct {
    int32_t *inp, *tgt, *plan;
    float *loss;
    cudaEvent_t done;               /* recorded after the microbatch */
    int B, nseg;                    /* as staged */
    float loss_scale;
} mb_stage_;

/* A step's CUDA graph (issue 18, item 4; gpt_cuda.cu "CUDA graphs"):
 * A, the zeroing of the gradients and microbatches [0, n) of the shapes
 * and loss scales B[k], scale[k] it was captured with; B, the optimizer
 * (sum of squares and the multi-tensor AdamW, its values from d_args). */
typedef struct {
    cudaGraphExec_t exec;           /* NULL: none captured */
    int n;                          /* A: microbatches */
    int *B;                         /* A: [n] */
    float *scale;                   /* A: [n] */
} step_graph_;

struct gpt_cuda {
    model_config cfg;
    int S, Vp, B, T;
    int n_res;                          /* slots [0, n_res) on the device */
    int *slot_of;                       /* [L] */
    size_t n_global, slot_size, n_params, n_global_cpu;
    tensor_ glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    int slot_nt;                        /* tensors per slot: SLOT_NTENSORS,
                                         * or SLOT_NTENSORS_MAX with MoE */
    /* slot and slot_size above are the largest kind's (MoE when E > 0),
     * what a staging buffer holds; a mixed model (model.moe.every > 1)
     * has dense slots too, smaller: each slot's kind and place below */
    tensor_ kind[2][SLOT_NTENSORS_MAX]; /* [0] dense, [1] MoE slot */
    size_t kind_size[2];                /* their padded sizes */
    int kind_nt[2];                     /* their tensor counts */
    unsigned char *slot_moe;            /* [S] kind of slot s (1 MoE) */
    size_t *slot_off;                   /* [S+1] elements from the first
                                         * slot to slot s: the same in the
                                         * device block (s < n_res) and in
                                         * gpt.h's plain layout */
    /* MoE (cfg.moe_experts > 0; every model.moe.every-th block) */
    int n_moe_layers;                   /* blocks with experts */
    int moe_eval;                       /* forward at eval_capacity_factor */
    int moe_cap;                        /* capacity of the last forward */
    int moe_B;                          /* its microbatch */
    float moe_daux, moe_dz;             /* this backward's loss weights */
    bf16 *params, *grads;               /* (n_params) each: device part */
    float *gradf;                       /* data parallelism: fp32 copy of
                                         * grads (gradf_n floats), or NULL
                                         * (gpt_cuda_grads_f32) */
    size_t gradf_n;
    float *opt, *master, *m, *v;        /* opt = master | m | v */
    long adam_t_global, *adam_t_slot;   /* [S] */
    struct adamw_multi_plan *mt;        /* multi-tensor AdamW of the device
                                         * block, or NULL until the first
                                         * step; for mt_nres slots */
    int mt_nres;
    long *mt_t;                         /* [1 + mt_nres] its step counts */
    /* the optimizer (gpt_cuda_create_optim): AdamW, or Adafactor (af),
     * with its first moment (af_m) or without (m NULL). Adafactor's v is
     * gpt.h's af layout (gpt_af_tensors): af_glob floats of the globals,
     * then af_kind[kind] floats per resident slot (optim_cuda.cu) */
    int af, af_m;
    size_t af_glob, af_kind[2];
    /* bf16 master weights (optimizer.master bf16): params ARE the masters
     * (master NULL, opt = m | v), AdamW rounds each update stochastically
     * keyed by sr_seed (kernels/sround.h, the CPU model's keys) */
    int mbf;
    uint64_t sr_seed;
    struct af_plan_ *af_plan;           /* its tensors on the device block,
                                         * or NULL until the next step */
    double *af_scratch;                 /* adafactor_update_cuda's */
    acts_ a;
    void *act_mem;
    size_t act_bytes;
    int att_flash;                      /* cuBLASLt refused the attention
                                         * GEMMs: the flash kernels */
    int epi_fallback;                   /* epilogues on own kernels (0-4) */
    int32_t *h_inp, *h_tgt, *h_plan;    /* pinned staging */
    float *h_out;                       /* pinned: loss, sumsq, total */
    float *h_loss;                      /* where head_forward_ copies the
                                         * loss: h_out, or a microbatch's
                                         * stage_ */
    /* queued microbatches (gpt_cuda_queue_microbatch): microbatch k of a
     * step stages its tokens, plan and loss in mb[k] (pinned, one block
     * each, made at the first step that has a k-th), so that none waits
     * for the one before; n_mb made, mb_k queued since the step began */
    mb_stage_ *mb;
    int n_mb, mb_k;
    int nseg;
    /* CUDA graphs (gpt_cuda_set_graphs): graphs wanted; a capture failed
     * (the queued path from then on); this step runs through them
     * (decided at its zero_grad); its zeroing and microbatches
     * [mb_q, mb_k) staged on the host and not queued yet */
    int graphs, graph_failed, step_graph, zero_defer, mb_q;
    step_graph_ ga, gb;
    float *h_args, *d_args;         /* gb's values: pinned, device */
    size_t n_args;
    cudaEvent_t args_done;          /* gb's copy of h_args done */
    long graph_captures;
    cudaStream_t stream;
    offload_rt_ off;
};

/* ---- layout (gpt_cuda.cu; the offload mock test lays out slots alike) */

static inline void tensor_at_(tensor_ *t, size_t *off, size_t rows,
                              size_t cols)
{
    t->off = *off;
    t->numel = rows * (cols ? cols : 1);
    t->two_d = cols != 0;
    *off += t->numel;
}

/* The tensors of a slot of each kind, as gpt.h orders them: sets
 * g->kind[], kind_size[] (padded to PAD), kind_nt[], and g->slot[],
 * slot_size and slot_nt as the largest kind's (MoE when E > 0), and
 * returns that kind's unpadded element count. */
static inline size_t slot_layout_(gpt_cuda *g)
{
    size_t C = g->cfg.n_embd, off = 0;
    tensor_at_(&g->slot[SLOT_LN1_W], &off, C, 0);
    tensor_at_(&g->slot[SLOT_LN1_B], &off, C, 0);
    tensor_at_(&g->slot[SLOT_QKV_W], &off, 3 * C, C);
    tensor_at_(&g->slot[SLOT_QKV_B], &off, 3 * C, 0);
    tensor_at_(&g->slot[SLOT_ATTPROJ_W], &off, C, C);
    tensor_at_(&g->slot[SLOT_ATTPROJ_B], &off, C, 0);
    tensor_at_(&g->slot[SLOT_LN2_W], &off, C, 0);
    tensor_at_(&g->slot[SLOT_LN2_B], &off, C, 0);
    size_t E = g->cfg.moe_experts, att = off, used = 0;
    for (int k = 0; k < 2; k++) {
        tensor_ *t = g->kind[k];
        off = att;
        memcpy(t, g->slot, (SLOT_LN2_B + 1) * sizeof(tensor_));
        memset(&t[SLOT_GATE_W], 0, 2 * sizeof(tensor_));
        if (k == 0 || E == 0) {
            tensor_at_(&t[SLOT_FC_W], &off, 4 * C, C);
            tensor_at_(&t[SLOT_FC_B], &off, 4 * C, 0);
            tensor_at_(&t[SLOT_FCPROJ_W], &off, C, 4 * C);
            tensor_at_(&t[SLOT_FCPROJ_B], &off, C, 0);
            g->kind_nt[k] = SLOT_NTENSORS;
        } else {
            /* the experts and the gate, as gpt.h's MoE slot */
            size_t H = (size_t)model_moe_hidden(&g->cfg);
            tensor_at_(&t[SLOT_FC_W], &off, E * H, C);
            tensor_at_(&t[SLOT_FC_B], &off, E * H, 0);
            tensor_at_(&t[SLOT_FCPROJ_W], &off, E * C, H);
            tensor_at_(&t[SLOT_FCPROJ_B], &off, E * C, 0);
            tensor_at_(&t[SLOT_GATE_W], &off, E, C);
            tensor_at_(&t[SLOT_GATE_B], &off, E, 0);
            g->kind_nt[k] = SLOT_NTENSORS_MAX;
        }
        g->kind_size[k] = (off + PAD - 1) / PAD * PAD;
        if (k == (E > 0))
            used = off;
    }
    /* the largest kind: MoE when there are experts */
    int big = E > 0;
    memcpy(g->slot, g->kind[big], sizeof g->slot);
    g->slot_nt = g->kind_nt[big];
    g->slot_size = g->kind_size[big];
    return used;
}

/* Slot s's size, tensors and tensor count under the current state. */
static inline size_t slot_n_(const gpt_cuda *g, int s)
{
    return g->slot_off[s + 1] - g->slot_off[s];
}
static inline const tensor_ *slot_ts_(const gpt_cuda *g, int s)
{
    return g->kind[g->slot_moe[s]];
}

/* ---- shared by the model's files */

/* n rounded up to the region padding PAD (elements). */
static inline size_t pad_(size_t n) { return (n + PAD - 1) / PAD * PAD; }

/* Global tensor i of the device block (GW_) and of its gradient (GDW_). */
#define GW_(g, i) ((g)->params + (g)->glob[i].off)
#define GDW_(g, i) ((g)->grads + (g)->glob[i].off)

/* gpt_cuda.cu: memory. Each slot's kind under share map slot_of (S slots)
 * into *moe and its place into *off ([S+1]; malloc'd both): 0, or -1 with
 * a message. */
int gpt_cuda_slot_places_(const gpt_cuda *g, int S, const int *slot_of,
                          unsigned char **moe, size_t **off);
/* Device state for the globals and n_res resident slots placed by off
 * (of kinds moe), step counts for S: 0, or -1 out of device memory (nothing allocated). */
int gpt_cuda_alloc_state_(gpt_cuda *g, int S, int n_res, const size_t *off,
                          const unsigned char *moe, bf16 **params,
                          bf16 **grads, float **opt, long **t_slot);
/* A whole state for share map places moe, off (gpt_cuda_slot_places_):
 * host slots for [n_res, S) into *hs (gpt_offload_alloc_slots) and the
 * device state (gpt_cuda_alloc_state_). 0; or -1 with nothing allocated
 * and moe, off freed. */
int gpt_cuda_alloc_placed_(gpt_cuda *g, int S, int n_res, unsigned char *moe,
                           size_t *off, bf16 **params, bf16 **grads,
                           float **opt, long **t_slot, hslot_ **hs);
/* Make the state allocated so the model's (it takes every buffer). */
void gpt_cuda_use_state_(gpt_cuda *g, int S, int n_res, bf16 *params,
                         bf16 *grads, float *opt, long *t_slot, hslot_ *hs,
                         unsigned char *moe, size_t *off);
/* Free a state gpt_cuda_alloc_state_ made. */
void gpt_cuda_free_state_(bf16 *params, bf16 *grads, float *opt,
                          long *t_slot);

/* optim_cuda.cu: the optimizer. g's optimizer from o (NULL: AdamW) before
 * any state is allocated; refused (-1, a message) where it is not built:
 * bf16 masters with offloading (off), Adafactor on a model made with
 * offloading. */
int gpt_cuda_optim_init_(gpt_cuda *g, const gpt_optim *o,
                         const gpt_cuda_offload *off);
void gpt_cuda_optim_fini_(gpt_cuda *g);
/* Forget the Adafactor tensor plan (the slots changed). */
void gpt_cuda_optim_drop_plan_(gpt_cuda *g);
/* Adafactor: floats of the af layout before slot s (0 <= s <= its slot
 * count) of slots of kinds moe: the globals' and slots [0, s)'s. */
size_t gpt_cuda_af_off_(const gpt_cuda *g, const unsigned char *moe, int s);
/* The step's gradient sum of squares into red[RED_SUMSQ] on the device
 * (and h_out[1]), the offloaded slots' host part added (waits for their
 * accumulations); returns the clip scale for the host updates (max_norm /
 * norm when the norm exceeds max_norm > 0, else 1). gpt_cuda.cu. */
float gpt_cuda_norm_sumsq_(gpt_cuda *g, float max_norm);
/* The optimizer state block of a state with n device parameters, its
 * resident slots [0, n_res) of kinds moe: master (n; none with bf16
 * masters, g->mbf) | m (n; none for
 * Adafactor without a first moment) | v (AdamW n, Adafactor the af
 * layout's floats). The pointers into opt (NULL: sizes only) into *m
 * (NULL when none) and *v (either may be NULL); returns the floats. */
size_t gpt_cuda_opt_layout_(const gpt_cuda *g, float *opt, size_t n,
                            int n_res, const unsigned char *moe, float **m,
                            float **v);
/* The fp32 master weights in opt (NULL with bf16 masters). */
float *gpt_cuda_opt_master_(const gpt_cuda *g, float *opt);
/* The stochastic-rounding key of the tensor at offset off of region
 * (-1 the globals, else slot s) in gpt.h's plain layout: the CPU model's
 * (gpt_optim.c), so both round alike; 0 with fp32 masters. */
uint64_t gpt_cuda_sr_key_(const gpt_cuda *g, int region, size_t off);

/* gpt_cuda.cu: passes. Exit with a message naming who when microbatch B
 * exceeds the B the model was created for. */
void gpt_cuda_check_B_(const gpt_cuda *g, int B, const char *who);
/* Positions [p0, p1) of a microbatch: forward layer p for p < L, backward
 * layer 2L-1-p after, the head in between. */
void gpt_cuda_run_pass_(gpt_cuda *g, int p0, int p1, int B, float loss_scale,
                        int last);
/* M6_ADAMW_PER_TENSOR: 1 the reference AdamW, one launch per tensor. */
int gpt_cuda_adamw_per_tensor_(void);
/* An environment switch: unset or empty, dflt; "0" or "1", that; another
 * value is reported on stderr once per *warned ("NAME=v is not 0 or 1:
 * dflt_means") and read as dflt. */
int gpt_cuda_env_flag_(const char *name, int dflt, const char *dflt_means,
                       int *warned);

/* moe_cuda.cu: MoE block l forward, out (B*T,C) from x; backward, d(x)
 * into a->dln from d(out) in a->dres, the gradients accumulated at dw. */
void gpt_cuda_moe_layer_forward_(gpt_cuda *g, int l, const bf16 *w,
                                 const bf16 *x, bf16 *out, int B);
void gpt_cuda_moe_layer_backward_(gpt_cuda *g, int l, const bf16 *w,
                                  bf16 *dw, const bf16 *x, int B);

/* graphs_cuda.cu: M6_CUDA_GRAPH (1 graphs where they apply, 0 not). */
int gpt_cuda_graphs_env_(void);
/* Drop one captured graph; both of the model's (a reslot). */
void gpt_cuda_graph_drop_(step_graph_ *sg);
void gpt_cuda_graphs_drop_(gpt_cuda *g);
/* Queue what the step has staged: call before any other work is queued
 * or waited for. */
void gpt_cuda_flush_(gpt_cuda *g);
/* Whether a step starting now runs through graphs. */
int gpt_cuda_graphs_apply_(const gpt_cuda *g);
/* Graph B (sum of squares, multi-tensor AdamW) launched with this step's
 * values: 0, or -1 not launched (the caller queues the update). */
int gpt_cuda_graph_b_(gpt_cuda *g, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float max_norm);

#endif /* M6_GPT_CUDA_IMPL_CUH */
