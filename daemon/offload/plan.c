/*
 * plan.c — the offload planner (what is resident, what is offloaded, bytes
 * per step), its printable forms, and the submit-time preflight check.
 * The accounting is written out in offload.h; this file follows it.
 */
#include "offload/offload.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/scratch.h" /* the CUDA ops' sizes, plain C */
#include "model/cuda/act_layout.h"
#include "model/facts.h"
#include "common/view.h"
#include "common/memlimit.h"
#include "common/node_share.h"
#include "offload/intervals.h"


/* "1.50 MiB (1572864 bytes)", "1 byte" (common/view.h view_bytes) */
static const char *fmt_bytes_(char *buf, size_t len, size_t n)
{
    return view_bytes(buf, len, (double)n, VIEW_BYTES_EXACT);
}

/* "1.50 MiB", "512 B" */
static const char *short_bytes_(char *buf, size_t len, uint64_t n)
{
    return view_bytes(buf, len, (double)n, VIEW_BYTES_2DP);
}

/* ------------------------------------------------------- cuda shapes */

/* The ops' scratch sizes are asked of kernels/cuda/scratch.h (plain C,
 * the functions the ops and gpt_cuda use), the activation table of the
 * CUDA model's own (model/cuda/act_layout.h). One figure is still
 * copied: gpt_cuda_impl.cuh's RED_NSCALARS, the model's reduction
 * scalars after grad_sumsq's partials. */
#define CUDA_RED_SCALARS_ 3     /* gpt_cuda_impl.cuh RED_NSCALARS */

