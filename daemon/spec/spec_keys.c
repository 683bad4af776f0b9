/*
 * spec_keys.c — the run spec's key table (spec_internal.h): every key
 * once, with where it lives in run_spec, its kind, its range and the doc
 * sentence docs/OPERATIONS.md's table is generated from; and the names of
 * the spec's enums, which the table and the name functions share.
 * spec.c parses and checks with it, spec_write.c writes with it.
 */
#include "spec/spec_internal.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>

static const char *const delink_names_[] = { "copy", "reset", NULL };
static const char *const policy_names_[] = { "step", "plateau", NULL };
static const char *const backend_names_[] = { "cpu", "cuda", NULL };
/* optimizer.name (spec.h optimizer_kind) */
static const char *const optimizer_names_[] = { "adamw", "adafactor", NULL };
/* optimizer.master (spec.h master_kind) */
static const char *const master_names_[] = { "fp32", "bf16", NULL };
/* pseudo.grad_scale (spec.h grad_scale_mode) */
static const char *const grad_scale_names_[] = { "sum", "mean", NULL };
/* device.precision (spec.h precision_kind) */
static const char *const precision_names_[] = { "fp32", "bf16", NULL };
/* model.moe.capacity_scope (model/config.h moe_scope) */
static const char *const scope_names_[] = { "rank", "group", NULL };
/* offload.speculative (spec.h SPEC_SPECULATIVE_*) */
static const char *const speculative_names_[] = { "auto", "on", "off", NULL };

#define STR(sec, k, m, doc) { sec, k, K_STR, OFF(m), sizeof(((run_spec *)0)->m), \
                              0, 0, 0, 0, 0, 0, NULL, doc, NULL }
#define INT(sec, k, m, lo, hi, doc) { sec, k, K_INT, OFF(m), sizeof(int), lo, \
                                      hi, 0, 0, 0, 0, NULL, doc, NULL }
#define LONG(sec, k, m, lo, hi, doc) { sec, k, K_LONG, OFF(m), sizeof(long), \
                                       lo, hi, 0, 0, 0, 0, NULL, doc, NULL }
/* INT and LONG whose default is a rule (key_.default_rule) */
#define INT_RULE(sec, k, m, lo, hi, rule, doc) \
    { sec, k, K_INT, OFF(m), sizeof(int), lo, hi, 0, 0, 0, 0, NULL, doc, rule }
#define LONG_RULE(sec, k, m, lo, hi, rule, doc) \
    { sec, k, K_LONG, OFF(m), sizeof(long), lo, hi, 0, 0, 0, 0, NULL, doc, rule }
#define FLT(sec, k, m, lo, lo_open, hi, hi_open, doc) \
    { sec, k, K_FLOAT, OFF(m), sizeof(float), 0, 0, lo, hi, lo_open, hi_open, \
      NULL, doc, NULL }
#define ENUM(sec, k, m, names, doc) { sec, k, K_ENUM, OFF(m), sizeof(int), 0, \
                                      0, 0, 0, 0, 0, names, doc, NULL }

