/*
 * trainer_internal.h — what the trainer's three files share, private to
 * daemon/train/: the trainer's state (struct trainer) and the helpers one
 * file calls in another. trainer.c owns the step (setup, data, schedule,
 * evaluation, delink); gradsync.c the data-parallel gradient sum (buckets,
 * the overlap thread, the state broadcast); trainer_ckpt.c the checkpoint
 * files (save, load, init.from) and the state copies. Nothing outside
 * daemon/train/ includes this header: trainer.h is the interface.
 */
#ifndef M6_TRAIN_TRAINER_INTERNAL_H
#define M6_TRAIN_TRAINER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "model/gpt.h"
#include "offload/offload.h"
#include "train/backend.h"
#include "train/data.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

typedef struct trainer_ep trainer_ep;

struct trainer {
    run_spec spec;
    backend be;            /* the model: weights, gradients, optimizer */
    backend_setup bsetup;  /* what be was made from (create_) */
    model_config bmodel;   /* the model be holds: spec.model, with
                            * moe_ep_* set under expert parallelism (its
                            * slots then hold this rank's experts only) */
    trainer_ep *ep;        /* expert parallelism (trainer_ep.c); NULL:
                            * none */
    m6_coll *ep_given[2];  /* trainer_adopt_expert_groups: the expert-
                            * parallel group and the experts' replicas
                            * (owned); NULL: none given */
    offload_stats off_before; /* the since-creation offload counts of the
                               * backends be replaced (trainer_ep.c's
                               * re-lays), added to be's own by
                               * trainer_offload_stats; zeros: none */
    unsigned char *dp_kind;  /* [S] each slot's kind (gradsync_layout_) */
    /* the plain layout of gpt.h (checkpoints, state access) */
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t n_global, slot_size;
    token_set train, val;  /* n_shards 0: not open (trainer_create_resumable,
                            * or a failed trainer_reopen_data) */
    size_t data_total[2];  /* tokens of train, val when first opened by this
                            * trainer, 0 not yet: what a reopen must find */
    uint64_t data_rng;     /* state of the training-batch sampler */
    long step;             /* optimizer steps completed */
    long delink_step;      /* step at which delink happened, -1 if none */
    run_phase phase;
    offload_plan plan;     /* the run's memory plan (planned: a budget), as
                            * create_ made it: Real, plan.pseudo Pseudo */
    int planned;
    int32_t *inp, *tgt;    /* (B,T) */
    uint16_t *rows;        /* (grad_accum*B, T+1): the step's windows */
    /* device bytes of the unbudgeted plan, [pseudo], [real]: what a run
     * that does not offload holds (step_placement); peak_planned 0: not
     * yet computed */
    size_t plan_peak[2];
    int peak_planned;
    char *init_error;      /* trainer_init_error; NULL none */
    /* data parallelism (trainer_set_collectives): coll NULL or world 1:
     * alone. B_rank, accum_rank: this rank's microbatches (spec_dp_split;
     * the spec's B and grad_accum alone) */
    m6_coll *coll;
    m6_coll *gcoll;         /* trainer_adopt_grad_group (owned): the
                             * gradient summed in device memory over it
                             * (NCCL); NULL: over coll (host memory) */
    m6_local *local;        /* trainer_adopt_node_groups (owned): the
                             * gradient buckets summed inside the node
                             * first (dist/local.h); NULL: over coll */
    m6_coll *leaders;       /* (owned) the nodes' leaders' group, on
                             * local rank 0 of a run over several nodes */
    int rank, world;
    int B_rank, accum_rank;
    float *bucket;          /* bucket_floats: the all-reduce staging */
    size_t bucket_floats;
    /* Which rank a bad gradient came from (host all-reduce only): this
     * rank's own gradient before the sum (finite elements' sum of squares,
     * count of non-finite elements), then, after one all-reduce of
     * 2*world floats at the end of the buckets, every rank's:
     * dp_rank_stats[2r], [2r+1]. dp_stats_valid: gathered this step. */
    double dp_local_sumsq, dp_local_nonfinite;
    float *dp_rank_stats;
    /* (MoE blocks, E): consecutive steps each expert has processed no
     * token of any rank (train.expert_idle_steps); NULL until first used */
    long *moe_idle;
    float *moe_tokens;    /* the step's tokens of each, over the ranks */
    int dp_rank_stats_world;
    int dp_stats_valid;
    /* overlap (dp_overlap 1): during the step's last microbatch the
     * backend reports finished slots (dp_ready_) and a communication
     * thread all-reduces each bucket once its regions are final. Under
     * dp_mu: dp_ready [dp_nreg] (regions of the virtual vector, see
     * grad_span_), dp_active (a step's thread runs), dp_loss, dp_rc and
     * dp_err (the thread's result). */
    int dp_overlap;
    /* trainer_set_eval_interrupt: asked between validation batches */
    int (*eval_stop)(void *ud);
    void *eval_stop_ud;
    int dp_sync;            /* dp_mu, dp_cv initialised */
    pthread_mutex_t dp_mu;
    pthread_cond_t dp_cv;
    unsigned char *dp_ready;
    size_t *dp_start;       /* [dp_nstart] first element of each region of
                             * the virtual vector, then its length
                             * (dp_layout_); a region is its slot's size */
    int dp_nstart;
    int dp_nreg, dp_active, dp_rc;
    int dp_mb_done;         /* the last microbatch returned */
    float dp_loss;
    m6_err dp_err;
    /* the last overlapped step: slots the backend reported before its
     * last microbatch returned, buckets whose all-reduce started before
     * then, and all buckets (trainer_dp_overlap_counts) */
    long dp_reported, dp_early, dp_buckets;
    size_t *win_pos;        /* (grad_accum*B) positions of this rank's
                             * windows of the last step; n_win of them */
    size_t n_win;
    int sharded;           /* the backend's optimizer state is sharded
                            * (optimizer.shard, gradsync_shard_: over
                            * the world's ranks, or each expert's
                            * replicas) */
    long bad_steps;        /* consecutive skipped (non-finite) steps */
    long skipped_steps;    /* all of them; both in checkpoints */
    /* tests (train/test_hooks.h): a fault armed for steps
     * fault_first..fault_first+fault_count-1 */
    trainer_fault fault;
    long fault_first, fault_count;
    int fault_slot;
    int fault_rank;            /* M6_TEST_FAULT_RANK: only this rank; -1 all */
};

