/*
 * trainer.h — one training run, driven one optimizer step at a time.
 *
 * The runner thread owns a trainer: it calls trainer_step() in a
 * loop and, between steps, acts on operator commands (pause, stop, delink)
 * and on the runner's phase policy (daemon/runner/). The trainer is the
 * mechanism; when to delink is decided by the caller.
 *
 * Determinism: given the spec (seed included), the sequence of losses is
 * bitwise reproducible on the CPU backend, across save/load too, and does
 * not depend on offloading: with device.memory_budget > 0 some slots may be
 * offloaded (daemon/offload/offload.h), and the losses stay bitwise those
 * of the fully resident run.
 *
 * Backends (device.backend): "cpu", the fp32 reference above, and "cuda",
 * one GPU through daemon/model/cuda/gpt_cuda.h (bf16 compute, fp32 master
 * weights and moments), available when m6 is built with CUDA. Both start
 * from the same weights for a seed, draw the same batches and follow the
 * same LR schedule; a CUDA run is bitwise reproducible on the same GPU and
 * build (its kernels use no floating-point atomics), and its losses track
 * the CPU's to bf16 precision. Checkpoints are the same files on both: one
 * written by a CUDA run loads into a CPU run of the same spec and back.
 */
#ifndef M6_TRAINER_H
#define M6_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include "common/err.h"
#include "common/phase.h"
#include "dist/collectives.h"
#include "dist/local.h"
#include "offload/offload.h"
#include "spec/spec.h"

typedef struct trainer trainer;

/* Where the model's state is and what the step copied (offload/offload.h).
 * Without a budget every slot is resident, the device bytes are the
 * plan's for the current phase (globals and slots with their gradients
 * and AdamW moments, plus activations) and nothing is copied. */
typedef struct {
    int resident_slots, offloaded_slots;
    int64_t device_bytes;       /* in use now */
    int64_t peak_device_bytes;  /* most in use at once since creation */
    int64_t budget_bytes;       /* device.memory_budget, 0 none */
    uint64_t h2d_bytes, d2h_bytes; /* copied by the step, each way */
    double h2d_s, d2h_s;        /* copy-thread (stream) busy seconds */
    double stall_s;             /* compute waiting on those copies */
    double h2d_gbps, d2h_gbps;  /* bytes / busy seconds / 1e9; NAN when
                                 * nothing was copied that way */
    double copy_hidden_fraction; /* 1 - stall / copy time, in [0,1]; NAN
                                  * when nothing was copied */
    int speculative;            /* offload.speculative is on (the plan) */
    int redone;                 /* this step's speculative host AdamW was
                                 * redone (its norm exceeded the clip) */
    uint64_t redo_steps;        /* such steps since the backend was made */
} step_placement;

/* The MoE router facts of one step, over its microbatches and MoE layers
 * (present 0 for a dense model: the rest unset). */
typedef struct {
    int present;
    double aux_loss;          /* balancing loss, mean over MoE layers and
                               * microbatches, before aux_loss_coef */
    double z_loss;            /* router z-loss, the same way, before
                               * z_loss_coef */
    double dropped_fraction;  /* dropped (token, prototype) pairs / all */
    double load_min, load_max;  /* tokens one expert processed in one
                                 * layer and microbatch, least and most */
    double load_cv;           /* their coefficient of variation (std/mean) */
    double experts_empty;     /* experts with no tokens, mean per layer and
                               * microbatch */
    /* The whole step, every rank's microbatches (from tokens, below):
     * the fewest and most tokens one (MoE block, expert) processed, the
     * (MoE block, expert) pairs that processed none (these three -1 when
     * tokens is NULL), and the (token, prototype) pairs dropped by
     * capacity, a count. Unlike load_min, load_max and experts_empty
     * these are not per microbatch. */
    long step_tokens_min, step_tokens_max, step_experts_empty;
    long step_dropped;
    /* train.expert_idle_steps: the (MoE block, expert) pairs that have
     * processed no token of any rank for that many steps or more, those
     * that reached it at this step, and the first of these (block index
     * among the MoE blocks, model_moe_layer_index; global expert); 0 and
     * -1 when train.expert_idle_steps is 0 */
    long experts_idle, idle_new;
    int idle_block, idle_expert;
    /* (MoE blocks, E): the tokens each expert processed in the step, over
     * every rank's microbatches (they add up to the step's (token,
     * prototype) pairs less step_dropped); the trainer's, valid until its
     * next step; NULL only when the backend keeps no per-expert counts */
    const float *tokens;
    size_t n_tokens;
} step_moe;

