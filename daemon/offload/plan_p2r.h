/*
 * plan_p2r.h — the Pseudo-to-Real cost model (m6ctl plan SPEC --p2r; issue
 * 21 item 3; docs/DESIGN.md "Pseudo-to-Real cost model"). From the
 * planner's placement of each phase (offload.h: resident and offloaded
 * slots, bytes moved per step) and four rates, the time of one optimizer
 * step of the pseudo model and of the real model; from the steps each
 * schedule needs to reach a target loss, the wall-clock of Pseudo-to-Real
 * against training from scratch.
 *
 * Units: seconds, bytes, FLOPs; rates in FLOP/s and bytes/s (the CLI takes
 * TFLOP/s and GB/s, 1e12 and 1e9). Per optimizer step and per device.
 *
 * The model, per phase (the formulas' sources in DESIGN.md):
 *   FLOPs/token  = 6 N + 12 L C T        (PaLM, Chowdhery et al. 2022,
 *                  appendix B; = Megatron-LM's 72 B s L h^2 (1 + s/6h +
 *                  V/12hL) / (B s), Narayanan et al. 2021, for a dense
 *                  model), N = model_active_params: the parameters one
 *                  token passes through (model/facts.h owns both)
 *   t_compute    = FLOPs/token * tokens/step / gpu_flops
 *   t_copy       = max(h2d / h2d rate, d2h / d2h rate): fetches and drains
 *                  run on two copy streams, PCIe is full duplex
 *   t_adam       = sum over offloaded slots of params * bytes touched per
 *                  parameter / host AdamW rate
 *   t_alltoall   = model_ep_alltoall_seconds (model/facts.h): the experts'
 *                  all-to-alls (latency per call, bytes over NVLink inside
 *                  a node and the network across nodes); none on one
 *                  device. They block the compute stream, not the copy
 *                  streams or the host threads:
 *   t_device     = t_compute + t_alltoall
 *   t_step       = max(t_device, t_copy, t_adam) when the host update
 *                  overlaps the step (no clipping: a slot's update starts
 *                  when its gradient is final; clipping with
 *                  offload.speculative on or auto: the speculative update);
 *                = max(t_device, t_copy) + max(0, t_adam - t_hidden)
 *                  otherwise, t_hidden = t_compute / 3 * (layers on
 *                  resident slots / L): the update waits for the global
 *                  norm and hides only behind the next forward's resident
 *                  layers (forward is a third of 6N + 12LCT).
 * Not modelled: the device AdamW of resident slots, evaluation passes,
 * the gradient all-reduce, stalls from a prefetch depth too short for the
 * copy.
 */
#ifndef M6_OFFLOAD_PLAN_P2R_H
#define M6_OFFLOAD_PLAN_P2R_H

#include <stdio.h>

#include "offload/offload.h"

/* Defaults, each with where it comes from (printed with it). */
/* NVIDIA H200 SXM dense BF16 tensor peak, TFLOP/s (the datasheet's figure,
 * NVIDIA H200 datasheet: dense BF16 about 990 TFLOP/s). */
#define P2R_H200_BF16_TFLOPS 990.0
/* Model FLOPs utilisation assumed when --gpu-tflops is not given. */
#define P2R_DEFAULT_MFU 0.4
/* PCIe 5.0 x16, one direction: 32 GT/s x 16 lanes x 128/130 (the 128b/130b
 * encoding) / 8 bits = 63.0 GB/s, the link rate (PCI Express Base 5.0);
 * achieved pinned copies are lower: measure with bench/gpu_offload. */
#define P2R_PCIE5_X16_GBPS 63.0
/* Host AdamW, GB/s of memory traffic: bench/offload_host, 2026-11-30 row of
 * bench/RESULTS.md (`--params 256`, 2 threads, machine shared): "direct
 * from bf16" 24 to 27 GB/s; the low end. */
#define P2R_HOST_ADAM_GBPS 24.0
/* Bytes the host AdamW touches per offloaded parameter: model/facts.h
 * model_param_bytes (adam_direct, adam_accum). */
/* NVLink 4 of an H200 SXM, one direction: the datasheet's 900 GB/s is
 * both directions (NVIDIA H200 datasheet). */
#define P2R_NVLINK4_GBPS 450.0
/* The network per GPU: one 400 Gb/s InfiniBand NDR port a GPU (ConnectX-7,
 * as in NVIDIA's DGX H100 and H200 systems) = 50 GB/s one way. */
#define P2R_NDR400_GBPS 50.0
/* Per all-to-all call, microseconds: an assumption of the order of a small
 * all-to-all across nodes; bench/moe_ep measures this machine's. */
