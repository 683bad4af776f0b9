/*
 * spec.c — the run spec (spec.h): JSON text ⇄ run_spec, with every key
 * range-checked and named in errors. One table lists every key once; parsing,
 * validation and the canonical serialisation all walk it.
 */
#include "spec/spec_internal.h"

#include "common/cpus.h"
#include "common/durable.h"
#include "common/err.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(delink_optimizer) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(delink_policy) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(backend_kind) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(grad_scale_mode) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(optimizer_kind) == sizeof(int), "enum is not int-sized");

/* ------------------------------------------------------------------------ */
/* The key table                                                             */
/* ------------------------------------------------------------------------ */


static const char *const delink_names_[] = { "copy", "reset", NULL };
static const char *const policy_names_[] = { "step", "plateau", NULL };
static const char *const backend_names_[] = { "cpu", "cuda", NULL };
/* optimizer.name (spec.h optimizer_kind) */
static const char *const optimizer_names_[] = { "adamw", "adafactor", NULL };
/* pseudo.grad_scale (spec.h grad_scale_mode) */
static const char *const grad_scale_names_[] = { "sum", "mean", NULL };
/* offload.speculative (spec.h SPEC_SPECULATIVE_*) */
static const char *const precision_names_[] = { "fp32", "bf16", NULL };
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
    FLT("model.moe", "capacity_factor", model.moe_capacity_factor, 0, 1,
        INFINITY, 0,
        "Training capacity: each expert takes at most "
        "ceil(factor * tokens / (E/k)) tokens of a microbatch; the rest "
        "pass by on the residual stream."),
    FLT("model.moe", "eval_capacity_factor", model.moe_eval_capacity_factor,
        0, 1, INFINITY, 0, "The capacity factor of validation passes."),
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
    ENUM("optimizer", "name", optimizer.name, optimizer_names_,
         "`adamw` (`train.beta1`, `beta2`, `eps`) or `adafactor` (Shazeer & "
         "Stern 2018: factored second moment of every matrix, full for "
         "vectors, update clipping; the `optimizer.*` keys below). Both use "
         "`train.lr` and its schedule, `train.weight_decay` (decoupled) and "
         "`train.grad_clip`. `adafactor` runs on `cpu`, one node, without "
         "offloading only (`device.memory_budget` 0)."),
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
    LONG("checkpoint", "every", checkpoint.every, 0, LONG_MAX,
         "Checkpoint every this many steps (also at the end, pause, stop and "
         "shutdown). 0: only at those."),
    INT("checkpoint", "keep", checkpoint.keep, 1, INT_MAX,
        "Newest checkpoints kept per run; older ones are deleted."),
    ENUM("device", "backend", device.backend, backend_names_,
         "`cpu` (oneDNN GEMMs in `precision`, OpenMP) or `cuda` (bf16 with "
         "fp32 master weights; needs an m6d built with nvcc and a GPU)."),
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
        "(1 to 64)."),
    ENUM("offload", "speculative", offload.speculative, speculative_names_,
         "With `grad_clip`: run an offloaded slot's AdamW as soon as its "
         "gradient lands, unclipped, into second buffers, kept when the "
         "global norm is within the clip and redone otherwise. `auto`: on "
         "when host memory allows its extra buffers (`m6ctl plan`)."),
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
    INT("nodes", "timeout", nodes.timeout, 1, 86400,
        "Seconds a collective (or the rendezvous) may wait for a peer "
        "before the run is paused."),
};
const size_t spec_n_keys_ = sizeof spec_keys_ / sizeof spec_keys_[0];

static const char *const sections_[] = {
    "data", "model", "pseudo", "delink", "train", "optimizer", "checkpoint",
    "device", "offload", "init", "nodes",
};
#define N_SECTIONS (sizeof sections_ / sizeof sections_[0])

static const key_ *find_key_(const char *section, const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_ *k = &spec_keys_[i];
        if ((section == NULL) != (k->section == NULL)) continue;
        if (section && strcmp(section, k->section) != 0) continue;
        if (strcmp(key, k->key) == 0) return k;
    }
    return NULL;
}

static int is_section_(const char *name)
{
    for (size_t i = 0; i < N_SECTIONS; i++)
        if (strcmp(name, sections_[i]) == 0) return 1;
    return 0;
}

/* "section.key" or "key" */
void spec_path_of_(const key_ *k, char *buf, size_t len)
{
    if (k->section) snprintf(buf, len, "%s.%s", k->section, k->key);
    else snprintf(buf, len, "%s", k->key);
}

/* ------------------------------------------------------------------------ */
/* Suggestions for unknown keys                                              */
/* ------------------------------------------------------------------------ */

/* Optimal string alignment distance (insertions, deletions, substitutions
 * and swaps of two neighbours, each 1), ignoring case; strings longer than
 * 63 bytes count as far from everything. */