/* How many of a step's ranks with non-finite gradients step_result names
 * (nonfinite_list): the lowest ones. */
#define STEP_NONFINITE_LIST 8

/* The facts of one step, as trainer_step measured them: the caller records
 * them and derives nothing. */
typedef struct {
    long step;            /* optimizer steps done after this one (1-based) */
    run_phase phase;      /* phase this step ran in */
    float train_loss;     /* mean over the step's B*T*grad_accum tokens, nats */
    int evaluated;        /* a validation pass was due after this step
                           * (eval_every divides it, or it is the last) */
    float val_loss;       /* that pass's loss; NAN when none ran */
    float lr;             /* learning rate used */
    float grad_norm;      /* global L2 norm before clipping */
    long tokens;          /* training tokens of the step: B*T*grad_accum */
    double tokens_per_s;  /* tokens / wall seconds of the step (its
                           * validation pass not counted) */
    double step_ms;       /* those wall seconds, in ms */
    step_placement mem;   /* after the step; copies: this step's own */
    int eval_failed;      /* the step was applied but its validation pass
                           * could not read the data (TRAINER_EDATA) */
    int eval_interrupted; /* the step was applied but its validation pass
                           * was abandoned (trainer_set_eval_interrupt):
                           * val_loss NAN, nothing owed */
    step_moe moe;         /* MoE router facts; moe.present 0: dense */
    /* Non-finite steps: a loss or global gradient norm that is NaN or Inf
     * skips the update (weights, AdamW moments and AdamW's step counts
     * untouched); the step still counts for the LR schedule and the step
     * number (res->step, trainer_step_count), its batch is consumed. */
    int skipped;          /* 1: this step's update was skipped */
    long bad_steps;       /* consecutive skipped steps ending with this one
                           * (0 after a good step) */
    long skipped_total;   /* the run's skipped steps so far, this one in */
    /* Data parallel over host memory (not a device-memory group): which
     * rank a bad gradient came from, each rank's own gradient before the
     * sum. nonfinite_ranks: how many ranks had NaN/Inf elements (0 none),
     * nonfinite_rank the lowest of them (-1 none), nonfinite_list the
     * lowest min(nonfinite_ranks, STEP_NONFINITE_LIST) of them in
     * ascending order; outlier_rank: the rank
     * whose gradient norm is over GRAD_OUTLIER_RATIO times the median of
     * the others' (grad_outlier_rank; -1 none, also alone), by
     * outlier_ratio. */
    int nonfinite_ranks, nonfinite_rank;
    int nonfinite_list[STEP_NONFINITE_LIST];
    int outlier_rank;
    float outlier_ratio;
} step_result;

/* A rank's gradient norm this many times the median of the others' is
 * reported (step_result.outlier_rank). */
#define GRAD_OUTLIER_RATIO 10.0f

/* The runner reports one rank's outlier steps (grad.outlier event,
 * run.grad_outlier log) at most once per this many steps, with a count
 * of the ones in between. */
#define GRAD_OUTLIER_REPORT_STEPS 100

/* The rank whose gradient stands out: of world ranks' sums of squares
 * sumsq[world] (finite, >= 0), the largest one's norm sqrt(sumsq[r]) if it
 * is over ratio times the median of the other ranks' norms (the mean of
 * the middle two for an even count), its ratio to that median into
 * *ratio_out; else -1 and 0 (also for world < 2, a median of 0, or out of
 * memory). */
