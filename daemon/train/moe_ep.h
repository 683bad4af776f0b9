/*
 * moe_ep.h — one MoE layer with its experts spread over the P ranks of an
 * expert-parallel group (expert parallelism, the layout M6-10T trained in:
 * Lin et al. 2021, arXiv 2110.03888; the all-to-all dispatch of GShard:
 * Lepikhin et al. 2020, arXiv 2006.16668). CPU engine, fp32.
 *
 * Every rank holds the router (gate) whole and the experts of its range
 * (model_expert_range: rank q the contiguous global experts
 * [first_q, first_q + El_q)). A rank routes its own N tokens exactly as
 * the one-rank layer does (kernels.h "mixture of experts": the same
 * probabilities, top-1 per prototype, capacity per expert over this rank's
 * N tokens, the same auxiliary and z losses over its tokens), then:
 *
 *   forward   gather the dispatch rows (expert by expert, so each owner's
 *             rows are contiguous); all-to-all of the per-expert row
 *             counts, then of the rows; the local experts' MLPs over the
 *             rows of every sender; all-to-all of their outputs back;
 *             combine on the tokens' rank
 *   backward  the combine's backward on the tokens' rank; all-to-all of
 *             the output gradients to the owners; the local experts'
 *             backward (their weight gradients summed over every
 *             sender's rows); all-to-all of the input gradients back;
 *             scatter and the router's backward on the tokens' rank
 *
 * A routing group (d->N_group = P*N, spec model.moe.capacity_scope
 * "group") routes the group's P*N tokens as one microbatch, ranks in
 * order: before the capacity, one more all-to-all gives every rank every
 * rank's routed counts and probability sums (as doubles), so that each
 * expert's capacity counts the pairs of lower ranks first (moe_route_plan
 * with `before`) and every rank's balancing loss and its gradient use the
 * group's fractions (moe_balance_loss, moe_router_backward on the group's
 * routed). The z-loss stays each rank's mean: averaged over the ranks it
 * is the group's.
 *
 * Three all-to-alls forward (four in a routing group) and two backward,
 * entered by every rank of
 * the group in the same order whatever the routing (a rank whose experts
 * get no token, or that sends none, still takes part). An expert with no
 * rows gets nothing added to its gradients (an exact zero where the
 * caller zeroed them). The result equals the one-rank layer on each
 * rank's tokens, with each expert's gradient summed over the ranks, to
 * the rounding of GEMMs over differently grouped rows (test moe_ep).
 *
 * Not thread-safe; one moe_ep per layer and group (it keeps the forward's
 * routing and rows for the backward).
 */
#ifndef M6_TRAIN_MOE_EP_H
#define M6_TRAIN_MOE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "dist/collectives.h"
#include "kernels.h"

typedef struct moe_ep moe_ep;

/* A layer of dimensions d (d->N tokens on each rank, d->capacity set) over
 * the group g (host buffers: a gloo group), which must outlive it. NULL
 * with err: M6_EINVALID when k does not divide E or the group is on device
 * buffers, M6_EINTERNAL when out of memory. */
moe_ep *moe_ep_create(const moe_dims *d, m6_coll *g, m6_err *err);

/* This rank's experts: the first global index, and the count El (the
 * weights passed below have El experts: w1 (El,H,C), b1 (El,H), w2
 * (El,C,H), b2 (El,C)). */
int moe_ep_local_experts(const moe_ep *m, int *first);

/* Forward of this rank's tokens x (N,C): out (N,C) overwritten; the
 * router wg (E,C), bg (E) (may be NULL) whole; the local experts' weights.
 * aux and z: this rank's auxiliary and z losses (moe_aux_losses); dropped
 * (may be NULL): its dropped (token, prototype) pairs. Keeps what the
 * backward needs. 0, or -1 with err (a collective's: the group is then
 * broken). */
int moe_ep_forward(moe_ep *m, float *out, float *aux, float *z, int *dropped,
                   const float *x, const float *wg, const float *bg,
                   const float *w1, const float *b1, const float *w2,
                   const float *b2, m6_err *err);

/* Backward of the last forward, for loss = <dout, out> + daux aux + dz z:
 * accumulates (+=) into dx (N,C), dwg (E,C), dbg (E) (may be NULL) and
 * the local experts' dw1, db1, dw2, db2. x, wg and the weights are the
 * forward's. 0, or -1 with err. */
int moe_ep_backward(moe_ep *m, float *dx, float *dwg, float *dbg, float *dw1,
                    float *db1, float *dw2, float *db2, const float *dout,
                    const float *x, const float *wg, const float *w1,
                    const float *w2, float daux, float dz, m6_err *err);

/* The tokens of this rank each expert took in the last forward (E, after
 * capacity: moe_route's counts), for the router's figures. */
const int32_t *moe_ep_counts(const moe_ep *m);

/* What a layer's all-to-alls have cost since moe_ep_create. */
typedef struct {
    double seconds;       /* wall seconds inside the all-to-alls (with the
                           * timing barrier on: the transfers alone) */
    double wait_seconds;  /* with the timing barrier on: seconds in the
                           * barrier before each, waiting for the slowest
                           * rank to arrive; else 0 */
    uint64_t bytes_sent;  /* bytes this rank sent to the other ranks (rows
                           * and counts; what stays on the rank not
                           * counted): model_ep_alltoall_bytes predicts it
                           * per step */
    uint64_t calls;       /* all-to-alls entered: 3 a forward, 2 a backward */
} moe_ep_stats;

/* Timing only (bench/moe_ep): with on, every all-to-all is preceded by a
 * barrier, timed apart (wait_seconds), so that `seconds` holds the
 * transfers and not the wait for ranks that arrive later (as Megatron-LM's
 * --barrier-with-L1-time). Every rank of the group must set the same. */
void moe_ep_set_timing_barrier(moe_ep *m, int on);

/* The layer's all-to-all figures so far into *out. */
void moe_ep_get_stats(const moe_ep *m, moe_ep_stats *out);

void moe_ep_free(moe_ep *m);

#endif /* M6_TRAIN_MOE_EP_H */