/* The all-reduce bucket's size in floats until trainer_set_bucket_floats. */
#define DEFAULT_BUCKET_FLOATS ((size_t)4 << 20)

static inline int n_slots_(const trainer *t)
{
    return t->be.iface->n_slots(t->be.ctx);
}

/* ---- trainer.c */

/* Validation batch i into t->inp/t->tgt: fixed, consecutive windows (the
 * same every eval). 0, or TRAINER_EDATA with err. */
int trainer_val_batch_(trainer *t, int i, m6_err *err);

/* ---- trainer_ckpt.c */

/* Each slot's kind (1 MoE) under the backend's share map, malloc'd [S];
 * NULL when out of memory. */
unsigned char *trainer_slot_kinds_(const trainer *t);
/* Floats of state buffer b of one region (region -1 the globals, 0 a
 * dense slot, 1 an MoE slot) of the spec's model whose weights are n
 * floats: n for the weights and for AdamW's m and v; Adafactor's m only
 * with a first moment (else 0), its v factored (gpt_af_tensors owns the
 * sizes). SIZE_MAX when out of memory. */
size_t trainer_state_floats_(const trainer *t, backend_buf b, int region,
                             size_t n);

/* init.from (ckpt/init_from.h): the weights of the spec's directory into
 * the new model, checked first; the optimizer stays fresh. 0, or -1 with
 * err. */
int trainer_init_from_load_(trainer *t, m6_err *err);

/* ---- gradsync.c (world > 1; t->coll the host group) */

/* Whether any rank failed (failed: this one did), by an all-reduce of the
 * count: 1 some rank failed (err says why), 0 none, -1 the collective
 * failed (err). key names the data split in the message. */
int gradsync_agree_(trainer *t, int failed, const char *key, m6_err *err);

/* Lay out the step's virtual gradient vector [loss | globals | slots] for
 * the current slots (once per step: a delink changes them). 0, or -1 out
 * of memory. */
int gradsync_layout_(trainer *t);

/* Sum the step's gradient and *loss_sum over the ranks after the
 * microbatches: over the host group (host), or in device memory over
 * t->gcoll (device). 0, or -1 with err (the collective's). */
int gradsync_allreduce_host_(trainer *t, double *loss_sum, m6_err *err);
int gradsync_allreduce_device_(trainer *t, double *loss_sum, m6_err *err);

/* Overlap: start the communication thread before the step's last
 * microbatch (1 started, 0 not: sum after the microbatches instead), and
 * after it wait for the last buckets (0, or -1 with err). */
int gradsync_overlap_start_(trainer *t, pthread_t *th);
int gradsync_overlap_finish_(trainer *t, pthread_t th, double *loss_sum,
                             m6_err *err);

/* Validation on W ranks: rank r the spec's batches r, r+W, ...; the sums
 * all-reduced into *loss. 0, TRAINER_EDATA or TRAINER_ECOLL with err. */
int gradsync_eval_(trainer *t, float *loss, m6_err *err);

