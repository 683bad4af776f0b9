/*
 * test_ep_train.c — expert parallelism in the trainer (nodes.expert_parallel)
 * against the one-rank run, on real text (fortunes shards), without the
 * daemon: each rank is a process of this binary over Gloo on loopback
 * (rank_procs.h).
 *
 *   same run   a 2-layer MoE model (E = 4 experts in k = 2 prototypes,
 *              capacity factor 1.25, balancing and z losses on), 12
 *              steps with a delink after 4, grad_clip 0.05 (it fires
 *              every step, so the global norm must count every expert
 *              once), at W = P = 2 and W = P = 4 against one rank with the
 *              same global batch (grad_accum 4: each rank takes whole
 *              microbatches, so the routing, capacity and router losses of
 *              each microbatch are the one-rank run's): train and
 *              validation losses, gradient norms, aux and z losses
 *   memory     each rank's floats of weights and of AdamW's moments
 *              against the one-rank model's: the dense part the same, the
 *              experts El/E of them (P = 2: half; P = 4: a quarter)
 *   checkpoint at P = 2, after step 8, every rank at the boundary
 *              (trainer_sync_boundary) and rank 0 saving the whole model
 *              (every rank's experts gathered); the ranks train on (rank 0
 *              with its own experts again) with the one-rank run's losses,
 *              and the checkpoint, resumed by one rank of a spec without
 *              expert parallelism, gives steps 9..12 of the one-rank run
 *   replicas   W = 4 as 2 replicas of P = 2 (trainer_adopt_expert_groups:
 *              the experts' gradients summed over the 2 ranks holding
 *              them), the same comparisons, a save at step 8 too
 *   reshard    the step-8 checkpoints (ep2 AdamW, its Adafactor, bf16
 *              and sharded siblings) loaded by P = 2, 4 and 2 x 2 ranks,
 *              each taking its experts, gathered back and saved: weights
 *              and optimizer state byte for byte those loaded
 *   refused    a save of a rank that holds its experts only, a load into
 *              one, and replicas without their sub-groups, by name
 *   offloaded  device.memory_budget the whole model's minimum (all its
 *              slots offloaded): at W = P = 2 (clip firing, pseudo phase
 *              included) each rank's own plan keeps one of its two real
 *              slots resident, the one-rank run's figures, and the save
 *              of step 8 (gathered into a whole offloaded model) resumed
 *              at P = 1; 2 replicas of P = 2 with offload.speculative on
 *              and a clip that never fires: every speculative update kept,
 *              so made only after the replicas summed the experts'
 *              gradients (reported early, 1e-4 to 5e-3 off from step 6);
 *              both save at step 8 with every gradient drain 5 ms late
 *              (offload_test_slow_drains), so that a rank's model re-laid
 *              after the save must wait for its drains as the first did
 *   adafactor  optimizer.name "adafactor" (eps1 1e-4: with the default
 *              1e-30 an update of a gradient near 0 is its sign, and a
 *              reordered sum moves it by O(1): two data-parallel ranks
 *              leave one rank by 1e-3 at step 7 without expert
 *              parallelism; at 1e-4 they agree to 9e-8): at W = P = 2
 *              without a first moment, its save of step 8 resumed at
 *              P = 1 and at P = 2; with one, 2 replicas of P = 2
 *              offloading (prefetch 1: some slots offloaded)
 *   bf16       optimizer.master "bf16" (stochastic rounding keyed by the
 *              whole model's layout): AdamW at W = P = 2 and its save
 *              resumed at P = 1, against one rank; Adafactor without a
 *              first moment as 2 replicas of P = 2 offloading, against 4
 *              data-parallel ranks: every multi-rank layout of that mode
 *              leaves one rank by 9e-5 and 2 dropped pairs at step 12 (a
 *              reordered sum now and then rounds a weight the other way,
 *              and Adafactor's normalised update carries it), expert
 *              parallelism must add nothing to that
 *   sharded    optimizer.shard as 2 replicas of P = 2 (each replica
 *              group shards its own layout): the one-rank run's figures,
 *              each rank's optimizer state bytes half its own model's,
 *              its save resumed at P = 1
 *   group      capacity over the whole group (model.moe.capacity_scope
 *              "group", capacity factor 1: pairs are dropped), one
 *              microbatch per rank, at W = P = 2, W = P = 4 and 2 replicas
 *              of P = 2, against one rank whose batch_size is P times
 *              larger (its microbatch is the group's): the same five
 *              figures and the same dropped pairs; the same data with
 *              the capacity per rank drops others
 *
 * Every comparison also requires the one-rank run's dropped pairs at every
 * step, exactly.
 *
 * Tolerance. Expert parallelism changes only the order of float
 * additions: the dense and router gradients are the ranks' sums added
 * by the all-reduce, where one rank accumulates its microbatches in
 * turn; an expert's weight gradient is one GEMM over the rows of every
 * sender where one rank runs one per microbatch; the norm's squares are
 * summed per rank, then added. Each is ~1e-7 relative per element; over
 * 12 steps of AdamW the losses and norms drift by ~1e-6 relative
 * (test_dp measures at most 2e-6 for the same reorderings of a dense
 * model). TOL, 1e-4 relative, leaves a factor of 50 for that and still
 * catches any real error: a gradient counted twice or missing (an expert
 * all-reduced, or one rank's tokens not sent) moves the norm by tens of
 * percent, and a wrong routing moves the losses at the first step. The
 * group comparisons differ by more, because the one-rank run's microbatch
 * is P times larger: its dense weight gradients are GEMMs over P times the
 * rows where the group's are the ranks' GEMMs summed by the all-reduce.
 * Measured: P = 2 within 1.3e-7; P = 4 and the replicas within 1.5e-5, one
 * step's grad norm (the first after the delink), with the routing of
 * every token and every loss within 1e-6. Capacity taken per rank instead,
 * the balancing loss or its gradient from the rank's own counts: 4e-4 to
 * 0.5 at steps 1-2.
 *
 * Exit 77 without Gloo or without the fortunes text.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/facts.h"
#include "offload/offload.h"
#include "offload/test_hooks.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "../common/rank_procs.h"

#define TOL 1e-4
#define MAX_STEPS 16
enum { E_ = 4, C_ = 32, H_ = 128, L_ = 2, PSEUDO_ = 4 };

/* ------------------------------------------------------------ a rank */

