/*
 * spec.h — the run spec: what an operator submits (a JSON file; docs/OPERATIONS.md, "Spec keys"),
 * parsed and range-checked into a plain struct. Unknown keys and bad values
 * are errors naming the key ("train.lr: must be > 0, got -1").
 */
#ifndef M6_SPEC_H
#define M6_SPEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "model/config.h"
#include "model/gpt.h"  /* gpt_optim */

#define SPEC_STR 1024

typedef enum { DELINK_OPT_COPY = 0, DELINK_OPT_RESET = 1 } delink_optimizer;
/* When the runner delinks (DESIGN.md "Phase policy: plateau"): at
 * pseudo.steps, or once the pseudo model's validation loss plateaus
 * (pseudo.steps then the latest step). */
typedef enum { DELINK_AT_STEP = 0, DELINK_AT_PLATEAU = 1 } delink_policy;
typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } backend_kind;

/* device.precision: the GEMMs' inputs in fp32, or rounded to bf16 (fp32
 * sums, fp32 everything else); spec_precision says which one a run uses. */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16 = 1 } precision_kind;

/* optimizer.name: AdamW (train.beta1, beta2, eps) or Adafactor
 * (optimizer.*; kernels.h adafactor_update_spans). */
typedef enum { OPTIMIZER_ADAMW = 0, OPTIMIZER_ADAFACTOR = 1 } optimizer_kind;
/* optimizer.master: the master weights the optimizer updates, fp32, or
 * bf16 with every update rounded stochastically (kernels.h "bf16 master
 * weights"; gpt.h gpt_model.master_bf16). */
typedef enum { MASTER_FP32 = 0, MASTER_BF16 = 1 } master_kind;
/* pseudo.grad_scale: a shared slot's gradient in the pseudo phase is the
 * sum over the layers that use it, or that sum divided by their number
 * (DESIGN.md "Pseudo-phase gradient scale and lr"). */
typedef enum { GRAD_SCALE_SUM = 0, GRAD_SCALE_MEAN = 1 } grad_scale_mode;

/* delink.rewarm_steps where a spec with a pseudo phase leaves it out: this
 * share of train.steps (bench/p2r_sweep's best, issue 21). */
#define SPEC_P2R_REWARM_FRAC 0.05

/* train.max_bad_steps' default. */
#define SPEC_MAX_BAD_STEPS 5
/* train.expert_idle_steps' default. */
#define SPEC_EXPERT_IDLE_STEPS 100

