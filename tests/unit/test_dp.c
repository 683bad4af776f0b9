/*
 * test_dp.c — data-parallel training (trainer_set_collectives) against the
 * one-node run, on real text (fortunes shards), without the daemon: each
 * rank is a separate process (this program run again as "rank ..."), its
 * trainer joined to the others by Gloo over loopback, bootstrapped through
 * a file store (tests/common/file_store.h).
 *
 *   same losses   2 and 3 ranks, through a delink (3 pseudo steps, 3 real),
 *                 against one node with the same global batch: train and
 *                 validation losses and final weights within the
 *                 tolerances below; the ranks' weights bitwise identical
 *                 after every step
 *   coverage      every step, the ranks' windows in rank order are exactly
 *                 the one-node step's windows: each used once, by one rank
 *   accumulation  microbatch 1 and grad_accum 4 on each of W ranks (2, 3)
 *                 against one node at batch 4W: weights after 3 steps within
 *                 tolerance, identical across ranks at every step (an
 *                 all-reduce per microbatch would count gradients twice)
 *   buckets       2 ranks with 1000-float buckets (boundaries inside every
 *                 tensor region) and with the default: bitwise the same
 *                 (with two ranks each sum is a+b or b+a, equal in IEEE)
 *   join          pseudo phase on 1 rank, real on 2: rank 0 trains the
 *                 pseudo phase alone, delinks, and broadcasts weights and
 *                 moments to rank 1; the real steps match the one-node run
 *   repeatable    3 ranks run twice: bitwise the same losses and weights
 *   overlap       the all-reduce overlapped with backward (the default,
 *                 every case above) and after it (trainer_set_dp_overlap
 *                 0): 3 ranks, and 2 ranks with 1000-float buckets,
 *                 bitwise the same losses and weights (the buckets and
 *                 the order of their all-reduces are the same)
 *   offloaded     device.memory_budget with every slot offloaded on 2
 *                 ranks (pseudo.grad_scale mean: the shared slot's mean
 *                 taken after the sum), and with one slot resident under
 *                 accumulation
 *                 (microbatch 1, grad_accum 4 a rank), against the
 *                 one-node offloaded run within the tolerances, and
 *                 bitwise against the same ranks without offloading
 *                 (offloading changes no float operation; the host
 *                 AdamW's speculative update starts as each slot is
 *                 summed, and the clip redoes it)
 *   killed        2 ranks, rank 1 killed after step 2: rank 0's step 3
 *                 fails with TRAINER_ECOLL within nodes.timeout
 *   moe, mixed    MoE in every block and in every other block (slots of
 *                 two kinds), 2 ranks, splitting grad_accum and splitting
 *                 rows, against one node whose microbatches are the ranks'
 *                 shares: losses, weights, and the step's MoE facts, which
 *                 rank 0 reports for the whole group
 *   refused       a group whose world size is not the spec's, in process
 *
 * Tolerances. Data parallelism changes only the order of float additions:
 * a rank's gradient is the sum over its own microbatches and rows, then
 * the ranks' sums are added, where one node adds all rows in one pass.
 * fp32 rounding of such reorderings is ~1e-7 relative per gradient
 * element, and over 6 steps of a 2-layer model the losses and gradient
 * norms differ by ~1e-7 (at most 2e-6 measured). LOSS_TOL, 1e-4 relative,
 * leaves a factor of 50 for that; it applies to the train and validation
 * losses and to the gradient norm. The norm is what catches a wrong scale
 * (a rank's share weighted as a whole batch doubles it), which AdamW's
 * update m/sqrt(v) hides from the weights. Weights: AdamW's update of an
 * element whose gradient is near zero follows that gradient's rounding,
 * so the largest single difference is ~5e-5 after 6 steps at lr 0.01 (a
 * step moves an element by up to 1e-2); PARAM_TOL 5e-4 absolute.
 *
 * Exit 77 without Gloo or without the fortunes text.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/corpus/corpus.h"
#include "dist/collectives.h"
#include "offload/offload.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "train/test_hooks.h"
#include "../common/rank_procs.h"
#include "../common/weights_hash.h"

#define LOSS_TOL 1e-4
#define PARAM_TOL 5e-4
/* compare_'s bound on the final weights: PARAM_TOL, but for Adafactor
 * 2 lr per step. Its eps1 (1e-30) sits inside the square root, so an
 * element whose true gradient is 0 but whose computed one is rounding
 * noise (the key bias: softmax ignores it) steps by a full +-lr, the sign
 * set by the noise, which one node and 2 ranks round differently; the
 * losses, norms and val losses cannot differ that way and keep their
 * tolerances. */
static double param_tol_ = PARAM_TOL;
#define MAX_STEPS 16
#define MAX_WIN 64
#define KILL_TIMEOUT_S 3
#define SLACK_S 5.0

/* ------------------------------------------------------------ a rank */

/* rank SPEC OUT WORLD RANK STORE BUCKET MODE: train the spec to its end
 * (delinking after pseudo.steps), one line per step into OUT, the final
 * weights into OUT.params, the most slots offloaded at once into OUT.off.
 * MODE: plain, seq (plain without overlap: the all-reduce after the
 * microbatches), join (pseudo phase on rank 0 alone, rank 1 joins at
 * the delink), die (rank 1 killed after step 2; rank 0 expects
 * TRAINER_ECOLL), inf (the last rank's batch is bad at step 2, and rank
 * 0's when world > 2: their own gradients all NaN before the sum; rank
 * 1's own gradient is scaled by TRAINER_FAULT_GRAD_SCALE_FACTOR at step 4
 * (world > 2); every rank writes its step results' attribution into
 * OUT.attr). */