/* rank SPEC OUT WORLD RANK STORE: train the spec to its end (delinking
 * after pseudo.steps); OUT gets "floats W M" (this rank's weights and
 * moments) and one line per step: step, loss, val, norm, aux, z. */
static int rank_main_(int argc, char **argv)
{
    (void)argc;
    rank_proc rp;
    if (rank_proc_open(&rp, argv) != 0)
        return 1;
    const char *out_path = rp.out_path, *store_dir = rp.store_dir;
    const char *mode = argv[7];
    /* save-slow: save, each gradient drain of an offloaded slot late */
    int save = strcmp(mode, "save") == 0 || strcmp(mode, "save-slow") == 0;
    if (strcmp(mode, "save-slow") == 0)
        offload_test_slow_drains(5000);
    int world = rp.world, rank = rp.rank;
    const run_spec spec = rp.spec;
    trainer *t = rp.t;
    char e[1024];
    m6_err err = M6_ERR_NONE;
    m6_store st;
    file_store fs;
    m6_coll *c = NULL;
    /* reshard:DIR loads DIR like resume:DIR, then only writes it again
     * (the experts split over the group and gathered back) */
    int reshard = strncmp(mode, "reshard:", 8) == 0;
    if ((strncmp(mode, "resume:", 7) == 0 || reshard) &&
        trainer_load(t, mode + (reshard ? 8 : 7), &err) != 0) {
        fprintf(stderr, "rank %d: resume: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    int P = spec.nodes.expert_parallel, D = world / P;
    m6_store sts[2];
    file_store fss[2];
    m6_coll *sub[2] = {NULL, NULL};
    if (world > 1) {
        if (!(c = rank_procs_group(store_dir, "g0", rank, world,
                                   spec.nodes.timeout * 1000, &st, &fs)))
            return 1;
        if (D > 1 && strcmp(mode, "nogroups") == 0) {
            /* replicas without their sub-groups: refused by name */
            int rc = trainer_set_collectives(t, c, &err);
            int ok = rc != 0 &&
                     strstr(m6_err_msg(&err), "trainer_adopt_expert_groups");
            if (!ok)
                fprintf(stderr, "rank %d: no sub-groups, not refused by "
                        "name: %s\n", rank, m6_err_msg(&err));
            /* every rank past its group's set-up before any leaves it (a
             * rank gone early closes a connection another still makes) */
            float one = 1.0f;
            m6_err e2 = M6_ERR_NONE;
            if (m6_coll_allreduce_sum(c, &one, 1, &e2) != 0)
                fprintf(stderr, "rank %d: barrier: %s\n", rank,
                        m6_err_msg(&e2));
            m6_err_free(&e2);
            trainer_free(t);
            m6_coll_destroy(c);
            m6_err_free(&err);
            return ok ? 0 : 1;
        }
        if (D > 1) {
            /* replicas: the expert-parallel group of ranks d*P.., and
             * the ranks q, q+P, ... holding the same experts */
            char pe[32], pd[32];
            snprintf(pe, sizeof pe, "ep%d", rank / P);
            snprintf(pd, sizeof pd, "edp%d", rank % P);
            if (!(sub[0] = rank_procs_group(store_dir, pe, rank % P, P,
                                            spec.nodes.timeout * 1000,
                                            &sts[0], &fss[0])) ||
                !(sub[1] = rank_procs_group(store_dir, pd, rank / P, D,
                                            spec.nodes.timeout * 1000,
                                            &sts[1], &fss[1])) ||
                trainer_adopt_expert_groups(t, sub[0], sub[1], &err) != 0) {
                fprintf(stderr, "rank %d: groups: %s\n", rank,
                        m6_err_msg(&err));
                return 1;
            }
        }
        if (trainer_set_collectives(t, c, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
    }
    FILE *out = fopen(out_path, "w");
    if (!out)
        return 1;
    int bad = 0;
    if (world > 1 && save) {
        /* a checkpoint of one rank's experts would lose the others' */
        char dir[600];
        snprintf(dir, sizeof dir, "%s.ckpt", out_path);
        if (trainer_save(t, dir, &err) >= 0 ||
            !strstr(m6_err_msg(&err), "nodes.expert_parallel")) {
            fprintf(stderr, "rank %d: save not refused by name: %s\n", rank,
                    m6_err_msg(&err));
            bad = 1;
        }
        m6_err_free(&err);
        if (trainer_load(t, dir, &err) == 0 ||
            !strstr(m6_err_msg(&err), "nodes.expert_parallel")) {
            fprintf(stderr, "rank %d: load not refused by name: %s\n", rank,
                    m6_err_msg(&err));
            bad = 1;
        }
        m6_err_free(&err);
    }
    if (reshard) {
        /* every rank at the boundary; rank 0 gets the whole model back
         * and saves it */
        int rc = trainer_sync_boundary(t, rank == 0, &err);
        char dir[600];
        snprintf(dir, sizeof dir, "%s.ckpt", out_path);
        if (rc != (rank == 0 && world > 1) ||
            (rank == 0 && trainer_save(t, dir, &err) < 0)) {
            fprintf(stderr, "rank %d: reshard (boundary %d): %s\n", rank, rc,
                    m6_err_msg(&err));
            bad = 1;
        }
    }
    while (!bad && !reshard && trainer_step_count(t) < spec.train.steps) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == spec.pseudo.steps &&
            trainer_delink(t, e, sizeof e) != 0) {
            fprintf(stderr, "rank %d: delink: %s\n", rank, e);
            bad = 1;
            break;
        }
        step_result r;
        if (trainer_step(t, &r, &err) != 0) {
            fprintf(stderr, "rank %d: step %ld: %s\n", rank,
                    trainer_step_count(t) + 1, m6_err_msg(&err));
            bad = 1;
            break;
        }
        fprintf(out, "%ld %a %a %a %a %a %ld\n", r.step,
                (double)r.train_loss, (double)r.val_loss,
                (double)r.grad_norm, r.moe.aux_loss, r.moe.z_loss,
                r.moe.step_dropped);
        if (save && r.step == 8) {
            /* every rank at the boundary; rank 0 gets the whole model
             * (every rank's experts), saves it, and trains on with its
             * own experts again */
            int rc = trainer_sync_boundary(t, rank == 0, &err);
            char dir[600];
            snprintf(dir, sizeof dir, "%s.ckpt", out_path);
            if (rc != (rank == 0) ||
                (rank == 0 && trainer_save(t, dir, &err) < 0)) {
                fprintf(stderr, "rank %d: save at step 8 (boundary %d): "
                        "%s\n", rank, rc, m6_err_msg(&err));
                bad = 1;
            }
        }
    }
    /* after the delink: one slot a layer; offloading: this rank's slots
     * on the host, the steps that updated them speculatively and the
     * steps whose speculation the clip undid */
    offload_stats os;
    if (trainer_offload_stats(t, &os) != 0)
        memset(&os, 0, sizeof os);
    fprintf(out, "floats %zu %zu offloaded %d %llu %llu optim %zu\n",
            trainer_copy_state(t, 0, NULL), trainer_copy_state(t, 1, NULL),
            os.n_offloaded, (unsigned long long)os.spec_steps,
            (unsigned long long)os.redo_steps, trainer_optim_bytes(t));
    fclose(out);
    trainer_free(t);  /* and the sub-groups it adopted */
    m6_coll_destroy(c);
    m6_err_free(&err);
    return bad;
}

/* ------------------------------------------------------------ results */

typedef struct {
    size_t nw, nm;  /* floats of weights, of m */
    int offloaded;  /* slots on the host after the delink */
    unsigned long long spec_steps, redo_steps;  /* offload_stats' */
    size_t optim;   /* bytes of optimizer state (trainer_optim_bytes) */
    int n;          /* steps 1..n have a line */
    double v[MAX_STEPS][5];  /* [step - 1]: loss, val, norm, aux, z */
    long dropped[MAX_STEPS]; /* [step - 1]: (token, prototype) pairs the
                              * capacity dropped, all ranks */
} result;

static int load_(const char *tag, int r, result *res)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s-%d.out", rank_dir_, tag, r);
    memset(res, 0, sizeof *res);
    FILE *f = fopen(path, "r");
    long step, dropped;
    double v[5];
    while (f && fscanf(f, "%ld %la %la %la %la %la %ld\n", &step, &v[0],
                       &v[1], &v[2], &v[3], &v[4], &dropped) == 7 &&
           step >= 1 && step <= MAX_STEPS) {
        memcpy(res->v[step - 1], v, sizeof v);
        res->dropped[step - 1] = dropped;
        res->n = (int)step;
    }
    if (!f || fscanf(f, "floats %zu %zu offloaded %d %llu %llu optim %zu\n",
                     &res->nw, &res->nm, &res->offloaded, &res->spec_steps,
                     &res->redo_steps, &res->optim) != 6) {
        if (f)
            fclose(f);
        CHECK(0, "%s: no result", path);
        return -1;
    }
    fclose(f);
    return 0;
}

/* world ranks, P of them an expert-parallel group (1: none) */
/* the spec of tag; moe_extra: more members of model.moe ("" none); B
 * sequences a microbatch, M microbatches a step, eval_batches of B */
static void write_spec_full_(const char *tag, int world, int P,
                             const char *moe_extra, int B, int M,
                             int eval_batches, double clip,
                             const char *top_extra)
{
    FILE *f = rank_procs_spec(tag, "ep");  /* one name: the hash */
    if (!f)
        return;
    fprintf(f, " \"model\": {\"vocab_size\": 256, \"n_layer\": %d, "
            "\"n_embd\": %d, \"n_head\": 2, \"seq_len\": 32, \"moe\": "
            "{\"num_experts\": %d, \"prototypes\": 2, \"aux_loss_coef\": "
            "0.05, \"z_loss_coef\": 0.01%s}},\n"
            " \"pseudo\": {\"steps\": %d},\n"
            " \"train\": {\"steps\": 12, \"batch_size\": %d, \"grad_accum\": "
            "%d, \"lr\": 0.01, \"min_lr\": 0.001, \"warmup_steps\": 2, "
            "\"grad_clip\": %g, \"seed\": 5, \"eval_every\": 3, "
            "\"eval_batches\": %d}%s", L_, C_, E_, moe_extra, PSEUDO_, B, M,
            clip,
            eval_batches, top_extra);
    if (world > 1)
        fprintf(f, ",\n \"nodes\": {\"world_size\": %d, "
                "\"expert_parallel\": %d}", world, P);
    fprintf(f, "}\n");
    fclose(f);
}

static void write_spec_batch_(const char *tag, int world, int P,
                              const char *moe_extra, int B, int M,
                              int eval_batches)
{
    write_spec_full_(tag, world, P, moe_extra, B, M, eval_batches, 0.05,
                     ",\n \"device\": {\"threads\": 1}");
}

static void write_spec_moe_(const char *tag, int world, int P,
                            const char *moe_extra)
{
    write_spec_batch_(tag, world, P, moe_extra, 2, 4, 4);
}

static void write_spec_(const char *tag, int world, int P)
{
    write_spec_moe_(tag, world, P, "");
}

static void reshard_(const char *ckpt_tag, const char *tag, int world);

static int load_(const char *tag, int r, result *res);
static double steps_close_(const char *tag, int r, const result *res,
                           const result *ref, int from);

/* The step-8 checkpoint rank 0 of ckpt_tag saved (mode "save") resumed by
 * `world` ranks of spec spec_tag as run `tag`: steps 9..12, and only
 * those, on every rank those of ref. */
static void resumed_(const char *tag, const char *ckpt_tag,
                     const char *spec_tag, int world, const result *ref)
{
    char resume[600];
    snprintf(resume, sizeof resume, "resume:%s/%s-0.out.ckpt", rank_dir_,
             ckpt_tag);
    const char *rs[1] = {resume};
    if (rank_procs_run(tag, spec_tag, world, rs, 1, 240, -1) != 0)
        return;
    for (int r = 0; r < world; r++) {
        result res;
        if (load_(tag, r, &res) != 0)
            continue;
        CHECK(res.v[7][0] == 0 && res.v[8][0] != 0, "%s: it ran steps "
              "other than 9..12", tag);
        printf("%s's checkpoint resumed by %s (rank %d of %d): steps 9..12 "
               "within %.2g of the reference's\n", ckpt_tag, spec_tag, r,
               world, steps_close_(tag, r, &res, ref, 9));
    }
}

/* Every rank of tag has slots offloaded. */
static void offloaded_some_(const char *tag, int world)
{
    for (int r = 0; r < world; r++) {
        result res;
        if (load_(tag, r, &res) == 0)
            CHECK(res.offloaded > 0, "%s rank %d: no slot offloaded", tag, r);
    }
}

static double rel_(double a, double b)
{
    if (isnan(a) && isnan(b))
        return 0;
    return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12);
}