int grad_outlier_rank(const float *sumsq, int world, float ratio,
                      float *ratio_out);

/* Errors: the functions below that take an m6_err *err set it on failure
 * (the message whole, a shard's or checkpoint's full path in it, never
 * cut; its code M6_EDATA or M6_ENOFILE for data, M6_EINVALID for a spec
 * the backend or the planner refuses, M6_EINTERNAL otherwise); the
 * caller frees it with m6_err_free, and may pass the same m6_err again
 * (a new error replaces the old one). */

/* Returned by trainer_step, trainer_eval_checked and trainer_reopen_data
 * when a shard cannot be read as it was checked (truncated, a token id
 * >= vocab_size, an I/O error): err names the file and the problem. The
 * run need not end: once the data is fixed, trainer_reopen_data and a
 * retry carry on bitwise as if nothing had happened. */
#define TRAINER_EDATA (-2)

/* Returned by trainer_check_spec, trainer_create_resumable (in *data_rc)
 * and trainer_reopen_data when a shard could not be opened because m6d ran
 * out of file descriptors (EMFILE, ENFILE; a run holds one per shard): the
 * spec and the data may be fine, err says which limit was hit
 * ("data.train: too many open files (limit 1024): ..."). Otherwise it is
 * handled as TRAINER_EDATA: the same retry works once descriptors are
 * free. */
#define TRAINER_ENOFILE (-3)

/* Returned by trainer_step and trainer_eval_checked of a data-parallel
 * trainer when a collective failed: a peer died, stopped answering past
 * nodes.timeout, or its connection broke. err names the operation, this
 * rank and the cause (code M6_ECANCELLED for a timeout, M6_EINTERNAL for a
 * lost connection). The step was not applied, but the trainer's gradients
 * are not its own any more and the group is broken: free both, and resume
 * from the last checkpoint with a new group. */
#define TRAINER_ECOLL (-4)

/* Returned by trainer_eval_checked when the function given to
 * trainer_set_eval_interrupt asked it to stop between two batches: *loss
 * is NAN, err (code M6_ECANCELLED) says after how many batches. A step
 * whose pass is interrupted so returns 0 with res->eval_interrupted 1. */
#define TRAINER_EINTR (-5)

/* Build the model (S = spec->pseudo.share_groups slots when pseudo.steps > 0,
 * else L), initialise weights from the seed (GPT-2 init: N(0, 0.02), residual
 * projections scaled by 1/sqrt(2L)), open the train and val shards.
 * threads > 0 sets the OpenMP/BLAS thread count. Returns NULL with err. */
trainer *trainer_create(const run_spec *spec, m6_err *err);

/* trainer_create for a run that has trained before (m6d taking it up again
 * at a restart, from a checkpoint): data that cannot be opened -- a shard
 * truncated, missing or holding a bad token, no file descriptor left --
 * does not stop it. Then *data_rc is TRAINER_EDATA (TRAINER_ENOFILE when
 * out of file descriptors), err names the key and the problem as
 * trainer_create's would, and the trainer is built without the split that
 * failed: trainer_load, trainer_save and the accessors work; trainer_step,
 * the evals and the probes return TRAINER_EDATA (or NAN) until
 * trainer_reopen_data succeeds. Otherwise *data_rc is 0 and err is
 * untouched. NULL with err for everything else trainer_create refuses
 * (backend, memory). */
trainer *trainer_create_resumable(const run_spec *spec, int *data_rc,
                                  m6_err *err);
void trainer_free(trainer *t);

/* Why the spec's init.from could not be loaded into a trainer made by
 * trainer_create_resumable (which does not fail for it: the run's own
 * checkpoint, loaded next, replaces those weights); NULL when it loaded
 * or the spec has none. A trainer with an init error and no checkpoint
 * loaded over it holds the seed's weights and must not train
 * (run_ckpts_restore refuses it). trainer_create refuses such a spec. */