#define P2R_ALLTOALL_LATENCY_US 20.0

typedef struct {
    double gpu_flops;             /* achieved FLOP/s per device, > 0 */
    double h2d_bytes_per_s;       /* host->device copies, > 0 */
    double d2h_bytes_per_s;       /* device->host copies, > 0 */
    double host_adam_bytes_per_s; /* host AdamW memory traffic, > 0 */
    double nvlink_bytes_per_s;    /* all-to-all inside a node, > 0 */
    double net_bytes_per_s;       /* all-to-all across nodes, > 0 */
    double alltoall_latency_s;    /* per all-to-all call, >= 0 */
    /* where each came from, printed beside it (static strings or the
     * caller's; the model only reads them) */
    const char *gpu_src, *h2d_src, *d2h_src, *adam_src, *nvlink_src,
        *net_src, *latency_src;
} p2r_rates;

/* The defaults above, with their sources. */
void p2r_rates_default(p2r_rates *r);

/* One phase's step. The inputs come from a plan (p2r_phase_of_plan,
 * p2r_phase_of_cluster); p2r_phase_time fills the times. */
typedef struct {
    int n_layer, n_slots, n_resident, n_offloaded;
    int resident_layers;       /* layers whose slot is resident */
    int devices;               /* devices the step runs on (1 or N*G) */
    double tokens;             /* per step per device: B T A (per rank) */
    double active_params;      /* N, per token */
    double flops_per_token, flops;   /* flops: per step per device */
    double h2d_bytes, d2h_bytes;     /* per step per device */
    double offloaded_params;   /* in offloaded slots, per device */
    double adam_bytes;         /* host AdamW traffic per step, bytes */
    int adam_overlaps;         /* 1: the host update overlaps the step */
    int ep_size, ep_per_node;  /* the experts' group: P devices, G a node
                                * (P 1: no all-to-all) */
    double alltoall_bytes;     /* sent per step per device (the most) */
    double alltoall_calls;     /* per step: MoE layers x grad_accum x
                                * MODEL_EP_ALLTOALLS */
    /* seconds (p2r_phase_time) */
    double t_compute, t_h2d, t_d2h, t_copy, t_adam, t_alltoall;
    double t_adam_hidden;      /* of t_adam behind compute when it does not
                                * overlap the step (else t_adam) */
    double t_adam_exposed;     /* added to the step */
    double t_step;
} p2r_phase;

/* Fill ph's times from its inputs and the rates (model above). */
void p2r_phase_time(p2r_phase *ph, const p2r_rates *r);

/* The inputs of a phase planned on one device (offload_plan_make's plan
 * p, of spec with p->n_slots slots; pseudo: 1 for the pseudo phase, which
 * picks its data-parallel world). 0, or -1 with err. */
int p2r_phase_of_plan(const run_spec *spec, const offload_plan *p, int pseudo,
                      p2r_phase *out, char *err, size_t errlen);

/* The inputs of a phase at scale (plan_cluster.c's cp for in): per
 * device, the cuda model's bytes (bf16 weights and gradients on the
 * wire), each device its own B x T x A tokens. 0, or -1 with err. */
int p2r_phase_of_cluster(const run_spec *spec, const cluster_input *in,
                         const cluster_phase *cp, p2r_phase *out, char *err,
                         size_t errlen);

/* Wall-clock to a target loss. Scratch reaches it at step N_s, Pseudo-to-
 * Real at N_p = R N_s, P of them pseudo steps:
 *   wall_scratch = N_s t_real
 *   wall_p2r     = P t_pseudo + (N_p - P) t_real     (N_p >= P)
 *                = N_p t_pseudo                      (N_p < P: reached
 *                                                     before the delink)
 *   wall_ratio   = wall_p2r / wall_scratch
 * break_even: the R at which wall_ratio = 1 (P2R pays for R below it);
 * 1 + (P / N_s)(1 - t_pseudo / t_real) when that is at least P / N_s. */
typedef struct {
    double pseudo_steps;   /* P */
    double scratch_steps;  /* N_s */
    double steps_ratio;    /* R = N_p / N_s */
    int never;             /* P2R never reaches the target: no ratio */
    /* filled by p2r_wall_fill */
    double p2r_steps;      /* N_p */
    double wall_scratch_s, wall_p2r_s, wall_ratio;   /* 0 when never */
    double break_even;
} p2r_wall;

/* Fill w's outputs. 0, or -1 with err when t_pseudo, t_real, P or N_s are
 * not positive, or R is negative. */