static int rank_main_(int argc, char **argv)
{
    (void)argc;
    srandom((unsigned)getpid());
    rank_proc rp;
    if (rank_proc_open(&rp, argv) != 0)
        return 1;
    const char *out_path = rp.out_path, *store_dir = rp.store_dir;
    const char *mode = argv[8];
    size_t bucket = (size_t)atol(argv[7]);
    int world = rp.world, rank = rp.rank;
    const run_spec spec = rp.spec;
    trainer *t = rp.t;
    char e[1024];
    m6_err err = M6_ERR_NONE;
    if (bucket)
        trainer_set_bucket_floats(t, bucket);
    if (strcmp(mode, "seq") == 0)
        trainer_set_dp_overlap(t, 0);
    int most_offloaded = 0;
    offload_stats ost = {0};
    int join = strcmp(mode, "join") == 0, die = strcmp(mode, "die") == 0;
    FILE *attr = NULL;
    if (strcmp(mode, "inf") == 0) {
        if (rank == world - 1 || (rank == 0 && world > 2))
            trainer_test_fault(t, TRAINER_FAULT_NAN_BATCH, 2, 1, 0);
        else if (rank == 1)
            trainer_test_fault(t, TRAINER_FAULT_GRAD_SCALE, 4, 1, 0);
        char ap[600];
        snprintf(ap, sizeof ap, "%s.attr", out_path);
        attr = fopen(ap, "w");
    }
    int timeout_ms = spec.nodes.timeout * 1000;
    m6_store st;
    file_store fs;
    m6_coll *c = NULL;
    if (world > 1 && !join) {
        if (!(c = rank_procs_group(store_dir, "g0", rank, world, timeout_ms,
                                   &st, &fs)))
            return 1;
        if (trainer_set_collectives(t, c, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
    }
    if (join && rank == 1) {
        /* waits for rank 0 to finish the pseudo phase */
        if (!(c = rank_procs_group(store_dir, "g1", rank, world, 120000,
                                   &st, &fs)))
            return 1;
        if (trainer_broadcast_state(t, c, 0, &err) != 0 ||
            trainer_set_collectives(t, c, &err) != 0) {
            fprintf(stderr, "rank %d: join: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
    }
    FILE *out = fopen(out_path, "w");
    char mp[600];
    snprintf(mp, sizeof mp, "%s.moe", out_path);
    FILE *moe = fopen(mp, "w");
    size_t np = trainer_copy_state(t, 0, NULL);
    float *w = malloc(np * sizeof(float) * 2);  /* room after the delink */
    while (trainer_step_count(t) < spec.train.steps) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == spec.pseudo.steps) {
            if (trainer_delink(t, e, sizeof e) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, e);
                return 1;
            }
            np = trainer_copy_state(t, 0, NULL);
            w = realloc(w, np * sizeof(float));
            if (join && rank == 0) {
                if (!(c = rank_procs_group(store_dir, "g1", rank, world,
                                           120000, &st, &fs)))
                    return 1;
                if (trainer_broadcast_state(t, c, 0, &err) != 0 ||
                    trainer_set_collectives(t, c, &err) != 0) {
                    fprintf(stderr, "rank 0: join: %s\n", m6_err_msg(&err));
                    return 1;
                }
            }
        }
        if (die && rank == 1 && trainer_step_count(t) == 2) {
            fclose(out);
            fclose(moe);
            raise(SIGKILL);
        }
        step_result r;
        double t0 = file_store_now_();
        long before = trainer_step_count(t);
        int rc = trainer_step(t, &r, &err);
        if (die && rank == 0 && before == 2) {
            double dt = file_store_now_() - t0;
            fprintf(stderr, "rank 0: step 3: rc %d after %.2f s: %s\n", rc,
                    dt, m6_err_msg(&err));
            fprintf(out, "ecoll %d %.3f\n", rc == TRAINER_ECOLL, dt);
            fclose(out);
            fclose(moe);
            trainer_free(t);
            m6_coll_destroy(c);
            m6_err_free(&err);
            free(w);
            return rc == TRAINER_ECOLL && dt < KILL_TIMEOUT_S + SLACK_S
                       ? 0 : 1;
        }
        if (rc != 0) {
            fprintf(stderr, "rank %d: step %ld: %s\n", rank,
                    trainer_step_count(t) + 1, m6_err_msg(&err));
            return 1;
        }
        if (attr)
            fprintf(attr, "%ld %d %d %d %d %d %d\n", r.step, r.skipped,
                    r.nonfinite_rank, r.nonfinite_ranks, r.outlier_rank,
                    r.nonfinite_ranks > 0 ? r.nonfinite_list[0] : -1,
                    r.nonfinite_ranks > 1 ? r.nonfinite_list[1] : -1);
        if (trainer_offload_stats(t, &ost) == 0 &&
            ost.n_offloaded > most_offloaded)
            most_offloaded = ost.n_offloaded;
        trainer_copy_state(t, 0, w);
        size_t pos[MAX_WIN];
        size_t nw = trainer_step_windows(t, pos);
        fprintf(out, "%ld %a %a %a %016llx %zu", r.step,
                (double)r.train_loss, (double)r.val_loss,
                (double)r.grad_norm, (unsigned long long)weights_hash(w, np), nw);
        for (size_t i = 0; i < nw; i++)
            fprintf(out, " %zu", pos[i]);
        fputc('\n', out);
        if (r.moe.present) {
            /* the tokens of each (block, expert), weighted by position */
            double tw = 0;
            for (size_t i = 0; i < r.moe.n_tokens; i++)
                tw += (double)(i + 1) * r.moe.tokens[i];
            fprintf(moe, "%ld %a %a %a %a %a %a %a %a %a %a %a %a\n",
                    r.step, r.moe.aux_loss, r.moe.z_loss,
                    r.moe.dropped_fraction, r.moe.load_min, r.moe.load_max,
                    r.moe.experts_empty, (double)r.moe.experts_idle, tw,
                    (double)r.moe.step_tokens_min,
                    (double)r.moe.step_tokens_max,
                    (double)r.moe.step_experts_empty,
                    (double)r.moe.step_dropped);
        }
    }
    fclose(out);
    fclose(moe);
    if (attr)
        fclose(attr);
    char pp[600];
    if (rank == 0 && world > 1) {
        /* rank 0 writes the replicated state; the checkpoint says the
         * world size, and a one-node trainer of the spec takes it */
        snprintf(pp, sizeof pp, "%s.ckpt", out_path);
        if (trainer_save(t, pp, &err) < 0) {
            fprintf(stderr, "rank 0: save: %s\n", m6_err_msg(&err));
            return 1;
        }
        snprintf(pp, sizeof pp, "%s.ckpt/meta.json", out_path);
        FILE *mf = fopen(pp, "r");
        char meta[8192] = "", want[64];
        size_t ml = mf ? fread(meta, 1, sizeof meta - 1, mf) : 0;
        meta[ml] = 0;
        if (mf)
            fclose(mf);
        snprintf(want, sizeof want, "\"world_size\": %d", world);
        if (!strstr(meta, want)) {
            fprintf(stderr, "rank 0: meta.json lacks %s\n", want);
            return 1;
        }
        trainer *t1 = trainer_create(&spec, &err);
        float *w1 = malloc(np * sizeof(float));
        snprintf(pp, sizeof pp, "%s.ckpt", out_path);
        if (!t1 || trainer_load(t1, pp, &err) != 0 ||
            trainer_copy_state(t1, 0, w1) != np ||
            memcmp(w1, w, np * sizeof(float)) != 0) {
            fprintf(stderr, "rank 0: the checkpoint does not load into a "
                    "one-node trainer as written: %s\n", m6_err_msg(&err));
            return 1;
        }
        free(w1);
        trainer_free(t1);
    }
    snprintf(pp, sizeof pp, "%s.params", out_path);
    FILE *f = fopen(pp, "wb");
    fwrite(w, sizeof(float), np, f);
    fclose(f);
    snprintf(pp, sizeof pp, "%s.off", out_path);
    if ((f = fopen(pp, "w"))) {
        long rep, early, nb;
        trainer_dp_overlap_counts(t, &rep, &early, &nb);
        fprintf(f, "%d %ld %ld %ld %d %d %llu %llu\n", most_offloaded, rep,
                early, nb, trainer_n_slots(t), ost.speculative,
                (unsigned long long)ost.spec_steps,
                (unsigned long long)ost.redo_steps);
        fclose(f);
    }
    trainer_free(t);
    m6_coll_destroy(c);
    m6_err_free(&err);
    free(w);
    return 0;
}

/* ------------------------------------------------------------ results */

typedef struct {
    int n;
    long step[MAX_STEPS];
    double loss[MAX_STEPS], val[MAX_STEPS], norm[MAX_STEPS];
    unsigned long long sum[MAX_STEPS];
    size_t nw[MAX_STEPS], win[MAX_STEPS][MAX_WIN];
    float *params;
    size_t np;
} result;

static int load_(const char *path, result *r)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    while (r->n < MAX_STEPS && fgets(line, sizeof line, f)) {
        int i = r->n, off;
        if (sscanf(line, "%ld %la %la %la %llx %zu%n", &r->step[i],
                   &r->loss[i], &r->val[i], &r->norm[i], &r->sum[i],
                   &r->nw[i], &off) != 6)
            break;
        char *p = line + off;
        for (size_t k = 0; k < r->nw[i] && k < MAX_WIN; k++) {
            int o2;
            sscanf(p, " %zu%n", &r->win[i][k], &o2);
            p += o2;
        }
        r->n++;
    }
    fclose(f);
    char pp[600];
    snprintf(pp, sizeof pp, "%s.params", path);
    if ((f = fopen(pp, "rb"))) {
        fseek(f, 0, SEEK_END);
        r->np = (size_t)ftell(f) / sizeof(float);
        fseek(f, 0, SEEK_SET);
        r->params = malloc(r->np * sizeof(float) + 1);
        if (fread(r->params, sizeof(float), r->np, f) != r->np)
            r->np = 0;
        fclose(f);
    }
    return 0;
}