const char *trainer_init_error(const trainer *t);

/* Everything trainer_create would refuse, checked cheaply at submit time:
 * the backend, both data globs (files, headers, token range) and that each
 * split holds more than seq_len+1 tokens. 0, or -1 with err naming the key,
 * or TRAINER_ENOFILE when the shards could not be opened for want of file
 * descriptors (not the spec's fault).
 * A 'cuda' spec is refused by an m6d built without CUDA ("device.backend:
 * 'cuda': this m6d was built without CUDA"), where no device is visible
 * ("device.backend: 'cuda': no CUDA device (cudaGetDeviceCount: <why>)"),
 * for shapes gpt_cuda does not support (model.*), and, on either backend,
 * when device.memory_budget is too small even with every slot offloaded
 * or the offloaded slots need more host memory than is available. */
int trainer_check_spec(const run_spec *spec, m6_err *err);

/* The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0
 * when there are none or m6d was built without CUDA. A rank of a cuda run
 * runs on device spec device.index. Never exits. */
int trainer_cuda_devices(void);

/* Device `device`'s free memory now, bytes (0: unknown or no CUDA); opens
 * a CUDA context on it if none is open. */
uint64_t trainer_cuda_free_bytes(int device);

/* One optimizer step: grad_accum microbatches forward+backward, global-norm
 * clip, AdamW. Runs a validation pass afterwards when eval_every divides the
 * step or it is the last step. Returns 0, or -1 with err.
 * A non-finite loss or gradient norm is not an error: the step returns 0
 * with res->skipped 1 and the model untouched (see step_result); offloaded
 * slots are never updated before the norm is known to be finite, with or
 * without clipping. The caller decides when too many in a row
 * (res->bad_steps) stop the run.
 * TRAINER_EDATA: a shard could not be read. Every training window of the
 * step is read before the model is touched, so then either nothing was
 * done (res->eval_failed 0: retry the step) or the step was applied and
 * only its validation pass failed (res->eval_failed 1, res filled with
 * val_loss NAN: retry with trainer_eval_checked). */
int trainer_step(trainer *t, step_result *res, m6_err *err);

/* Mean validation loss over spec.train.eval_batches fixed batches (nats)
 * into *loss. 0, or TRAINER_EDATA or TRAINER_EINTR with err (and *loss
 * NAN). */
int trainer_eval_checked(trainer *t, float *loss, m6_err *err);

/* Make the validation passes (trainer_step's, trainer_eval_checked)
 * interruptible: fn(ud) is called before each validation batch, and when
 * it returns nonzero the pass is abandoned with TRAINER_EINTR. fn NULL:
 * never (the default). Only a trainer that trains alone is interrupted:
 * a data-parallel pass is collective, every rank must run it whole. fn
 * runs on the thread that called trainer_step and must be cheap (a flag
 * read under a lock). */
void trainer_set_eval_interrupt(trainer *t, int (*fn)(void *ud), void *ud);

/* Loss (nats) of the model on a fixed batch of the validation set, index i,
 * without touching any state: used to show delink keeps the function.
 * NAN when the data cannot be read. */
float trainer_probe_loss(trainer *t, int batch_index);

/* After TRAINER_EDATA, once the shards are fixed: open both splits again
 * by their globs (a shard replaced by rename is picked up), with every
 * check of trainer_create. Each split must hold as many tokens as when
 * this trainer first opened it, or as trainer_load's checkpoint recorded,
 * so the run draws the same batches (a split trainer_create_resumable could
 * not open, of a checkpoint that predates the counts, is taken as it is).
 * Each split's old set is closed before it is opened again, so a set of
 * many shards never needs twice its file descriptors. 0, or TRAINER_EDATA
 * (TRAINER_ENOFILE: out of file descriptors) with err naming the key and
 * the problem; the split that failed is then left closed (trainer_step
 * returns TRAINER_EDATA until a reopen works). */