static int distance_(const char *a, const char *b)
{
    enum { N = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= N || m >= N) return INT_MAX / 2;
    int d[N][N];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]);
            int cb = tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                cb == tolower((unsigned char)a[i - 2]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

/* Names from other trainers that no spelling distance leads to ours. */
static const struct { const char *alias, *path; } synonyms_[] = {
    { "learning_rate", "train.lr" },
    { "min_learning_rate", "train.min_lr" },
    { "max_steps", "train.steps" },
    { "max_iters", "train.steps" },
    { "micro_batch_size", "train.batch_size" },
    { "gradient_accumulation_steps", "train.grad_accum" },
    { "max_grad_norm", "train.grad_clip" },
    { "clip_grad_norm", "train.grad_clip" },
    { "epsilon", "train.eps" },
    { "adam_eps", "train.eps" },
    { "wd", "train.weight_decay" },
    { "eval_interval", "train.eval_every" },
    { "eval_iters", "train.eval_batches" },
    { "num_layers", "model.n_layer" },
    { "num_heads", "model.n_head" },
    { "hidden_size", "model.n_embd" },
    { "d_model", "model.n_embd" },
    { "block_size", "model.seq_len" },
    { "context_length", "model.seq_len" },
    { "delink_step", "pseudo.steps" },
    { "pseudo_steps", "pseudo.steps" },
};

/* The known key nearest to an unknown one: section (NULL at the top level)
 * and key as written. A key of the same section at distance d, or one of
 * another section at d + 1, counts when d is at most a third of the key's
 * length (at least 1); at the top level a section name counts too. Writes
 * "section.key" (or "key") to buf, or "" when nothing is near. */
static void suggest_(const char *section, const char *key, char *buf,
                     size_t len)
{
    buf[0] = 0;
    for (size_t i = 0; i < sizeof synonyms_ / sizeof synonyms_[0]; i++)
        if (strcasecmp(key, synonyms_[i].alias) == 0) {
            snprintf(buf, len, "%s", synonyms_[i].path);
            return;
        }
    int limit = (int)strlen(key) / 3;
    if (limit < 1) limit = 1;
    int best = limit + 1;
    if (!section)
        for (size_t i = 0; i < N_SECTIONS; i++) {
            int d = distance_(key, sections_[i]);
            if (d < best) {
                best = d;
                snprintf(buf, len, "%s", sections_[i]);
            }
        }
    for (int pass = 0; pass < 2; pass++)  /* own section first: it wins ties */
        for (size_t i = 0; i < N_KEYS; i++) {
            const key_ *k = &spec_keys_[i];
            int same = (section == NULL) == (k->section == NULL) &&
                       (!section || strcmp(section, k->section) == 0);
            if (same != (pass == 0)) continue;
            int d = distance_(key, k->key) + !same;
            if (d < best) {
                best = d;
                spec_path_of_(k, buf, len);
            }
        }
}

/* "unknown key 'train.learning_rate' (did you mean 'train.lr'?)" */
static void unknown_key_(const char *section, const char *key, char *err,
                         size_t errlen)
{
    char near[96];
    suggest_(section, key, near, sizeof near);
    const char *dot = section ? "." : "";
    if (near[0])
        seterr_(err, errlen, "unknown key '%s%s%s' (did you mean '%s'?)",
                section ? section : "", dot, key, near);
    else
        seterr_(err, errlen, "unknown key '%s%s%s'", section ? section : "",
                dot, key);
}

/* ------------------------------------------------------------------------ */
/* Defaults                                                                  */
/* ------------------------------------------------------------------------ */

void spec_defaults(run_spec *s)
{
    memset(s, 0, sizeof *s);  /* padding and string tails too: memcmp-stable */
    strcpy(s->name, "run");
    s->model = (model_config){ .vocab_size = 256, .n_layer = 6, .n_head = 4,
                               .n_embd = 128, .seq_len = 128,
                               .moe_experts = 0, .moe_prototypes = 1,
                               .moe_every = 1, .moe_hidden = 0,
                               .moe_capacity_factor = 1.25f,
                               .moe_eval_capacity_factor = 2.0f,
                               .moe_aux_coef = 0.01f, .moe_z_coef = 0.001f };
    s->nodes.world_size = 1;
    s->nodes.pseudo_world_size = 0;
    s->nodes.timeout = 30;
    s->pseudo.share_groups = 1;
    s->pseudo.steps = 0;
    s->pseudo.grad_scale = GRAD_SCALE_SUM;
    s->pseudo.lr_scale = 1.0f;
    s->delink.optimizer = DELINK_OPT_COPY;
    s->delink.rewarm_steps = 0;
    s->delink.policy = DELINK_AT_STEP;
    s->delink.min_delta = 0.01f;
    s->delink.patience = 3;
    s->train.steps = 1000;
    s->train.batch_size = 16;
    s->train.grad_accum = 1;
    s->train.lr = 1e-3f;
    s->train.min_lr = 1e-4f;
    s->train.warmup_steps = 50;
    s->train.weight_decay = 0.1f;
    s->train.grad_clip = 1.0f;
    s->train.beta1 = 0.9f;
    s->train.beta2 = 0.95f;
    s->train.eps = 1e-8f;
    s->train.seed = 1337;
    s->train.eval_every = 100;
    s->train.eval_batches = 8;
    s->train.max_bad_steps = SPEC_MAX_BAD_STEPS;
    s->optimizer.name = OPTIMIZER_ADAMW;
    s->optimizer.beta1 = 0.0f;
    s->optimizer.decay_rate = 0.8f;
    s->optimizer.clip_threshold = 1.0f;
    s->optimizer.eps1 = 1e-30f;
    s->optimizer.eps2 = 1e-3f;
    s->optimizer.scale_parameter = 0;
    s->checkpoint.every = 0;
    s->checkpoint.keep = 2;
    s->device.backend = BACKEND_CPU;
    s->device.threads = 0;
    s->device.memory_budget = 0;
    s->device.precision = PRECISION_FP32;
    s->offload.prefetch = 2;
    s->offload.host_threads = 0; /* auto: spec_host_threads */
    s->offload.speculative = SPEC_SPECULATIVE_AUTO;
}

int spec_host_threads(const run_spec *s)
{
    if (s->offload.host_threads > 0)
        return s->offload.host_threads;
    if (s->device.backend != BACKEND_CUDA)
        return 2; /* the CPU backend's compute threads use the cores */
    long n = cpus_available(); /* affinity, capped by the cgroup quota */
    n -= 2; /* the thread that drives the GPU, and m6d's event loop */
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

/* ------------------------------------------------------------------------ */
/* Parsing one value                                                         */
/* ------------------------------------------------------------------------ */

/* A JSON value as the operator wrote it, shortened for messages. */
static void show_(const json_t *v, char *buf, size_t len)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT |
                            JSON_REAL_PRECISION(9));
    if (!t) {
        snprintf(buf, len, "(value)");
        return;
    }
    if (strlen(t) > 60) strcpy(t + 57, "...");
    snprintf(buf, len, "%s", t);
    free(t);
}