/* steps from..n of tag's rank r against ref; the worst relative
 * difference */
static double steps_close_(const char *tag, int r, const result *res,
                           const result *ref, int from)
{
    const char *what[5] = {"loss", "val loss", "grad norm", "aux", "z"};
    CHECK(res->n == ref->n, "%s rank %d: %d steps, the one-rank run %d", tag,
          r, res->n, ref->n);
    double worst = 0;
    for (int i = from - 1; i < res->n && i < ref->n; i++)
        for (int k = 0; k < 5; k++) {
            double d = rel_(res->v[i][k], ref->v[i][k]);
            worst = d > worst ? d : worst;
            CHECK(d <= TOL, "%s rank %d step %d: %s %.9g, one rank %.9g "
                  "(%.2g relative, over %g)", tag, r, i + 1, what[k],
                  res->v[i][k], ref->v[i][k], d, TOL);
        }
    for (int i = from - 1; i < res->n && i < ref->n; i++)
        CHECK(res->dropped[i] == ref->dropped[i], "%s rank %d step %d: %ld "
              "pairs dropped, one rank %ld", tag, r, i + 1, res->dropped[i],
              ref->dropped[i]);
    return worst;
}

static void compare_(const char *tag, int world, int P, const result *ref)
{
    /* the experts' floats of one slot of the whole model (weights, biases) */
    size_t per_expert = (size_t)2 * H_ * C_ + H_ + C_;
    for (int r = 0; r < world; r++) {
        result res;
        if (load_(tag, r, &res) != 0)
            continue;
        double worst = steps_close_(tag, r, &res, ref, 1);
        /* memory: the rank's model after the delink has L MoE slots;
         * it lacks the experts of the other ranks, nothing else (each
         * slot padded to 16 floats: at most 15 floats a slot apart) */
        int first, El = model_expert_range(E_, P, r % P, &first);
        double lack = (double)(E_ - El) * per_expert * L_;
        double all = (double)E_ * per_expert * L_;
        double mine_w = (double)ref->nw - (double)res.nw;
        double mine_m = (double)ref->nm - (double)res.nm;
        double lack_m = ref->nm ? lack : 0;  /* Adafactor without m: none */
        if (res.nm == 0 && ref->nm > 0) {
            /* sharded over the world/P ranks holding the same experts
             * (AdamW's m and v: 8 bytes a float of weights): each holds
             * its share of its own model's, padding aside */
            int D = world / P;
            double want = ((double)ref->optim - 8.0 * lack) / D;
            CHECK(fabs((double)res.optim - want) <= 0.01 * want, "%s rank "
                  "%d: %zu bytes of optimizer state, want %.0f (the one-rank "
                  "model's %zu less the other experts', over %d ranks)", tag,
                  r, res.optim, want, ref->optim, D);
            printf("%s rank %d: %zu bytes of optimizer state, %.3f of the "
                   "one-rank model's\n", tag, r, res.optim,
                   (double)res.optim / (double)ref->optim);
            mine_m = lack_m;
        }
        CHECK(fabs(mine_w - lack) <= 16.0 * L_ && fabs(mine_m - lack_m) <=
              16.0 * L_, "%s rank %d: %zu floats of weights and %zu of m, "
              "the one-rank model %zu and %zu: %.0f and %.0f fewer, not the "
              "%.0f floats of %d experts", tag, r, res.nw, res.nm, ref->nw,
              ref->nm, mine_w, mine_m, lack, E_ - El);
        double ratio = (all - mine_w) / all;
        printf("%s rank %d: losses, norms, aux and z within %.2g of one "
               "rank's; experts %d..%d: %zu floats of weights (one rank "
               "%zu), expert bytes %.3f of one rank's\n", tag, r, worst,
               first, first + El - 1, res.nw, ref->nw, ratio);
    }
}

