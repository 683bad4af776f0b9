/*
 * views.c — m6ctl's field tables (views.h): one table per view, read by
 * the one renderer of common/view.h for text, --json and --csv. Here,
 * below both, so that m6ctl and m6d's dashboard (daemon/http) render the
 * protocol's messages with the same tables; data prepare's view, over the
 * client's own corpus tool, is client/prepare_view.c.
 */
#include "proto/views.h"

#include "common/run_state.h"  /* the names of the states */

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *views_state_str(M6__RunState s)
{
    int st = run_state_from_wire((int)s);
    return st < 0 ? "unknown" : run_state_name((run_state)st);
}

static const char *state_color_(M6__RunState s)
{
    switch (s) {
    case M6__RUN_STATE__RUN_STATE_RUNNING: return "\033[32m";
    case M6__RUN_STATE__RUN_STATE_PAUSED: return "\033[33m";
    case M6__RUN_STATE__RUN_STATE_FAILED: return "\033[31m";
    case M6__RUN_STATE__RUN_STATE_COMPLETED: return "\033[1m";
    default: return "\033[2m";
    }
}

/* A protocol string as a view value: protobuf-c's unset (NULL) or empty
 * string is the view's null. */
static const char *unset_null_(const char *s)
{
    return s && *s ? s : NULL;
}

static const char *phase_str_(M6__Phase p)
{
    return p == M6__PHASE__PHASE_REAL ? "real" : "pseudo";
}

int views_terminal(M6__RunState s)
{
    return s == M6__RUN_STATE__RUN_STATE_COMPLETED || s == M6__RUN_STATE__RUN_STATE_FAILED ||
           s == M6__RUN_STATE__RUN_STATE_STOPPED;
}

/* ---- a run's ranks (status): one row per M6__RankState */

#define K_ ((const M6__RankState *)row)
static void k_rank_(const void *row, view_val *v) { v->i = K_->rank; }
static void k_local_(const void *row, view_val *v) { v->i = K_->local_rank; }
static void k_node_(const void *row, view_val *v) { v->i = K_->node_id; }
static void k_host_(const void *row, view_val *v) { v->s = unset_null_(K_->hostname); }
static void k_step_(const void *row, view_val *v) { v->i = K_->step; }
static void k_state_(const void *row, view_val *v) { v->s = unset_null_(K_->state); }
static void k_reason_(const void *row, view_val *v) { v->s = unset_null_(K_->reason); }
#undef K_

static const view_field rank_fields_[] = {
    {"rank", "RANK", 0, 5, VIEW_INT, VF_PLAIN, 0, k_rank_},
    {"local_rank", "LOCAL", 0, 6, VIEW_INT, VF_PLAIN, 0, k_local_},
    {"node_id", "NODE", 0, 5, VIEW_INT, VF_PLAIN, 0, k_node_},
    {"hostname", "HOSTNAME", 0, -16, VIEW_STR, VF_PLAIN, 0, k_host_},
    {"step", "STEP", 0, 7, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL, k_step_},
    {"state", "STATE", 0, -9, VIEW_STR, VF_PLAIN, 0, k_state_},
    {"reason", "REASON", 0, 0, VIEW_STR, VF_PLAIN, 0, k_reason_},
};
const view views_ranks = VIEW_OF(rank_fields_);

/* One rank as a JSON object of views_ranks' keys (integers and strings,
 * null when unset): RunInfo.ranks in status --json. */
static json_t *rank_json_(const M6__RankState *r)
{
    json_t *o = json_object();
    for (int k = 0; o && k < views_ranks.n; k++) {
        const view_field *fd = &views_ranks.fields[k];
        view_val v;
        memset(&v, 0, sizeof v);
        fd->get(r, &v);
        json_t *x = fd->type == VIEW_INT ? json_integer(v.i)
                    : v.s                ? json_string(v.s)
                                         : json_null();
        json_object_set_new(o, fd->name, x);
    }
    return o;
}

/* ---- a run: list, status, the commands' replies, watch */

#define R_ (((const views_run_row *)row)->r)

static void r_id_(const void *row, view_val *v) { v->i = R_->id; }
static void r_name_(const void *row, view_val *v) { v->s = R_->name; }
static void r_state_(const void *row, view_val *v) { v->s = views_state_str(R_->state); }
/* text: "running", or "running (pausing)" while a command is pending */
static void r_state_text_(const void *row, view_val *v)
{
    const char *p = R_->pending ? R_->pending : "";
    snprintf(v->buf, sizeof v->buf, "%s%s%s%s", views_state_str(R_->state), *p ? " (" : "", p,
             *p ? ")" : "");
    v->s = v->buf;
    v->color = state_color_(R_->state);
}
static void r_phase_(const void *row, view_val *v) { v->s = phase_str_(R_->phase); }
/* status: "pseudo (delink at step 100)", "real (delinked at step 100)",
 * "real (trained from scratch)"; a run that ended delinks no more. A run
 * of pseudo.steps 0 never had a Pseudo phase (m6d before the delink step
 * had its own column said delinked at step 0). */