int trainer_reopen_data(trainer *t, m6_err *err);

/* Delink (docs/DESIGN.md, "The delink, end to end"): S slots -> L slots, each layer a copy of the slot it
 * shared; AdamW moments copied or zeroed per spec.delink.optimizer; the LR
 * schedule continues, re-warming over spec.delink.rewarm_steps.
 * No-op returning 0 when already Real. Returns -1 with err on OOM.
 * With sharded optimizer state (optimizer.shard) it first gathers it
 * (trainer_gather_optim: a collective, every rank delinks at the same
 * step) and the next trainer_step shards the grown layout again; -1 with
 * err when that gather fails. */
int trainer_delink(trainer *t, char *err, size_t errlen);

/* ---- Data parallelism (DESIGN.md "Data parallelism") ----
 *
 * A trainer trains alone until it is given a collectives group; then it
 * is one of world_size data-parallel ranks. The global batch of a step is
 * always the spec's (train.batch_size * train.grad_accum sequences, drawn
 * by every rank's identical sampler exactly as one node draws them); rank
 * r reads only its share, windows [r*n/W, (r+1)*n/W) of the step's n in
 * draw order, as spec_dp_split's microbatches. Each microbatch's gradient
 * has the single-node loss scale 1/(B*T*grad_accum), so the sum over the
 * ranks is the one-node step's gradient; it is summed by all-reduce once
 * per optimizer step, in fixed-size buckets over
 * [loss | globals | slot 0 | ... | slot S-1] (the step's loss sum riding
 * in the first bucket), the last bucket first. Overlapped (the default,
 * trainer_set_dp_overlap), a communication thread all-reduces a bucket
 * as soon as the last microbatch's backward has finished its slots (the
 * last layers' first), so the sums are the same bits as without overlap;
 * the globals and the loss go last. Every rank then holds the same gradient,
 * so the norm (clipping) is the global one and AdamW keeps the replicas
 * identical. A shard read that fails on one rank fails the step on every
 * rank (one small all-reduce of a flag before the model is touched), so
 * the step can be retried as on one node. Validation: rank r evaluates
 * the spec's eval batches r, r+W, ...; their loss sums are all-reduced and
 * divided by eval_batches.
 *
 * trainer_step, trainer_eval_checked and trainer_broadcast_state are then
 * collective: every rank calls them, in the same order (a step that one
 * rank retries after TRAINER_EDATA, every rank retries). The others
 * (probes, saves, accessors) stay local. */

/* Make t one rank of c's group (c NULL, or a group of world size 1: train
 * alone, the one-node path bit for bit; c NULL is always taken, whatever
 * the spec's world: the trainer leaves its group). A group's world size
 * must be the spec's for the current phase (nodes.pseudo_world_size in the pseudo
 * phase when set, else nodes.world_size), its buffers host memory (gloo),
 * and a backend that can train data-parallel: cpu (offloading or not),
 * cuda without offloaded slots (its gradients staged through host memory,
 * or summed on the device over a group given to trainer_adopt_grad_group
 * first). Called between steps; after trainer_delink with the real
 * phase's group when the worlds differ. The trainer does not own c. c
 * NULL or of one rank also destroys an adopted gradient group. 0, or -1
 * with err (M6_EINVALID) naming what does not fit; t is then unchanged.
 * With optimizer.shard and more than one rank, the optimizer state is then
 * sharded over c (each rank keeps its part; trainer_gather_optim makes it
 * whole again); refused while it is sharded over an earlier group. Load
 * checkpoints before this call (trainer_load refuses a sharded trainer).
 * With nodes.expert_parallel P > 1 the group must have P ranks: the model
 * is then re-laid to this rank's experts (model_local_experts), its MoE
 * blocks run over c by all-to-all (train/moe_ep.h), overlap is off, and
 * trainer_load and trainer_broadcast_state are refused; c NULL after it
 * leaves a trainer that fails every step (it cannot train alone), except
 * on rank 0 holding every expert (trainer_sync_boundary gathered them):
 * that one is a plain trainer again, whose state a later group's
 * trainer_broadcast_state carries before it is re-laid. */