static const char *type_name_(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

int spec_name_ok(const char *s)
{
    if (!*s || *s == '.' || *s == '-') return 0;
    if (strspn(s, "0123456789") == strlen(s)) return 0;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* "4GiB", "1.5 MiB", "512MB", "1024" → bytes (a fraction of a larger unit
 * rounds down to whole bytes; one of a byte, "1.5", is bad text). 0 ok, -1
 * bad text, -2 overflow */
int spec_parse_size(const char *s, size_t *out)
{
    static const struct { const char *sfx; unsigned long long mult; } units[] = {
        { "", 1 }, { "B", 1 },
        { "KiB", 1ULL << 10 }, { "MiB", 1ULL << 20 }, { "GiB", 1ULL << 30 },
        { "TiB", 1ULL << 40 },
        { "KB", 1000ULL }, { "MB", 1000000ULL }, { "GB", 1000000000ULL },
        { "TB", 1000000000000ULL },
    };
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    unsigned long long whole = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (whole > (ULLONG_MAX - 9) / 10) return -2;
        whole = whole * 10 + (unsigned)(*p - '0');
    }
    const char *frac = NULL;
    size_t nfrac = 0;
    if (*p == '.') {
        frac = ++p;
        for (; *p >= '0' && *p <= '9'; p++) nfrac++;
        if (nfrac == 0) return -1;
    }
    if (*p == ' ') p++;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (strcasecmp(p, units[u].sfx) != 0) continue;
        unsigned long long m = units[u].mult;
        /* a fraction of a byte ("1.5", "2.25B") is a typo, not a size */
        if (frac && m == 1 && strspn(frac, "0") < nfrac) return -1;
        if (whole > (unsigned long long)INT64_MAX / m) return -2;
        unsigned long long v = whole * m;
        if (frac) {  /* fraction of the unit, rounded down to whole bytes */
            long double f = 0, scale = 1;
            for (size_t i = 0; i < nfrac; i++) {
                scale /= 10;
                f += (frac[i] - '0') * scale;
            }
            unsigned long long extra = (unsigned long long)(f * (long double)m);
            if (v > (unsigned long long)INT64_MAX - extra) return -2;
            v += extra;
        }
        if (v > SIZE_MAX) return -2;
        *out = (size_t)v;
        return 0;
    }
    return -1;
}