static void r_phase_text_(const void *row, view_val *v)
{
    const M6__RunInfo *r = R_;
    int real = r->phase == M6__PHASE__PHASE_REAL;
    if (real && r->pseudo_steps == 0 && r->delink_step <= 0)
        snprintf(v->buf, sizeof v->buf, "real (trained from scratch)");
    else if (real && r->delink_step >= 0)
        snprintf(v->buf, sizeof v->buf, "real (delinked at step %lld)",
                 (long long)r->delink_step);
    else if (!real && r->pseudo_steps > 0 && !views_terminal(r->state) &&
             r->delink_policy && strcmp(r->delink_policy, "plateau") == 0 &&
             r->next_delink_step == r->pseudo_steps)
        /* delink.policy plateau, no operator delink pending */
        snprintf(v->buf, sizeof v->buf, "pseudo (delink on a plateau, at "
                 "step %lld at the latest)", (long long)r->pseudo_steps);
    else if (!real && r->pseudo_steps > 0 && !views_terminal(r->state))
        /* next_delink_step: the boundary an operator's pending delink
         * is taken at, else pseudo_steps (0 from an m6d without it) */
        snprintf(v->buf, sizeof v->buf, "pseudo (delink at step %lld)",
                 (long long)(r->next_delink_step > 0 ? r->next_delink_step
                                                     : r->pseudo_steps));
    else
        snprintf(v->buf, sizeof v->buf, "%s", phase_str_(r->phase));
    v->s = v->buf;
}
static void r_step_(const void *row, view_val *v) { v->i = R_->step; }
static void r_total_(const void *row, view_val *v) { v->i = R_->total_steps; }
static void r_step_text_(const void *row, view_val *v)
{
    snprintf(v->buf, sizeof v->buf, "%lld/%lld", (long long)R_->step,
             (long long)R_->total_steps);
    v->s = v->buf;
}
static void r_loss_(const void *row, view_val *v) { v->d = R_->train_loss; }
static void r_val_(const void *row, view_val *v) { v->d = R_->val_loss; }
static void r_tps_(const void *row, view_val *v) { v->d = R_->tokens_per_s; }
static void r_lr_(const void *row, view_val *v) { v->d = R_->lr; }
static void r_pseudo_(const void *row, view_val *v) { v->i = R_->pseudo_steps; }
static void r_delink_(const void *row, view_val *v) { v->i = R_->delink_step; }
static void r_eta_(const void *row, view_val *v)
{
    v->d = R_->eta_s;
    v->null = R_->eta_s < 0;
}
static void r_watch_eta_(const void *row, view_val *v)
{
    v->d = ((const views_run_row *)row)->watch_eta;
    v->null = v->d < 0;
}
static void r_ckpt_(const void *row, view_val *v) { v->i = R_->checkpoint_step; }
static void r_ckpt_text_(const void *row, view_val *v)
{
    v->null = R_->checkpoint_step < 0;
    snprintf(v->buf, sizeof v->buf, "step %lld", (long long)R_->checkpoint_step);
    v->s = v->buf;
}
/* every rank of a run of several (status --json); null (no key) for one */
static void r_ranks_(const void *row, view_val *v)
{
    v->null = R_->n_ranks == 0;
    if (v->null) return;
    v->j = json_array();
    for (size_t i = 0; v->j && i < R_->n_ranks; i++)
        json_array_append_new(v->j, rank_json_(R_->ranks[i]));
}
/* the ranks whose loss paused the run (status): --json an object of
 * LostRanks' fields, null (no key) when none */
static void r_lost_(const void *row, view_val *v)
{
    const M6__LostRanks *l = R_->lost;
    v->null = !l;
    if (v->null) return;
    v->j = json_pack("{s:I, s:s, s:I, s:I, s:I}", "node_id",
                     (json_int_t)l->node_id, "hostname",
                     l->hostname ? l->hostname : "", "rank",
                     (json_int_t)l->rank, "local_rank",
                     (json_int_t)l->local_rank, "ranks", (json_int_t)l->ranks);
}
/* text: "rank 3: node w (id 2), local rank 1"; a whole node's "ranks 2-3:
 * node w (id 2), local ranks 0-1" */