/* Capacity over the whole group (model.moe.capacity_scope "group"), at a
 * capacity factor of 1 so that pairs are dropped: each rank takes one
 * microbatch of 2 sequences a step (grad_accum = world), so the group's
 * microbatches together are those of one rank whose batch_size is P
 * times larger (the windows of a step are drawn in order and split
 * among the ranks in order): at W = P = 2 and 4, and as 2 replicas of
 * P = 2, the losses, norms, aux, z and dropped pairs of that one-rank
 * run. The same data with the capacity per rank drops other pairs: the
 * scope decides something. */
static void group_scope_(void)
{
    const char *cf = ", \"capacity_factor\": 1";
    const char *grp = ", \"capacity_factor\": 1, \"capacity_scope\": "
                      "\"group\"";
    static const struct {
        const char *tag, *ref;
        int world, P, ref_B, ref_M, ref_eval;
    } runs[] = {
        {"ep2g", "big2", 2, 2, 4, 1, 2},
        {"ep4g", "big4", 4, 4, 8, 1, 1},
        {"ep2x2g", "big2x2", 4, 2, 4, 2, 2},
    };
    const char *plain[1] = {"plain"};
    result rank2 = {0}, group2 = {0};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        write_spec_batch_(runs[i].tag, runs[i].world, runs[i].P, grp, 2,
                          runs[i].world, 4);
        write_spec_batch_(runs[i].ref, 1, 1, cf, runs[i].ref_B,
                          runs[i].ref_M, runs[i].ref_eval);
        result ref;
        if (rank_procs_run(runs[i].ref, runs[i].ref, 1, plain, 1, 240,
                           -1) != 0 || load_(runs[i].ref, 0, &ref) != 0)
            continue;
        long dropped = 0;
        for (int s = 0; s < ref.n; s++)
            dropped += ref.dropped[s];
        CHECK(dropped > 0, "%s: no pair dropped in %d steps: the capacity "
              "is not tested", runs[i].ref, ref.n);
        if (rank_procs_run(runs[i].tag, runs[i].tag, runs[i].world, plain,
                           1, 240, -1) == 0)
            compare_(runs[i].tag, runs[i].world, runs[i].P, &ref);
        if (i == 0)
            load_(runs[i].tag, 0, &group2);
    }
    write_spec_batch_("ep2r", 2, 2, cf, 2, 2, 4);
    if (rank_procs_run("ep2r", "ep2r", 2, plain, 1, 240, -1) == 0 &&
        load_("ep2r", 0, &rank2) == 0) {
        int differ = 0;
        for (int s = 0; s < rank2.n && s < group2.n; s++)
            differ += rank2.dropped[s] != group2.dropped[s] ||
                      rel_(rank2.v[s][3], group2.v[s][3]) > TOL;
        CHECK(differ > 0, "ep2r (capacity per rank) and ep2g (per group): "
              "the same dropped pairs and aux losses at every step");
        printf("capacity per rank against per group, same data: %d of %d "
               "steps differ in dropped pairs or aux\n", differ, rank2.n);
    }
}