int trainer_set_collectives(trainer *t, m6_coll *c, m6_err *err);

/* Expert parallelism with replicas (nodes.world_size W = D x P, D > 1),
 * given before trainer_set_collectives' group of W: this rank's
 * expert-parallel group ep (the P world ranks d*P .. d*P+P-1 with
 * d = rank / P; its rank there rank % P), over which tokens travel, and
 * edp, the D world ranks q, q+P, ... holding the same experts (q = rank %
 * P; its rank there rank / P), over which the experts' gradients are
 * summed (the dense ones over all W). trainer_set_collectives checks
 * their sizes and ranks. The trainer owns both from now on, on failure
 * too: destroyed by the next adopt, by trainer_set_collectives with no
 * group or one rank, and by trainer_free. Between steps, while the
 * trainer's all-to-alls do not run over groups it holds already. 0, or
 * -1 with err (M6_EINVALID: not two host groups, or groups in use). */
int trainer_adopt_expert_groups(trainer *t, m6_coll *ep, m6_coll *edp,
                                m6_err *err);

/* Sum the gradients over dev, a device-memory group (nccl) of the same
 * ranks as the host group given to trainer_set_collectives next, in place
 * on the device (backend.h device_grads; the cuda backend), instead of
 * staging them through host memory over the host group (which still
 * carries the loss, the step's agreement, MoE figures, validation and
 * the state broadcast). The trainer owns dev from now on, on failure too:
 * it is destroyed by the next adopt, by trainer_set_collectives with no
 * group or one rank, and by trainer_free. Between steps. 0, or -1 with
 * err (M6_EINVALID: dev NULL or of host memory, a backend without device
 * gradients). */
int trainer_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err);

/* Sum the gradient buckets hierarchically (dist/local.h
 * m6_local_hier_allreduce_sum): inside this rank's node over local (its
 * m6d's local ranks, shared memory), across the nodes over leaders (Gloo,
 * one rank per node in node order; given on local rank 0 only, and NULL
 * with one node), back inside the node. Everything else (the loss's
 * figures, the state broadcast, ZeRO-1) stays on trainer_set_collectives'
 * group. Every rank of the run adopts its node's groups, or none does.
 * The trainer owns both (on error too): freed by trainer_free or when
 * trainer_set_collectives leaves data parallelism (NULL or world 1).
 * Host-memory gradients only. local NULL (and leaders NULL): leave the
 * node's groups the trainer holds, if any; the buckets go over the host
 * group again. 0, or -1 with err (M6_EINVALID: leaders without local, a
 * gradient group in device memory, leaders given to a rank that is not
 * local rank 0). */
int trainer_adopt_node_groups(trainer *t, m6_local *local, m6_coll *leaders,
                              m6_err *err);

/* Floats per all-reduce bucket (default 4 Mi floats, 16 MiB); n >= 1.
 * The result does not depend on it beyond float rounding (with 2 ranks
 * not at all: a+b is b+a). */
void trainer_set_bucket_floats(trainer *t, size_t n);

/* Overlap the all-reduce with the last microbatch's backward (on 1, the
 * default; the environment's M6_DP_OVERLAP=0 makes it 0 at creation) or
 * all-reduce after the microbatches (0). The same bits either way; for
 * comparison and benchmarks. Between steps. */
void trainer_set_dp_overlap(trainer *t, int on);

/* The last overlapped step (0s before one): slots whose gradient the
 * backend reported final before the last microbatch returned (all S of
 * them on the cpu backend), buckets whose all-reduce started before it
 * returned (how much overlapped: a timing, not a result), and the
 * step's buckets. */