typedef struct {
    char name[256];
    struct { char train[SPEC_STR]; char val[SPEC_STR]; } data;  /* globs */
    model_config model;
    struct {
        int share_groups;
        long steps;                 /* 0: from scratch */
        grad_scale_mode grad_scale; /* slots' gradients: sum or mean */
        float lr_scale;             /* the pseudo phase's lr multiplier */
    } pseudo;
    struct {
        delink_optimizer optimizer;
        long rewarm_steps;
        delink_policy policy;
        float min_delta;     /* plateau: validation loss (nats per token) */
        int patience;        /* plateau: evaluations */
    } delink;
    struct {
        long steps;          /* total optimizer steps, pseudo + real */
        int batch_size;      /* B: sequences per microbatch */
        int grad_accum;      /* microbatches per optimizer step */
        float lr, min_lr;    /* peak and floor of the cosine schedule */
        long warmup_steps;
        float weight_decay;  /* decoupled; applied to 2-D weights only */
        float grad_clip;     /* global-norm clip; 0 disables */
        float beta1, beta2, eps;
        uint64_t seed;
        long eval_every;     /* 0: only at the end */
        int eval_batches;
        long max_bad_steps;  /* consecutive non-finite (skipped) steps that
                              * pause the run (SPEC_MAX_BAD_STEPS) */
        long expert_idle_steps; /* MoE: consecutive steps without a token
                                 * after which an expert is reported (event
                                 * moe.expert_idle); 0: never */
    } train;
    /* optimizer.*: which optimizer, and Adafactor's knobs (at their
     * defaults unless name is adafactor); lr, its schedule, weight decay
     * and the clip are train.*'s for both */
    struct {
        optimizer_kind name;
        float beta1;          /* 0: no first moment */
        float decay_rate;     /* beta2_t = 1 - t^-decay_rate */
        float clip_threshold; /* d of the update clipping */
        float eps1, eps2;     /* added to g^2; floor of RMS(x) */
        int scale_parameter;  /* 1: step lr * max(eps2, RMS(x)) */
        master_kind master;   /* either optimizer's master weights */
        int shard;            /* 1: ZeRO stage 1, the AdamW state sharded
                               * over the data-parallel ranks (gpt.h
                               * gpt_shard_range); nothing with one rank */
    } optimizer;
    struct { long every; int keep; } checkpoint;  /* every 0: only at the end */
    struct {
        backend_kind backend;
        int threads;
        size_t memory_budget;
        precision_kind precision;  /* as written; spec_precision: in use */
        int index;            /* the node's, never from JSON: the device
                               * (GPU) this rank runs on, its local rank
                               * (cluster/dp.c); 0 for rank 0 of a node */
    } device;
    struct {
        int prefetch;        /* staging buffers: fetches run ahead */
        int host_threads;    /* host AdamW threads; 0: spec_host_threads */
        int speculative;     /* SPEC_SPECULATIVE_*: speculative clipped
                              * host AdamW (offload.h, the planner) */
        int stream_grads;    /* 1: an offloaded slot's gradient is consumed
                              * by its host update as soon as it is final,
                              * from a pool of slots in flight (offload.h) */
    } offload;
    /* init.from: a checkpoint directory (an m6 checkpoint, m6ctl import
     * llmc's or m6ctl export --format safetensors' output) whose weights
     * the run starts from, with a fresh optimizer; "" none */
    struct { char from[SPEC_STR]; } init;
    struct {
        int world_size;        /* data-parallel ranks of the real phase */
        int pseudo_world_size; /* ... of the pseudo phase; 0: world_size */
        int expert_parallel;   /* P: ranks each MoE slot's experts are
                                * split over (model_expert_range); 1: none */
        int timeout;           /* seconds a collective may wait */
    } nodes;
} run_spec;

/* offload.speculative: auto (on when the planner finds host memory for
 * the second buffers), on, off. */
enum { SPEC_SPECULATIVE_AUTO = 0, SPEC_SPECULATIVE_ON = 1,
       SPEC_SPECULATIVE_OFF = 2 };

/* Fill *s with the defaults (those of examples/fortunes-p2r.json's shape). */
void spec_defaults(run_spec *s);

/* Host threads for offloaded slots' accumulation and AdamW:
 * offload.host_threads, or when it is 0 (auto, the default) the node's
 * 2 on the CPU backend (whose compute threads use the cores) and, on
 * cuda, the CPUs this process may use (common/cpus.h: its affinity mask
 * capped by its cgroup's CPU quota) less 2, in [1, 64]; split among the
 * run's ranks on this node (common/node_share.h: node_share_split by
 * node_share_ranks(nodes.world_size); the whole on a node of one rank). */
int spec_host_threads(const run_spec *s);

/* Data parallelism: each of world ranks takes an equal share of every
 * global batch (train.batch_size * train.grad_accum sequences per
 * optimizer step, whatever the world size): grad_accum/world microbatches
 * of batch_size sequences when world divides grad_accum, else grad_accum
 * microbatches of batch_size/world sequences when world divides
 * batch_size. 0 with *B_rank and *accum_rank, or -1 when world divides
 * neither (or world < 1). */
int spec_dp_split(const run_spec *s, int world, int *B_rank,
                  int *accum_rank);

/* The data-parallel world size of a phase: nodes.pseudo_world_size (when
 * set) for pseudo 1, else nodes.world_size. */
int spec_world_of_phase(const run_spec *s, int pseudo);

/* The ranks a phase's optimizer state is sharded over (optimizer.shard):
 * its world size, or with nodes.expert_parallel P > 1 the world/P ranks
 * holding the same experts (1 where the phase's world is below P). */
int spec_shard_world_of_phase(const run_spec *s, int pseudo);

/* 1 when a data-parallel group's ranks hold parts of the state, so that
 * a save of rank 0 needs every rank's trainer_sync_boundary first:
 * optimizer.shard (each rank its range of the optimizer state) or
 * nodes.expert_parallel > 1 (each rank its experts); else 0. */