/* In canonical order: spec_to_json writes the keys as listed here. */
const key_ spec_keys_[] = {
    STR(NULL, "name", name,
        "Run name, shown by `m6ctl list`; usable as RUN where unique. Letters, "
        "digits, `.`, `_`, `-`; not starting with `.` or `-`; not all digits."),
    STR("data", "train", data.train,
        "Required. Glob of training shards (llm.c layout), relative to the "
        "spec file."),
    STR("data", "val", data.val,
        "Required. Glob of validation shards, relative to the spec file."),
    INT("model", "vocab_size", model.vocab_size, 1, 65536,
        "V: token ids run from 0 to V-1 (256 for `m6ctl data prepare`'s "
        "bytes)."),
    INT("model", "n_layer", model.n_layer, 1, INT_MAX,
        "L: transformer blocks."),
    INT("model", "n_head", model.n_head, 1, INT_MAX,
        "NH: attention heads; must divide `n_embd`."),
    INT("model", "n_embd", model.n_embd, 1, INT_MAX,
        "C: width of the residual stream."),
    INT("model", "seq_len", model.seq_len, 1, INT_MAX,
        "T: tokens per sequence (and positions in the position table)."),
    INT("model.moe", "num_experts", model.moe_experts, 0, INT_MAX,
        "E: experts per MoE block, all prototypes together. 0: a dense model "
        "(the other `model.moe` keys must then stay at their defaults)."),
    INT("model.moe", "prototypes", model.moe_prototypes, 1, INT_MAX,
        "k: prototypes of E/k experts each; every prototype routes every "
        "token top-1 among its experts. Must divide `num_experts`."),
    FLT("model.moe", "capacity_factor", model.moe_capacity_factor, 0, 0,
        INFINITY, 0,
        "Training capacity: each expert takes at most "
        "ceil(factor * tokens / (E/k)) tokens of a microbatch; the rest "
        "pass by on the residual stream. 0: dropless, no token dropped "
        "(buffers for every token at each expert)."),
    FLT("model.moe", "eval_capacity_factor", model.moe_eval_capacity_factor,
        0, 0, INFINITY, 0, "The capacity factor of validation passes; 0: "
        "dropless."),
    ENUM("model.moe", "capacity_scope", model.moe_capacity_scope,
         scope_names_,
         "Over which tokens both capacity factors and the balancing loss's "
         "fractions count, with `nodes.expert_parallel` P > 1. `rank`: each "
         "rank's microbatch (the run equals one rank accumulating the P "
         "microbatches). `group`: the P microbatches of an expert-parallel "
         "group as one of P times the tokens, an expert's capacity shared "
         "by the whole group, ranks in order (the run equals one rank with "
         "a P times larger `batch_size`). Without expert parallelism the "
         "two are the same."),
    FLT("model.moe", "aux_loss_coef", model.moe_aux_coef, 0, 0, INFINITY, 0,
        "Coefficient of the balancing loss (mean over MoE blocks) added to "
        "the loss for the gradient; the reported loss leaves it out."),
    FLT("model.moe", "z_loss_coef", model.moe_z_coef, 0, 0, INFINITY, 0,
        "Coefficient of the router z-loss (mean over MoE blocks), added like "
        "`aux_loss_coef`."),
    INT("model.moe", "every", model.moe_every, 1, INT_MAX,
        "MoE in block l when (l+1) % every == 0, dense MLP in the others; "
        "at most `n_layer`. Above 1 the model mixes dense and MoE slots "
        "(a pseudo model then needs `share_groups` >= 2)."),
    INT("model.moe", "expert_hidden", model.moe_hidden, 0, INT_MAX,
        "H: hidden size of each expert's MLP. 0: 4 * `n_embd`."),
    INT_RULE("pseudo", "share_groups", pseudo.share_groups, 1, INT_MAX, "L/2",
        "S: slots of the pseudo model, at most L; layer l uses slot `l*S/L` "
        "(with `model.moe.every` > 1, each kind's layers so over its slots). "
        "Left out of a spec with a pseudo phase: L/2 (at least 1; 2 with "
        "`model.moe.every` > 1), the best of bench/p2r_sweep's grid."),
    LONG("pseudo", "steps", pseudo.steps, 0, LONG_MAX,
         "Steps of the pseudo phase, at most `train.steps`; the delink comes "
         "after them. 0: train the real model from scratch."),
    ENUM("pseudo", "grad_scale", pseudo.grad_scale, grad_scale_names_,
         "A slot's gradient in the pseudo phase: `sum` over the layers that "
         "share it, or `mean` (the sum divided by their number), before the "
         "clip and AdamW. The embeddings and the final LN are not scaled; "
         "no effect after the delink (one layer per slot)."),
    FLT("pseudo", "lr_scale", pseudo.lr_scale, 0, 1, INFINITY, 0,
        "Multiplier of the learning rate (the schedule's value at each step) "
        "in the pseudo phase; the real phase's is the schedule's."),
    ENUM("delink", "optimizer", delink.optimizer, delink_names_,
         "At the delink each layer's optimizer state (AdamW's moments, "
         "Adafactor's statistics) is copied from its slot (`copy`) or starts "
         "at zero (`reset`)."),
    LONG_RULE("delink", "rewarm_steps", delink.rewarm_steps, 0, LONG_MAX,
              "5% of `train.steps`",
         "After the delink, scale the learning rate up linearly over this many "
         "steps. 0: no re-warmup. Left out of a spec with a pseudo phase: 5% "
         "of `train.steps` (at most the real phase's steps), the best of "
         "bench/p2r_sweep's grid."),
    ENUM("delink", "policy", delink.policy, policy_names_,
         "When the run delinks: `step`, after `pseudo.steps`; "
         "`plateau`, at the first validation pass of the pseudo phase whose "
         "best-so-far loss is less than `min_delta` below the best-so-far "
         "`patience` passes earlier, and after `pseudo.steps` at the latest. "
         "`plateau` needs `pseudo.steps` > 0 and `train.eval_every` > 0."),
    FLT("delink", "min_delta", delink.min_delta, 0, 0, INFINITY, 0,
        "`plateau`: the least improvement of the validation loss (mean "
        "cross-entropy, nats per token) over `patience` passes that keeps "
        "the pseudo phase going. 0: never a plateau (the bound delinks). "
        "Only with `policy` `plateau`."),
    INT("delink", "patience", delink.patience, 1, INT_MAX,
        "`plateau`: the validation passes (every `train.eval_every` steps) "
        "the improvement is measured over. Only with `policy` `plateau`."),
    /* bounded: 10^9 steps is years at any step rate; beyond it the ETA,
     * the rewarm's 5% and the tables' columns only overflow */
    LONG("train", "steps", train.steps, 1, 1000000000L,
         "Total optimizer steps, pseudo and real together."),
    INT("train", "batch_size", train.batch_size, 1, INT_MAX,
        "B: sequences per microbatch (`B*T` at most 2^31-1)."),
    INT("train", "grad_accum", train.grad_accum, 1, INT_MAX,
        "Microbatches summed into one optimizer step."),
    FLT("train", "lr", train.lr, 0, 1, INFINITY, 0,
        "Peak learning rate, reached after `warmup_steps`."),
    FLT("train", "min_lr", train.min_lr, 0, 0, INFINITY, 0,
        "Floor of the cosine decay, reached at `train.steps`; at most `lr`."),
    LONG("train", "warmup_steps", train.warmup_steps, 0, LONG_MAX,
         "Steps of linear warmup to `lr`."),
    FLT("train", "weight_decay", train.weight_decay, 0, 0, INFINITY, 0,
        "AdamW decoupled weight decay, on 2-D weights only."),
    FLT("train", "grad_clip", train.grad_clip, 0, 0, INFINITY, 0,
        "Clip the global gradient norm to this. 0: no clipping."),
    FLT("train", "beta1", train.beta1, 0, 0, 1, 1, "AdamW beta1."),
    FLT("train", "beta2", train.beta2, 0, 0, 1, 1, "AdamW beta2."),
    FLT("train", "eps", train.eps, 0, 1, INFINITY, 0, "AdamW epsilon."),
    { "train", "seed", K_U64, OFF(train.seed), sizeof(uint64_t), 0, 0, 0, 0,
      0, 0, NULL,
      "Seed of the weight init and the batch sampler; above 2^63-1 write it "
      "as a decimal string.", NULL },
    LONG("train", "eval_every", train.eval_every, 0, LONG_MAX,
         "Validation pass every this many steps, and always after the last. "
         "0: only after the last."),
    /* bounded: a pass of 10^6 batches is hours already, and every one
     * of them is a batch more to read (the validation shard's size is not
     * known here: the spec is checked before its data) */
    INT("train", "eval_batches", train.eval_batches, 1, 1000000,
        "Batches of B sequences per validation pass."),
    LONG("train", "max_bad_steps", train.max_bad_steps, 1, LONG_MAX,
         "A step whose loss or gradient norm is NaN or Inf is skipped (no "
         "update); this many in a row pause the run."),
    LONG("train", "expert_idle_steps", train.expert_idle_steps, 0, LONG_MAX,
         "MoE: an expert that received no token (of any rank) for this many "
         "consecutive steps is named in an event `moe.expert_idle`, once "
         "until it gets a token again. 0: never. Does not change training."),
    ENUM("optimizer", "name", optimizer.name, optimizer_names_,
         "`adamw` (`train.beta1`, `beta2`, `eps`) or `adafactor` (Shazeer & "
         "Stern 2018: factored second moment of every matrix, full for "
         "vectors, update clipping; the `optimizer.*` keys below). Both use "
         "`train.lr` and its schedule, `train.weight_decay` (decoupled) and "
         "`train.grad_clip`. `adafactor` runs on `cpu` (any number of "
         "ranks) and on `cuda`; offloaded slots get a host Adafactor, "
         "without `offload.speculative` `on`."),
    FLT("optimizer", "beta1", optimizer.beta1, 0, 0, 1, 1,
        "Adafactor: first moment of the clipped update. 0: none (no "
        "memory for it)."),
    FLT("optimizer", "decay_rate", optimizer.decay_rate, 0, 1, 1, 0,
        "Adafactor: c in beta2 = 1 - t^-c at the optimizer's step t."),
    FLT("optimizer", "clip_threshold", optimizer.clip_threshold, 0, 1,
        INFINITY, 0,
        "Adafactor: d, the update U is divided by max(1, RMS(U)/d)."),
    FLT("optimizer", "eps1", optimizer.eps1, 0, 1, INFINITY, 0,
        "Adafactor: added to each squared gradient element."),
    FLT("optimizer", "eps2", optimizer.eps2, 0, 0, INFINITY, 0,
        "Adafactor: floor of RMS(weights) when `scale_parameter` is 1."),
    INT("optimizer", "scale_parameter", optimizer.scale_parameter, 0, 1,
        "Adafactor: 1 scales each tensor's step by max(`eps2`, RMS of its "
        "weights) (the paper's relative step with `train.lr`'s schedule); "
        "0: the step is `train.lr`."),
    ENUM("optimizer", "master", optimizer.master, master_names_,
         "Master weights of either optimizer: `fp32`, or `bf16` (2 bytes a "
         "parameter in checkpoints; every update rounded to bf16 "
         "stochastically, seeded by `train.seed`, so a run and its resume "
         "are reproducible). `bf16` runs on `cpu` (offloaded slots "
         "included: their host AdamW rounds the same way; the CPU model "
         "computes from an fp32 copy of the bf16 values) and on `cuda` (the "
         "bf16 weights are the masters, an offloaded slot's pinned copy "
         "too; not with `offload.speculative` `on`)."),
    INT("optimizer", "shard", optimizer.shard, 0, 1,
        "ZeRO stage 1: `true` (or 1; `false`, 0: off) shards the "
        "optimizer state over the data-parallel ranks, each keeping that of "
        "a contiguous 1/`nodes.world_size` of the parameters (Adafactor's "
        "by whole tensors, dense models only); gradients are summed as before, each rank "
        "updates its part and the weights are all-gathered. Losses as "
        "unsharded; checkpoints hold the whole state (any world size "
        "resumes them): rank 0 saves after every rank has gathered the "
        "state at that boundary, and a run whose rank is lost resumes "
        "from its last whole checkpoint. With `nodes.expert_parallel` P "
        "the ranks holding the same experts shard their own state "
        "(`world_size` / P of them; at least 2). With offloading "
        "(`device.memory_budget`) the optimizer state leaves the slots: "
        "each rank's share lives in its host memory (ZeRO-Offload), the "
        "device and an offloaded slot keep weights and gradients; not "
        "with `offload.speculative` `on`. `cpu` (fp32 or bf16 masters: "
        "the same rounding as unsharded)."),
    LONG("checkpoint", "every", checkpoint.every, 0, LONG_MAX,
         "Checkpoint every this many steps (also at the end, pause, stop and "
         "shutdown). 0: only at those."),
    INT("checkpoint", "keep", checkpoint.keep, 1, INT_MAX,
        "Newest checkpoints kept per run; older ones are deleted."),
    ENUM("device", "backend", device.backend, backend_names_,
         "`cpu` (oneDNN GEMMs in `precision`, OpenMP) or `cuda` (bf16 "
         "kernels, fp32 sums, masters as `optimizer.master` says; needs an "
         "m6d built with nvcc and a GPU)."),
    INT("device", "threads", device.threads, 0, 1024,
        "OpenMP threads for the CPU kernels. 0: m6d's `--threads`, else "
        "`OMP_NUM_THREADS`, else the CPUs m6d may use (its affinity mask, "
        "capped by its cgroup's CPU quota)."),
    { "device", "memory_budget", K_SIZE, OFF(device.memory_budget),
      sizeof(size_t), 0, 0, 0, 0, 0, 0, NULL,
      "Device memory the model may use (on `cpu`, a budgeted pool of "
      "ordinary memory); slots that do not fit are offloaded to host "
      "memory. 0: no budget, every slot resident.", NULL },
    ENUM("device", "precision", device.precision, precision_names_,
         "`fp32`, or `bf16`: every GEMM's inputs (weights and activations) "
         "rounded to bf16, products summed in fp32; master weights, AdamW "
         "state, layernorm, softmax, loss and residual sums stay fp32. On "
         "`cpu` both (bf16 through oneDNN, emulated where the CPU lacks "
         "bf16 instructions, as m6d's `cpu.gemm` log line says); `cuda` "
         "is bf16 only and refuses `fp32`."),
    INT("offload", "prefetch", offload.prefetch, 1, 64,
        "Staging buffers for offloaded slots: how many fetches run ahead of "
        "the layer that computes."),
    INT("offload", "host_threads", offload.host_threads, 0, 256,
        "Host threads that accumulate gradients and run AdamW for offloaded "
        "slots. 0: 2 on `cpu`, on `cuda` the CPUs m6d may use less 2 "
        "(1 to 64), divided among the run's ranks on the node; a number: "
        "each rank's own."),
    ENUM("offload", "speculative", offload.speculative, speculative_names_,
         "With `grad_clip`: run an offloaded slot's AdamW as soon as its "
         "gradient lands, unclipped, into second buffers, kept when the "
         "global norm is within the clip and redone otherwise. `auto`: on "
         "when host memory allows its extra buffers (`m6ctl plan`)."),
    INT("offload", "stream_grads", offload.stream_grads, 0, 1,
        "`true` (or 1; `false`, 0: off): an offloaded slot's host update "
        "runs as soon as its gradient is final, and its host gradient "
        "buffer goes back to a small pool (the slots in flight, `m6ctl "
        "plan`) instead of being kept for every offloaded slot for the "
        "whole step. Needs offloading (`device.memory_budget` > 0), "
        "`train.grad_clip` 0 (the global-norm clip needs every gradient "
        "before any update; Adafactor's update clipping bounds each update "
        "instead), `train.grad_accum` 1 and one rank (`nodes.world_size` "
        "1); on `cuda` also each offloaded slot's layers adjacent (the "
        "planner says so). A step whose gradient norm is NaN or "
        "Inf skips the resident update and the update of each offloaded "
        "slot whose own gradient is not finite; offloaded slots already "
        "updated keep their update."),
    STR("init", "from", init.from,
        "A checkpoint directory (of a run, from `m6ctl import llmc` or "
        "`m6ctl export --format safetensors`) to start from: its weights, "
        "a fresh optimizer. Shapes must match the model. Relative to the "
        "spec file."),
    INT("nodes", "world_size", nodes.world_size, 1, 65536,
        "Data-parallel ranks (nodes) of the real phase. Each rank takes an "
        "equal share of every global batch (`batch_size * grad_accum` "
        "sequences, whatever the world size), so it must divide "
        "`grad_accum` or `batch_size`. `cpu` (offloading or not, dense or "
        "MoE) or `cuda` without offloading (gradients over NCCL, or Gloo "
        "staged through host memory)."),
    INT("nodes", "pseudo_world_size", nodes.pseudo_world_size, 0, 65536,
        "Data-parallel ranks of the pseudo phase, at most `world_size` (the "
        "shared model needs less memory); the others join at the delink. "
        "0: `world_size`."),
    INT("nodes", "expert_parallel", nodes.expert_parallel, 1, 65536,
        "P: ranks each MoE slot's experts are split over (expert "
        "parallelism: a rank holds about E/P experts of each MoE slot, "
        "tokens reach them by all-to-all; dense and router weights are "
        "replicated). Must divide `world_size` and be at most "
        "`model.moe.num_experts`; needs MoE blocks. P > 1 runs on `cpu`, "
        "offloading or not (a rank's slots hold its experts, placed by its "
        "own plan), AdamW or Adafactor, fp32 or bf16 masters, "
        "`optimizer.shard` over each expert's replicas; "
        "`pseudo_world_size` 1 or a multiple of P (`world_size` / P "
        "replicas of each expert-parallel group). Every checkpoint is the "
        "one-rank model's (rank 0 gathers the experts)."),
    INT("nodes", "timeout", nodes.timeout, 1, 86400,
        "Seconds a collective (or the rendezvous) may wait for a peer "
        "before the run is paused."),
};
const size_t spec_n_keys_ = sizeof spec_keys_ / sizeof spec_keys_[0];

const char *spec_backend_name(backend_kind b)
{
    return b == BACKEND_CPU || b == BACKEND_CUDA ? backend_names_[b] : "?";
}

const char *spec_precision_name(precision_kind p)
{
    return p == PRECISION_FP32 || p == PRECISION_BF16 ? precision_names_[p]
                                                      : "?";
}

const char *spec_optimizer_name(optimizer_kind o)
{
    return o == OPTIMIZER_ADAMW || o == OPTIMIZER_ADAFACTOR
               ? optimizer_names_[o] : "?";
}

const char *spec_master_name(master_kind m)
{
    return m >= 0 && m < (int)(sizeof master_names_ / sizeof *master_names_) - 1
               ? master_names_[m] : "?";
}

const char *spec_delink_policy_name(delink_policy p)
{
    return p == DELINK_AT_STEP || p == DELINK_AT_PLATEAU ? policy_names_[p]
                                                         : "?";
}