void trainer_dp_overlap_counts(const trainer *t, long *reported, long *early,
                               long *buckets);

/* This trainer's rank and the world size (0 and 1 alone). */
int trainer_rank(const trainer *t);
int trainer_world_size(const trainer *t);

/* Copy root's whole training state to every rank of group c (not yet the
 * trainer's own: call trainer_set_collectives after it): share map
 * and slots (a rank with other slots is reslotted first), weights and
 * AdamW moments and step counts, the step, phase, delink step and the
 * sampler's state. For ranks that join at the delink (a pseudo phase on
 * fewer ranks): afterwards every rank continues as root would. Every
 * rank of the group calls it; the spec must be the same on all. 0,
 * TRAINER_ECOLL with err when a collective fails, or -1 with err (no
 * group; out of memory). */
int trainer_broadcast_state(trainer *t, m6_coll *c, int root, m6_err *err);

/* The token positions (in the training split) of the windows this rank
 * read for its last step, in the order its microbatches used them, into
 * dst (NULL: only the count); returns the count (0 before any step).
 * For tests: the ranks' windows of a step, in rank order, are the one-node
 * run's windows. */
size_t trainer_step_windows(const trainer *t, size_t *dst);

long trainer_step_count(const trainer *t);
/* Consecutive skipped (non-finite) steps up to now, and all of them; both
 * are saved in checkpoints. trainer_clear_bad_steps sets the consecutive
 * count to 0 (an operator's resume after the run paused on them). */
long trainer_bad_steps(const trainer *t);
long trainer_skipped_steps(const trainer *t);
void trainer_clear_bad_steps(trainer *t);
run_phase trainer_phase(const trainer *t);
int trainer_n_slots(const trainer *t);
/* Step at which delink happened (-1 if still pseudo or trained from scratch). */
long trainer_delink_step(const trainer *t);
/* The run's memory plan as trainer_create made it, once, from the spec
 * (offload_plan_for_spec: the Real phase; ->pseudo the Pseudo phase when
 * the run has one), valid for the trainer's life; NULL without a
 * device.memory_budget. */
const offload_plan *trainer_plan(const trainer *t);

/* Checkpoint into dir (must not exist): model.safetensors,
 * optimizer.safetensors, meta.json (with "world_size" when the trainer is
 * one of several data-parallel ranks: replicated state, written by one
 * rank, loadable at any world size). A rank of an expert-parallel group
 * holds only its experts: refused (M6_EINVALID) unless it is rank 0 after
 * trainer_sync_boundary gathered them. Written to dir.tmp-<pid>, every file
 * fsynced, renamed to dir, parent fsynced. Returns bytes written, or -1
 * with err naming the file and the cause. */
long trainer_save(trainer *t, const char *dir, m6_err *err);

/* optimizer.shard (ZeRO stage 1): make the AdamW state sharded over the
 * data-parallel group whole again on every rank, each rank's range
 * all-gathered (a collective: every rank calls it at the same step).
 * trainer_save of a sharded trainer is refused (M6_EINVALID): call this on
 * every rank first, then save on one; the checkpoint is the unsharded one
 * and resumes at any world size, sharded or not. The next trainer_step
 * shards again. 0 (also when not sharded), or TRAINER_ECOLL with err. */
int trainer_gather_optim(trainer *t, m6_err *err);