static void r_lost_text_(const void *row, view_val *v)
{
    const M6__LostRanks *l = R_->lost;
    v->null = !l;
    if (v->null) return;
    const char *h = l->hostname && *l->hostname ? l->hostname : "?";
    if (l->ranks > 1)
        snprintf(v->buf, sizeof v->buf, "ranks %d-%d: node %s (id %lld), "
                 "local ranks %d-%d", l->rank, l->rank + l->ranks - 1, h,
                 (long long)l->node_id, l->local_rank,
                 l->local_rank + l->ranks - 1);
    else
        snprintf(v->buf, sizeof v->buf, "rank %d: node %s (id %lld), local "
                 "rank %d", l->rank, h, (long long)l->node_id, l->local_rank);
    v->s = v->buf;
}
static void r_created_(const void *row, view_val *v) { v->d = R_->created; }
static void r_updated_(const void *row, view_val *v) { v->d = R_->updated; }
static void r_error_(const void *row, view_val *v) { v->s = unset_null_(R_->error); }
static void r_pending_(const void *row, view_val *v) { v->s = unset_null_(R_->pending); }
static void r_backend_(const void *row, view_val *v) { v->s = unset_null_(R_->backend); }
static void r_policy_(const void *row, view_val *v) { v->s = unset_null_(R_->delink_policy); }
/* the layout: unknown (0) from an m6d without it */
static void r_world_(const void *row, view_val *v)
{
    v->i = R_->world_size;
    v->null = R_->world_size <= 0;
}
static void r_ep_(const void *row, view_val *v)
{
    v->i = R_->expert_parallel;
    v->null = R_->expert_parallel <= 0;
}
/* "4 ranks: 2 data-parallel replicas x 2 expert-parallel" (each MoE
 * layer's experts split over 2 ranks), "2 ranks, data parallel"; none
 * for one rank */
static void r_layout_text_(const void *row, view_val *v)
{
    const M6__RunInfo *r = R_;
    int W = r->world_size, P = r->expert_parallel > 0 ? r->expert_parallel : 1;
    v->null = W <= 1;
    if (v->null) return;
    if (P > 1)
        snprintf(v->buf, sizeof v->buf, "%d ranks: %d data-parallel "
                 "replica%s x %d expert-parallel", W, W / P,
                 W / P == 1 ? "" : "s", P);
    else
        snprintf(v->buf, sizeof v->buf, "%d ranks, data parallel", W);
    v->s = v->buf;
}
/* "" (an m6d without them): unknown */
static void r_prec_(const void *row, view_val *v) { v->s = unset_null_(R_->precision); }
static void r_master_(const void *row, view_val *v) { v->s = unset_null_(R_->master_precision); }
/* "bf16 GEMM inputs, fp32 sums; masters fp32" */
static void r_prec_text_(const void *row, view_val *v)
{
    const M6__RunInfo *r = R_;
    v->null = !r->precision || !*r->precision || !r->master_precision ||
              !*r->master_precision;
    if (v->null) return;
    snprintf(v->buf, sizeof v->buf, "%s GEMM inputs, fp32 sums; masters %s",
             r->precision, r->master_precision);
    v->s = v->buf;
}
static void r_res_(const void *row, view_val *v) { v->i = R_->resident_slots; }
static void r_off_(const void *row, view_val *v) { v->i = R_->offloaded_slots; }
static void r_inuse_(const void *row, view_val *v) { v->i = R_->device_bytes_in_use; }
static void r_peak_(const void *row, view_val *v) { v->i = R_->peak_device_bytes; }
static void r_budget_(const void *row, view_val *v) { v->i = R_->device_budget_bytes; }
static void r_h2d_(const void *row, view_val *v) { v->d = R_->h2d_gbps; }
static void r_d2h_(const void *row, view_val *v) { v->d = R_->d2h_gbps; }
static void r_hidden_(const void *row, view_val *v) { v->d = R_->copy_hidden_fraction; }

/* "4/6 slots offloaded, peak 157.1 MiB of 160 MiB budget, h2d 3.2 GB/s,
 * 87% of copy time hidden"; unknown before the run has a sample. On the
 * cpu backend the "device" is a budgeted pool of ordinary memory. */