/* Shortest "%.Ng" that reads back (as spec_parse reads it: strtod, then a
 * float cast) to exactly f; 9 digits always do. Keeps a '.' or exponent so
 * the value stays a JSON real. */
void spec_float_text_(float f, char *buf, size_t len)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, len, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", len - strlen(buf) - 1);
}

/* Print a float range like "> 0", ">= 0" or "in [0, 1)". */
static void range_text_(const key_ *k, char *buf, size_t len)
{
    if (isinf(k->fhi))
        snprintf(buf, len, "%s %g", k->lo_open ? ">" : ">=", k->flo);
    else
        snprintf(buf, len, "in %c%g, %g%c", k->lo_open ? '(' : '[', k->flo,
                 k->fhi, k->hi_open ? ')' : ']');
}

static int set_value_(run_spec *s, const key_ *k, const json_t *v, char *err,
                      size_t errlen)
{
    char path[64], shown[80];
    spec_path_of_(k, path, sizeof path);
    show_(v, shown, sizeof shown);
    char *dst = (char *)s + k->off;

    switch (k->kind) {
    case K_STR: {
        if (!json_is_string(v)) {
            seterr_(err, errlen, "%s: must be a string, got %s", path, shown);
            return -1;
        }
        size_t n = json_string_length(v);
        if (n >= k->size) {
            seterr_(err, errlen, "%s: too long (%zu bytes, at most %zu)", path,
                    n, k->size - 1);
            return -1;
        }
        const char *str = json_string_value(v);
        if (k->section == NULL && !spec_name_ok(str)) {
            seterr_(err, errlen,
                    "%s: must be letters, digits, '.', '_' or '-', not starting "
                    "with '.' or '-' and not all digits (those are run ids), "
                    "got %s", path, shown);
            return -1;
        }
        memset(dst, 0, k->size);
        memcpy(dst, str, n);
        return 0;
    }
    case K_INT:
    case K_LONG: {
        if (!json_is_integer(v)) {
            seterr_(err, errlen, "%s: must be an integer, got %s", path, shown);
            return -1;
        }
        long long x = json_integer_value(v);
        if (x < k->ilo || x > k->ihi) {
            if (x < k->ilo && (k->ihi == INT_MAX || k->ihi == LONG_MAX))
                seterr_(err, errlen, "%s: must be >= %lld, got %lld", path,
                        k->ilo, x);
            else
                seterr_(err, errlen, "%s: must be in [%lld, %lld], got %lld",
                        path, k->ilo, k->ihi, x);
            return -1;
        }
        if (k->kind == K_INT) { int y = (int)x; memcpy(dst, &y, sizeof y); }
        else { long y = (long)x; memcpy(dst, &y, sizeof y); }
        return 0;
    }
    case K_U64: {
        uint64_t x;
        if (json_is_integer(v) && json_integer_value(v) >= 0) {
            x = (uint64_t)json_integer_value(v);
        } else if (json_is_string(v)) {  /* full uint64 range */
            const char *t = json_string_value(v);
            char *end;
            errno = 0;
            unsigned long long y = strtoull(t, &end, 10);
            if (*t < '0' || *t > '9' || *end || errno == ERANGE) {
                seterr_(err, errlen, "%s: must be an integer in [0, 2^64), got %s",
                        path, shown);
                return -1;
            }
            x = (uint64_t)y;
        } else {
            seterr_(err, errlen, "%s: must be an integer in [0, 2^64), got %s",
                    path, shown);
            return -1;
        }
        memcpy(dst, &x, sizeof x);
        return 0;
    }
    case K_FLOAT: {
        if (!json_is_number(v)) {
            seterr_(err, errlen, "%s: must be a number, got %s", path, shown);
            return -1;
        }
        double d = json_number_value(v);
        if (!(fabs(d) <= FLT_MAX)) {
            seterr_(err, errlen, "%s: %s is out of range for a 32-bit float",
                    path, shown);
            return -1;
        }
        float f = (float)d;
        int ok = (k->lo_open ? f > k->flo : f >= k->flo) &&
                 (k->hi_open ? f < k->fhi : f <= k->fhi);
        if (!ok) {
            char range[64];
            range_text_(k, range, sizeof range);
            if ((double)f != d) {
                char ft[48];
                spec_float_text_(f, ft, sizeof ft);
                seterr_(err, errlen, "%s: must be %s, got %s (%s as a "
                        "32-bit float)", path, range, shown, ft);
            }
            else
                seterr_(err, errlen, "%s: must be %s, got %s", path, range,
                        shown);
            return -1;
        }
        memcpy(dst, &f, sizeof f);
        return 0;
    }
    case K_ENUM: {
        if (json_is_string(v)) {
            for (int i = 0; k->names[i]; i++)
                if (strcmp(json_string_value(v), k->names[i]) == 0) {
                    memcpy(dst, &i, sizeof i);
                    return 0;
                }
        }
        char want[128] = "";
        for (int i = 0; k->names[i]; i++) {
            size_t len = strlen(want);
            snprintf(want + len, sizeof want - len, "%s\"%s\"",
                     i == 0 ? "" : k->names[i + 1] ? ", " : " or ",
                     k->names[i]);
        }
        seterr_(err, errlen, "%s: must be %s, got %s", path, want, shown);
        return -1;
    }
    case K_SIZE: {
        size_t bytes;
        if (json_is_integer(v)) {
            if (json_integer_value(v) < 0) {
                seterr_(err, errlen, "%s: must be >= 0, got %s", path, shown);
                return -1;
            }
            bytes = (size_t)json_integer_value(v);
        } else if (json_is_string(v)) {
            int rc = spec_parse_size(json_string_value(v), &bytes);
            if (rc == -2) {
                seterr_(err, errlen, "%s: %s is too large", path, shown);
                return -1;
            }
            if (rc != 0) {
                seterr_(err, errlen, "%s: bad size %s (want bytes, or a number "
                        "with a suffix: " SPEC_SIZE_UNITS ")", path, shown);
                return -1;
            }
        } else {
            seterr_(err, errlen, "%s: must be bytes (an integer) or a string "
                    "like \"8GiB\", got %s", path, shown);
            return -1;
        }
        memcpy(dst, &bytes, sizeof bytes);
        return 0;
    }
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Parsing a spec                                                            */
/* ------------------------------------------------------------------------ */

/* delink.policy's rules between keys. With the `step` policy min_delta and
 * patience stay at their defaults: the canonical JSON omits them then, so a
 * spec without a policy keeps the hash it had before the policy existed. */
static int policy_check_(const run_spec *s, char *err, size_t errlen)
{
    run_spec d;
    spec_defaults(&d);
    if (s->delink.policy == DELINK_AT_STEP) {
        if (s->delink.min_delta != d.delink.min_delta ||
            s->delink.patience != d.delink.patience) {
            seterr_(err, errlen, "delink.%s: set, but delink.policy is "
                    "\"step\" (it applies to \"plateau\" only); set "
                    "delink.policy to \"plateau\" or remove it",
                    s->delink.min_delta != d.delink.min_delta ? "min_delta"
                                                             : "patience");
            return -1;
        }
        return 0;
    }
    if (s->pseudo.steps == 0) {
        seterr_(err, errlen, "delink.policy: \"plateau\" needs a pseudo "
                "phase, but pseudo.steps is 0 (the run trains the real model "
                "from scratch); set pseudo.steps, the latest delink step");
        return -1;
    }
    if (s->train.eval_every == 0) {
        seterr_(err, errlen, "delink.policy: \"plateau\" watches the "
                "validation loss, but train.eval_every is 0 (only a pass "
                "after the last step); set train.eval_every");
        return -1;
    }
    return 0;
}

/* model.moe's rules between keys. A dense model (num_experts 0) leaves the
 * other keys at their defaults: the canonical JSON omits the section then,
 * so a dense spec keeps the hash it had before MoE existed. */
static int moe_check_(const run_spec *s, char *err, size_t errlen)
{
    const model_config *m = &s->model;
    if (m->moe_experts == 0) {
        run_spec d;
        spec_defaults(&d);
        for (size_t i = 0; i < N_KEYS; i++) {
            const key_ *k = &spec_keys_[i];
            if (!k->section || strcmp(k->section, "model.moe") != 0 ||
                strcmp(k->key, "num_experts") == 0)
                continue;
            if (memcmp((const char *)s + k->off, (const char *)&d + k->off,
                       k->size) != 0) {
                seterr_(err, errlen, "model.moe.%s: set, but "
                        "model.moe.num_experts is 0 (a dense model); set "
                        "num_experts or remove it", k->key);
                return -1;
            }
        }
        return 0;
    }
    if (m->moe_experts % m->moe_prototypes != 0) {
        seterr_(err, errlen, "model.moe.prototypes: must divide "
                "model.moe.num_experts (%d %% %d != 0)", m->moe_experts,
                m->moe_prototypes);
        return -1;
    }
    if (m->moe_every > m->n_layer) {
        seterr_(err, errlen, "model.moe.every: must be in [1, model.n_layer "
                "= %d], got %d", m->n_layer, m->moe_every);
        return -1;
    }
    /* the expert tensors have E*H and E*C rows (gpt_tensor's rows are an
     * int): keep both products in range here, where the keys are named */
    long long EH = (long long)m->moe_experts * model_moe_hidden(m),
              EC = (long long)m->moe_experts * m->n_embd;
    if (EH > INT_MAX || EC > INT_MAX) {
        seterr_(err, errlen, "model.moe.num_experts: %d experts of %s %lld "
                "rows make %lld rows in one expert tensor, more than %d",
                m->moe_experts,
                EH > INT_MAX ? "model.moe.expert_hidden" : "model.n_embd",
                (long long)(EH > INT_MAX ? model_moe_hidden(m) : m->n_embd),
                EH > INT_MAX ? EH : EC, INT_MAX);
        return -1;
    }
    int n_moe = m->n_layer / m->moe_every;  /* layers l with (l+1) % n == 0 */
    if (n_moe < m->n_layer) {
        /* a mixed model: a slot holds blocks of one kind */
        if (s->pseudo.steps > 0 && s->pseudo.share_groups < 2) {
            seterr_(err, errlen, "pseudo.share_groups: model.moe.every = %d "
                    "mixes dense and MoE blocks, and a slot holds blocks of "
                    "one kind, so the pseudo model needs at least 2 slots "
                    "(one of each kind), got %d", m->moe_every,
                    s->pseudo.share_groups);
            return -1;
        }
    }
    return 0;
}

int spec_dp_split(const run_spec *s, int world, int *B_rank,
                  int *accum_rank)
{
    int B = s->train.batch_size, A = s->train.grad_accum;
    if (world < 1)
        return -1;
    if (A % world == 0) {
        *B_rank = B;
        *accum_rank = A / world;
        return 0;
    }
    if (B % world == 0) {
        *B_rank = B / world;
        *accum_rank = A;
        return 0;
    }
    return -1;
}

int spec_world_of_phase(const run_spec *s, int pseudo)
{
    return pseudo && s->nodes.pseudo_world_size > 0
               ? s->nodes.pseudo_world_size : s->nodes.world_size;
}

const char *spec_backend_name(backend_kind b)
{
    return b == BACKEND_CPU || b == BACKEND_CUDA ? backend_names_[b] : "?";
}

precision_kind spec_precision(const run_spec *s)
{
    return s->device.backend == BACKEND_CUDA ? PRECISION_BF16
                                             : s->device.precision;
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

/* optimizer.*: Adafactor's knobs only with it, and what it does not run
 * on yet refused by name. */
static int optimizer_check_(const run_spec *s, char *err, size_t errlen)
{
    if (s->optimizer.name == OPTIMIZER_ADAMW) {
        run_spec d;
        spec_defaults(&d);
        if (memcmp(&s->optimizer, &d.optimizer, sizeof s->optimizer) != 0) {
            seterr_(err, errlen, "optimizer: its keys other than name are "
                    "Adafactor's; set optimizer.name to \"adafactor\" or "
                    "remove them (AdamW's are train.beta1, beta2, eps)");
            return -1;
        }
        return 0;
    }
    if (s->device.backend == BACKEND_CUDA) {
        seterr_(err, errlen, "optimizer.name \"adafactor\" on "
                "device.backend \"cuda\" is not supported yet (the CUDA "
                "backend runs AdamW only); use device.backend \"cpu\"");
        return -1;
    }
    if (s->device.memory_budget > 0) {
        seterr_(err, errlen, "optimizer.name \"adafactor\" with offloading "
                "(device.memory_budget > 0, and so the speculative host "
                "update) is not supported yet: offloaded slots are updated "
                "by host AdamW only; set device.memory_budget to 0");
        return -1;
    }
    if (s->nodes.world_size > 1 || s->nodes.pseudo_world_size > 1) {
        seterr_(err, errlen, "optimizer.name \"adafactor\" with data "
                "parallelism (nodes.world_size or pseudo_world_size > 1) is "
                "not supported yet: a joining rank's state broadcast knows "
                "AdamW's layout only");
        return -1;
    }
    return 0;
}

const char *spec_delink_policy_name(delink_policy p)
{
    return p == DELINK_AT_STEP || p == DELINK_AT_PLATEAU ? policy_names_[p]
                                                         : "?";
}

int spec_slots_of_phase(const run_spec *s, int pseudo)
{
    return pseudo ? s->pseudo.share_groups : s->model.n_layer;
}

/* nodes.*: the worlds must split the global batch evenly, the pseudo
 * world is at most the real one and needs a pseudo phase, and what the
 * data-parallel step does not do yet is refused by name. */
static int nodes_check_(const run_spec *s, char *err, size_t errlen)
{
    int W = s->nodes.world_size, P = s->nodes.pseudo_world_size, b, a;
    if (P > W) {
        seterr_(err, errlen, "nodes.pseudo_world_size: at most "
                "nodes.world_size (%d), got %d", W, P);
        return -1;
    }
    if (P > 0 && s->pseudo.steps == 0) {
        seterr_(err, errlen, "nodes.pseudo_world_size: set, but the run has "
                "no pseudo phase (pseudo.steps is 0); remove it");
        return -1;
    }
    const char *key[2] = {"nodes.world_size", "nodes.pseudo_world_size"};
    int worlds[2] = {W, P};
    for (int i = 0; i < 2; i++)
        if (worlds[i] > 1 && spec_dp_split(s, worlds[i], &b, &a) != 0) {
            seterr_(err, errlen, "%s: %d must divide train.grad_accum (%d) "
                    "or train.batch_size (%d): every rank takes an equal "
                    "share of each global batch", key[i], worlds[i],
                    s->train.grad_accum, s->train.batch_size);
            return -1;
        }
    if (W > 1 && s->device.backend == BACKEND_CUDA &&
        s->device.memory_budget > 0) {
        seterr_(err, errlen, "nodes.world_size: %d ranks on device.backend "
                "\"cuda\" cannot offload yet (device.memory_budget must be "
                "0: an offloaded slot's host update would need the group's "
                "gradient first)", W);
        return -1;
    }
    return 0;
}

/* Checks between keys, once every key is read. */
static int cross_check_(const run_spec *s, char *err, size_t errlen)
{
    if (!s->data.train[0]) {
        seterr_(err, errlen, "data.train: required (a glob of token shards)");
        return -1;
    }
    if (!s->data.val[0]) {
        seterr_(err, errlen, "data.val: required (a glob of token shards)");
        return -1;
    }
    const model_config *m = &s->model;
    if (m->n_embd % m->n_head != 0) {
        seterr_(err, errlen, "model.n_embd: must be divisible by model.n_head "
                "(%d %% %d != 0)", m->n_embd, m->n_head);
        return -1;
    }
    if (moe_check_(s, err, errlen) != 0)
        return -1;
    if (nodes_check_(s, err, errlen) != 0)
        return -1;
    if (optimizer_check_(s, err, errlen) != 0)
        return -1;
    /* B*T is the row count of every GEMM (an int for CBLAS and cuBLAS) */
    if ((long long)s->train.batch_size * m->seq_len > INT_MAX) {
        seterr_(err, errlen, "train.batch_size * model.seq_len: %lld tokens "
                "per microbatch, at most %d (lower batch_size and raise "
                "grad_accum)", (long long)s->train.batch_size * m->seq_len,
                INT_MAX);
        return -1;
    }
    /* Parameters with their gradients and AdamW moments (16 bytes each) and
     * the activations of one microbatch (attention scores B*NH*T*T per
     * layer): beyond 1 PiB no node holds it, and the byte counts of the
     * planner would be near size_t's limit. Counted in long double. */
    long double L = m->n_layer, C = m->n_embd, T = m->seq_len,
                NH = m->n_head, V = m->vocab_size, B = s->train.batch_size;
    long double params = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
    long double acts = L * B * T * (16 * C + NH * T) + B * T * (3 * V + 14 * C);
    if (m->moe_experts > 0) {  /* MoE blocks: experts and gate */
        long double E = m->moe_experts, H = model_moe_hidden(m),
                    k = m->moe_prototypes, Lm = m->n_layer / m->moe_every;
        params += Lm * (E * (2 * H * C + H + C) + E * C + E - 8 * C * C - 5 * C);
        acts += L * B * T * (k * (2 * C + 2 * H) + E);
    }
    long double bytes = 16 * params + 4 * acts;
    if (bytes > 0x1p50L) {
        seterr_(err, errlen, "model: needs about %.3Lg PiB (%.3Lg parameters "
                "with gradients and AdamW moments, and the activations of a "
                "batch of %d x %d tokens), more than the 1 PiB m6 plans for "
                "on one node", bytes / 0x1p50L, params, s->train.batch_size,
                m->seq_len);
        return -1;
    }
    if (s->pseudo.share_groups > m->n_layer) {
        seterr_(err, errlen, "pseudo.share_groups: must be in [1, model.n_layer "
                "= %d], got %d", m->n_layer, s->pseudo.share_groups);
        return -1;
    }
    if (s->pseudo.steps > s->train.steps) {
        seterr_(err, errlen, "pseudo.steps: must be in [0, train.steps = %ld], "
                "got %ld", s->train.steps, s->pseudo.steps);
        return -1;
    }
    if (policy_check_(s, err, errlen) < 0) return -1;
    if (s->train.min_lr > s->train.lr) {
        char lr[48], min_lr[48];
        spec_float_text_(s->train.lr, lr, sizeof lr);
        spec_float_text_(s->train.min_lr, min_lr, sizeof min_lr);
        seterr_(err, errlen, "train.min_lr: must be in [0, train.lr = %s], "
                "got %s", lr, min_lr);
        return -1;
    }
    return 0;
}

/* The Pseudo-to-Real keys a spec with a pseudo phase leaves out take the
 * best setting of bench/p2r_sweep's grid (issue 21; docs/DESIGN.md "When
 * Pseudo-to-Real pays"): S = L/2 slots (at least 1, or the 2 a model with
 * dense and MoE slots needs), and a re-warmup over 5% of train.steps (at
 * most the real phase). The values then stand in the canonical JSON, so a
 * stored run resumes with them whatever later defaults are. spec_defaults
 * (the C API's starting point, without a model yet) keeps 1 and 0. */
static void p2r_defaults_(run_spec *s, const json_t *root)
{
    if (s->pseudo.steps <= 0)
        return;
    if (!json_object_get(json_object_get(root, "pseudo"), "share_groups")) {
        int S = s->model.n_layer / 2;
        if (s->model.moe_experts > 0 && s->model.moe_every > 1 && S < 2)
            S = 2;
        s->pseudo.share_groups = S < 1 ? 1 : S;
    }
    if (!json_object_get(json_object_get(root, "delink"), "rewarm_steps")) {
        long r = lround(SPEC_P2R_REWARM_FRAC * (double)s->train.steps);
        long room = s->train.steps - s->pseudo.steps;
        s->delink.rewarm_steps = r < room ? r : room < 0 ? 0 : room;
    }
}

int spec_parse(run_spec *out, const char *json, size_t len, char *err,
               size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", json ? len : 0,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        seterr_(err, errlen, "JSON syntax error at line %d, column %d: %s",
                jerr.line, jerr.column, jerr.text);
        return -1;
    }
    int rc = -1;
    char shown[80];
    if (!json_is_object(root)) {
        show_(root, shown, sizeof shown);
        seterr_(err, errlen, "spec: must be a JSON object, got %s", shown);
        goto out;
    }
    run_spec s;
    spec_defaults(&s);

    const char *name;
    json_t *val;
    json_object_foreach(root, name, val) {  /* document order */
        if (!is_section_(name)) {
            const key_ *k = find_key_(NULL, name);
            if (!k) {
                unknown_key_(NULL, name, err, errlen);
                goto out;
            }
            if (set_value_(&s, k, val, err, errlen) != 0) goto out;
            continue;
        }
        if (!json_is_object(val)) {
            seterr_(err, errlen, "%s: must be an object, got %s", name,
                    type_name_(val));
            goto out;
        }
        const char *key;
        json_t *v;
        json_object_foreach(val, key, v) {
            if (strcmp(name, "model") == 0 && strcmp(key, "moe") == 0) {
                if (!json_is_object(v)) {
                    seterr_(err, errlen, "model.moe: must be an object, got %s",
                            type_name_(v));
                    goto out;
                }
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) {
                    const key_ *k = find_key_("model.moe", mk);
                    if (!k) {
                        unknown_key_("model.moe", mk, err, errlen);
                        goto out;
                    }
                    if (set_value_(&s, k, mv, err, errlen) != 0) goto out;
                }
                continue;
            }
            const key_ *k = find_key_(name, key);
            if (!k) {
                unknown_key_(name, key, err, errlen);
                goto out;
            }
            if (set_value_(&s, k, v, err, errlen) != 0) goto out;
        }
    }
    p2r_defaults_(&s, root);
    if (cross_check_(&s, err, errlen) != 0) goto out;
    /* cuda computes in bf16 only: a spec that asks for fp32 there is
     * refused by name rather than silently trained in bf16 */
    json_t *dev = json_object_get(root, "device");
    if (s.device.backend == BACKEND_CUDA && s.device.precision ==
        PRECISION_FP32 && dev && json_object_get(dev, "precision")) {
        seterr_(err, errlen, "device.precision: \"fp32\" is not available "
                "on device.backend \"cuda\" (its kernels are bf16 with fp32 "
                "accumulation and fp32 master weights); use \"bf16\" or the "
                "\"cpu\" backend");
        goto out;
    }
    *out = s;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int spec_load_file(run_spec *s, const char *path, char *err, size_t errlen)
{
    enum { MAX_SPEC = 16 << 20 };
    struct stat st;
    int fd = open_regular(path, 0, &st, err, errlen);  /* no FIFO hang */
    if (fd < 0)
        return -1;
    if (st.st_size > MAX_SPEC) {
        seterr_(err, errlen, "%s: %lld bytes is too large for a spec (max %d)",
                path, (long long)st.st_size, MAX_SPEC);
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        seterr_(err, errlen, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    for (;;) {
        if (n == cap) {  /* file grew since fstat */
            seterr_(err, errlen, "%s: changed while being read", path);
            free(buf);
            close(fd);
            return -1;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0) {
            if (errno == EINTR) continue;
            seterr_(err, errlen, "%s: read: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    char msg[1024];
    int rc = spec_parse(s, buf, n, msg, sizeof msg);
    free(buf);
    if (rc != 0) seterr_(err, errlen, "%s: %s", path, msg);
    return rc;
}