int spec_state_split(const run_spec *s);

/* The spec's names of a backend ("cpu", "cuda") and a delink policy
 * ("step", "plateau"), as device.backend and delink.policy spell them;
 * "?" out of range. */
const char *spec_backend_name(backend_kind b);
/* "adamw", "adafactor" as optimizer.name spells them; "?" out of range. */
const char *spec_optimizer_name(optimizer_kind o);
/* "fp32", "bf16" as optimizer.master spells them; "?" out of range. */
const char *spec_master_name(master_kind m);
const char *spec_delink_policy_name(delink_policy p);

/* The precision the run's GEMMs use: device.precision on `cpu`; bf16 on
 * `cuda`, whose kernels are bf16 only (a spec saying fp32 there is
 * refused). */
precision_kind spec_precision(const run_spec *s);

/* "fp32", "bf16", as device.precision spells them; "?" out of range. */
const char *spec_precision_name(precision_kind p);

/* S, the parameter slots of a phase: pseudo.share_groups for pseudo 1,
 * model.n_layer (every layer its own slot) for pseudo 0. The one place
 * this is decided: the trainer, the planners and init.from ask it. */
int spec_slots_of_phase(const run_spec *s, int pseudo);

/* Whether the run's optimizer keeps a first moment m: AdamW always,
 * Adafactor only with optimizer.beta1 > 0 (Shazeer & Stern 2018, §5). The
 * one place this is decided: state sizes, checkpoints and the gathers of
 * sharded state ask it. 1 or 0. */
int spec_has_first_moment(const run_spec *s);

/* The optimizer setting of the spec as the model sizes and runs it
 * (gpt.h gpt_optim): Adafactor or not, its first moment, bf16 masters,
 * train.seed as the stochastic rounding's seed, and the state on the host
 * apart from the slots (optimizer.shard with offloading on the cpu
 * backend: the one place that is decided). */
gpt_optim spec_gpt_optim(const run_spec *s);

/* Whether the run starts in the Pseudo phase (pseudo.steps > 0). */
static inline int spec_starts_pseudo(const run_spec *s)
{
    return s->pseudo.steps > 0;
}

/* Parse a JSON spec text (len bytes) over the defaults and validate it.
 * Returns 0, or -1 with a message naming the key in err. */
int spec_parse(run_spec *s, const char *json, size_t len, char *err,
               size_t errlen);

/* A byte size as the spec writes it: "4GiB", "1.5 MiB", "512MB", "1024"
 * (KiB/MiB/GiB/TiB powers of 2, KB/MB/GB/TB powers of 10; case-insensitive;
 * a fraction of a unit rounds down to whole bytes, but a fraction of a byte,
 * "1.5" or "2.5B", is bad text). 0, or -1 for bad text, -2 for overflow. */
int spec_parse_size(const char *s, size_t *out);

/* Whether s may name a run: letters, digits, '.', '_', '-', not starting
 * with '.' or '-' (path-safe), and not all digits (m6ctl reads "12" as run
 * id 12). */
int spec_name_ok(const char *s);

/* The suffixes spec_parse_size takes, for error messages. */
#define SPEC_SIZE_UNITS "B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"


/* Parse the file at path (errors name the file). */
int spec_load_file(run_spec *s, const char *path, char *err, size_t errlen);

/* Serialize to canonical JSON (malloc'd string, caller frees); NULL on OOM.
 * spec_parse(spec_to_json(s)) gives back s. */
char *spec_to_json(const run_spec *s);

/* FNV-1a 64 of the canonical JSON: identifies a spec in checkpoints. */
uint64_t spec_hash(const run_spec *s);

/* Write every spec key as one row of a Markdown table to out: key path,
 * JSON type, default (from spec_defaults, as spec_to_json writes it; "none"
 * for an empty string), accepted range and meaning, in the key table's
 * order. docs/OPERATIONS.md's key table is this output (docs/gen-tables.sh). 0, or
 * -1 on a write error or out of memory. */
int spec_keys_markdown(FILE *out);

#endif /* M6_SPEC_H */