static void r_offload_text_(const void *row, view_val *v)
{
    const M6__RunInfo *r = R_;
    int n = r->resident_slots + r->offloaded_slots;
    static const view_field peak = {0, 0, 0, 0, VIEW_INT, VF_BYTES, 0, r_peak_};
    static const view_field budget = {0, 0, 0, 0, VIEW_INT, VF_BYTES, 0, r_budget_};
    char pk[32], bud[32];
    v->null = n <= 0;
    if (v->null) return;
    view_text(pk, sizeof pk, &peak, row);
    int cpu = r->backend && strcmp(r->backend, "cpu") == 0;
    size_t o = 0, len = sizeof v->buf;
    if (r->device_budget_bytes <= 0) {
        snprintf(v->buf, len, "off (no budget): %d/%d slots resident, %s %s",
                 r->resident_slots, n, cpu ? "memory pool" : "device", pk);
        v->s = v->buf;
        return;
    }
    view_text(bud, sizeof bud, &budget, row);
    o += (size_t)snprintf(v->buf + o, len - o, "%d/%d slots offloaded, peak %s of %s budget",
                          r->offloaded_slots, n, pk, bud);
    if (!isnan(r->h2d_gbps) && o < len)
        o += (size_t)snprintf(v->buf + o, len - o, ", h2d %.3g GB/s", r->h2d_gbps);
    if (!isnan(r->d2h_gbps) && o < len)
        o += (size_t)snprintf(v->buf + o, len - o, ", d2h %.3g GB/s", r->d2h_gbps);
    if (o < len)
        snprintf(v->buf + o, len - o, isnan(r->copy_hidden_fraction)
                     ? ", no copies in the last step" : ", %.0f%% of copy time hidden",
                 100.0 * r->copy_hidden_fraction);
    v->s = v->buf;
}
static void r_message_(const void *row, view_val *v) { v->s = ((const views_run_row *)row)->message; }
/* non-finite steps skipped: a line (and a JSON key) only when there were */
static void r_skipped_(const void *row, view_val *v)
{
    v->i = R_->skipped_steps;
    v->null = R_->skipped_steps == 0;
}
/* MoE figures: unknown for a dense run (NaN; 0 from an m6d without them:
 * a balancing loss is > 0 whenever a model has experts) */
static int r_moe_none_(const M6__RunInfo *r) { return !(r->moe_aux_loss > 0); }
#define R_MOE_(fn, field)                                                 \
    static void fn(const void *row, view_val *v)                         \
    {                                                                     \
        v->d = R_->field;                                                 \
        v->null = r_moe_none_(R_);                                        \
    }
R_MOE_(r_moe_aux_, moe_aux_loss)
R_MOE_(r_moe_z_, moe_z_loss)
R_MOE_(r_moe_drop_, moe_dropped_fraction)
R_MOE_(r_moe_lmin_, moe_load_min)
R_MOE_(r_moe_lmax_, moe_load_max)
R_MOE_(r_moe_cv_, moe_load_cv)
R_MOE_(r_moe_empty_, moe_experts_empty)
#undef R_MOE_
/* "aux 1.02, z 0.351, dropped 3.1%, load 12-40 per expert (cv 0.31), 0.5
 * experts empty" (the latest step's, over its MoE blocks) */
static void r_moe_text_(const void *row, view_val *v)
{
    const M6__RunInfo *r = R_;
    v->null = r_moe_none_(r);
    if (v->null) return;
    snprintf(v->buf, sizeof v->buf,
             "aux %.3g, z %.3g, dropped %.1f%%, load %.0f-%.0f per expert "
             "(cv %.2f), %.3g experts empty", r->moe_aux_loss, r->moe_z_loss,
             100.0 * r->moe_dropped_fraction, r->moe_load_min,
             r->moe_load_max, r->moe_load_cv, r->moe_experts_empty);
    v->s = v->buf;
}

#undef R_

/* list: the columns with a head; status: the lines with a label; --json:
 * the fields with a name (list, status and the commands alike). */