/* The device.memory_budget that tag's whole model needs in its real
 * phase with every slot offloaded (the planner's minimum): each rank
 * starts with the whole model, and the slots of its own experts are
 * smaller. 0 when it cannot be planned. */
static size_t min_budget_(const char *tag)
{
    char p[600], e[512];
    snprintf(p, sizeof p, "%s/%s.json", rank_dir_, tag);
    run_spec sp;
    offload_plan pl;
    if (spec_load_file(&sp, p, e, sizeof e) != 0 ||
        offload_plan_for_spec(&sp, 0, &pl, e, sizeof e) != 0) {
        CHECK(0, "plan %s: %s", tag, e);
        return 0;
    }
    size_t b = pl.min_budget_bytes;
    offload_plan_free(&pl);
    return b;
}

/* Offloading under expert parallelism: each rank's slots hold its own
 * experts, placed by a plan of its own model (device.memory_budget the
 * whole model's minimum). At W = P = 2 with the clip firing every step
 * (pseudo phase included), and as 2 replicas of P = 2 with
 * offload.speculative on and a clip that never fires (every step's
 * speculative update of an offloaded slot kept: made only once the
 * replicas have summed its experts' gradient), the one-rank run's
 * figures; every rank has offloaded slots. */
static void offloaded_(const result *ref)
{
    size_t b = min_budget_("one");
    if (b == 0)
        return;
    char dev[300];
    snprintf(dev, sizeof dev, ",\n \"device\": {\"threads\": 1, "
             "\"memory_budget\": %zu}", b);
    write_spec_full_("ep2o", 2, 2, "", 2, 4, 4, 0.05, dev);
    write_spec_full_("dp2o", 2, 1, "", 2, 4, 4, 0.05, dev);
    snprintf(dev, sizeof dev, ",\n \"device\": {\"threads\": 1, "
             "\"memory_budget\": %zu},\n \"offload\": {\"speculative\": "
             "\"on\"}", b);
    write_spec_full_("ep2x2k", 4, 2, "", 2, 4, 4, 1000, dev);
    write_spec_full_("onek", 1, 1, "", 2, 4, 4, 1000,
                     ",\n \"device\": {\"threads\": 1}");
    /* both save at step 8, every gradient drain late: a rank's model
     * re-laid after the save (to_local_) must wait for its drains as the
     * first one did */
    const char *plain[1] = {"plain"}, *save[1] = {"save-slow"};
    result refk;
    static const struct { const char *tag; int world; int kept; } runs[] = {
        {"ep2o", 2, 0}, {"ep2x2k", 4, 1}};
    if (rank_procs_run("onek", "onek", 1, plain, 1, 240, -1) != 0 ||
        load_("onek", 0, &refk) != 0)
        return;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (rank_procs_run(runs[i].tag, runs[i].tag, runs[i].world, save, 1,
                           240, -1) != 0)
            continue;
        compare_(runs[i].tag, runs[i].world, 2, runs[i].kept ? &refk : ref);
        for (int r = 0; r < runs[i].world; r++) {
            result res;
            if (load_(runs[i].tag, r, &res) != 0)
                continue;
            CHECK(res.offloaded > 0 && res.offloaded < L_, "%s rank %d: %d "
                  "of its %d slots offloaded (want some, not all)",
                  runs[i].tag, r, res.offloaded, L_);
            /* the pseudo phase's one slot is resident; rank 0's counts
             * go on across the re-lay after its save of step 8 */
            CHECK(!runs[i].kept ||
                      (res.spec_steps == (unsigned long long)(res.n - PSEUDO_)
                       && res.redo_steps == 0),
                  "%s rank %d: %llu of its %d real steps speculated, %llu "
                  "redone (want every one, kept)", runs[i].tag, r,
                  res.spec_steps, res.n - PSEUDO_, res.redo_steps);
            printf("%s rank %d: %d of %d slots offloaded; %llu steps "
                   "speculated, %llu redone\n", runs[i].tag, r,
                   res.offloaded, L_, res.spec_steps, res.redo_steps);
        }
    }
    /* ep2o's checkpoint of step 8 (rank 0 gathered the experts into a
     * whole model placed by the whole model's plan), resumed by one
     * offloading rank without expert parallelism */
    resumed_("resumedo", "ep2o", "dp2o", 1, ref);
}