/* The spec file tag.json: the shared shape (model_extra: more members of
 * "model", pseudo_extra of "pseudo"), device.memory_budget `budget` bytes
 * (0: none), then extra members. */
static void write_spec_full_(const char *tag, int B, int accum, long steps,
                             long pseudo, const char *model_extra,
                             const char *pseudo_extra, size_t budget,
                             const char *extra)
{
    FILE *f = rank_procs_spec(tag, tag);
    if (!f)
        return;
    fprintf(f, " \"model\": {\"vocab_size\": 256, \"n_layer\": 2, \"n_embd\": 32,"
            " \"n_head\": 2, \"seq_len\": 32%s%s},\n"
            " \"pseudo\": {\"steps\": %ld%s},\n"
            " \"train\": {\"steps\": %ld, \"batch_size\": %d, \"grad_accum\":"
            " %d, \"lr\": 0.01, \"min_lr\": 0.001, \"warmup_steps\": 2,"
            " \"grad_clip\": 1.0, \"seed\": 5, \"eval_every\": 3,"
            " \"eval_batches\": 6, \"expert_idle_steps\": 1},\n"
            " \"device\": {\"threads\": 1, \"memory_budget\": %zu}%s%s}\n",
            model_extra[0] ? ", " : "", model_extra, pseudo,
            pseudo_extra, steps, B, accum, budget, extra[0] ? ",\n " : "",
            extra);
    fclose(f);
}

/* ... with pseudo.grad_scale mean when mean. */
static void write_spec_budget_(const char *tag, int B, int accum, long steps,
                               long pseudo, size_t budget, int mean,
                               const char *extra)
{
    write_spec_full_(tag, B, accum, steps, pseudo, "",
                     mean ? ", \"grad_scale\": \"mean\"" : "", budget, extra);
}

static void write_spec_model_(const char *tag, int B, int accum, long steps,
                              long pseudo, const char *model_extra,
                              const char *pseudo_extra, const char *extra)
{
    write_spec_full_(tag, B, accum, steps, pseudo, model_extra, pseudo_extra,
                     0, extra);
}

static void write_spec_(const char *tag, int B, int accum, long steps,
                        long pseudo, const char *extra)
{
    write_spec_budget_(tag, B, accum, steps, pseudo, 0, 0, extra);
}

/* The specs oneSUF, w2SUF and joinSUF (B 6, 6 steps, 3 pseudo) with the
 * members opt (not empty): one node; 2 ranks; 2 ranks with the pseudo
 * phase on rank 0 alone (the other joins at the delink). */
static void write_opt_specs_(const char *suf, const char *opt)
{
    const char *nodes[3][2] = {
        {"one", ""},
        {"w2", ", \"nodes\": {\"world_size\": 2}"},
        {"join", ", \"nodes\": {\"world_size\": 2, "
                 "\"pseudo_world_size\": 1}"}};
    for (int i = 0; i < 3; i++) {
        char tag[64], ex[256];
        snprintf(tag, sizeof tag, "%s%s", nodes[i][0], suf);
        snprintf(ex, sizeof ex, "%s%s", opt, nodes[i][1]);
        write_spec_(tag, 6, 1, 6, 3, ex);
    }
}

/* The device.memory_budget of spec tag that leaves `resident` slots of
 * its real phase on the (stand-in) device: the planner's minimum plus
 * that many slots. 0 when it cannot be planned. */
static size_t budget_for_(const char *tag, int resident)
{
    char p[512], e[512];
    snprintf(p, sizeof p, "%s/%s.json", rank_dir_, tag);
    run_spec sp;
    offload_plan pl;
    if (spec_load_file(&sp, p, e, sizeof e) != 0 ||
        offload_plan_for_spec(&sp, 0, &pl, e, sizeof e) != 0) {
        fprintf(stderr, "plan %s: %s\n", tag, e);
        return 0;
    }
    /* a slot made resident frees a staging buffer (prefetch 2) */
    size_t b = pl.min_budget_bytes +
               (size_t)resident * (pl.slot_bytes - pl.staging_bytes);
    offload_plan_free(&pl);
    return b;
}