static const view_field run_fields_[] = {
    {"id", "ID", "id", -5, VIEW_INT, VF_PLAIN, 0, r_id_},
    {"name", "NAME", "name", -20, VIEW_STR, VF_PLAIN, VIEW_CUT, r_name_},
    {"state", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, r_state_},
    {0, "STATE", "state", -19, VIEW_STR, VF_PLAIN, 0, r_state_text_},
    {"pending", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, r_pending_},
    {"phase", "PHASE", 0, -7, VIEW_STR, VF_PLAIN, 0, r_phase_},
    {0, 0, "phase", 0, VIEW_STR, VF_PLAIN, 0, r_phase_text_},
    {"step", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_step_},
    {"total_steps", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_total_},
    {0, "STEP", "step", -13, VIEW_STR, VF_PLAIN, 0, r_step_text_},
    {"train_loss", "LOSS", "train_loss", -9, VIEW_F32, VF_LOSS, 0, r_loss_},
    {"val_loss", "VAL", "val_loss", -9, VIEW_F32, VF_LOSS, 0, r_val_},
    {"tokens_per_s", "TOK/S", "tokens_per_s", 0, VIEW_F64, VF_RATE, 0, r_tps_},
    {"lr", 0, 0, 0, VIEW_F32, VF_PLAIN, 0, r_lr_},
    {"pseudo_steps", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_pseudo_},
    {"delink_step", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL, r_delink_},
    {"delink_policy", 0, 0, 0, VIEW_STR, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_policy_},
    {"eta_s", 0, "eta", 0, VIEW_F64, VF_SECONDS, 0, r_eta_},
    {"checkpoint_step", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL, r_ckpt_},
    {0, 0, "checkpoint", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_ckpt_text_},
    {0, 0, "offload", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_offload_text_},
    {"backend", 0, "backend", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_backend_},
    {"world_size", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_world_},
    {"expert_parallel", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_ep_},
    {0, 0, "layout", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_layout_text_},
    {"precision", 0, 0, 0, VIEW_STR, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_prec_},
    {"master_precision", 0, 0, 0, VIEW_STR, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_master_},
    {0, 0, "precision", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_prec_text_},
    {"created", 0, "created", 0, VIEW_F64, VF_UTC, 0, r_created_},
    {"updated", 0, "updated", 0, VIEW_F64, VF_UTC, 0, r_updated_},
    {"error", 0, "error", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_error_},
    {0, 0, "lost", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_lost_text_},
    {"lost", 0, 0, 0, VIEW_JSON, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_lost_},
    {"resident_slots", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_res_},
    {"offloaded_slots", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_off_},
    {"device_bytes_in_use", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_inuse_},
    {"peak_device_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_peak_},
    {"device_budget_bytes", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, r_budget_},
    {"h2d_gbps", 0, 0, 0, VIEW_F64, VF_PLAIN, 0, r_h2d_},
    {"d2h_gbps", 0, 0, 0, VIEW_F64, VF_PLAIN, 0, r_d2h_},
    {"copy_hidden_fraction", 0, 0, 0, VIEW_F64, VF_PLAIN, 0, r_hidden_},
    {0, 0, "moe", 0, VIEW_STR, VF_PLAIN, VIEW_OMIT_NULL, r_moe_text_},
    {"moe_aux_loss", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_aux_},
    {"moe_z_loss", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_z_},
    {"moe_dropped_fraction", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_drop_},
    {"moe_load_min", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_lmin_},
    {"moe_load_max", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_lmax_},
    {"moe_load_cv", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_cv_},
    {"moe_experts_empty", 0, 0, 0, VIEW_F64, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_moe_empty_},
    {"skipped_steps", 0, "skipped steps", 0, VIEW_INT, VF_PLAIN,
     VIEW_OMIT_NULL | VIEW_JSON_OMIT_NULL, r_skipped_},
    {"message", 0, 0, 0, VIEW_STR, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_message_},
    {"ranks", 0, 0, 0, VIEW_JSON, VF_PLAIN, VIEW_JSON_OMIT_NULL, r_ranks_},
};
const view views_run = VIEW_OF(run_fields_);

/* watch's line: "step 5/100 running pseudo loss 2.3456 val - tok/s 1234
 * eta 3m05s" (the ETA watch measured itself). */
static const view_field watch_fields_[] = {
    {0, 0, "step", 0, VIEW_STR, VF_PLAIN, 0, r_step_text_},
    {0, 0, "", 0, VIEW_STR, VF_PLAIN, 0, r_state_text_},
    {0, 0, "", 0, VIEW_STR, VF_PLAIN, 0, r_phase_},
    {0, 0, "loss", 0, VIEW_F32, VF_LOSS, 0, r_loss_},
    {0, 0, "val", 0, VIEW_F32, VF_LOSS, 0, r_val_},
    {0, 0, "tok/s", 0, VIEW_F64, VF_RATE, 0, r_tps_},
    {0, 0, "eta", 0, VIEW_F64, VF_SECONDS, 0, r_watch_eta_},
};
const view views_watch_line = VIEW_OF(watch_fields_);

/* ---- metrics: one row per step */

#define M_ ((const M6__MetricRow *)row)
static void m_step_(const void *row, view_val *v) { v->i = M_->step; }
static void m_phase_(const void *row, view_val *v) { v->s = phase_str_(M_->phase); }
static void m_loss_(const void *row, view_val *v) { v->d = M_->train_loss; }
static void m_val_(const void *row, view_val *v) { v->d = M_->val_loss; }
static void m_lr_(const void *row, view_val *v) { v->d = M_->lr; }
static void m_tps_(const void *row, view_val *v) { v->d = M_->tokens_per_s; }
static void m_gn_(const void *row, view_val *v) { v->d = M_->grad_norm; }
static void m_res_(const void *row, view_val *v) { v->i = M_->resident_slots; }
/* text "4/6" (offloaded of all slots); unknown in rows before schema 0002 */
static void m_off_(const void *row, view_val *v)
{
    v->i = M_->offloaded_slots;
    v->null = M_->offloaded_slots < 0 || M_->resident_slots < 0;
    snprintf(v->buf, sizeof v->buf, "%d/%d", M_->offloaded_slots,
             M_->offloaded_slots + M_->resident_slots);
    if (!v->null) v->text = v->buf;
}
static void m_peak_(const void *row, view_val *v) { v->i = M_->peak_device_bytes; }
static void m_h2d_(const void *row, view_val *v) { v->d = M_->h2d_gbps; }
static void m_d2h_(const void *row, view_val *v) { v->d = M_->d2h_gbps; }
static void m_hid_(const void *row, view_val *v) { v->d = M_->copy_hidden_fraction; }
static void m_aux_(const void *row, view_val *v) { v->d = M_->moe_aux_loss; }
static void m_z_(const void *row, view_val *v) { v->d = M_->moe_z_loss; }
static void m_drop_(const void *row, view_val *v) { v->d = M_->moe_dropped_fraction; }
static void m_lmin_(const void *row, view_val *v) { v->d = M_->moe_load_min; }
static void m_lmax_(const void *row, view_val *v) { v->d = M_->moe_load_max; }
static void m_cv_(const void *row, view_val *v) { v->d = M_->moe_load_cv; }
static void m_empty_(const void *row, view_val *v) { v->d = M_->moe_experts_empty; }
static void m_smin_(const void *row, view_val *v) { v->i = M_->moe_step_tokens_min; }
static void m_smax_(const void *row, view_val *v) { v->i = M_->moe_step_tokens_max; }
static void m_sempty_(const void *row, view_val *v) { v->i = M_->moe_step_experts_empty; }
static void m_sdrop_(const void *row, view_val *v) { v->i = M_->moe_step_dropped; }
static void m_idle_(const void *row, view_val *v) { v->i = M_->moe_experts_idle; }
#undef M_

/* The columns of every run's rows; hidden_w: the width of the last of
 * them, 0 where it ends the line (a dense run) */
#define METRIC_FIELDS_(hidden_w)                                              \
    {"step", "STEP", 0, 6, VIEW_INT, VF_PLAIN, 0, m_step_},                   \
    {"phase", "PHASE", 0, -6, VIEW_STR, VF_PLAIN, 0, m_phase_},               \
    {"train_loss", "TRAIN_LOSS", 0, -12, VIEW_F32, VF_PLAIN, 0, m_loss_},     \
    {"val_loss", "VAL_LOSS", 0, -12, VIEW_F32, VF_PLAIN, 0, m_val_},          \
    {"lr", "LR", 0, -12, VIEW_F32, VF_PLAIN, 0, m_lr_},                       \
    {"tokens_per_s", "TOK/S", 0, -10, VIEW_F64, VF_RATE, 0, m_tps_},          \
    {"grad_norm", "GRAD_NORM", 0, -10, VIEW_F32, VF_PLAIN, 0, m_gn_},         \
    {"resident_slots", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL, m_res_},   \
    {"offloaded_slots", "OFFL", 0, -7, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL,     \
     m_off_},                                                                 \
    {"peak_device_bytes", "PEAK", 0, -10, VIEW_INT, VF_BYTES, VIEW_NEG_NULL,  \
     m_peak_},                                                                \
    {"h2d_gbps", "H2D_GB/S", 0, -8, VIEW_F64, VF_G3, 0, m_h2d_},              \
    {"d2h_gbps", 0, 0, 0, VIEW_F64, VF_PLAIN, 0, m_d2h_},                     \
    {"copy_hidden_fraction", "HIDDEN", 0, hidden_w, VIEW_F64, VF_PCT, 0,      \
     m_hid_}

static const view_field metric_fields_[] = {
    METRIC_FIELDS_(0),
};
const view views_metrics = VIEW_OF(metric_fields_);

/* An MoE run's rows: the same, then the router's figures (a dense run's
 * output stays as it was: views_metrics): those per (block, microbatch)
 * (LOAD_*, EMPTY), then those of the whole step (STEP_*, IDLE). */
static const view_field metric_moe_fields_[] = {
    METRIC_FIELDS_(-7),
    {"moe_aux_loss", "AUX", 0, -7, VIEW_F64, VF_G3, 0, m_aux_},
    {"moe_z_loss", "ZLOSS", 0, -7, VIEW_F64, VF_G3, 0, m_z_},
    {"moe_dropped_fraction", "DROP", 0, -5, VIEW_F64, VF_PCT, 0, m_drop_},
    {"moe_load_min", "LOAD_MIN", 0, -9, VIEW_F64, VF_RATE, 0, m_lmin_},
    {"moe_load_max", "LOAD_MAX", 0, -9, VIEW_F64, VF_RATE, 0, m_lmax_},
    {"moe_load_cv", "LOAD_CV", 0, -8, VIEW_F64, VF_G3, 0, m_cv_},
    {"moe_experts_empty", "EMPTY", 0, -6, VIEW_F64, VF_G3, 0, m_empty_},
    /* the whole step over every rank: (block, expert) counts */
    {"moe_step_tokens_min", "STEP_MIN", 0, -9, VIEW_INT, VF_PLAIN,
     VIEW_NEG_NULL, m_smin_},
    {"moe_step_tokens_max", "STEP_MAX", 0, -9, VIEW_INT, VF_PLAIN,
     VIEW_NEG_NULL, m_smax_},
    {"moe_step_experts_empty", "STEP_EMPTY", 0, -11, VIEW_INT, VF_PLAIN,
     VIEW_NEG_NULL, m_sempty_},
    {"moe_step_dropped", "STEP_DROP", 0, -10, VIEW_INT, VF_PLAIN,
     VIEW_NEG_NULL, m_sdrop_},
    {"moe_experts_idle", "IDLE", 0, 0, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL,
     m_idle_},
};
const view views_metrics_moe = VIEW_OF(metric_moe_fields_);

/* ---- events: a run's history */

#define E_ ((const M6__Event *)row)
static void e_id_(const void *row, view_val *v) { v->i = E_->id; }
static void e_time_(const void *row, view_val *v) { v->d = E_->time; }
static void e_kind_(const void *row, view_val *v) { v->s = E_->kind; }
static void e_detail_(const void *row, view_val *v) { v->s = E_->detail; }
#undef E_

static const view_field event_fields_[] = {
    {"id", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, e_id_},
    {"time", "TIME (UTC)", 0, -20, VIEW_F64, VF_UTC, 0, e_time_},
    {"kind", "KIND", 0, -16, VIEW_STR, VF_PLAIN, 0, e_kind_},
    {"detail", "DETAIL", 0, 0, VIEW_STR, VF_PLAIN, 0, e_detail_},
};
const view views_events = VIEW_OF(event_fields_);

/* ---- checkpoints: a run's recorded checkpoints, on disk or gone */

#define C_ ((const M6__CheckpointEntry *)row)
static void c_step_(const void *row, view_val *v) { v->i = C_->step; }
static void c_bytes_(const void *row, view_val *v) { v->i = C_->bytes; }
static void c_path_(const void *row, view_val *v) { v->s = C_->path; }
static void c_on_disk_(const void *row, view_val *v)
{
    v->j = json_boolean(C_->on_disk);
    v->text = C_->on_disk ? "yes" : "gone";
}
#undef C_

static const view_field checkpoint_fields_[] = {
    {"step", "STEP", 0, 8, VIEW_INT, VF_PLAIN, 0, c_step_},
    {"bytes", "SIZE", 0, 11, VIEW_INT, VF_BYTES, 0, c_bytes_},
    {"on_disk", "ON DISK", 0, -8, VIEW_JSON, VF_PLAIN, 0, c_on_disk_},
    {"path", "DIRECTORY", 0, 0, VIEW_STR, VF_PLAIN, 0, c_path_},
};
const view views_checkpoints = VIEW_OF(checkpoint_fields_);

/* ---- submit's answer: the run's id (text: the id alone) */

static void s_id_(const void *row, view_val *v) { v->i = ((const M6__SubmitReply *)row)->run_id; }
static void s_name_(const void *row, view_val *v) { v->s = ((const M6__SubmitReply *)row)->name; }

static const view_field submit_fields_[] = {
    {"id", 0, "", 0, VIEW_INT, VF_PLAIN, 0, s_id_},
    {"name", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, s_name_},
};
const view views_submit = VIEW_OF(submit_fields_);

/* ---- watch's events: {"event", "step"[, "last_seen_step"]} */


#define W_ ((const views_watch_event_row *)row)
static void w_event_(const void *row, view_val *v) { v->s = W_->event; }
static void w_step_(const void *row, view_val *v) { v->i = W_->step; }
static void w_seen_(const void *row, view_val *v) { v->i = W_->last_seen; }
#undef W_

static const view_field watch_event_fields_[] = {
    {"event", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, w_event_},
    {"step", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, w_step_},
    {"last_seen_step", 0, 0, 0, VIEW_INT, VF_PLAIN, VIEW_NEG_NULL | VIEW_JSON_OMIT_NULL,
     w_seen_},
};
const view views_watch_event = VIEW_OF(watch_event_fields_);

/* ---- nodes: the coordinator's node registry (issue 14) */

#define N_ ((const M6__NodeInfo *)row)
static void n_id_(const void *row, view_val *v) { v->i = N_->id; }
static void n_host_(const void *row, view_val *v) { v->s = N_->hostname; }
static void n_uuid_(const void *row, view_val *v) { v->s = N_->node_uuid; }
static void n_state_(const void *row, view_val *v)
{
    v->s = N_->state;
    v->color = strcmp(N_->state, "live") == 0   ? "\033[32m"
               : strcmp(N_->state, "lost") == 0 ? "\033[31m"
                                                 : "\033[2m";
}
static void n_role_(const void *row, view_val *v) { v->s = N_->role; }
static void n_backend_(const void *row, view_val *v) { v->s = N_->backend; }
static void n_devices_(const void *row, view_val *v) { v->i = N_->devices; }
static void n_mem_(const void *row, view_val *v) { v->i = (long long)N_->memory; }
static void n_free_(const void *row, view_val *v) { v->i = (long long)N_->free_device_memory; }
static void n_run_(const void *row, view_val *v)
{
    v->i = N_->run_id;
    v->null = N_->run_id <= 0;
}
static void n_rank_(const void *row, view_val *v)
{
    v->i = N_->rank;
    v->null = N_->rank < 0 || N_->run_id <= 0;
}
/* the ranks it holds, "R" or "R-S" (local ranks contiguous) */
static void n_ranks_(const void *row, view_val *v)
{
    v->null = N_->rank < 0 || N_->run_id <= 0;
    int k = N_->ranks > 0 ? N_->ranks : 1;
    if (k == 1)
        snprintf(v->buf, sizeof v->buf, "%d", N_->rank);
    else
        snprintf(v->buf, sizeof v->buf, "%d-%d", N_->rank, N_->rank + k - 1);
    v->s = v->buf;
}
static void n_hb_(const void *row, view_val *v) { v->d = N_->last_heartbeat; }
static void n_joined_(const void *row, view_val *v) { v->d = N_->joined; }
static void n_updated_(const void *row, view_val *v) { v->d = N_->updated; }
static void n_addr_(const void *row, view_val *v) { v->s = unset_null_(N_->address); }
static void n_gemm_(const void *row, view_val *v) { v->s = unset_null_(N_->gemm); }
static void n_detail_(const void *row, view_val *v) { v->s = unset_null_(N_->detail); }
#undef N_

static const view_field node_fields_[] = {
    {"id", "ID", 0, 4, VIEW_INT, VF_PLAIN, 0, n_id_},
    {"hostname", "HOSTNAME", 0, -16, VIEW_STR, VF_PLAIN, 0, n_host_},
    {"state", "STATE", 0, -8, VIEW_STR, VF_PLAIN, 0, n_state_},
    {"role", "ROLE", 0, -12, VIEW_STR, VF_PLAIN, 0, n_role_},
    {"backend", "BACKEND", 0, -8, VIEW_STR, VF_PLAIN, 0, n_backend_},
    {"devices", "DEV", 0, 4, VIEW_INT, VF_PLAIN, 0, n_devices_},
    {"gemm", "GEMM", 0, -24, VIEW_STR, VF_PLAIN, 0, n_gemm_},
    {"memory", "MEMORY", 0, 11, VIEW_INT, VF_BYTES, 0, n_mem_},
    {"free_device_memory", "FREE DEV MEM", 0, 13, VIEW_INT, VF_BYTES, 0, n_free_},
    {"run_id", "RUN", 0, 5, VIEW_INT, VF_PLAIN, 0, n_run_},
    {"rank", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, n_rank_},
    {"ranks", "RANKS", 0, 6, VIEW_STR, VF_PLAIN, 0, n_ranks_},
    {"last_heartbeat", "LAST HEARTBEAT", 0, -21, VIEW_F64, VF_UTC, 0, n_hb_},
    {"address", "ADDRESS", 0, -22, VIEW_STR, VF_PLAIN, 0, n_addr_},
    {"detail", "DETAIL", 0, 0, VIEW_STR, VF_PLAIN, 0, n_detail_},
    {"node_uuid", 0, 0, 0, VIEW_STR, VF_PLAIN, 0, n_uuid_},
    {"joined", 0, 0, 0, VIEW_F64, VF_UTC, 0, n_joined_},
    {"updated", 0, 0, 0, VIEW_F64, VF_UTC, 0, n_updated_},
};
const view views_nodes = VIEW_OF(node_fields_);