/* The step boundary of a data-parallel group with optimizer.shard, for
 * callers whose saves are one rank's at moments of that rank's choosing
 * (m6d: rank 0, the runner). Every rank of the group calls it exactly
 * once between two trainer_steps, and once after the last step, in the
 * same order as every other collective; rank 0's want_whole decides for
 * all (the others' is ignored): one all-reduce of one float, then, when
 * rank 0 wants it, every other rank sends rank 0 its part of the state
 * (one all-to-all per buffer) and keeps its shard, so the state is whole
 * on rank 0 alone (it may save it, delink, or leave the group; no other
 * rank's memory grows) and the next trainer_step shards rank 0 again.
 * Expert parallelism (nodes.expert_parallel) the same way: when rank 0
 * wants it, every rank sends rank 0 its experts (one all-to-all per
 * expert tensor, slot and buffer), so rank 0's model is whole (it may
 * save it: the checkpoint is the one-rank model's, and resumes at any
 * P) until its next trainer_step, which keeps its own experts again.
 * Without optimizer.shard or expert parallelism, or alone: no
 * collective, returns 0. 1 the
 * state is whole on this rank now (rank 0, gathered), 0 not,
 * TRAINER_ECOLL with err (a rank failed: the group is lost, and the state
 * is still sharded; never save it). */
int trainer_sync_boundary(trainer *t, int want_whole, m6_err *err);

/* Restore from a complete checkpoint dir written by trainer_save for the same
 * spec (spec hash checked; device.backend is left out of it, so checkpoints
 * move between backends). After loading, the run continues bitwise as if
 * never interrupted. Returns 0 or -1 with err. */
int trainer_load(trainer *t, const char *dir, m6_err *err);

/* After trainer_load: do the open splits hold as many tokens as the
 * checkpoint's run was trained on (meta.json train_tokens, val_tokens;
 * batches are drawn by position, so other counts mean other batches)? 0,
 * or TRAINER_EDATA with err naming the key and both counts; the split that
 * differs is closed, so trainer_step returns TRAINER_EDATA until
 * trainer_reopen_data finds the old count again. */
int trainer_check_data(trainer *t, m6_err *err);

/* Whether trainer_step runs a validation pass after step (1-based):
 * eval_every divides it, or it is the run's last (train.steps). */
int trainer_step_evaluates(const trainer *t, long step);

/* The placement now, outside a step (before the first, after a delink):
 * p's copy fields are 0 and NAN. */
void trainer_placement(trainer *t, step_placement *p);

/* Offloading figures for status and metrics: slot counts, pool capacity,
 * use and peak, bytes and GB/s each way, fraction of copy time hidden
 * behind compute. Returns 0, or -1 when offloading is off
 * (memory_budget 0; then only n_slots = n_resident = S are set). */
int trainer_offload_stats(trainer *t, offload_stats *st);

/* Device memory the run's model holds now, in bytes (changes at delink).
 * cuda: the planned allocations of gpt_cuda — bf16 weights and gradients,
 * fp32 master weights and AdamW moments, activations and scratch — without
 * cuBLASLt's workspace and the CUDA context. cpu: the stand-in device
 * pool's bytes in use when offloading (device.memory_budget > 0), else 0
 * (the model is ordinary host memory). */
size_t trainer_device_bytes(const trainer *t);

/* The model's state in the plain layout of gpt.h, [globals | slot 0 | ...
 * | slot S-1] (n_global + S*slot_size floats), wherever it is placed:
 * which 0 parameters, 1 AdamW m, 2 AdamW v. With optimizer.name
 * adafactor: 1 its first moment in that layout (0 floats without one), 2
 * its second moment in the af layout (gpt.h gpt_af_tensors: the globals'
 * region, then each slot's). Returns the float count (dst NULL: only
 * that; 0 out of memory, and 0 for the moments while they are sharded,
 * trainer_gather_optim). For tests and export; waits for pending
 * updates. */
size_t trainer_copy_state(trainer *t, int which, float *dst);

/* Bytes of optimizer state the model's resident part allocated (cpu:
 * gpt_optim_bytes, the sizes its allocations were made with); 0 where
 * the backend does not count them (cuda). */
size_t trainer_optim_bytes(const trainer *t);
/* AdamW step counts [globals, slot 0, ..., slot S-1] into dst (S+1
 * entries); returns S+1. */
int trainer_copy_adam_steps(trainer *t, long *dst);

#endif /* M6_TRAINER_H */