/* Run ranks [0, world) of spec tag (outputs tag-R.out); 0 when all
 * exit 0 within limit_s. */
static int run_(const char *tag, const char *spec_tag, int world,
                size_t bucket, const char *mode, double limit_s)
{
    char bs[32];
    snprintf(bs, sizeof bs, "%zu", bucket);
    const char *extra[2] = {bs, mode};
    return rank_procs_run(tag, spec_tag, world, extra, 2, limit_s,
                          strcmp(mode, "die") == 0 ? 1 : -1);
}

static void load_tag_(const char *tag, int r, result *res)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s-%d.out", rank_dir_, tag, r);
    if (load_(p, res) != 0)
        memset(res, 0, sizeof *res);
}

static double rel_(double a, double b)
{
    return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12);
}

static double max_param_diff_(const result *a, const result *b)
{
    if (a->np != b->np || a->np == 0)
        return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a->np; i++) {
        double d = fabs((double)a->params[i] - b->params[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

/* Rank r of tags a and b: bitwise the same losses, norms, validation
 * losses and weights at every step, and the same final weights. */
static int bitwise_same_(const char *a, const char *b, int r)
{
    result x, y;
    load_tag_(a, r, &x);
    load_tag_(b, r, &y);
    int eq = x.n == y.n && x.n > 0 && x.np == y.np && x.np > 0 &&
             memcmp(x.params, y.params, x.np * sizeof(float)) == 0;
    for (int i = 0; eq && i < x.n; i++)
        eq = x.loss[i] == y.loss[i] && x.norm[i] == y.norm[i] &&
             x.sum[i] == y.sum[i] &&
             (x.val[i] == y.val[i] || (isnan(x.val[i]) && isnan(y.val[i])));
    free(x.params);
    free(y.params);
    return eq;
}

/* The most slots rank r of tag had offloaded (its OUT.off), -1 unknown. */
static int offloaded_(const char *tag, int r)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s-%d.out.off", rank_dir_, tag, r);
    FILE *f = fopen(p, "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1)
        n = -1;
    if (f)
        fclose(f);
    return n;
}

/* Rank r of tag's last step, overlapped: slots reported final before its
 * last microbatch returned, of S; buckets all-reduced before it returned,
 * of nb. 0, or -1 when not recorded. */
static int overlap_of_(const char *tag, int r, long *reported, long *early,
                       long *nb, int *S)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s-%d.out.off", rank_dir_, tag, r);
    FILE *f = fopen(p, "r");
    int off, ok = f && fscanf(f, "%d %ld %ld %ld %d", &off, reported, early,
                              nb, S) == 5;
    if (f)
        fclose(f);
    return ok ? 0 : -1;
}

/* Runs spec `tag` on one node (no fault, to the end) and loads its
 * record into *res. */
static void run_one_node_(const char *tag, result *res)
{
    run_(tag, tag, 1, 0, "plain", 120);
    load_tag_(tag, 0, res);
}

/* A rank's figure `what` at a step against the one node's: within
 * LOSS_TOL relative (rel_), the largest difference so far in *worst. */
static void close_to_ref_(const char *tag, int r, long step, const char *what,
                          double got, double want, double *worst)
{
    double d = rel_(got, want);
    if (d > *worst)
        *worst = d;
    CHECK(d <= LOSS_TOL, "%s: rank %d step %ld: %s %.9g, one node %.9g (rel "
          "%.2g > %g)", tag, r, step, what, got, want, d, LOSS_TOL);
}

/* Ranks of tag against the one-node ref: losses, val losses, weights; the
 * ranks' weights identical every step; coverage (windows) when check_win.
 * first: the first step the ranks ran (join: the real phase). */
static void compare_(const char *tag, int world, const result *ref,
                     int check_win, int check_val, int first)
{
    result rk[8];
    double worst_loss = 0, worst_val = 0, worst_norm = 0;
    for (int r = 0; r < world; r++)
        load_tag_(tag, r, &rk[r]);
    int nref = ref->n, n = rk[0].n;
    for (int r = 0; r < world; r++) {
        int n0 = rk[r].n;
        CHECK(n0 > 0, "%s: rank %d recorded no steps", tag, r);
        for (int i = 0; i < n0; i++) {
            int j = (int)rk[r].step[i] - 1;
            if (j < 0 || j >= nref)
                continue;
            close_to_ref_(tag, r, rk[r].step[i], "loss", rk[r].loss[i],
                          ref->loss[j], &worst_loss);
            close_to_ref_(tag, r, rk[r].step[i], "gradient norm",
                          rk[r].norm[i], ref->norm[j], &worst_norm);
            if (check_val && !isnan(ref->val[j]))
                close_to_ref_(tag, r, rk[r].step[i], "val", rk[r].val[i],
                              ref->val[j], &worst_val);
            CHECK(rk[r].sum[i] == rk[0].sum[i], "%s: step %ld: rank %d's "
                  "weights differ from rank 0's", tag, rk[r].step[i], r);
        }
        double pd = max_param_diff_(&rk[r], ref);
        CHECK(pd <= param_tol_, "%s: rank %d: final weights differ from one "
              "node's by %.3g (> %g)", tag, r, pd, param_tol_);
    }
    CHECK(n > 0 && rk[0].step[0] == first + 1 && rk[0].step[n - 1] ==
          ref->step[nref - 1], "%s: ran steps %ld..%ld, want %d..%ld", tag,
          n ? rk[0].step[0] : 0, n ? rk[0].step[n - 1] : 0, first + 1,
          ref->step[nref - 1]);
    if (check_win)
        for (int i = 0; i < n && i < nref; i++) {
            size_t k = 0, ok = 1;
            for (int r = 0; r < world; r++)
                for (size_t q = 0; q < rk[r].nw[i]; q++, k++)
                    ok = ok && k < ref->nw[i] && rk[r].win[i][q] ==
                                                     ref->win[i][k];
            CHECK(ok && k == ref->nw[i], "%s: step %d: the ranks' windows "
                  "are not the one-node batch's, each once", tag, i + 1);
        }
    printf("%-12s %d ranks: max rel diff: loss %.2g, val %.2g, grad norm "
           "%.2g; weights max abs diff %.2g\n", tag, world, worst_loss,
           worst_val, worst_norm, max_param_diff_(&rk[0], ref));
    for (int r = 0; r < world; r++)
        free(rk[r].params);
}

/* A run of spec tag in mode join (2 ranks; rank 1 joins at the delink
 * after 3 pseudo steps): rank 1 ran steps 4..6 with rank 0's weights at
 * each of them, and rank 0's steps are one node's (ref). */
static void check_join_(const char *tag, const result *ref)
{
    result j1;
    load_tag_(tag, 1, &j1);
    CHECK(j1.n == 3 && j1.step[0] == 4, "%s: rank 1 ran %d steps from %ld, "
          "want 3 from 4", tag, j1.n, j1.n ? j1.step[0] : 0);
    free(j1.params);
    result j0;
    load_tag_(tag, 0, &j0);
    for (int i = 0; i < j0.n && j1.n == 3; i++)
        if (j0.step[i] >= 4)
            CHECK(j0.sum[i] == j1.sum[i - 3], "%s: step %ld: ranks' "
                  "weights differ", tag, j0.step[i]);
    free(j0.params);
    compare_(tag, 1, ref, 0, 1, 0);
}

/* The figures of one line of a .moe file after its step (rank_main_). */
enum { MOE_FACTS_ = 12 };

/* One line of a .moe file: its step into *step, its figures into x. */
static int read_moe_(FILE *f, long *step, double *x)
{
    if (fscanf(f, "%ld", step) != 1)
        return 0;
    for (int k = 0; k < MOE_FACTS_; k++)
        if (fscanf(f, " %la", &x[k]) != 1)
            return 0;
    return 1;
}

/* Rank 0's MoE facts of tag (its .moe file) against the one-node ref's,
 * step by step: the balancing and z-losses within LOSS_TOL (sums of the
 * same router probabilities in another order); the counts (dropped
 * fraction, least and most tokens of an expert, empty experts, idle
 * experts, the tokens of each (block, expert) as a weighted sum, the whole
 * step's least and most tokens, empty experts and dropped pairs) exactly,
 * being integers over the same routing decisions, which rounding of
 * ~1e-7 would change only at an exact tie of two logits. A rank that
 * reported only its own microbatches would have half the passes and
 * other extremes. */
static void compare_moe_(const char *tag, const char *ref_tag)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s-0.out.moe", rank_dir_, tag);
    snprintf(pb, sizeof pb, "%s/%s-0.out.moe", rank_dir_, ref_tag);
    FILE *fa = fopen(pa, "r"), *fb = fopen(pb, "r");
    int n = 0;
    double worst = 0;
    long sa, sb;
    double a[MOE_FACTS_], b[MOE_FACTS_];
    while (fa && fb && read_moe_(fa, &sa, a) && read_moe_(fb, &sb, b)) {
        n++;
        CHECK(sa == sb, "%s: MoE facts of step %ld against step %ld", tag, sa,
              sb);
        for (int k = 0; k < 2; k++) {
            double d = rel_(a[k], b[k]);
            worst = d > worst ? d : worst;
            CHECK(d <= LOSS_TOL, "%s: step %ld: MoE %s loss %.9g, one node "
                  "%.9g", tag, sa, k ? "z" : "aux", a[k], b[k]);
        }
        static const char *name[] = {
            "dropped fraction", "least load", "most load", "empty experts",
            "idle experts", "tokens per expert", "step's least tokens",
            "step's most tokens", "step's empty experts", "step's dropped"};
        for (int k = 2; k < MOE_FACTS_; k++)
            CHECK(a[k] == b[k], "%s: step %ld: MoE %s %.9g, one node %.9g",
                  tag, sa, name[k - 2], a[k], b[k]);
    }
    CHECK(n == 6, "%s: %d steps of MoE facts compared, want 6", tag, n);
    printf("%-12s MoE facts of %d steps: aux and z max rel diff %.2g, counts "
           "equal\n", tag, n, worst);
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
}

int main(int argc, char **argv)
{
    int rc = rank_procs_enter(argc, argv, 9, rank_main_, "dp", 1);
    if (rc != RANK_PROCS_PARENT)
        return rc;
    /* same losses, coverage: 3 pseudo + 3 real steps, B 6 */
    write_spec_("one", 6, 1, 6, 3, "");
    write_spec_("w2", 6, 1, 6, 3, "\"nodes\": {\"world_size\": 2}");
    write_spec_("w3", 6, 1, 6, 3, "\"nodes\": {\"world_size\": 3}");
    write_spec_("join", 6, 1, 6, 3,
                "\"nodes\": {\"world_size\": 2, \"pseudo_world_size\": 1}");
    /* accumulation: microbatch 1, grad_accum 4 per rank vs one node at 4W */
    write_spec_("acc2", 1, 8, 3, 0, "\"nodes\": {\"world_size\": 2}");
    write_spec_("acc2_one", 8, 1, 3, 0, "");
    write_spec_("acc3", 1, 12, 3, 0, "\"nodes\": {\"world_size\": 3}");
    write_spec_("acc3_one", 12, 1, 3, 0, "");
    char kill_extra[96];
    snprintf(kill_extra, sizeof kill_extra,
             "\"nodes\": {\"world_size\": 2, \"timeout\": %d}",
             KILL_TIMEOUT_S);
    write_spec_("kill", 6, 1, 6, 3, kill_extra);

    result one, r2, r2b, acc_one;
    run_one_node_("one", &one);
    CHECK(one.n == 6, "one node: %d steps recorded, want 6", one.n);

    run_("w2", "w2", 2, 0, "plain", 120);
    compare_("w2", 2, &one, 1, 1, 0);
    run_("w3", "w3", 3, 0, "plain", 120);
    compare_("w3", 3, &one, 1, 1, 0);

    /* repeatable: 3 ranks again, bitwise */
    run_("w3r", "w3", 3, 0, "plain", 120);
    {
        result a, b;
        load_tag_("w3", 2, &a);
        load_tag_("w3r", 2, &b);
        int eq = a.n == b.n && a.n > 0 && a.np == b.np && a.np > 0 &&
                 memcmp(a.params, b.params, a.np * sizeof(float)) == 0;
        for (int i = 0; eq && i < a.n; i++)
            eq = a.loss[i] == b.loss[i] && a.sum[i] == b.sum[i] &&
                 (a.val[i] == b.val[i] ||
                  (isnan(a.val[i]) && isnan(b.val[i])));
        CHECK(eq, "repeatable: two 3-rank runs differ");
        printf("repeatable   3 ranks: two runs %s\n",
               eq ? "bitwise equal" : "DIFFER");
        free(a.params);
        free(b.params);
    }

    /* attribution: NaN in ranks 0's and 2's own gradients at step 2 (the
     * fault hook's bad batch) skips the step on every rank, and every
     * rank's step result names those two ranks and not rank 1; rank 1's
     * gradient scaled 1000x at step 4 makes it the outlier on every rank,
     * and no rank stands out on the ordinary steps */
    run_("w3inf", "w3", 3, 0, "inf", 120);
    for (int r = 0; r < 3; r++) {
        char ap[600];
        snprintf(ap, sizeof ap, "%s/w3inf-%d.out.attr", rank_dir_, r);
        FILE *f = fopen(ap, "r");
        CHECK(f != NULL, "attribution: no %s", ap);
        long step;
        int sk, nr, nn, orank, l0, l1, rows = 0, ok = 1;
        while (f && fscanf(f, "%ld %d %d %d %d %d %d", &step, &sk, &nr, &nn,
                           &orank, &l0, &l1) == 7) {
            rows++;
            int bad = step == 2, out = step == 4 ? 1 : -1;
            if (sk != bad || nn != (bad ? 2 : 0) || nr != (bad ? 0 : -1) ||
                l0 != (bad ? 0 : -1) || l1 != (bad ? 2 : -1) ||
                orank != out) {
                fprintf(stderr, "attribution: rank %d step %ld: skipped %d "
                        "nonfinite_rank %d nonfinite_ranks %d (%d, %d) "
                        "outlier %d; want %d %d %d (%d, %d) %d\n", r, step,
                        sk, nr, nn, l0, l1, orank, bad, bad ? 0 : -1,
                        bad ? 2 : 0, bad ? 0 : -1, bad ? 2 : -1, out);
                ok = 0;
            }
        }
        if (f) fclose(f);
        CHECK(ok && rows == 6, "attribution: rank %d: %d rows, %s", r, rows,
              ok ? "as wanted" : "wrong (above)");
    }
    printf("attribution  3 ranks: NaN in ranks 0's and 2's own gradients at "
           "step 2, rank 1's 1000x gradient at step 4, named on every "
           "rank\n");
    {
        /* the outlier rule on hand-made sums of squares: norms 1, 1.2,
         * 0.9, 30 -> rank 3, 30 / median(1, 1.2, 0.9) = 30 */
        float ss[4] = {1.0f, 1.44f, 0.81f, 900.0f}, ratio;
        int o = grad_outlier_rank(ss, 4, GRAD_OUTLIER_RATIO, &ratio);
        CHECK(o == 3 && fabsf(ratio - 30.0f) < 1e-4f,
              "outlier rule: rank %d ratio %g, want 3 and 30", o, ratio);
        ss[3] = 81.0f;  /* norm 9: under 10 x 1 */
        o = grad_outlier_rank(ss, 4, GRAD_OUTLIER_RATIO, &ratio);
        CHECK(o == -1, "outlier rule: norm 9 against median 1 reported "
              "(rank %d)", o);
        float two[2] = {4.0f, 484.0f};  /* norms 2 and 22: 11 x */
        o = grad_outlier_rank(two, 2, GRAD_OUTLIER_RATIO, &ratio);
        CHECK(o == 1 && fabsf(ratio - 11.0f) < 1e-4f,
              "outlier rule, 2 ranks: rank %d ratio %g, want 1 and 11", o,
              ratio);
        float alone[1] = {100.0f};
        CHECK(grad_outlier_rank(alone, 1, GRAD_OUTLIER_RATIO, &ratio) == -1,
              "outlier rule: one rank reported");
        printf("outlier      rule on hand-made norms as wanted\n");
    }

    /* buckets: bitwise with two ranks */
    run_("w2b", "w2", 2, 1000, "plain", 120);
    load_tag_("w2", 0, &r2);
    load_tag_("w2b", 0, &r2b);
    int same = r2.n == r2b.n && r2.n > 0 && r2.np == r2b.np && r2.np > 0 &&
               memcmp(r2.params, r2b.params, r2.np * sizeof(float)) == 0;
    for (int i = 0; same && i < r2.n; i++)
        same = r2.loss[i] == r2b.loss[i] && r2.sum[i] == r2b.sum[i];
    CHECK(same, "buckets: 2 ranks with 1000-float buckets differ from the "
          "default buckets");
    printf("buckets      2 ranks: 1000-float and default buckets %s\n",
           same ? "bitwise equal" : "DIFFER");

    run_one_node_("acc2_one", &acc_one);
    run_("acc2", "acc2", 2, 0, "plain", 120);
    compare_("acc2", 2, &acc_one, 1, 0, 0);
    free(acc_one.params);
    run_one_node_("acc3_one", &acc_one);
    run_("acc3", "acc3", 3, 0, "plain", 120);
    compare_("acc3", 3, &acc_one, 1, 0, 0);
    free(acc_one.params);

    /* MoE: two prototypes of two experts, capacity factor 1 (tokens are
     * dropped), every block (moe) and every other block (mixed). The
     * one-node reference runs microbatches of 3 with grad_accum 2: a rank
     * of a 2-rank run with batch 3 and grad_accum 2 trains one of those
     * microbatches (the split takes accumulation steps), and so does a
     * rank of a run with batch 6 (the split takes rows): in both, each
     * microbatch's capacity and balancing loss are the one node's. */
    {
        static const char *kind[2][2] = {
            {"moe", "\"moe\": {\"num_experts\": 4, \"prototypes\": 2, "
                    "\"capacity_factor\": 1.0}"},
            {"mixed", "\"moe\": {\"num_experts\": 4, \"prototypes\": 2, "
                      "\"capacity_factor\": 1.0, \"every\": 2}"}};
        for (int k = 0; k < 2; k++) {
            char one_tag[32], acc_tag[32], row_tag[32];
            /* mixed: a slot of each kind in the pseudo phase */
            const char *share = k ? ", \"share_groups\": 2" : "";
            const char *w2 = "\"nodes\": {\"world_size\": 2}";
            snprintf(one_tag, sizeof one_tag, "%s_one", kind[k][0]);
            snprintf(acc_tag, sizeof acc_tag, "%s_w2a", kind[k][0]);
            snprintf(row_tag, sizeof row_tag, "%s_w2b", kind[k][0]);
            write_spec_model_(one_tag, 3, 2, 6, 3, kind[k][1], share, "");
            write_spec_model_(acc_tag, 3, 2, 6, 3, kind[k][1], share, w2);
            write_spec_model_(row_tag, 6, 1, 6, 3, kind[k][1], share, w2);
            result ref;
            run_one_node_(one_tag, &ref);
            CHECK(ref.n == 6, "%s: %d steps recorded, want 6", one_tag, ref.n);
            run_(acc_tag, acc_tag, 2, 0, "plain", 120);
            compare_(acc_tag, 2, &ref, 1, 1, 0);
            compare_moe_(acc_tag, one_tag);
            /* its validation batches are the spec's batch_size, 6 rows,
             * against the reference's 3: another validation set */
            run_(row_tag, row_tag, 2, 0, "plain", 120);
            compare_(row_tag, 2, &ref, 1, 0, 0);
            compare_moe_(row_tag, one_tag);
            if (k == 1) {
                /* mixed: a dense slot is smaller than an MoE slot, so
                 * 1000-float buckets end inside slots of both sizes */
                run_("mixed_w2a_b", acc_tag, 2, 1000, "plain", 120);
                compare_("mixed_w2a_b", 2, &ref, 1, 1, 0);
                /* the pseudo phase on rank 0 alone; rank 1 takes the
                 * delinked slots of both kinds from it */
                char jtag[] = "mixed_join";
                write_spec_model_(jtag, 3, 2, 6, 3, kind[k][1], share,
                                  "\"nodes\": {\"world_size\": 2, "
                                  "\"pseudo_world_size\": 1}");
                run_(jtag, jtag, 2, 1000, "join", 120);
                result j0, j1;
                load_tag_(jtag, 0, &j0);
                load_tag_(jtag, 1, &j1);
                CHECK(j1.n == 3 && j1.step[0] == 4, "mixed_join: rank 1 ran "
                      "%d steps from %ld, want 3 from 4", j1.n,
                      j1.n ? j1.step[0] : 0);
                for (int i = 3; i < j0.n && j1.n == 3; i++)
                    CHECK(j0.sum[i] == j1.sum[i - 3], "mixed_join: step %ld: "
                          "ranks' weights differ", j0.step[i]);
                free(j0.params);
                free(j1.params);
                compare_(jtag, 1, &ref, 0, 1, 0);
            }
            free(ref.params);
        }
    }

    /* join at the delink: the real steps (4..6) as one node's */
    run_("join", "join", 2, 0, "join", 120);
    check_join_("join", &one);

    /* Adafactor across ranks: the gradient is the same sum, so 2 ranks
     * give one node's steps; at a join the broadcast carries Adafactor's
     * factored statistics (and m only with beta1 > 0): a wrong one makes
     * rank 1's next updates, and so its weights, differ from rank 0's */
    {
        const char *af0 = "\"optimizer\": {\"name\": \"adafactor\"}";
        const char *af9 =
            "\"optimizer\": {\"name\": \"adafactor\", \"beta1\": 0.9}";
        result one0, one9;
        write_opt_specs_("af0", af0);
        write_opt_specs_("af9", af9);
        param_tol_ = 2 * 0.01 * 6;  /* 2 lr x 6 steps (above) */
        run_one_node_("oneaf0", &one0);
        run_one_node_("oneaf9", &one9);
        run_("w2af9", "w2af9", 2, 0, "plain", 120);
        compare_("w2af9", 2, &one9, 1, 1, 0);
        run_("joinaf0", "joinaf0", 2, 0, "join", 120);
        check_join_("joinaf0", &one0);
        run_("joinaf9", "joinaf9", 2, 0, "join", 120);
        check_join_("joinaf9", &one9);
        param_tol_ = PARAM_TOL;
        free(one0.params);
        free(one9.params);
        printf("adafactor    2 ranks, and a join at the delink with and "
               "without a first moment: one node's steps\n");
    }

    /* bf16 master weights across ranks: every rank rounds its update
     * with the same bits (a hash of the seed, the tensor and the step),
     * so the ranks' weights stay equal, and a join takes rank 0's bf16
     * values. Against one node a weight may round the other way where
     * the all-reduce's sum differs in its last bits from one node's: one
     * bf16 ulp, 2^-7 for a weight below 2 (LayerNorm's 1s), the bound */
    {
        const char *bf = "\"optimizer\": {\"master\": \"bf16\"}";
        result onebf;
        write_opt_specs_("bf", bf);
        param_tol_ = 0x1p-7;
        run_one_node_("onebf", &onebf);
        run_("w2bf", "w2bf", 2, 0, "plain", 120);
        compare_("w2bf", 2, &onebf, 1, 1, 0);
        run_("joinbf", "joinbf", 2, 0, "join", 120);
        check_join_("joinbf", &onebf);
        param_tol_ = PARAM_TOL;
        free(onebf.params);
        printf("bf16 masters 2 ranks, and a join at the delink: one node's "
               "steps\n");
    }

    /* overlap on (every run above) and off: the same bits */
    run_("w3s", "w3", 3, 0, "seq", 120);
    compare_("w3s", 3, &one, 1, 1, 0);
    {
        int eq = 1;
        for (int r = 0; r < 3; r++)
            eq = eq && bitwise_same_("w3", "w3s", r);
        CHECK(eq, "overlap: 3 ranks with and without overlap differ");
        run_("w2bs", "w2", 2, 1000, "seq", 120);
        int eq2 = bitwise_same_("w2b", "w2bs", 0) &&
                  bitwise_same_("w2b", "w2bs", 1);
        CHECK(eq2, "overlap: 2 ranks, 1000-float buckets, with and without "
              "overlap differ");
        printf("overlap      on and off: 3 ranks %s, 2 ranks with "
               "1000-float buckets %s\n", eq ? "bitwise equal" : "DIFFER",
               eq2 ? "bitwise equal" : "DIFFER");
        /* the hook fired: every slot reported before the microbatch
         * returned when overlapping, none without; how many buckets
         * started early is timing, printed only */
        const char *on[] = {"w3", "w2b", "acc2", "acc3"};
        for (int i = 0; i < 4; i++) {
            long rp, early, nb;
            int S;
            int ok = overlap_of_(on[i], 0, &rp, &early, &nb, &S) == 0;
            CHECK(ok && rp == S && nb > 0, "overlap: %s: %ld of %d slots "
                  "reported final during the last backward", on[i],
                  ok ? rp : -1, ok ? S : -1);
            if (ok)
                printf("overlap      %-5s rank 0: %ld of %d slots reported "
                       "during backward; %ld of %ld buckets started before "
                       "it ended\n", on[i], rp, S, early, nb);
        }
        long rp = -1, early, nb;
        int S;
        CHECK(overlap_of_("w2bs", 0, &rp, &early, &nb, &S) == 0 && rp == 0 &&
              nb == 0, "overlap off: %ld slots reported", rp);
    }

    /* offloaded: every slot on 2 ranks through the delink, and one slot
     * resident under accumulation, against the one-node offloaded runs */
    {
        /* activations differ with B: each its own budget, slot 0 resident */
        size_t b_all = budget_for_("one", 0), b_one = budget_for_("acc2", 1);
        size_t b_one1 = budget_for_("acc2_one", 1);
        CHECK(b_all > 0 && b_one > 0 && b_one1 > 0, "offloaded: no budget");
        /* the pseudo phase's mean gradient: divided after the sum */
        write_spec_budget_("off_one", 6, 1, 6, 3, b_all, 1, "");
        write_spec_budget_("off_w2", 6, 1, 6, 3, b_all, 1,
                           "\"nodes\": {\"world_size\": 2}");
        write_spec_budget_("mw2", 6, 1, 6, 3, 0, 1,
                           "\"nodes\": {\"world_size\": 2}");
        write_spec_budget_("offacc_one", 8, 1, 3, 0, b_one1, 0, "");
        write_spec_budget_("offacc2", 1, 8, 3, 0, b_one, 0,
                           "\"nodes\": {\"world_size\": 2}");
        result off_one;
        run_one_node_("off_one", &off_one);
        CHECK(off_one.n == 6, "offloaded: one node ran %d steps", off_one.n);
        run_("off_w2", "off_w2", 2, 0, "plain", 120);
        compare_("off_w2", 2, &off_one, 1, 1, 0);
        run_("mw2", "mw2", 2, 0, "plain", 120);
        free(off_one.params);
        run_one_node_("offacc_one", &off_one);
        run_("offacc2", "offacc2", 2, 0, "plain", 120);
        compare_("offacc2", 2, &off_one, 1, 0, 0);
        free(off_one.params);
        int n1 = offloaded_("off_one", 0), n2 = offloaded_("off_w2", 1);
        int n3 = offloaded_("offacc2", 0), n4 = offloaded_("offacc_one", 0);
        CHECK(n1 == 2 && n2 == 2 && n3 == 1 && n4 == 1, "offloaded: the runs "
              "offloaded %d, %d, %d and %d slots, want 2 (every slot), 2, "
              "1 and 1", n1, n2, n3, n4);
        int eq = bitwise_same_("mw2", "off_w2", 0) &&
                 bitwise_same_("mw2", "off_w2", 1);
        int eq2 = bitwise_same_("acc2", "offacc2", 0) &&
                  bitwise_same_("acc2", "offacc2", 1);
        CHECK(eq && eq2, "offloaded: 2 ranks offloading differ from 2 "
              "ranks without (%s, %s)", eq ? "same" : "through the delink",
              eq2 ? "same" : "accumulation");
        printf("offloaded    2 ranks (%d and %d slots offloaded) against "
               "2 ranks resident: %s, %s\n", n2, n3,
               eq ? "bitwise equal" : "DIFFER",
               eq2 ? "bitwise equal" : "DIFFER");
        /* offloaded slots are reported as their last drain lands; with
         * a speculative plan their host AdamW started as each was summed
         * (kept or redone: the bits are the plain update's, as above) */
        const char *on[] = {"off_w2", "offacc2"};
        for (int i = 0; i < 2; i++) {
            long rp, early, nb;
            int S;
            int ok = overlap_of_(on[i], 1, &rp, &early, &nb, &S) == 0;
            CHECK(ok && rp == S, "offloaded: %s: %ld of %d slots reported "
                  "final during the last backward", on[i], ok ? rp : -1,
                  ok ? S : -1);
            char p[512];
            snprintf(p, sizeof p, "%s/%s-1.out.off", rank_dir_, on[i]);
            FILE *f = fopen(p, "r");
            int spec = -1;
            unsigned long long ss = 0, redo = 0;
            if (!f || fscanf(f, "%*d %*d %*d %*d %*d %d %llu %llu", &spec,
                             &ss, &redo) != 3)
                spec = -1;
            if (f)
                fclose(f);
            CHECK(spec == 0 || (spec == 1 && ss > 0), "offloaded: %s: "
                  "speculative plan %d, %llu steps speculated", on[i], spec,
                  ss);
            printf("offloaded    %-7s speculative plan %d: %llu steps "
                   "speculated, %llu redone (clipped)\n", on[i], spec, ss,
                   redo);
        }
    }

    /* a rank killed mid-run */
    run_("kill", "kill", 2, 0, "die", 60);
    {
        char p[512], line[128];
        snprintf(p, sizeof p, "%s/kill-0.out", rank_dir_);
        FILE *f = fopen(p, "r");
        int ok = 0;
        double dt = -1;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "ecoll %d %lf", &ok, &dt) == 2)
                break;
        if (f)
            fclose(f);
        CHECK(ok == 1 && dt >= 0 && dt < KILL_TIMEOUT_S + SLACK_S,
              "killed: rank 0's step did not fail with TRAINER_ECOLL in "
              "time (ok %d, %.2f s)", ok, dt);
        printf("killed       rank 1 gone: rank 0's step failed after %.2f s "
               "(nodes.timeout %d s)\n", dt, KILL_TIMEOUT_S);
    }

    /* refused: a group of 1 for a spec of 2 ranks (in process, after the
     * children: this process now runs OpenMP) */
    {
        run_spec sp;
        char p[512];
        snprintf(p, sizeof p, "%s/w2.json", rank_dir_);
        char e[512];
        m6_err err = M6_ERR_NONE;
        CHECK(spec_load_file(&sp, p, e, sizeof e) == 0, "%s", e);
        trainer *t = trainer_create(&sp, &err);
        file_store fs;
        m6_store st;
        char sd[512];
        snprintf(sd, sizeof sd, "%s/store-refused", rank_dir_);
        mkdir(sd, 0755);
        m6_coll *c = rank_procs_group(sd, "g", 0, 1, 5000, &st, &fs);
        CHECK(t && c, "refused: setup: %s", m6_err_msg(&err));
        if (t && c) {
            int rc = trainer_set_collectives(t, c, &err);
            CHECK(rc == -1 && err.code == M6_EINVALID &&
                  strstr(m6_err_msg(&err), "a group of 1 rank, but the "
                         "spec's pseudo phase has nodes.world_size 2"),
                  "refused: got %d '%s'", rc, m6_err_msg(&err));
            CHECK(trainer_world_size(t) == 1, "refused: the trainer changed");
            printf("refused      %s\n", m6_err_msg(&err));
            CHECK(trainer_broadcast_state(t, NULL, 0, &err) == -1,
                  "refused: broadcast without a group accepted");
        }
        m6_coll_destroy(c);
        trainer_free(t);
        m6_err_free(&err);
    }

    free(one.params);
    free(r2.params);
    free(r2b.params);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rank_dir_);
    if (failures_ == 0 && !getenv("M6_KEEP") && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", rank_dir_);
    if (failures_)
        fprintf(stderr, "%d failures; files kept in %s\n", failures_, rank_dir_);
    return failures_ ? 1 : 0;
}