/* Adafactor (its statistics factored per expert matrix, so a rank's
 * experts' are theirs alone): without a first moment at W = P = 2, its
 * save of step 8 (the experts' statistics gathered) resumed at P = 1;
 * with one, as 2 replicas of P = 2 offloading (a host Adafactor for the
 * offloaded slots): the one-rank runs' figures. */
static void adafactor_(void)
{
    const char *dev = ",\n \"device\": {\"threads\": 1}";
    char top[400];
    const char *plain[1] = {"plain"}, *save[1] = {"save"};
    result ref;
    snprintf(top, sizeof top, "%s,\n \"optimizer\": {\"name\": "
             "\"adafactor\", \"beta1\": 0, \"eps1\": 1e-4}", dev);
    write_spec_full_("oneaf", 1, 1, "", 2, 4, 4, 0.05, top);
    write_spec_full_("ep2af", 2, 2, "", 2, 4, 4, 0.05, top);
    write_spec_full_("dp2af", 2, 1, "", 2, 4, 4, 0.05, top);
    if (rank_procs_run("oneaf", "oneaf", 1, plain, 1, 240, -1) == 0 &&
        load_("oneaf", 0, &ref) == 0 &&
        rank_procs_run("ep2af", "ep2af", 2, save, 1, 240, -1) == 0) {
        compare_("ep2af", 2, 2, &ref);
        resumed_("resumedaf", "ep2af", "dp2af", 1, &ref);
        reshard_("ep2af", "ep2af", 2);
        /* and at P = 2: each rank takes its experts' statistics from the
         * whole model it loaded */
        resumed_("resumedaf2", "ep2af", "ep2af", 2, &ref);
    }
    snprintf(top, sizeof top, "%s,\n \"optimizer\": {\"name\": "
             "\"adafactor\", \"beta1\": 0.9, \"eps1\": 1e-4}", dev);
    write_spec_full_("oneafm", 1, 1, "", 2, 4, 4, 0.05, top);
    snprintf(top, sizeof top, "%s,\n \"offload\": {\"prefetch\": 1},\n "
             "\"optimizer\": {\"name\": \"adafactor\", \"beta1\": 0.9, "
             "\"eps1\": 1e-4}", dev);
    /* one staging buffer: the whole model's minimum leaves no room for
     * a rank's two slots resident (Adafactor's are small) */
    write_spec_full_("afo", 1, 1, "", 2, 4, 4, 0.05, top);
    size_t b = min_budget_("afo");
    snprintf(top, sizeof top, ",\n \"device\": {\"threads\": 1, "
             "\"memory_budget\": %zu},\n \"offload\": {\"prefetch\": "
             "1},\n \"optimizer\": {\"name\": \"adafactor\", \"beta1\": "
             "0.9, \"eps1\": 1e-4}", b);
    write_spec_full_("ep2x2afo", 4, 2, "", 2, 4, 4, 0.05, top);
    if (b && rank_procs_run("oneafm", "oneafm", 1, plain, 1, 240, -1) == 0 &&
        load_("oneafm", 0, &ref) == 0 &&
        rank_procs_run("ep2x2afo", "ep2x2afo", 4, plain, 1, 240, -1) == 0) {
        compare_("ep2x2afo", 4, 2, &ref);
        offloaded_some_("ep2x2afo", 4);
    }
}