static size_t ceil_div_(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t pad16_(size_t n) { return ceil_div_(n, 16) * 16; }

/* Elements of gpt_cuda's global region: wte with Vp rows, wpe, ln_f. */
static size_t cuda_n_global_(const model_config *c)
{
    size_t Vp = ceil_div_((size_t)c->vocab_size, GPT_CUDA_VPAD) *
                GPT_CUDA_VPAD;
    size_t C = (size_t)c->n_embd;
    return pad16_(Vp * C + (size_t)c->seq_len * C + 2 * C);
}

/* The attention workspace gpt_cuda allocates: the cuBLASLt path's where
 * the shape and $M6_ATTENTION take it, else none (scratch.h). */
static size_t cuda_att_ws_(int B, int T, int C, int NH)
{
    return attention_impl_env(C, NH) == ATT_IMPL_GEMM
               ? attention_gemm_workspace_bytes(B, T, C, NH) : 0;
}

size_t offload_cuda_act_bytes(const model_config *c, int B_)
{
    const size_t T = (size_t)c->seq_len;
    const size_t C = (size_t)c->n_embd, NH = (size_t)c->n_head;
    const size_t B = (size_t)B_, BT = B * T;
    /* op scratch: the largest of matmul backward (OC = 4C), layernorm
     * backward and attention backward, as gpt_cuda sizes it */
    size_t scratch = matmul_backward_scratch_floats((int)BT, 4 * (int)C);
    size_t s2 = layernorm_backward_scratch_floats((int)BT, (int)C);
    size_t s3 = attention_backward_scratch_floats((int)B, (int)T, (int)NH);
    if (s2 > scratch)
        scratch = s2;
    if (s3 > scratch)
        scratch = s3;
    gpt_cuda_act_ops ops = {
        scratch, cuda_att_ws_((int)B, (int)T, (int)C, (int)NH),
        grad_sumsq_scratch_floats() + CUDA_RED_SCALARS_,
        encoder_plan_ints((int)BT),
    };
    return gpt_cuda_act_layout(c, B_, &ops, NULL);
}

/* ------------------------------------------------------------- planner */

/* Device bytes with slots [0, n_resident) resident. resident_of: NULL
 * when every slot has one kind (slot_bytes each); else [S+1] the bytes of
 * slots [0, r) for each r (a mixed model's dense and MoE slots). */
static size_t device_bytes_(const offload_plan *p, int n_resident, int prefetch,
                            const size_t *resident_of)
{
    int k = p->n_slots - n_resident;
    int nst = k < prefetch ? k : prefetch;
    size_t res = resident_of ? resident_of[n_resident]
                             : (size_t)n_resident * p->slot_bytes;
    /* cpu: the globals and resident slots are one pool block, 64-byte
     * rounded (AdamW's always fill it; Adafactor's factored state may
     * not); cuda: gpt_cuda's allocator's rounding is not counted */
    size_t block = p->global_bytes + res;
    if (p->backend == BACKEND_CPU)
        block = (block + 63) / 64 * 64;
    return block + p->act_bytes + p->workspace_bytes +
           (size_t)nst * p->staging_bytes;
}

/* h2d and d2h bytes of one optimizer step (see offload.h). resident_of:
 * as device_bytes_ (NULL: every slot slot_bytes), so slot s's weights
 * travel as (resident_of[s+1] - resident_of[s]) / resident * moved
 * (model_param_bytes: / 4 cpu, / 8 cuda). */
static int count_step_bytes_(offload_plan *p, const int *slot_of,
                             const size_t *resident_of)
{
    int L = p->n_layer;
    size_t W0 = p->staging_bytes / 2; /* one slot's weights (or grads) */
    model_param_bytes pb = model_param_bytes_of(p->backend == BACKEND_CUDA);
    offload_interval *iv = malloc(2 * (size_t)L * sizeof *iv);
    int *at = malloc(2 * (size_t)L * sizeof(int));
    unsigned char *touched = calloc((size_t)p->n_slots, 1);
    if (!iv || !at || !touched) {
        free(iv);
        free(at);
        free(touched);
        return -1;
    }
    p->h2d_bytes_per_step = p->d2h_bytes_per_step = 0;
    /* The microbatches between the first and the last cut the same pass
     * (every slot is touched after the first, none is final): one of them
     * counts for all, so the cost does not grow with grad_accum (which a
     * spec may set to 2^31 - 1: m6d plans at submit). */
    int A = p->grad_accum;
    const int reps[3] = {1, A > 2 ? A - 2 : 0, A > 1 ? 1 : 0};
    for (int k = 0; k < 3; k++) {
        if (!reps[k])
            continue;
        int n = offload_cut_pass(slot_of, L, p->placement, 1, k == 2 || A == 1,
                                 touched, iv, at);
        for (int j = 0; j < n; j++) {
            int sl = iv[j].slot;
            /* a slot's weights: moved of its resident bytes per
             * parameter (4 of 16 on the cpu, fp32; 2 on cuda, bf16) */
            size_t W = resident_of
                           ? (resident_of[sl + 1] - resident_of[sl]) /
                                 (size_t)(pb.resident / pb.moved)
                           : W0;
            size_t h2d = W, d2h = 0;
            if (iv[j].has_bwd) {
                d2h = W;
                /* CPU: the partial gradient comes back to be accumulated
                 * on the device; CUDA accumulates drained gradients on
                 * the host instead */
                if (iv[j].grad_from_host && p->backend == BACKEND_CPU)
                    h2d += W;
            }
            p->h2d_bytes_per_step += h2d * (size_t)reps[k];
            p->d2h_bytes_per_step += d2h * (size_t)reps[k];
        }
    }
    free(iv);
    free(at);
    free(touched);
    return 0;
}

int offload_stream_partials(const int *slot_of, int L,
                            const unsigned char *offloaded, int S)
{
    offload_interval *iv = malloc(2 * (size_t)L * sizeof *iv);
    int *at = malloc(2 * (size_t)L * sizeof(int));
    unsigned char *touched = calloc((size_t)S, 1);
    int n = -1;
    if (iv && at && touched) {
        int niv = offload_cut_pass(slot_of, L, offloaded, 1, 1, touched, iv,
                                   at);
        n = offload_partial_max(iv, niv);
    }
    free(iv);
    free(at);
    free(touched);
    return n;
}

int offload_stream_grad_bufs(const int *slot_of, int L,
                             const unsigned char *offloaded, int S,
                             int host_threads)
{
    int k = 0;
    for (int s = 0; s < S; s++)
        k += offloaded[s] != 0;
    int n = offload_stream_partials(slot_of, L, offloaded, S);
    if (n < 0)
        return -1;
    n += (host_threads > 1 ? host_threads : 1) + 1;
    return n > k ? k : n;
}

int offload_plan_make(const offload_plan_input *in, offload_plan *out,
                      char *err, size_t errlen)
{
    const model_config *c = &in->model;
    memset(out, 0, sizeof *out);
    int L = c->n_layer, S = in->n_slots;
    if (L < 1 || S < 1 || S > L || in->batch_size < 1 || in->grad_accum < 1 ||
        in->prefetch < 1 || c->n_head < 1 || c->n_embd % c->n_head) {
        snprintf(err, errlen,
                 "offload plan: bad input (L %d, slots %d, batch %d, accum %d, "
                 "prefetch %d)", L, S, in->batch_size, in->grad_accum,
                 in->prefetch);
        return -1;
    }
    size_t ng, ss;
    int cuda = in->backend == BACKEND_CUDA;
    /* CPU: an MoE slot's experts and gate, their gradients and moments are
     * part of ss, and the dispatch buffers (N*k rows, the most any
     * capacity factor routes) part of gpt_act_floats */
    gpt_layout_sizes(c, &ng, &ss);
    out->n_layer = L;
    out->n_slots = S;
    out->batch_size = in->batch_size;
    out->grad_accum = in->grad_accum;
    out->prefetch = in->prefetch;
    out->backend = in->backend;
    out->budget_bytes = in->budget;
    /* bytes per parameter of each placement: model/facts.h */
    model_param_bytes pb = model_param_bytes_for(cuda, &in->optim);
    out->global_bytes = pb.resident * (cuda ? cuda_n_global_(c) : ng);
    out->slot_bytes = pb.resident * ss;
    out->staging_bytes = pb.staging * ss;
    out->host_slot_bytes = pb.host * ss;
    out->pinned_slot_bytes = pb.pinned * ss;
    if (in->stream_grads && in->grad_accum != 1) {
        snprintf(err, errlen, "offload plan: streamed gradients "
                 "(offload.stream_grads) are planned with one microbatch a "
                 "step only");
        return -1;
    }
    /* streamed: an offloaded slot keeps no gradient of its own */
    int host_keep = pb.host - (in->stream_grads ? pb.host_grads : 0);
    int pin_keep = pb.pinned - (in->stream_grads ? pb.stream_grad : 0);
    out->host_slot_bytes = (size_t)host_keep * ss;
    out->pinned_slot_bytes = (size_t)pin_keep * ss;
    /* Adafactor: an offloaded slot's weights and gradients per parameter
     * (cpu: all pinned; cuda: the fp32 master and accumulator pageable,
     * the bf16 copies pinned: pb), its state by the tensors' shapes
     * (model_optim_floats; gpt_cuda_offload.cu allocates the same) */
    int af = in->optim.adafactor;
    size_t af_host[2] = {0, 0};  /* an offloaded dense [0] and MoE [1] slot */
    if (af) {
        size_t dsz;
        gpt_tensor dt[SLOT_NTENSORS_MAX];
        gpt_slot_layout(c, 0, dt, &dsz);
        /* weights and gradients (and the first moment) fill whole 64-byte
         * pool blocks; the second moment's block is rounded up to one */
        int wgh = host_keep - pb.optim;
        for (int kd = 0; kd < 2; kd++) {
            size_t n = kd ? ss : dsz;
            size_t mb = in->optim.first_moment ? n * sizeof(float) : 0;
            size_t vb = sizeof(float) *
                            model_optim_floats(c, kd && c->moe_experts > 0,
                                               &in->optim) - mb;
            af_host[kd] = (size_t)wgh * n + mb + (vb + 63) / 64 * 64;
        }
        out->host_slot_bytes = af_host[c->moe_experts > 0];
        out->pinned_slot_bytes = cuda ? (size_t)pin_keep * ss
                                      : out->host_slot_bytes;
    }
    /* bf16 masters on cuda: the bf16 weights are their masters, on the
     * device and in an offloaded slot's pinned copy (pb) */
    int mbf_cuda = in->optim.master_bf16 && cuda;
    size_t wg = (size_t)(pb.weights + pb.grads);
    if (af) {
        /* cuda: the globals' weights, gradients and first moment span wte's
         * padded rows too (cuda_n_global_); the statistics do not */
        size_t ngd = cuda ? cuda_n_global_(c) : ng;
        out->global_bytes = wg * ngd + sizeof(float) *
                            (model_optim_floats(c, -1, &in->optim) +
                             (in->optim.first_moment ? ngd - ng : 0));
        out->slot_bytes = wg * ss + sizeof(float) *
                          model_optim_floats(c, c->moe_experts > 0,
                                             &in->optim);
    }
    /* optimizer.shard: a rank keeps its share of the optimizer state (the
     * cpu backend: the spec refuses the rest); with offloading the state
     * is kept on the host apart from the slots (gpt.h state_on_host), so
     * the device and an offloaded slot's block hold weights and
     * gradients only */
    int D = in->shard_world > 1 ? in->shard_world : 1;
    int soh = in->optim.state_on_host;
    if ((D > 1 || soh) && cuda) {
        snprintf(err, errlen, "offload plan: sharded optimizer state "
                 "(optimizer.shard) is planned on the cpu backend only");
        return -1;
    }
    if (D > 1 && in->budget > 0 && !soh) {
        snprintf(err, errlen, "offload plan: optimizer.shard with "
                 "offloading keeps the state on the host (gpt_optim "
                 "state_on_host unset)");
        return -1;
    }
    /* the optimizer state of the globals and of a slot of each kind,
     * bytes, whole: AdamW's by the table, Adafactor's by its sizes */
    size_t opt_g = af ? sizeof(float) * model_optim_floats(c, -1, &in->optim)
                      : pb.optim * ng;
    size_t opt_s = af ? sizeof(float) *
                            model_optim_floats(c, c->moe_experts > 0,
                                               &in->optim)
                      : pb.optim * ss;
    if (D > 1 || soh) {
        out->global_bytes = wg * ng + (soh ? 0 : model_optim_bytes_sharded(
                                                     opt_g, D));
        out->slot_bytes = wg * ss + (soh ? 0 : model_optim_bytes_sharded(
                                                   opt_s, D));
    }
    if (soh) { /* an offloaded slot: its weights and gradient */
        host_keep -= pb.optim;
        out->host_slot_bytes = out->pinned_slot_bytes = (size_t)host_keep * ss;
        af_host[0] = af_host[1] = 0;  /* counted below at their sizes */
    }
    if (cuda) {
        out->act_bytes = offload_cuda_act_bytes(c, in->batch_size);
        out->workspace_bytes = MM_WORKSPACE; /* cuBLASLt's */
    } else {
        out->act_bytes = gpt_act_floats(c, in->batch_size) * sizeof(float);
        out->workspace_bytes = 0;
    }
    /* a mixed model (model.moe.every > 1): the slots' kinds from the share
     * map, a dense slot counted at its own size; staging buffers hold the
     * largest kind */
    int *map = malloc((size_t)L * sizeof(int));
    unsigned char *kind = malloc((size_t)S);
    size_t *res_of = NULL;
    if (!map || !kind) {
        free(map);
        free(kind);
        snprintf(err, errlen, "offload plan: out of memory");
        return -1;
    }
    if (in->slot_of)
        memcpy(map, in->slot_of, (size_t)L * sizeof(int));
    else if (gpt_default_share_map(c, S, map) != 0) {
        snprintf(err, errlen, "offload plan: no share map of %d slots "
                 "(a model of dense and MoE blocks needs at least one slot "
                 "of each kind)", S);
        free(map);
        free(kind);
        return -1;
    }
    for (int l = 0; l < L; l++)
        if (map[l] < 0 || map[l] >= S) {
            snprintf(err, errlen, "offload plan: slot_of[%d] = %d out of "
                     "range [0,%d)", l, map[l], S);
            free(map);
            free(kind);
            return -1;
        }
    if (gpt_model_mixed(c)) {
        char e2[256];
        if (gpt_slot_kinds(c, S, map, kind, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "offload plan: %s", e2);
            free(map);
            free(kind);
            return -1;
        }
        gpt_tensor tab[SLOT_NTENSORS_MAX];
        size_t ds;
        gpt_slot_layout(c, 0, tab, &ds);
        res_of = malloc(((size_t)S + 1) * sizeof(size_t));
        if (!res_of) {
            free(map);
            free(kind);
            snprintf(err, errlen, "offload plan: out of memory");
            return -1;
        }
        res_of[0] = 0;
        for (int s = 0; s < S; s++)
            res_of[s + 1] = res_of[s] + (kind[s] ? out->slot_bytes
                                         : wg * ds +
                                           (soh ? 0 : model_optim_bytes_sharded(
                                               af ? sizeof(float) *
                                                    model_optim_floats(
                                                        c, 0, &in->optim)
                                                  : pb.optim * ds, D)));
    }
    out->min_budget_bytes = device_bytes_(out, 0, in->prefetch, res_of);

    int R = S;
    if (in->budget > 0) {
        while (R >= 0 &&
               device_bytes_(out, R, in->prefetch, res_of) > in->budget)
            R--;
        if (R < 0) {
            char b[64], m[64], g[64], a[64], st[64], w[64], all[48];
            int nst = S < in->prefetch ? S : in->prefetch;
            if (S == 1)
                snprintf(all, sizeof all, "its one slot");
            else
                snprintf(all, sizeof all, "all %d slots", S);
            snprintf(err, errlen,
                     "device memory budget %s is too small for this model: "
                     "even with %s offloaded it needs %s (globals "
                     "%s, activations %s for batch %d, %d staging buffer%s of "
                     "%s, workspace %s)",
                     fmt_bytes_(b, sizeof b, in->budget), all,
                     fmt_bytes_(m, sizeof m, out->min_budget_bytes),
                     fmt_bytes_(g, sizeof g, out->global_bytes),
                     fmt_bytes_(a, sizeof a, out->act_bytes), in->batch_size,
                     nst, nst == 1 ? "" : "s",
                     fmt_bytes_(st, sizeof st, out->staging_bytes),
                     fmt_bytes_(w, sizeof w, out->workspace_bytes));
            free(map);
            free(res_of);
            free(kind);
            return -1;
        }
    }
    out->placement = calloc((size_t)S, 1);
    if (!out->placement) {
        free(map);
        free(res_of);
        free(kind);
        snprintf(err, errlen, "offload plan: out of memory");
        return -1;
    }
    out->n_resident = R;
    out->n_offloaded = S - R;
    for (int s = R; s < S; s++)
        out->placement[s] = OFFLOAD_OFFLOADED;
    out->n_staging = out->n_offloaded < in->prefetch ? out->n_offloaded
                                                     : in->prefetch;
    out->peak_device_bytes = device_bytes_(out, R, in->prefetch, res_of);
    out->host_bytes = (size_t)out->n_offloaded * out->host_slot_bytes;
    out->pinned_bytes = (size_t)out->n_offloaded * out->pinned_slot_bytes;
    /* a mixed model's offloaded slots at their own sizes: f parameters,
     * pb.resident bytes each in res_of, pb.host on the host */
    size_t f = res_of ? (res_of[S] - res_of[R]) / (soh ? wg : (size_t)pb.resident)
                      : 0;
    if (res_of) {
        out->host_bytes = (size_t)host_keep * f;
        out->pinned_bytes = (size_t)pin_keep * f;
    }
    if (af && !soh) { /* each offloaded slot at its kind's Adafactor bytes */
        int mixed = gpt_model_mixed(c);
        out->host_bytes = 0;
        for (int s = R; s < S; s++)
            out->host_bytes +=
                af_host[mixed ? kind[s] : c->moe_experts > 0];
        if (!cuda)
            out->pinned_bytes = out->host_bytes;
    }
    if (in->stream_grads && out->n_offloaded > 0) {
        out->stream_grads = 1;
        out->n_grad_bufs = offload_stream_grad_bufs(map, L, out->placement, S,
                                                    in->host_threads);
        /* cuda keeps no fp32 accumulator: each slot drained once a step */
        int partial = cuda ? offload_stream_partials(map, L, out->placement,
                                                     S)
                           : 0;
        if (out->n_grad_bufs < 0 || partial != 0) {
            free(res_of);
            free(kind);
            free(map);
            offload_plan_free(out);
            if (partial > 0)
                snprintf(err, errlen, "offload plan: streamed gradients "
                         "(offload.stream_grads) on cuda need each "
                         "offloaded slot's layers adjacent (one drain a "
                         "step); this share map uses a slot in layers "
                         "apart");
            else
                snprintf(err, errlen, "offload plan: out of memory");
            return -1;
        }
        out->grad_buf_bytes = (size_t)pb.stream_grad * ss;
        out->host_bytes += (size_t)out->n_grad_bufs * out->grad_buf_bytes;
        out->pinned_bytes += (size_t)out->n_grad_bufs * out->grad_buf_bytes;
    }
    if (soh) {
        /* the optimizer state of the whole model (each slot at its kind's
         * size), this rank's share of it, in ordinary host memory */
        size_t whole = opt_g;
        for (int s = 0; s < S; s++)
            whole += !gpt_model_mixed(c) || kind[s]
                         ? opt_s
                         : af ? sizeof(float) *
                                    model_optim_floats(c, 0, &in->optim)
                              : pb.optim * (res_of[s + 1] - res_of[s]) / wg;
        out->host_state_bytes = model_optim_bytes_sharded(whole, D);
        out->host_bytes += out->host_state_bytes;
    }
    /* the speculative update's second buffers (offload.h) */
    out->speculative_mode = in->speculative;
    out->spec_slot_bytes = pb.spec_host * ss;
    out->spec_pinned_slot_bytes = pb.spec_pinned * ss;
    size_t spec = res_of ? f * pb.spec_host
                         : (size_t)out->n_offloaded * out->spec_slot_bytes;
    size_t need = out->host_bytes + spec +
                  (cuda ? 0 : out->peak_device_bytes);
    out->speculative =
        out->n_offloaded > 0 && in->clipped && !af && !mbf_cuda && !soh &&
        (in->speculative == SPEC_SPECULATIVE_ON ||
         (in->speculative == SPEC_SPECULATIVE_AUTO && in->host_limit > 0 &&
          need <= in->host_limit));
    if (out->speculative) {
        out->host_bytes += spec;
        out->pinned_bytes +=
            res_of ? pb.spec_pinned * f
                   : (size_t)out->n_offloaded * out->spec_pinned_slot_bytes;
    }
    int rc = count_step_bytes_(out, map, res_of);
    free(res_of);
    free(kind);
    free(map);
    if (rc != 0) {
        offload_plan_free(out);
        snprintf(err, errlen, "offload plan: out of memory");
        return -1;
    }
    return 0;
}

void offload_plan_free(offload_plan *p)
{
    if (!p)
        return;
    free(p->placement);
    p->placement = NULL;
    if (p->pseudo) {
        offload_plan_free(p->pseudo);
        free(p->pseudo);
        p->pseudo = NULL;
    }
    if (p->ep_rank) {
        offload_plan_free(p->ep_rank);
        free(p->ep_rank);
        p->ep_rank = NULL;
    }
}

int offload_plan_copy(offload_plan *dst, const offload_plan *src)
{
    *dst = *src;
    dst->pseudo = NULL;
    dst->ep_rank = NULL;
    if (!src->placement)
        return 0;
    dst->placement = malloc((size_t)(src->n_slots > 0 ? src->n_slots : 1));
    if (!dst->placement)
        return -1;
    memcpy(dst->placement, src->placement, (size_t)src->n_slots);
    return 0;
}

offload_plan_input offload_plan_input_of(const run_spec *spec)
{
    return (offload_plan_input){
        .model = spec->model,
        .n_slots = spec_slots_of_phase(spec, 0),
        .slot_of = NULL,
        .batch_size = spec->train.batch_size,
        .grad_accum = spec->train.grad_accum,
        .prefetch = spec->offload.prefetch,
        .backend = spec->device.backend,
        .budget = spec->device.memory_budget,
        .speculative = spec->offload.speculative,
        .clipped = spec->train.grad_clip > 0,
        .host_limit = 0,
        .stream_grads = spec->offload.stream_grads,
        .host_threads = spec_host_threads(spec),
        .optim = spec_gpt_optim(spec),
        .shard_world = spec->optimizer.shard
                           ? spec_shard_world_of_phase(spec, 0) : 1,
    };
}

int offload_plan_for_spec(const run_spec *spec, size_t budget_override,
                          offload_plan *out, char *err, size_t errlen)
{
    return offload_plan_for_run(spec, budget_override, 0, out, err, errlen);
}

/* Without a budget, out's least budget as offloading would place the
 * state: spec_gpt_optim decides where (sharded, it leaves the device), so
 * the plan of in is made again with a budget's optimizer setting. */
static void offloaded_minimum_(const run_spec *spec,
                               const offload_plan_input *in,
                               offload_plan *out)
{
    if (in->budget)
        return;
    run_spec ob = *spec;
    ob.device.memory_budget = 1;
    offload_plan_input oin = *in;
    oin.optim = offload_plan_input_of(&ob).optim;
    offload_plan op;
    char e2[256];
    if (oin.optim.state_on_host != in->optim.state_on_host &&
        offload_plan_make(&oin, &op, e2, sizeof e2) == 0) {
        out->min_budget_bytes = op.min_budget_bytes;
        offload_plan_free(&op);
    }
}

int offload_plan_for_run(const run_spec *spec, size_t budget_override,
                         size_t host_limit, offload_plan *out, char *err,
                         size_t errlen)
{
    run_spec bs = *spec;  /* the budget decides where state lives too */
    if (budget_override)
        bs.device.memory_budget = budget_override;
    offload_plan_input in = offload_plan_input_of(&bs);
    in.host_limit = host_limit;
    if (offload_plan_make(&in, out, err, errlen) != 0)
        return -1;
    offloaded_minimum_(&bs, &in, out);
    /* auto also needs the pinned part of the second buffers to be
     * lockable: else plan without them (as for host memory) */
    if (out->speculative && in.speculative == SPEC_SPECULATIVE_AUTO &&
        out->pinned_bytes > offload_pin_limit()) {
        offload_plan_free(out);
        in.host_limit = 0;
        if (offload_plan_make(&in, out, err, errlen) != 0)
            return -1;
    }
    if (spec_starts_pseudo(spec)) {
        char e2[512];
        out->pseudo = calloc(1, sizeof *out->pseudo);
        in.n_slots = spec_slots_of_phase(spec, 1);
        if (spec->optimizer.shard)
            in.shard_world = spec_shard_world_of_phase(spec, 1);
        if (!out->pseudo ||
            offload_plan_make(&in, out->pseudo, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "pseudo phase: %s",
                     out->pseudo ? e2 : "out of memory");
            offload_plan_free(out);
            return -1;
        }
        offloaded_minimum_(&bs, &in, out->pseudo);
    }
    /* expert parallelism: a rank's own model, the most experts a rank
     * holds (model_expert_range), planned alike */
    int P = spec->nodes.expert_parallel, E = spec->model.moe_experts;
    if (P > 1 && E > 0 && spec->model.moe_ep_size <= 1) {
        run_spec rs = *spec;
        int most = 0, f;
        for (int q = 0; q < P; q++) {
            int n = model_expert_range(E, P, q, &f);
            if (n > model_expert_range(E, P, most, &f))
                most = q;
        }
        rs.model.moe_ep_size = P;
        rs.model.moe_ep_rank = most;
        char e2[512];
        out->ep_rank = calloc(1, sizeof *out->ep_rank);
        if (!out->ep_rank ||
            offload_plan_for_run(&rs, budget_override, host_limit,
                                 out->ep_rank, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "a rank's own model "
                     "(nodes.expert_parallel %d): %s", P,
                     out->ep_rank ? e2 : "out of memory");
            offload_plan_free(out);
            return -1;
        }
        out->ep_experts = model_expert_range(E, P, most, &f);
    }
    return 0;
}

/* ------------------------------------------------------------- printing */

/* The plan's view (common/view.h): one field table for the text table,
 * JSON and CSV. A row is one phase's plan; the top level (the Real phase)
 * also carries the backend and the Pseudo phase. */
typedef struct {
    const offload_plan *p;
    const char *phase; /* the text table's row label */
    int top;
} plan_row_;

#define P_ ((const plan_row_ *)row)->p

/* "0-3,7" style list of the slots with placement pl; "-" when none. */
static void slot_list_(char *buf, size_t len, const offload_plan *p, int pl)
{
    size_t o = 0;
    buf[0] = 0;
    for (int s = 0; s < p->n_slots; s++) {
        if (p->placement[s] != pl || (s > 0 && p->placement[s - 1] == pl))
            continue;
        int e = s;
        while (e + 1 < p->n_slots && p->placement[e + 1] == pl)
            e++;
        int w = e > s ? snprintf(buf + o, len - o, "%s%d-%d", o ? "," : "", s, e)
                      : snprintf(buf + o, len - o, "%s%d", o ? "," : "", s);
        if (w < 0 || (size_t)w >= len - o)
            break;
        o += (size_t)w;
    }
    if (!o)
        snprintf(buf, len, "-");
}

/* The slots with placement pl: JSON array of indices, text "1-3". */
static void slots_(const void *row, view_val *v, int pl)
{
    v->j = json_array();
    for (int s = 0; s < P_->n_slots; s++)
        if (P_->placement[s] == pl)
            json_array_append_new(v->j, json_integer(s));
    slot_list_(v->buf, sizeof v->buf, P_, pl);
    v->text = v->buf;
}

/* Bytes: JSON and CSV the count, text "1.50 MiB". */
static void bytes_(view_val *v, uint64_t n)
{
    v->i = (long long)n;
    v->text = short_bytes_(v->buf, sizeof v->buf, n);
}

static void g_phase_(const void *row, view_val *v) { v->s = ((const plan_row_ *)row)->phase; }
static void g_layers_(const void *row, view_val *v) { v->i = P_->n_layer; }
static void g_slots_(const void *row, view_val *v) { v->i = P_->n_slots; }
static void g_res_(const void *row, view_val *v) { slots_(row, v, OFFLOAD_RESIDENT); }
static void g_off_(const void *row, view_val *v) { slots_(row, v, OFFLOAD_OFFLOADED); }
static void g_nst_(const void *row, view_val *v) { v->i = P_->n_staging; }
static void g_budget_(const void *row, view_val *v) { v->i = (long long)P_->budget_bytes; }
static void g_peak_(const void *row, view_val *v) { bytes_(v, P_->peak_device_bytes); }
static void g_min_(const void *row, view_val *v) { v->i = (long long)P_->min_budget_bytes; }
static void g_host_(const void *row, view_val *v) { bytes_(v, P_->host_bytes); }
static void g_pinned_(const void *row, view_val *v) { bytes_(v, P_->pinned_bytes); }
static void g_h2d_(const void *row, view_val *v) { bytes_(v, P_->h2d_bytes_per_step); }
static void g_d2h_(const void *row, view_val *v) { bytes_(v, P_->d2h_bytes_per_step); }
static void g_batch_(const void *row, view_val *v) { v->i = P_->batch_size; }
static void g_accum_(const void *row, view_val *v) { v->i = P_->grad_accum; }
static void g_glob_(const void *row, view_val *v) { v->i = (long long)P_->global_bytes; }
static void g_slotb_(const void *row, view_val *v) { v->i = (long long)P_->slot_bytes; }
static void g_resb_(const void *row, view_val *v)
{
    v->i = (long long)((size_t)P_->n_resident * P_->slot_bytes);
}
static void g_act_(const void *row, view_val *v) { v->i = (long long)P_->act_bytes; }
static void g_stb_(const void *row, view_val *v) { v->i = (long long)P_->staging_bytes; }
static void g_sts_(const void *row, view_val *v)
{
    v->i = (long long)((size_t)P_->n_staging * P_->staging_bytes);
}
static void g_ws_(const void *row, view_val *v) { v->i = (long long)P_->workspace_bytes; }
static void g_hsl_(const void *row, view_val *v) { v->i = (long long)P_->host_slot_bytes; }
static void g_psl_(const void *row, view_val *v) { v->i = (long long)P_->pinned_slot_bytes; }

static void g_ssl_(const void *row, view_val *v) { v->i = (long long)P_->spec_slot_bytes; }
static void g_sg_(const void *row, view_val *v) { v->i = P_->stream_grads; }
static void g_ngb_(const void *row, view_val *v) { v->i = P_->n_grad_bufs; }
static void g_gbb_(const void *row, view_val *v) { v->i = (long long)P_->grad_buf_bytes; }
static void g_spsl_(const void *row, view_val *v) { v->i = (long long)P_->spec_pinned_slot_bytes; }
static void g_hstate_(const void *row, view_val *v) { v->i = (long long)P_->host_state_bytes; }

static const view_field breakdown_fields_[] = {
    {"globals_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_glob_},
    {"slot_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_slotb_},
    {"resident_slots_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_resb_},
    {"activations_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_act_},
    {"staging_buffer_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_stb_},
    {"staging_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_sts_},
    {"workspace_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_ws_},
    {"host_slot_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_hsl_},
    {"pinned_slot_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_psl_},
    {"speculative_slot_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_ssl_},
    {"speculative_pinned_slot_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_spsl_},
    {"stream_grads", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_sg_},
    {"grad_buffers", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_ngb_},
    {"grad_buffer_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_gbb_},
    {"host_state_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_hstate_},
};
static const view breakdown_view_ = VIEW_OF(breakdown_fields_);

static void g_breakdown_(const void *row, view_val *v)
{
    v->sub = &breakdown_view_;
    v->sub_row = row;
}

const char *offload_speculative_mode_name(int mode)
{
    return mode == SPEC_SPECULATIVE_AUTO ? "auto"
           : mode == SPEC_SPECULATIVE_ON ? "on"
           : mode == SPEC_SPECULATIVE_OFF ? "off"
                                          : "?";
}

int offload_speculative_mode_of(const char *name)
{
    static const int modes[] = {SPEC_SPECULATIVE_AUTO, SPEC_SPECULATIVE_ON,
                                SPEC_SPECULATIVE_OFF};
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, offload_speculative_mode_name(modes[i])))
            return modes[i];
    return -1;
}

static void g_spec_(const void *row, view_val *v) { v->i = P_->speculative; }
static void g_spec_mode_(const void *row, view_val *v)
{
    v->s = offload_speculative_mode_name(P_->speculative_mode);
}

static void g_backend_(const void *row, view_val *v)
{
    const plan_row_ *r = row;
    v->s = !r->top ? NULL : r->p->backend == BACKEND_CUDA ? "cuda" : "cpu";
}

static const view plan_view_;

static void g_ep_rank_(const void *row, view_val *v)
{
    const plan_row_ *r = row;
    if (!r->top || !r->p->ep_rank)
        return; /* none: no key */
    plan_row_ *sub = (plan_row_ *)v->buf;
    *sub = (plan_row_){.p = r->p->ep_rank, .phase = "real", .top = 1};
    v->sub = &plan_view_;
    v->sub_row = sub;
}

static void g_ep_experts_(const void *row, view_val *v)
{
    const plan_row_ *r = row;
    v->null = !r->top || !r->p->ep_rank;
    v->i = r->p->ep_experts;
}

static void g_pseudo_(const void *row, view_val *v)
{
    const plan_row_ *r = row;
    if (!r->top || !r->p->pseudo)
        return; /* unknown: no key */
    plan_row_ *sub = (plan_row_ *)v->buf;
    *sub = (plan_row_){.p = r->p->pseudo, .phase = "pseudo", .top = 0};
    v->sub = &plan_view_;
    v->sub_row = sub;
}

/* The columns' headers speak of the "device" of the backend: on cpu a
 * budgeted pool of ordinary memory, whose host side is page-locked
 * (plan_print_ relabels them). */
static const view_field plan_fields_[] = {
    {NULL, "phase", 0, -7, VIEW_STR, VF_PLAIN, 0, g_phase_},
    {"n_layer", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_layers_},
    {"n_slots", "slots", 0, 5, VIEW_INT, VF_PLAIN, 0, g_slots_},
    {"resident_slots", "resident", 0, -13, VIEW_JSON, VF_PLAIN, 0, g_res_},
    {"offloaded_slots", "offloaded", 0, -12, VIEW_JSON, VF_PLAIN, 0, g_off_},
    {"staging_buffers", "staging", 0, 7, VIEW_INT, VF_PLAIN, 0, g_nst_},
    {"budget_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_budget_},
    {"peak_device_bytes", "peak device", 0, 13, VIEW_INT, VF_PLAIN, 0, g_peak_},
    {"min_budget_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_min_},
    {"h2d_bytes_per_step", "h2d/step", 0, 13, VIEW_INT, VF_PLAIN, 0, g_h2d_},
    {"d2h_bytes_per_step", "d2h/step", 0, 13, VIEW_INT, VF_PLAIN, 0, g_d2h_},
    {"host_bytes", "host", 0, 13, VIEW_INT, VF_PLAIN, 0, g_host_},
    {"pinned_bytes", "pinned", 0, 13, VIEW_INT, VF_PLAIN, 0, g_pinned_},
    {"batch_size", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_batch_},
    {"grad_accum", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_accum_},
    {"speculative", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, g_spec_},
    {"speculative_mode", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, g_spec_mode_},
    {"breakdown", 0, 0, 0, VIEW_SUB, VF_PLAIN, 0, g_breakdown_},
    {"backend", 0, 0, 0, VIEW_STR, VF_PLAIN, VIEW_JSON_OMIT_NULL, g_backend_},
    {"pseudo", 0, 0, 0, VIEW_SUB, VF_PLAIN, VIEW_JSON_OMIT_NULL, g_pseudo_},
    {"expert_parallel_rank", 0, 0, 0, VIEW_SUB, VF_PLAIN, VIEW_JSON_OMIT_NULL,
     g_ep_rank_},
    {"expert_parallel_rank_experts", 0, 0, 0, VIEW_INT, VF_PLAIN,
     VIEW_JSON_OMIT_NULL, g_ep_experts_},
};
static const view plan_view_ = VIEW_OF(plan_fields_);

#undef P_

void offload_plan_print(FILE *f, const offload_plan *p, int json)
{
    plan_row_ real = {.p = p, .phase = "real", .top = 1};
    int cpu = p->backend == BACKEND_CPU;
    if (json) {
        view_out o = {.f = f, .v = &plan_view_, .form = VIEW_JSON_OBJECT};
        view_row(&o, &real);
        return;
    }
    /* cpu: the "device" is the budgeted memory pool, the host side of the
     * offloaded slots is page-locked (no GPU's pinned memory) */
    view_field cols[sizeof plan_fields_ / sizeof plan_fields_[0]];
    memcpy(cols, plan_fields_, sizeof cols);
    for (size_t i = 0; cpu && i < sizeof cols / sizeof cols[0]; i++) {
        if (cols[i].name && strcmp(cols[i].name, "peak_device_bytes") == 0)
            cols[i].head = "peak pool";
        if (cols[i].name && strcmp(cols[i].name, "pinned_bytes") == 0)
            cols[i].head = "locked";
    }
    const view table = VIEW_OF(cols);
    view_out o = {.f = f, .v = &table, .form = VIEW_TABLE};
    view_begin(&o);
    if (p->pseudo) {
        plan_row_ ps = {.p = p->pseudo, .phase = "pseudo", .top = 0};
        view_row(&o, &ps);
    }
    view_row(&o, &real);
    view_end(&o);
    char b[64], m[64], g[64], a[64], st[64], w[64], sl[64], hs[64], ps[64];
    char ht[32], pt[32];
    fprintf(f, "budget %s; minimum with every slot offloaded %s\n",
            p->budget_bytes ? fmt_bytes_(b, sizeof b, p->budget_bytes)
                            : "unlimited",
            fmt_bytes_(m, sizeof m, p->min_budget_bytes));
    if (!p->budget_bytes)
        fprintf(f, "note: no device.memory_budget and no --device-memory, "
                "so every slot is counted resident on one device; give "
                "--device-memory SIZE to plan offloading, or --nodes N "
                "--gpus-per-node G for the plan at scale\n");
    fprintf(f, "%s (real): globals %s + %d resident x %s + activations "
            "%s + %d staging x %s + workspace %s\n",
            cpu ? "budgeted memory pool" : "device",
            short_bytes_(g, sizeof g, p->global_bytes), p->n_resident,
            short_bytes_(sl, sizeof sl, p->slot_bytes),
            short_bytes_(a, sizeof a, p->act_bytes), p->n_staging,
            short_bytes_(st, sizeof st, p->staging_bytes),
            short_bytes_(w, sizeof w, p->workspace_bytes));
    short_bytes_(hs, sizeof hs, p->host_slot_bytes);
    short_bytes_(ht, sizeof ht, (size_t)p->n_offloaded * p->host_slot_bytes);
    if (cpu && p->stream_grads) {
        char gb[32], gt[32], sb[32];
        fprintf(f, "host (real): %d offloaded x %s = %s (cpu: fp32 params%s) "
                "+ %d gradient buffers in flight x %s = %s "
                "(offload.stream_grads), page-locked", p->n_offloaded, hs,
                ht, p->host_state_bytes ? "" : " and optimizer state",
                p->n_grad_bufs,
                short_bytes_(gb, sizeof gb, p->grad_buf_bytes),
                short_bytes_(gt, sizeof gt,
                             (size_t)p->n_grad_bufs * p->grad_buf_bytes));
        if (p->host_state_bytes)
            fprintf(f, " + optimizer state %s (this rank's share, "
                    "optimizer.shard)",
                    short_bytes_(sb, sizeof sb, p->host_state_bytes));
        fprintf(f, "\n");
    } else if (cpu && p->host_state_bytes) {
        char sb[32];
        fprintf(f, "host (real): %d offloaded x %s = %s, page-locked (cpu: "
                "fp32 params and grads) + optimizer state %s (this rank's "
                "share, optimizer.shard)\n", p->n_offloaded, hs, ht,
                short_bytes_(sb, sizeof sb, p->host_state_bytes));
    } else if (cpu)
        fprintf(f, "host (real): %d offloaded x %s = %s, page-locked (cpu: "
                "fp32 params, grads and optimizer state)\n", p->n_offloaded,
                hs, ht);
    else
        fprintf(f, "host (real): %d offloaded x %s = %s, of which %s pinned (%s "
                "a slot) (cuda: fp32 master, m, v, gradient accumulator; "
                "pinned bf16 weights and gradient)\n", p->n_offloaded, hs, ht,
                short_bytes_(pt, sizeof pt,
                             (size_t)p->n_offloaded * p->pinned_slot_bytes),
                short_bytes_(ps, sizeof ps, p->pinned_slot_bytes));
    if (p->n_offloaded > 0 && p->host_state_bytes)
        fprintf(f, "speculative clipped update (offload.speculative %s): "
                "off (it copies a slot's optimizer state, which "
                "optimizer.shard keeps apart)\n",
                offload_speculative_mode_name(p->speculative_mode));
    else if (p->n_offloaded > 0) {
        char sb[32], sp[32];
        fprintf(f, "speculative clipped update (offload.speculative %s): "
                "%s; %s a slot more (%s pinned) when on\n",
                offload_speculative_mode_name(p->speculative_mode),
                p->speculative ? "on, counted in host"
                : p->speculative_mode == SPEC_SPECULATIVE_AUTO
                    ? "off here (auto is decided by m6d at start from its "
                      "host memory)"
                    : "off",
                short_bytes_(sb, sizeof sb, p->spec_slot_bytes),
                short_bytes_(sp, sizeof sp, p->spec_pinned_slot_bytes));
    }
    if (p->ep_rank) {
        fprintf(f, "\nexpert parallelism: above, the whole model (what each "
                "rank starts with, and rank 0 holds for a save); below, a "
                "rank's own model once its group forms (%d experts of each "
                "MoE slot, the most a rank holds):\n", p->ep_experts);
        offload_plan_print(f, p->ep_rank, 0);
    }
}

/* ------------------------------------------------------------- preflight */

/* Host memory m6d may still use (MemAvailable capped by its cgroup's
 * memory limit, common/memlimit.h) in bytes, or SIZE_MAX when unknown; *m
 * says what bound it. */
static size_t mem_available_(host_mem *m)
{
    host_mem_available(m);
    return m->avail >= SIZE_MAX ? SIZE_MAX : (size_t)m->avail;
}

size_t offload_host_available(void)
{
    host_mem m;
    size_t a = mem_available_(&m);
    return a == SIZE_MAX ? 0 : a;
}

size_t offload_rank_host_available(const run_spec *spec)
{
    return node_share_bytes(offload_host_available(),
                            node_share_ranks(spec->nodes.world_size));
}

/* The node's host memory (and what bound it) as one rank of spec's run
 * has it: its share among the run's ranks on this node (*k of them).
 * SIZE_MAX unknown. */
static size_t rank_mem_available_(const run_spec *spec, host_mem *m, int *k)
{
    *k = node_share_ranks(spec->nodes.world_size);
    return node_share_bytes(mem_available_(m), *k);
}

/* For refusals on a node of several ranks: "; node vm runs 2 ranks of
 * this run, which share its host memory: 1.50 GiB (1610612736 bytes)
 * each" (empty with one rank). Returns buf. */
static const char *share_clause_(char *buf, size_t len, int k,
                                 size_t each, const char *what)
{
    char b[64];
    if (k <= 1) {
        buf[0] = 0;
        return buf;
    }
    snprintf(buf, len, "; %s runs %d ranks of this run, which share its "
             "%s: %s each", node_share_name(), k, what,
             each == SIZE_MAX ? "no limit"
                              : fmt_bytes_(b, sizeof b, each));
    return buf;
}

int offload_check(const run_spec *spec, size_t budget_override, int flags,
                  offload_plan *out, char *warn, size_t warnlen, char *err,
                  size_t errlen)
{
    offload_plan p;
    if (warnlen)
        warn[0] = 0;
    /* as m6ctl plans (no host limit: auto speculation shows off, and is
     * decided when the run starts, never failing it); on is counted */
    if (offload_plan_for_spec(spec, budget_override, &p, err, errlen) != 0)
        return -1;
    /* the Real phase needs the most host memory */
    size_t host = p.host_bytes, pinned = p.pinned_bytes;
    char a[64], b[64], c[64];
    /* On the CPU backend the "device" is host memory too. */
    size_t cpu = p.backend == BACKEND_CPU ? p.peak_device_bytes : 0;
    /* the node's memory and lockable pages are shared by the run's
     * ranks on it (common/node_share.h): each must fit its share */
    host_mem hm;
    int k = 1;
    size_t avail = cpu + host > 0 ? rank_mem_available_(spec, &hm, &k)
                                  : SIZE_MAX;
    char why[768], sh[320];
    if (avail != SIZE_MAX && cpu > 0 && cpu + host > avail) {
        snprintf(err, errlen,
                 "host memory: training needs %s (parameters, gradients, AdamW "
                 "moments and activations; `m6ctl plan` itemises them), %s%s",
                 fmt_bytes_(a, sizeof a, cpu + host),
                 host_mem_describe(&hm, why, sizeof why),
                 share_clause_(sh, sizeof sh, k, avail, "host memory"));
        offload_plan_free(&p);
        return -1;
    }
    if (avail != SIZE_MAX && host > avail) {
        snprintf(err, errlen,
                 "host memory: offloading %d slots needs %s of host memory, "
                 "%s of it pinned; %s%s", p.n_offloaded,
                 fmt_bytes_(a, sizeof a, host),
                 short_bytes_(c, sizeof c, pinned),
                 host_mem_describe(&hm, why, sizeof why),
                 share_clause_(sh, sizeof sh, k, avail, "host memory"));
        offload_plan_free(&p);
        return -1;
    }
    if (pinned > 0) {
        int kp = node_share_ranks(spec->nodes.world_size);
        size_t lim = node_share_bytes(offload_pin_limit(), kp);
        if (pinned > lim) {
            const char *fmt =
                "pinning: offloading %d slots pins %s of host memory but "
                "this process may lock only %s (RLIMIT_MEMLOCK, no "
                "CAP_IPC_LOCK)%s; raise LimitMEMLOCK= in m6d.service or "
                "`ulimit -l`%s";
            share_clause_(sh, sizeof sh, kp, lim, "lockable memory");
            if (flags & OFFLOAD_REQUIRE_PINNED) {
                snprintf(err, errlen, fmt, p.n_offloaded,
                         fmt_bytes_(a, sizeof a, pinned),
                         fmt_bytes_(b, sizeof b, offload_pin_limit()), sh,
                         "");
                offload_plan_free(&p);
                return -1;
            }
            snprintf(warn, warnlen, fmt, p.n_offloaded,
                     fmt_bytes_(a, sizeof a, pinned),
                     fmt_bytes_(b, sizeof b, offload_pin_limit()), sh,
                     "; the run will use pageable memory (slower copies)");
        }
    }
    if (out)
        *out = p;
    else
        offload_plan_free(&p);
    return 0;
}
