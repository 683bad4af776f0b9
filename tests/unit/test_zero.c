/*
 * test_zero.c — sharded optimizer state (optimizer.shard, ZeRO stage 1)
 * against the same runs unsharded, without the daemon: each rank is a
 * separate process (this program run again as "rank ..."), its trainer
 * joined to the others by Gloo over loopback through a file store, as in
 * test_dp.c.
 *
 * One spec shape: pseudo phase on 2 ranks (nodes.pseudo_world_size 2),
 * delink at step PSEUDO, real phase on 4 (nodes.world_size 4), STEPS in
 * all. Each run is two lives: "p1" trains the pseudo phase on 2 ranks,
 * delinks, and rank 0 saves a checkpoint (the sharded run gathers its
 * state first, trainer_gather_optim); "p2" loads it on 4 ranks and trains
 * the real phase to the end. So every sharded run crosses a delink (the
 * shard ranges change when the layout grows from S slots to L) and a
 * resume at another D (2 -> 4). "root" is p1 on 2 ranks without the
 * delink, its state gathered to rank 0 alone at m6d's step boundary
 * (trainer_sync_boundary) before rank 0 saves: rank 0 whole, rank 1 still
 * at its share, the checkpoint the unsharded run's byte for byte. A
 * second spec trains on 2 ranks
 * throughout, DELINK_STEPS steps with the delink at PSEUDO, in one life:
 * the delink of sharded state (gathered, re-laid, sharded again over the
 * grown layout at the next step).
 *
 *   same losses  sharded (D 2, then D 4; and D 2 through a delink)
 *                against unsharded: every step's
 *                train loss, gradient norm and validation loss within
 *                1e-6 relative, final weights within 1e-6 absolute.
 *                (Sharding changes no float operation: the gradient is
 *                the same all-reduce, AdamW is elementwise, so equality
 *                is expected; 1e-6 is the bound asked for.)
 *   Adafactor    sharded by whole tensors, with a first moment on 4 ranks
 *                and without on 2, through the delink: the same losses
 *                and weights as unsharded, and less optimizer state a
 *                rank (the model's count)
 *   MoE          every other block MoE (two slot kinds), AdamW, 2 ranks
 *                through the delink: the same
 *   NaN batch    the last rank's batch of step 3 all NaN, 2 ranks: every
 *                rank skips that step (no all-gather on a skipped step,
 *                none missed), the same losses as unsharded
 *   cross resume the sharded run's checkpoint resumed unsharded (p2
 *                without optimizer.shard) gives the unsharded run's
 *                losses within 1e-6 relative: the saved state is whole
 *   memory       bytes in use by the allocator (mallinfo2: heap in use +
 *                mmapped; AddressSanitizer's count under it) after the first real step, per rank, sharded
 *                against unsharded at D 4: the unsharded optimizer state
 *                minus that difference (the sharded state, measured) is
 *                at most 0.3 of the unsharded state
 *   planned      the real phase's plan of the sharded spec (m6ctl plan's
 *                figures, offload_plan_for_spec) less its weights and
 *                gradients (8 bytes a float) predicts the measured
 *                sharded state of every rank within 10%
 *   refused      trainer_save of a sharded trainer (before the gather)
 *                fails, naming trainer_gather_optim
 *
 * Exit 77 without Gloo or without the fortunes text.
 */
#include <malloc.h>
#if defined(__SANITIZE_ADDRESS__)
/* the ASan runtime's (sanitizer/allocator_interface.h, not installed here) */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif
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
#include "model/gpt.h"
#include "offload/offload.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "train/test_hooks.h"
#include "../common/rank_procs.h"

#define STEPS 50
#define PSEUDO 10
#define DELINK_STEPS 20   /* the delink run: PSEUDO, then real steps */
#define REL_TOL 1e-6
#define PARAM_TOL 1e-6
#define MEM_RATIO 0.3

/* ------------------------------------------------------------ a rank */

/* Bytes the allocator holds for the program: glibc's heap in use plus
 * its mmapped blocks, or AddressSanitizer's own count under it (its
 * allocator replaces glibc's, whose mallinfo2 then says 0). */