/* bf16 master weights (optimizer.master "bf16": every update rounded
 * stochastically, keyed by the element's place in the whole model, so a
 * rank rounds its experts as one rank does): AdamW at W = P = 2, its save
 * of step 8 resumed at P = 1, against one rank; Adafactor without a first
 * moment as 2 replicas of P = 2 offloading, against 4 data-parallel ranks
 * (the header says why). */
static void bf16_masters_(void)
{
    const char *plain[1] = {"plain"}, *save[1] = {"save"};
    const char *dev = ",\n \"device\": {\"threads\": 1}";
    char top[400];
    result ref;
    snprintf(top, sizeof top, "%s,\n \"optimizer\": {\"master\": "
             "\"bf16\"}", dev);
    write_spec_full_("onebf", 1, 1, "", 2, 4, 4, 0.05, top);
    write_spec_full_("ep2bf", 2, 2, "", 2, 4, 4, 0.05, top);
    write_spec_full_("dp2bf", 2, 1, "", 2, 4, 4, 0.05, top);
    if (rank_procs_run("onebf", "onebf", 1, plain, 1, 240, -1) == 0 &&
        load_("onebf", 0, &ref) == 0 &&
        rank_procs_run("ep2bf", "ep2bf", 2, save, 1, 240, -1) == 0) {
        compare_("ep2bf", 2, 2, &ref);
        reshard_("ep2bf", "ep2bf", 2);
        resumed_("resumedbf", "ep2bf", "dp2bf", 1, &ref);
    }
    const char *af = "\"optimizer\": {\"name\": \"adafactor\", \"beta1\": 0, "
                     "\"eps1\": 1e-4, \"master\": \"bf16\"}";
    snprintf(top, sizeof top, "%s,\n \"offload\": {\"prefetch\": 1},\n "
             "%s", dev, af);
    write_spec_full_("bfaf", 1, 1, "", 2, 4, 4, 0.05, top);
    size_t b = min_budget_("bfaf");
    snprintf(top, sizeof top, ",\n \"device\": {\"threads\": 1, "
             "\"memory_budget\": %zu},\n \"offload\": {\"prefetch\": "
             "1},\n %s", b, af);
    write_spec_full_("dp4bfaf", 4, 1, "", 2, 4, 4, 0.05, top);
    write_spec_full_("ep2x2bfaf", 4, 2, "", 2, 4, 4, 0.05, top);
    if (b && rank_procs_run("dp4bfaf", "dp4bfaf", 4, plain, 1, 240, -1) == 0 &&
        load_("dp4bfaf", 0, &ref) == 0 &&
        rank_procs_run("ep2x2bfaf", "ep2x2bfaf", 4, plain, 1, 240, -1) == 0) {
        compare_("ep2x2bfaf", 4, 2, &ref);
        offloaded_some_("ep2x2bfaf", 4);
    }
}

/* 0 when files a and b hold the same bytes (CHECKs otherwise) */
static int same_file_(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    long n = 0;
    int ca = EOF, cb = EOF, same = fa && fb;
    while (same) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
        n++;
    }
    CHECK(same && ca == EOF, "%s and %s differ at byte %ld (%s)", a, b, n,
          fa && fb ? "contents" : "missing");
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same && ca == EOF ? 0 : -1;
}

/* A checkpoint (written whole by rank 0) loaded by the world ranks of
 * spec tag, each taking its experts, gathered back and saved: its
 * weights and optimizer state are those saved, byte for byte (every
 * tensor by its global expert). */
static void reshard_(const char *ckpt_tag, const char *tag, int world)
{
    char src[600], arg[700], a[800], b[800];
    snprintf(src, sizeof src, "%s/%s-0.out.ckpt", rank_dir_, ckpt_tag);
    snprintf(arg, sizeof arg, "reshard:%s", src);
    const char *mode[1] = {arg};
    char out[100];
    snprintf(out, sizeof out, "re-%s-%s", ckpt_tag, tag);
    if (rank_procs_run(out, tag, world, mode, 1, 240, -1) != 0)
        return;
    const char *files[2] = {"model.safetensors", "optimizer.safetensors"};
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s-0.out.ckpt/%s", rank_dir_, out, files[i]);
        ok &= same_file_(a, b) == 0;
    }
    if (ok)
        printf("%s's checkpoint split over %d ranks (%s) and gathered: "
               "weights and optimizer state byte for byte\n", ckpt_tag,
               world, tag);
}