/* optimizer.shard (ZeRO stage 1) over t->coll, or under expert
 * parallelism over the D ranks holding this rank's experts (each replica
 * group shards its own layout; nothing when D is 1). shard: keep this rank's
 * range of the AdamW state (nothing when the spec does not shard, alone,
 * or sharded already). unshard: every rank's range gathered, the state
 * whole again on every rank (a collective: every rank calls it at the same
 * point). allgather_params: after a sharded update, every rank's updated
 * range of the weights to every rank. 0, or -1 with err. */
int gradsync_shard_(trainer *t, m6_err *err);
int gradsync_unshard_(trainer *t, m6_err *err);

/* Before t's backend is freed for another (trainer_ep.c): its offload
 * counts kept in t->off_before, so that the run's since-start figures
 * (trainer_offload_stats) go on from them. */
void trainer_keep_offload_counts_(trainer *t);

/* Tell t's backend how the step's gradient is summed over t->coll
 * (backend.h dp_device and data_parallel: the rank's microbatches, the
 * last one's gradient final in host memory on return). Every backend the
 * trainer adopts hears it, a replacement included (trainer_ep.c's
 * re-lays): one that has not waits for no drain at the last microbatch,
 * and the all-reduce reads an offloaded slot's gradient half landed. */
void gradsync_backend_(trainer *t);
int gradsync_allgather_params_(trainer *t, m6_err *err);

/* The MoE router sums of all ranks' microbatches: *st this rank's on
 * entry, the group's on return, exactly (rank order). 0, or -1 with err. */
int gradsync_moe_gather_(trainer *t, gpt_moe_stats *st, m6_err *err);

/* ---- trainer_ep.c (nodes.expert_parallel P > 1) */

/* With the group c of P = world ranks: the model re-laid to this rank's
 * experts (a new backend of t->bmodel, the old state's values copied),
 * its MoE blocks run over c (train/moe_ep.h), no overlap. Nothing when
 * the spec has no expert parallelism or it is on already. 0, or -1 with
 * err (the old model kept). */
int trainer_ep_start_(trainer *t, m6_coll *c, m6_err *err);
void trainer_ep_free_(trainer_ep *e);
/* The all-to-alls over c from now on (a new group of the same ranks); c
 * NULL: the group is gone: a trainer holding every expert (rank 0 after
 * trainer_ep_gather_root_) is a plain one again (t->ep freed: a later
 * group re-lays it), any other fails every later step saying so (this
 * rank holds only its experts: it cannot train alone). */
void trainer_ep_regroup_(trainer *t, m6_coll *c);
/* Destroy the groups trainer_adopt_expert_groups gave (leaving the run's
 * group, trainer_free). */
void trainer_ep_groups_free_(trainer *t);
/* At a save's step boundary (trainer_sync_boundary; every rank, after
 * agreeing): every rank's experts sent to rank 0, whose model then holds
 * every expert (a new backend of spec.model; the others keep theirs)
 * until its next step (trainer_ep_local_again_). 0, or -1 with err. */
int trainer_ep_gather_root_(trainer *t, m6_err *err);
/* Rank 0 after a gather: back to its own experts (no collective).
 * Nothing otherwise. 0, or -1 with err. */
int trainer_ep_local_again_(trainer *t, m6_err *err);
/* 1 when the model holds every expert (no expert parallelism, or rank 0
 * gathered): it may be saved. */
int trainer_ep_whole_(const trainer *t);
/* -1 with the all-to-all's err when one failed since the last call (the
 * group is then broken), else 0. */
int trainer_ep_check_(trainer *t, m6_err *err);
/* Replicas (world = D x P): each MoE slot's local experts' gradient
 * summed over the D ranks holding the same experts, after the step's
 * all-reduce and before the norm, each slot then reported to the backend
 * as summed (backend.h grad_summed; the all-reduce does not report them
 * with replicas: trainer_ep_replica_group_). Nothing without replicas.
 * 0, or -1 with err. */
int trainer_ep_reduce_experts_(trainer *t, m6_err *err);
/* The group of the D ranks holding this rank's experts (world = D x P,
 * D > 1), or NULL: none. */
m6_coll *trainer_ep_replica_group_(const trainer *t);
/* The floats of a slot of kind moe that the gradient all-reduce skips
 * (this rank's experts, summed by the all-to-all already) and their start
 * *h0 in the slot; 0 without expert parallelism or for a dense slot. */
size_t trainer_ep_hole_(const trainer *t, int moe, size_t *h0);
/* The step's global gradient norm, every parameter once: the dense and
 * router squares of this rank (the same on every rank after the
 * all-reduce) plus every rank's expert squares (one all-reduce of 2W
 * floats, exact). After the backend's grad_norm. 0, or -1 with err. */
int trainer_ep_norm_(trainer *t, float *norm, m6_err *err);

#endif /* M6_TRAIN_TRAINER_INTERNAL_H */