int p2r_wall_fill(p2r_wall *w, double t_pseudo, double t_real, char *err,
                  size_t errlen);

/* The break-even steps ratio alone (as p2r_wall). */
double p2r_break_even(double t_pseudo, double t_real, double P, double N_s);

/* ----------------------------------------------------------- the sweep
 * bench/p2r_sweep's CSV (header P2R_SWEEP_HEADER): the rows of one
 * setting, mean step_ratio over their seeds. */
#define P2R_SWEEP_HEADER                                                    \
    "corpus,seed,share_groups,pseudo_frac,delink_optimizer,rewarm_frac,"    \
    "grad_scale,pseudo_lr_scale,steps,final_val,scratch_final_val,"        \
    "final_val_ratio,steps_to_target,scratch_steps_to_target,step_ratio,"  \
    "wall_s,scratch_wall_s,wall_ratio"

typedef struct {
    const char *corpus;
    int share_groups;
    double pseudo_frac;        /* pseudo.steps / train.steps */
    const char *delink_optimizer;   /* "copy" or "reset" */
    double rewarm_frac;        /* delink.rewarm_steps / train.steps */
    const char *grad_scale;    /* "sum", "mean", or NULL: any (but one) */
    double pseudo_lr_scale;    /* < 0: any (but one) */
} p2r_sweep_key;

typedef struct {
    int rows;                  /* matching rows (seeds) */
    int never;                 /* of which step_ratio "never" */
    double mean_step_ratio;    /* over the rows that reached it */
    char grad_scale[8];        /* the matching rows' */
    double pseudo_lr_scale;
} p2r_sweep_match;

/* Read path and average the rows matching key (floats equal to 1e-6
 * relative, as %g prints them). 0, or -1 with err naming the file, line and
 * field: unreadable file, a header other than P2R_SWEEP_HEADER, a row with
 * the wrong field count or a malformed field, no matching row (the settings
 * the file has are listed), or rows of several grad_scale /
 * pseudo_lr_scale settings when key leaves them open. */
int p2r_sweep_lookup(const char *path, const p2r_sweep_key *key,
                     p2r_sweep_match *m, char *err, size_t errlen);

/* ------------------------------------------------------------ the plan */

typedef struct {
    p2r_rates rates;
    size_t budget_override;    /* as offload_plan_for_spec (0: the spec's) */
    const cluster_input *cluster;  /* non-NULL: plan at scale */
    double steps_ratio;        /* R; < 0: 1.0, or the sweep's */
    long scratch_steps;        /* N_s; 0: the spec's train.steps */
    const char *sweep;         /* bench/p2r_sweep CSV, or NULL */
    const char *corpus;        /* its corpus (with sweep) */
    const char *grad_scale;    /* sweep filter, NULL: any */
    double pseudo_lr_scale;    /* sweep filter, < 0: any */
} p2r_options;

typedef struct {
    p2r_rates rates;
    int cluster;               /* planned at scale */
    int unbudgeted;            /* single-node, no memory budget: every slot
                                * of both phases counted resident */
    int ep_unpriced;           /* single-node, an MoE model with
                                * nodes.expert_parallel P > 1: P (no
                                * all-to-all priced), else 0 */
    cluster_input cin;
    backend_kind backend;
    p2r_phase pseudo, real;
    double step_ratio;         /* t_pseudo / t_real */
    p2r_wall wall;
    const char *steps_ratio_src;   /* "default", "--steps-ratio", "sweep" */
    int plateau;               /* delink.policy plateau: P is the earliest */
    p2r_sweep_match sweep;     /* when from the sweep */
    const char *sweep_path, *corpus;
} p2r_report;

/* Plan spec's two phases and run the model. 0, or -1 with err: no pseudo
 * phase (pseudo.steps 0), a plan that fails, bad rates (not positive), a
 * sweep that cannot be read or has no matching row. */
int p2r_plan_for_spec(const run_spec *spec, const p2r_options *o,
                      p2r_report *out, char *err, size_t errlen);

/* Text (each phase's placement, FLOPs, time terms, step times, their
 * ratio, the break-even steps ratio and the predicted wall ratio) or one
 * JSON object (json 1) with the same figures: rates {gpu_flops, ...,
 * *_source}, pseudo and real {n_slots, ..., t_step_s}, step_time_ratio,
 * pseudo_steps, scratch_steps, steps_ratio, p2r_steps, wall_scratch_s,
 * wall_p2r_s, wall_ratio (null when never), reaches_target,
 * break_even_steps_ratio. */
void p2r_print(FILE *f, const p2r_report *r, int json);

#endif /* M6_OFFLOAD_PLAN_P2R_H */