/* optimizer.shard with replicas (ZeRO stage 1 over the D ranks holding
 * the same experts): 2 replicas of P = 2, its save of step 8 (every
 * replica group whole, then the experts to rank 0) resumed at P = 1;
 * against one rank. And with offloading (device.memory_budget the whole
 * model's minimum; the state on each rank's host, apart from its slots):
 * the same figures, slots offloaded on every rank, and its save of step
 * 8 loaded by its 4 ranks, gathered back and saved byte for byte. */
static void sharded_(const result *ref)
{
    /* the minimum of the whole model with its state on the host and one
     * staging buffer: a resident slot costs what a staging buffer does
     * then (weights and gradients), so only prefetch 1 leaves a smaller
     * footprint offloaded, and a rank's own model offloads its slots */
    size_t b = min_budget_("one");
    char dev[300];
    for (int k = 0; k < 2 && b > 0; k++) {
        snprintf(dev, sizeof dev, ",\n \"device\": {\"threads\": 1, "
                 "\"memory_budget\": %zu},\n \"offload\": {\"prefetch\": "
                 "1},\n \"optimizer\": {\"shard\": true}", b);
        write_spec_full_("ep2x2zo", 4, 2, "", 2, 4, 4, 0.05, dev);
        if (k == 0)
            b = min_budget_("ep2x2zo");
    }
    const char *save_o[1] = {"save"};
    if (b > 0 &&
        rank_procs_run("ep2x2zo", "ep2x2zo", 4, save_o, 1, 240, -1) == 0) {
        compare_("ep2x2zo", 4, 2, ref);
        offloaded_some_("ep2x2zo", 4);
        reshard_("ep2x2zo", "ep2x2zo", 4);
    }
    const char *save[1] = {"save"};
    const char *top = ",\n \"device\": {\"threads\": 1},\n "
                      "\"optimizer\": {\"shard\": true}";
    write_spec_full_("ep2x2z", 4, 2, "", 2, 4, 4, 0.05, top);
    write_spec_full_("dp2z", 2, 1, "", 2, 4, 4, 0.05, top);
    if (rank_procs_run("ep2x2z", "ep2x2z", 4, save, 1, 240, -1) != 0)
        return;
    compare_("ep2x2z", 4, 2, ref);
    reshard_("ep2x2z", "ep2x2z", 4);
    resumed_("resumedz", "ep2x2z", "dp2z", 1, ref);
}

int main(int argc, char **argv)
{
    int rc = rank_procs_enter(argc, argv, 8, rank_main_, "ep-train", 1);
    if (rc != RANK_PROCS_PARENT)
        return rc;
    write_spec_("one", 1, 1);
    write_spec_("ep2", 2, 2);
    write_spec_("ep4", 4, 4);
    write_spec_("ep2x2", 4, 2);  /* two replicas of a group of 2 */
    write_spec_("dp2", 2, 1);  /* ep2's checkpoint taken up at P = 1 */
    /* dropless (capacity factor 0): every token reaches its expert */
    write_spec_moe_("one0", 1, 1, ", \"capacity_factor\": 0");
    write_spec_moe_("ep2d", 2, 2, ", \"capacity_factor\": 0");
    const char *plain[1] = {"plain"}, *save[1] = {"save"};
    rank_procs_run("one", "one", 1, plain, 1, 240, -1);
    result ref;
    if (load_("one", 0, &ref) == 0) {
        CHECK(ref.n == 12, "one rank: %d steps of 12", ref.n);
        /* the clip fires every step, and the router losses count */
        for (int i = 0; i < ref.n; i++)
            CHECK(ref.v[i][2] > 0.05 && ref.v[i][3] > 0 && ref.v[i][4] > 0,
                  "one rank step %d: norm %g (clip 0.05), aux %g, z %g",
                  i + 1, ref.v[i][2], ref.v[i][3], ref.v[i][4]);
        static const struct { const char *tag; int world, P; } runs[] = {
            {"ep2", 2, 2}, {"ep4", 4, 4}, {"ep2x2", 4, 2}};
        for (int i = 0; i < 3; i++)
            if (rank_procs_run(runs[i].tag, runs[i].tag, runs[i].world,
                               runs[i].P == 2 ? save : plain, 1, 240, -1) == 0)
                compare_(runs[i].tag, runs[i].world, runs[i].P, &ref);
        reshard_("ep2", "ep2", 2);
        reshard_("ep2", "ep4", 4);
        reshard_("ep2", "ep2x2", 4);
        const char *nogroups[1] = {"nogroups"};
        rank_procs_run("nogroups", "ep2x2", 4, nogroups, 1, 120, -1);
        /* ep2's checkpoint of step 8, written whole by rank 0, resumed by
         * one rank of a spec without expert parallelism: steps 9..12 are
         * the one-rank run's */
        resumed_("resumed", "ep2", "dp2", 1, &ref);
        /* dropless at P = 2 against dropless on one rank */
        result ref0;
        if (rank_procs_run("one0", "one0", 1, plain, 1, 240, -1) == 0 &&
            load_("one0", 0, &ref0) == 0 &&
            rank_procs_run("ep2d", "ep2d", 2, plain, 1, 240, -1) == 0)
            compare_("ep2d", 2, 2, &ref0);
        offloaded_(&ref);
        sharded_(&ref);
    }
    adafactor_();
    bf16_masters_();
    group_scope_();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rank_dir_);
    if (failures_ == 0 && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", rank_dir_);
    printf("%s\n", failures_ ? "FAILED" : "ok");
    return failures_ ? 1 : 0;
}