static double inuse_(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return (double)__sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
#endif
}

/* rank SPEC OUT WORLD RANK STORE LIFE CKPT: LIFE p1 trains the pseudo
 * phase, delinks, gathers (sharded) and rank 0 saves CKPT; p2 loads CKPT
 * and trains to the end. One line per step into OUT ("s step loss norm
 * val"), then "m inuse optim_bytes" after the first step of the life,
 * the final weights into OUT.params (p2). */
static int rank_main_(int argc, char **argv)
{
    (void)argc;
    const char *life = argv[7], *ckpt = argv[8];
    rank_proc rp;
    if (rank_proc_open(&rp, argv) != 0)
        return 1;
    trainer *t = rp.t;
    const run_spec spec = rp.spec;
    const char *out_path = rp.out_path, *store_dir = rp.store_dir;
    int world = rp.world, rank = rp.rank;
    char e[1024];
    m6_err err = M6_ERR_NONE;
    /* p2f: p2 with the last rank's batch of step 3 all NaN (every rank
     * must skip that step together) */
    int fault = strcmp(life, "p2f") == 0;
    int p2 = strcmp(life, "p2") == 0 || fault;
    /* root: p1 without the delink, the state gathered to rank 0 alone by
     * m6d's step boundary (trainer_sync_boundary) before its save */
    int root = strcmp(life, "root") == 0;
    if (fault && rank == world - 1)
        trainer_test_fault(t, TRAINER_FAULT_NAN_BATCH, 3, 1, 0);
    if (p2 && ckpt[0] && trainer_load(t, ckpt, &err) != 0) {
        fprintf(stderr, "rank %d: load: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    m6_store st;
    file_store fs;
    m6_coll *c = rank_procs_group(store_dir, "g0", rank, world,
                                  spec.nodes.timeout * 1000, &st, &fs);
    if (!c)
        return 1;
    if (trainer_set_collectives(t, c, &err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    FILE *out = fopen(out_path, "w");
    long end = p2 ? spec.train.steps : spec.pseudo.steps;
    int first = 1;
    while (trainer_step_count(t) < end) {
        step_result r;
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == spec.pseudo.steps &&
            trainer_delink(t, e, sizeof e) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, e);
            return 1;
        }
        if (trainer_step(t, &r, &err) != 0) {
            fprintf(stderr, "rank %d: step %ld: %s\n", rank,
                    trainer_step_count(t) + 1, m6_err_msg(&err));
            return 1;
        }
        fprintf(out, "s %ld %a %a %a %d\n", r.step, (double)r.train_loss,
                (double)r.grad_norm, (double)r.val_loss, r.skipped);
        if (first) {
            offload_stats os;
            int off = trainer_offload_stats(t, &os) == 0 ? os.n_offloaded
                                                          : 0;
            fprintf(out, "m %.0f %zu %d\n", inuse_(), trainer_optim_bytes(t),
                    off);
        }
        first = 0;
    }
    if (root) {
        size_t before = trainer_optim_bytes(t);
        int rc = trainer_sync_boundary(t, rank == 0, &err);
        if (rc < 0) {
            fprintf(stderr, "rank %d: sync: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
        fprintf(out, "g %d %zu %zu\n", rc, before, trainer_optim_bytes(t));
        if (rank == 0 && trainer_save(t, ckpt, &err) < 0) {
            fprintf(stderr, "rank 0: save: %s\n", m6_err_msg(&err));
            return 1;
        }
    } else if (!p2) {
        if (spec.optimizer.shard && rank == 0) {
            /* sharded: a save before the gather is refused by name */
            char bad[600];
            snprintf(bad, sizeof bad, "%s.early", ckpt);
            m6_err e2 = M6_ERR_NONE;
            long b = trainer_save(t, bad, &e2);
            fprintf(out, "r %d\n", b < 0 && strstr(m6_err_msg(&e2),
                                                   "trainer_gather_optim"));
            m6_err_free(&e2);
        }
        /* sharded: gathers, re-lays, shards again at the next step */
        if (trainer_delink(t, e, sizeof e) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, e);
            return 1;
        }
        if (trainer_gather_optim(t, &err) != 0) {
            fprintf(stderr, "rank %d: gather: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
        if (rank == 0 && trainer_save(t, ckpt, &err) < 0) {
            fprintf(stderr, "rank 0: save: %s\n", m6_err_msg(&err));
            return 1;
        }
    } else {
        size_t np = trainer_copy_state(t, 0, NULL);
        float *w = np ? malloc(np * sizeof(float)) : NULL;
        char pp[600];
        snprintf(pp, sizeof pp, "%s.params", out_path);
        FILE *f = fopen(pp, "wb");
        if (w && trainer_copy_state(t, 0, w) == np)
            fwrite(w, sizeof(float), np, f);
        fclose(f);
        free(w);
    }
    fclose(out);
    trainer_free(t);
    m6_coll_destroy(c);
    m6_err_free(&err);
    return 0;
}

/* ------------------------------------------------------------ the test */


typedef struct {
    int n;
    long step[STEPS];
    double loss[STEPS], norm[STEPS], val[STEPS];
    double inuse;        /* after the life's first step */
    size_t optim;
    int offloaded;       /* slots offloaded at the life's first step */
    int refused;         /* p1 sharded rank 0: the early save refused */
    int skipped;         /* steps skipped (non-finite) */
    int g_rc;            /* root: trainer_sync_boundary's answer (-1: no line) */
    size_t g_before, g_after; /* root: optimizer bytes around it */
    float *params;
    size_t np;
} result;

/* The spec tag.json: nodes.world_size world, pseudo_world_size pw (0:
 * none), steps in all, PSEUDO of them pseudo. */
static void write_spec_all_(const char *tag, int shard, int world, int pw,
                            int steps, int n_layer, double grad_clip,
                            const char *opt_extra,
                            const char *model_extra, const char *pseudo_extra,
                            const char *dev_extra, const char *top_extra)
{
    char nodes[96];
    snprintf(nodes, sizeof nodes, pw ? "\"world_size\": %d, "
             "\"pseudo_world_size\": %d" : "\"world_size\": %d", world, pw);
    FILE *f = rank_procs_spec(tag, "zero");
    if (!f)
        return;
    fprintf(f, " \"model\": {\"vocab_size\": 256, \"n_layer\": %d, "
            "\"n_embd\": 64, \"n_head\": 2, \"seq_len\": 32%s},\n"
            " \"pseudo\": {\"steps\": %d%s},\n"
            " \"train\": {\"steps\": %d, \"batch_size\": 4, \"grad_accum\": 1,"
            " \"lr\": 0.01, \"min_lr\": 0.001, \"warmup_steps\": 2,"
            " \"grad_clip\": %g, \"seed\": 5, \"eval_every\": 10,"
            " \"eval_batches\": 2},\n"
            " \"nodes\": {%s},\n"
            " \"optimizer\": {\"shard\": %s%s},\n"
            " \"device\": {\"threads\": 1%s}%s}\n",
            n_layer, model_extra, PSEUDO, pseudo_extra, steps, grad_clip,
            nodes,
            shard ? "true" : "false", opt_extra, dev_extra, top_extra);
    fclose(f);
}

static void write_spec_moe_(const char *tag, int shard, int world, int pw,
                            int steps, const char *opt_extra,
                            const char *model_extra, const char *pseudo_extra)
{
    write_spec_all_(tag, shard, world, pw, steps, 2, 1.0, opt_extra,
                    model_extra, pseudo_extra, "", "");
}

static void write_spec_(const char *tag, int shard, int world, int pw,
                        int steps, const char *opt_extra)
{
    write_spec_moe_(tag, shard, world, pw, steps, opt_extra, "", "");
}

/* One life (tag-R.out for its ranks) of the spec spec_tag, from the
 * checkpoint ckpt_tag.ckpt ("": none): 0 when every rank exits 0. */
static int run_(const char *tag, const char *spec_tag, int world,
                const char *life, const char *ckpt_tag)
{
    char ckpt[512] = "";
    if (ckpt_tag[0])
        snprintf(ckpt, sizeof ckpt, "%s/%s.ckpt", rank_dir_, ckpt_tag);
    const char *extra[2] = {life, ckpt};
    return rank_procs_run(tag, spec_tag, world, extra, 2, 0, -1);
}

static void load_(const char *tag, int r, result *res)
{
    char p[600], line[256];
    memset(res, 0, sizeof *res);
    res->g_rc = -1;
    snprintf(p, sizeof p, "%s/%s-%d.out", rank_dir_, tag, r);
    FILE *f = fopen(p, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        long s;
        double a, b, c;
        int k = 0;
        if (line[0] == 's' && res->n < STEPS &&
            sscanf(line, "s %ld %la %la %la %d", &s, &a, &b, &c, &k) == 5) {
            res->skipped += k;
            res->step[res->n] = s;
            res->loss[res->n] = a;
            res->norm[res->n] = b;
            res->val[res->n++] = c;
        } else if (line[0] == 'm') {
            sscanf(line, "m %lf %zu %d", &res->inuse, &res->optim,
                   &res->offloaded);
        } else if (line[0] == 'r') {
            sscanf(line, "r %d", &res->refused);
        } else if (line[0] == 'g') {
            sscanf(line, "g %d %zu %zu", &res->g_rc, &res->g_before,
                   &res->g_after);
        }
    }
    fclose(f);
    snprintf(p, sizeof p, "%s/%s-%d.out.params", rank_dir_, tag, r);
    if ((f = fopen(p, "rb"))) {
        fseek(f, 0, SEEK_END);
        long bytes = ftell(f);
        fseek(f, 0, SEEK_SET);
        res->np = bytes > 0 ? (size_t)bytes / sizeof(float) : 0;
        res->params = res->np ? malloc(res->np * sizeof(float)) : NULL;
        if (res->params && fread(res->params, sizeof(float), res->np, f) !=
                               res->np)
            res->np = 0;
        fclose(f);
    }
}

static double rel_(double a, double b)
{
    if (isnan(a) && isnan(b))
        return 0;
    double d = fabs(a - b), m = fmax(fabs(a), fabs(b));
    return m > 0 ? d / m : d;
}

/* got against want, step by step: the steps the same, every figure within
 * REL_TOL, the weights (when both have them) within PARAM_TOL. */
static void compare_(const char *what, const result *got, const result *want,
                     int nsteps)
{
    CHECK(got->n == nsteps && want->n == nsteps, "%s: %d and %d steps, want "
          "%d", what, got->n, want->n, nsteps);
    double worst = 0;
    for (int i = 0; i < got->n && i < want->n; i++) {
        CHECK(got->step[i] == want->step[i], "%s: step %ld against %ld",
              what, got->step[i], want->step[i]);
        double d = fmax(rel_(got->loss[i], want->loss[i]),
                        fmax(rel_(got->norm[i], want->norm[i]),
                             rel_(got->val[i], want->val[i])));
        CHECK(d <= REL_TOL, "%s: step %ld: loss %.9g/%.9g norm %.9g/%.9g "
              "val %.9g/%.9g: %.3g relative > %g", what, got->step[i],
              got->loss[i], want->loss[i], got->norm[i], want->norm[i],
              got->val[i], want->val[i], d, REL_TOL);
        worst = fmax(worst, d);
    }
    double pw = 0;
    if (got->np || want->np) {
        CHECK(got->np == want->np && got->np > 0, "%s: %zu and %zu weights",
              what, got->np, want->np);
        for (size_t j = 0; got->np == want->np && j < got->np; j++)
            pw = fmax(pw, fabs((double)got->params[j] - want->params[j]));
        CHECK(pw <= PARAM_TOL, "%s: weights differ by %.3g > %g", what, pw,
              PARAM_TOL);
    }
    printf("%-34s %d steps: worst %.3g relative, weights %.3g\n", what,
           got->n, worst, pw);
}

/* Rank r of the DELINK_STEPS-step lives got and want compared (compare_),
 * named "LABEL rank r"; their figures into out[0] and out[1] (NULL: not
 * kept; the weights are freed either way). */
static void compare_lives_(const char *got, const char *want,
                           const char *label, int r, result *out)
{
    result a, b;
    load_(got, r, &a);
    load_(want, r, &b);
    char what[64];
    snprintf(what, sizeof what, "%s rank %d", label, r);
    compare_(what, &a, &b, DELINK_STEPS);
    free(a.params);
    free(b.params);
    a.params = b.params = NULL;
    if (out) {
        out[0] = a;
        out[1] = b;
    }
}

/* The spec tag.json loaded into *sp and planned as m6ctl plan would
 * (offload_plan_for_spec) into *pl: 0, or -1 with the error printed. */
static int plan_of_(const char *tag, run_spec *sp, offload_plan *pl)
{
    char p[512], e[512];
    snprintf(p, sizeof p, "%s/%s.json", rank_dir_, tag);
    if (spec_load_file(sp, p, e, sizeof e) == 0 &&
        offload_plan_for_spec(sp, 0, pl, e, sizeof e) == 0)
        return 0;
    fprintf(stderr, "plan %s: %s\n", tag, e);
    return -1;
}

/* The runs with offloading against the unsharded resident ones: the
 * same losses and weights, slots offloaded where the plan says, and the
 * optimizer state a rank keeps (the model's allocation) at most
 * MEM_RATIO of the whole at D 4 and within 10% of the plan's
 * host_state_bytes. */
static void offloaded_checks_(void)
{
    result a[4], b[4];
    for (int r = 0; r < 2; r++) {
        load_("oh1", r, &a[r]);
        load_("ou1", r, &b[r]);
        char what[64];
        snprintf(what, sizeof what, "offloaded pseudo D 2 rank %d", r);
        compare_(what, &a[r], &b[r], PSEUDO);
        CHECK(a[r].offloaded == 2, "offloaded pseudo D 2 rank %d: %d slots "
              "offloaded, the plan says 2", r, a[r].offloaded);
    }
    run_spec sp;
    offload_plan pl;
    double planned = -1;
    if (plan_of_("oh", &sp, &pl) == 0) {
        planned = (double)pl.host_state_bytes;
        offload_plan_free(&pl);
    }
    for (int r = 0; r < 4; r++) {
        load_("oh2", r, &a[r]);
        load_("ou2", r, &b[r]);
        char what[64];
        snprintf(what, sizeof what, "offloaded real D 4 (resumed) rank %d",
                 r);
        compare_(what, &a[r], &b[r], STEPS - PSEUDO);
        CHECK(a[r].offloaded == 4, "offloaded real D 4 rank %d: %d slots "
              "offloaded, the plan says 4", r, a[r].offloaded);
        double got = (double)a[r].optim, whole = (double)b[r].optim;
        CHECK(whole > 0 && got <= MEM_RATIO * whole, "offloaded memory: "
              "rank %d keeps %.0f bytes of optimizer state, %.0f whole",
              r, got, whole);
        CHECK(planned > 0 && fabs(planned - got) <= 0.1 * got, "offloaded "
              "plan: %.0f bytes of host optimizer state a rank, rank %d "
              "keeps %.0f (more than 10%% apart)", planned, r, got);
        printf("offloaded D 4 rank %d: optimizer state %.0f bytes on the "
               "host, %.0f unsharded (ratio %.3f), plan %.0f\n", r, got,
               whole, whole > 0 ? got / whole : 0, planned);
        free(a[r].params);
        free(b[r].params);
    }
    for (int r = 0; r < 2; r++)
        compare_lives_("om", "omu", "offloaded bf16 masters delink D 2", r,
                       NULL);
    compare_lives_("o1", "o1u", "one rank, state on the host, streamed", 0,
                   a);
    CHECK(a[0].optim == a[1].optim && a[0].offloaded == 0, "one rank, "
          "state on the host: %zu bytes of optimizer state (resident run "
          "%zu), %d slots offloaded in the pseudo phase", a[0].optim,
          a[1].optim, a[0].offloaded);
    for (int r = 0; r < 2; r++) {
        compare_lives_("od", "odu", "offloaded Adafactor delink D 2", r, a);
        CHECK(a[0].offloaded == 0, "offloaded Adafactor delink: the pseudo "
              "phase offloaded %d slots, the plan none", a[0].offloaded);
    }
}

int main(int argc, char **argv)
{
    int rc = rank_procs_enter(argc, argv, 9, rank_main_, "zero", 1);
    if (rc != RANK_PROCS_PARENT)
        return rc;
    write_spec_("sh", 1, 4, 2, STEPS, "");
    write_spec_("un", 0, 4, 2, STEPS, "");
    write_spec_("sd", 1, 2, 0, DELINK_STEPS, "");
    write_spec_("ud", 0, 2, 0, DELINK_STEPS, "");
    /* Adafactor, sharded by whole tensors: with a first moment on 4
     * ranks, without one on 2, both through the delink */
    const char *af1 = ", \"name\": \"adafactor\", \"beta1\": 0.9";
    const char *af0 = ", \"name\": \"adafactor\", \"beta1\": 0";
    write_spec_("sa", 1, 4, 0, DELINK_STEPS, af1);
    write_spec_("ua", 0, 4, 0, DELINK_STEPS, af1);
    write_spec_("sb", 1, 2, 0, DELINK_STEPS, af0);
    write_spec_("ub", 0, 2, 0, DELINK_STEPS, af0);
    /* MoE in every other block (slots of two kinds; a slot of each in
     * the pseudo phase), AdamW, on 2 ranks (the spec refuses Adafactor's
     * sharding on MoE models) */
    const char *mx = ", \"moe\": {\"num_experts\": 4, \"prototypes\": 2, "
                     "\"capacity_factor\": 1.0, \"every\": 2}";
    const char *sg = ", \"share_groups\": 2";
    write_spec_moe_("sn", 1, 2, 0, DELINK_STEPS, "", mx, sg);
    write_spec_moe_("un_", 0, 2, 0, DELINK_STEPS, "", mx, sg);
    /* with offloading (the state on the host, apart from the slots): 4
     * layers; "oh" every slot offloaded in both phases (the pseudo phase
     * on 2 ranks, then resumed on 4), "od" Adafactor without a first
     * moment, no clipping, through a delink on 2 ranks, the real phase 2
     * slots resident and 2 offloaded; each against the unsharded resident run of its model
     * (offloading changes no float operation on the CPU) */
    write_spec_all_("oh", 1, 4, 2, STEPS, 4, 1.0, "", "", "",
                    ", \"memory_budget\": \"3761KiB\"",
                    ",\n \"offload\": {\"prefetch\": 1}");
    write_spec_all_("ou", 0, 4, 2, STEPS, 4, 1.0, "", "", "", "", "");
    write_spec_all_("od", 1, 2, 0, DELINK_STEPS, 4, 0.0, af0, "", "",
                    ", \"memory_budget\": \"4542KiB\"",
                    ",\n \"offload\": {\"prefetch\": 1}");
    write_spec_all_("odu", 0, 2, 0, DELINK_STEPS, 4, 0.0, af0, "", "", "", "");
    /* bf16 masters (stochastic rounding keyed by whole tensors, a shard's
     * elements at their places in them), half the real phase's slots
     * offloaded, through a delink on 2 ranks */
    const char *bf = ", \"master\": \"bf16\"";
    write_spec_all_("om", 1, 2, 0, DELINK_STEPS, 4, 1.0, bf, "", "",
                    ", \"memory_budget\": \"4542KiB\"",
                    ",\n \"offload\": {\"prefetch\": 1}");
    write_spec_all_("omu", 0, 2, 0, DELINK_STEPS, 4, 1.0, bf, "", "", "",
                    "");
    /* one rank: the state whole on the host, streamed gradients (no
     * clipping; one rank only), Adafactor without a first moment */
    write_spec_all_("o1", 1, 1, 0, DELINK_STEPS, 4, 0.0, af0, "", "",
                    ", \"memory_budget\": \"4542KiB\"",
                    ",\n \"offload\": {\"prefetch\": 1, "
                    "\"stream_grads\": true}");
    write_spec_all_("o1u", 0, 1, 0, DELINK_STEPS, 4, 0.0, af0, "", "", "",
                    "");
    run_("o1", "o1", 1, "p2", "");
    run_("o1u", "o1u", 1, "p2", "");
    run_("om", "om", 2, "p2", "");
    run_("omu", "omu", 2, "p2", "");
    run_("oh1", "oh", 2, "p1", "oh1");
    run_("ou1", "ou", 2, "p1", "ou1");
    run_("oh2", "oh", 4, "p2", "oh1");
    run_("ou2", "ou", 4, "p2", "ou1");
    run_("od", "od", 2, "p2", "");
    run_("odu", "odu", 2, "p2", "");
    run_("sn", "sn", 2, "p2", "");
    run_("un_", "un_", 2, "p2", "");
    run_("sa", "sa", 4, "p2", "");
    run_("ua", "ua", 4, "p2", "");
    run_("sb", "sb", 2, "p2", "");
    run_("ub", "ub", 2, "p2", "");
    run_("sd", "sd", 2, "p2", "");     /* a delink while sharded */
    run_("ud", "ud", 2, "p2", "");
    run_("sf", "sd", 2, "p2f", "");    /* a NaN batch on rank 1 */
    run_("uf", "ud", 2, "p2f", "");
    run_("sh1", "sh", 2, "p1", "sh1");
    run_("un1", "un", 2, "p1", "un1");
    run_("sh2", "sh", 4, "p2", "sh1");
    run_("un2", "un", 4, "p2", "un1");
    run_("x2", "un", 4, "p2", "sh1");  /* sharded checkpoint, unsharded */
    run_("rs", "sd", 2, "root", "rs");  /* gathered to rank 0 alone */
    run_("ru", "ud", 2, "root", "ru");

    result sh1[2], un1[2], sh2[4], un2[4], x2;
    for (int r = 0; r < 2; r++) {
        load_("sh1", r, &sh1[r]);
        load_("un1", r, &un1[r]);
        char what[64];
        snprintf(what, sizeof what, "pseudo D 2 rank %d", r);
        compare_(what, &sh1[r], &un1[r], PSEUDO);
    }
    CHECK(sh1[0].refused == 1, "a sharded trainer's save before "
          "trainer_gather_optim was not refused by name");
    for (int r = 0; r < 4; r++) {
        load_("sh2", r, &sh2[r]);
        load_("un2", r, &un2[r]);
        char what[64];
        snprintf(what, sizeof what, "real D 4 (resumed) rank %d", r);
        compare_(what, &sh2[r], &un2[r], STEPS - PSEUDO);
    }
    for (int r = 0; r < 2; r++)
        compare_lives_("sd", "ud", "delink D 2", r, NULL);
    for (int r = 0; r < 2; r++) {
        result ab[2];
        compare_lives_("sf", "uf", "NaN batch D 2", r, ab);
        CHECK(ab[0].skipped == 1 && ab[1].skipped == 1, "NaN batch D 2 "
              "rank %d: %d and %d steps skipped, want 1 each", r,
              ab[0].skipped, ab[1].skipped);
    }
    const char *af_tags[3][3] = {{"sa", "ua", "Adafactor D 4"},
                                 {"sb", "ub", "Adafactor no m D 2"},
                                 {"sn", "un_", "AdamW MoE mixed D 2"}};
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < (k ? 2 : 4); r++) {
            result ab[2];
            compare_lives_(af_tags[k][0], af_tags[k][1], af_tags[k][2], r,
                           ab);
            /* sharded by whole tensors: a rank keeps less than all */
            CHECK(ab[0].optim > 0 && ab[0].optim < ab[1].optim, "%s rank "
                  "%d: %zu bytes of optimizer state sharded, %zu whole",
                  af_tags[k][2], r, ab[0].optim, ab[1].optim);
            printf("%-20s rank %d optimizer state %zu bytes, %zu unsharded\n",
                   af_tags[k][2], r, ab[0].optim, ab[1].optim);
        }
    /* gathered to rank 0 alone: rank 0 whole (the unsharded run's
     * bytes), rank 1 still at its share; the checkpoint rank 0 writes is
     * the unsharded run's, byte for byte */
    {
        result rs[2], ru;
        for (int r = 0; r < 2; r++)
            load_("rs", r, &rs[r]);
        load_("ru", 0, &ru);
        CHECK(rs[0].g_rc == 1 && rs[1].g_rc == 0 && ru.g_rc == 0,
              "root: sync answers %d %d (unsharded %d), want 1 0 0",
              rs[0].g_rc, rs[1].g_rc, ru.g_rc);
        CHECK(rs[0].g_after == ru.g_after && rs[0].g_before < ru.g_after,
              "root: rank 0's optimizer bytes %zu -> %zu, unsharded %zu",
              rs[0].g_before, rs[0].g_after, ru.g_after);
        CHECK(rs[1].g_after == rs[1].g_before && rs[1].g_after < ru.g_after,
              "root: rank 1's optimizer bytes %zu -> %zu, unsharded %zu",
              rs[1].g_before, rs[1].g_after, ru.g_after);
        const char *files[2] = {"model.safetensors", "optimizer.safetensors"};
        for (int i = 0; i < 2; i++) {
            char cmd[1400];
            snprintf(cmd, sizeof cmd, "cmp -s '%s/rs.ckpt/%s' '%s/ru.ckpt/%s'",
                     rank_dir_, files[i], rank_dir_, files[i]);
            CHECK(system(cmd) == 0, "root: rank 0's %s differs from the "
                  "unsharded run's", files[i]);
        }
        printf("root gather  rank 0 %zu -> %zu bytes (whole %zu), rank 1 "
               "keeps %zu; checkpoint as unsharded\n", rs[0].g_before,
               rs[0].g_after, ru.g_after, rs[1].g_after);
    }
    load_("x2", 0, &x2);
    compare_("sharded ckpt resumed unsharded", &x2, &un2[0], STEPS - PSEUDO);

    offloaded_checks_();

    /* memory: what the allocator holds, sharded against unsharded */
    for (int r = 0; r < 4; r++) {
        double whole = (double)un2[r].optim;
        double shard = whole - (un2[r].inuse - sh2[r].inuse);
        CHECK(whole > 0 && shard <= MEM_RATIO * whole, "memory: rank %d "
              "keeps %.0f bytes of optimizer state sharded, %.0f whole: "
              "ratio %.3f > %g", r, shard, whole, shard / whole, MEM_RATIO);
        printf("memory rank %d: in use %.0f unsharded, %.0f sharded: "
               "optimizer state %.0f -> %.0f bytes (ratio %.3f; the model "
               "counts %zu)\n", r, un2[r].inuse, sh2[r].inuse, whole, shard,
               whole > 0 ? shard / whole : 0, sh2[r].optim);
    }

    /* the plan's figure for one rank's optimizer state, real phase */
    {
        run_spec sp;
        offload_plan pl;
        size_t ng, ss;
        double planned = -1;
        if (plan_of_("sh", &sp, &pl) == 0) {
            gpt_layout_sizes(&sp.model, &ng, &ss);
            planned = (double)(pl.global_bytes +
                               (size_t)pl.n_slots * pl.slot_bytes) -
                      8.0 * (double)(ng + (size_t)pl.n_slots * ss);
            offload_plan_free(&pl);
        }
        for (int r = 0; r < 4; r++) {
            double shard = (double)un2[r].optim - (un2[r].inuse -
                                                   sh2[r].inuse);
            CHECK(planned > 0 && fabs(planned - shard) <= 0.1 * shard,
                  "plan: %.0f bytes of optimizer state a rank, rank %d "
                  "measured %.0f (more than 10%% apart)", planned, r, shard);
        }
        printf("plan: %.0f bytes of optimizer state a rank\n", planned);
    }

    for (int r = 0; r < 4; r++) {
        free(sh2[r].params);
        free(un2[r].params);
    }
    free(x2.params);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rank_dir_);
    if (failures_ == 0 && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", rank_dir_);
    if (failures_) {
        fprintf(stderr, "%d failure(s); files kept in %s\n", failures_, rank_dir_);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
