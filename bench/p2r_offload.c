/*
 * p2r_offload.c — the Pseudo-to-Real pay-off under memory pressure (issue
 * 19, item 3). Trains the same model on the same text with the same seed
 * and token budget twice, under one device memory budget
 * (device.memory_budget) chosen from the planner so that the Real model
 * must offload most of its slots while the Pseudo model fits resident:
 *   scratch  Real (L slots) from the first step, offloaded throughout;
 *   p2r      Pseudo (S slots, all resident) for the first pseudo-frac of
 *            the steps, delinked, then Real and offloaded like scratch.
 * Prints both validation curves (with the phase of each point), the
 * placements the trainer reported in each phase, the tokens/s of each
 * phase, the delink, the wall-clock each run takes to reach the scratch
 * run's final validation loss and their ratio (p2r / scratch). Ends with
 * one key=value line. --out DIR also writes the curves as CSV.
 *
 * --backend cpu (default): the CPU engine, offloading into its budgeted
 * stand-in device pool. --backend cuda: one GPU, offloading to pinned host
 * memory; exits 77 (skip) when this build has no CUDA or no device is
 * visible.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_args.h"
#include "p2r_run.h"
#include "client/corpus/corpus.h"
#include "offload/offload.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

#define P_ "p2r_offload" /* program name in messages */

/* ------------------------------------------------------------ one run */

/* What one run recorded: its validation curve, and per phase (index
 * run_phase: 0 pseudo, 1 real) the steps, tokens, step seconds and the
 * placement the trainer reported after each step. */
typedef struct {
    const char *name;
    int n;                   /* curve points */
    long *step;              /* [n] optimizer steps done at the pass */
    double *wall, *val;      /* [n] training wall-clock (s), val loss */
    run_phase *phase;        /* [n] phase of the step before the pass */
    double total_wall;       /* training wall-clock of the whole run, s */
    long delink_step;        /* steps done at the delink, -1 none */
    double delink_s;         /* the delink's own seconds */
    int delink_resident, delink_offloaded; /* placement right after it */
    int start_resident, start_offloaded;   /* placement before step 1 */
    int plan_resident[2], plan_offloaded[2]; /* the trainer's plan; -1 */
    long steps[2], tokens[2];
    double step_s[2];
    int resident[2], offloaded[2]; /* after the phase's first step */
    int placement_varied[2];       /* a later step reported another */
    int64_t peak_device[2];        /* most device bytes after a step */
    uint64_t h2d[2], d2h[2];       /* bytes copied in the phase */
    double stall_s[2];             /* compute waiting on copies */
    run_phase last_phase;          /* of the last step trained */
} run_rec;

static void on_start_(void *ctx, trainer *t)
{
    run_rec *r = ctx;
    step_placement p;
    trainer_placement(t, &p);
    r->start_resident = p.resident_slots;
    r->start_offloaded = p.offloaded_slots;
    const offload_plan *pl = trainer_plan(t);
    for (int i = 0; i < 2; i++)
        r->plan_resident[i] = r->plan_offloaded[i] = -1;
    if (pl) {
        r->plan_resident[PHASE_REAL] = pl->n_resident;
        r->plan_offloaded[PHASE_REAL] = pl->n_offloaded;
        if (pl->pseudo) {
            r->plan_resident[PHASE_PSEUDO] = pl->pseudo->n_resident;
            r->plan_offloaded[PHASE_PSEUDO] = pl->pseudo->n_offloaded;
        }
    }
}

static void on_step_(void *ctx, trainer *t, const step_result *s)
{
    (void)t;
    run_rec *r = ctx;
    int ph = s->phase == PHASE_PSEUDO ? PHASE_PSEUDO : PHASE_REAL;
    if (r->steps[ph] == 0) {
        r->resident[ph] = s->mem.resident_slots;
        r->offloaded[ph] = s->mem.offloaded_slots;
    } else if (r->resident[ph] != s->mem.resident_slots ||
               r->offloaded[ph] != s->mem.offloaded_slots) {
        r->placement_varied[ph] = 1;
    }
    r->steps[ph]++;
    r->last_phase = (run_phase)ph;
    r->tokens[ph] += s->tokens;
    r->step_s[ph] += s->step_ms / 1e3;
    if (s->mem.peak_device_bytes > r->peak_device[ph])
        r->peak_device[ph] = s->mem.peak_device_bytes;
    r->h2d[ph] += s->mem.h2d_bytes;
    r->d2h[ph] += s->mem.d2h_bytes;
    r->stall_s[ph] += s->mem.stall_s;
}

/* right after the delink: the steps done, its seconds, the placement */
static void on_delink_(void *ctx, trainer *t, double seconds)
{
    run_rec *r = ctx;
    step_placement p;
    trainer_placement(t, &p);
    r->delink_step = trainer_step_count(t);
    r->delink_s = seconds;
    r->delink_resident = p.resident_slots;
    r->delink_offloaded = p.offloaded_slots;
}

/* a validation pass follows the step on_step_ just saw: its phase */
static void on_eval_(void *ctx, long step, double val, double wall_s)
{
    run_rec *r = ctx;
    r->step[r->n] = step;
    r->wall[r->n] = wall_s;
    r->val[r->n] = val;
    r->phase[r->n] = r->last_phase;
    r->n++;
}

static void run_free_(run_rec *r)
{
    free(r->step);
    free(r->wall);
    free(r->val);
    free(r->phase);
}

static int run_(const run_spec *s, run_rec *r)
{
    size_t n = (size_t)s->train.steps + 1;
    r->n = 0;
    r->delink_step = -1;
    r->step = calloc(n, sizeof(long));
    r->wall = calloc(n, sizeof(double));
    r->val = calloc(n, sizeof(double));
    r->phase = calloc(n, sizeof(run_phase));
    if (!r->step || !r->wall || !r->val || !r->phase) {
        fprintf(stderr, P_ ": out of memory\n");
        return -1;
    }
    p2r_hooks h = {.on_start = on_start_, .on_step = on_step_,
                   .on_delink = on_delink_, .on_eval = on_eval_,
                   .ctx = r};
    long delink = -1;
    if (p2r_train_hooked(P_, s, &h, &r->total_wall, &delink) != 0)
        return -1;
    if (delink != r->delink_step) { /* the two records of one event */
        fprintf(stderr, P_ ": %s: delink at step %ld, hook saw %ld\n",
                r->name, delink, r->delink_step);
        return -1;
    }
    if (r->n == 0) {
        fprintf(stderr, P_ ": %s: no validation pass ran\n", r->name);
        return -1;
    }
    return 0;
}

static double tok_s_(const run_rec *r, int ph)
{
    return r->step_s[ph] > 0 ? r->tokens[ph] / r->step_s[ph] : NAN;
}

/* DIR/NAME.csv: step,val_loss,wall_s,phase (val as %.9g: the float
 * exactly), written to a temporary name and renamed. 0 or -1. */
static int write_curve_(const char *dir, const run_rec *r)
{
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/%s.csv", dir, r->name);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, P_ ": %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# %s: delink_step=%ld delink_s=%.6f\n", r->name,
            r->delink_step, r->delink_s);
    fprintf(f, "step,val_loss,wall_s,phase\n");
    for (int i = 0; i < r->n; i++)
        fprintf(f, "%ld,%.9g,%.6f,%s\n", r->step[i], r->val[i], r->wall[i],
                phase_name(r->phase[i]));
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, P_ ": %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ budget */

/* Device bytes of plan p (budget 0: every slot's size known) with r of
 * its slots resident, as the planner counts them (offload.h; dense slots,
 * all slot_bytes: this benchmark's models). main plans again with the
 * budget chosen from it and checks the placements the planner gives. */
static size_t need_bytes_(const offload_plan *p, int r)
{
    int k = p->n_slots - r;
    int nst = k < p->prefetch ? k : p->prefetch;
    return p->global_bytes + p->act_bytes + p->workspace_bytes +
           (size_t)r * p->slot_bytes + (size_t)nst * p->staging_bytes;
}

/* The budget: the Real phase with n_off of its L slots offloaded, or the
 * Pseudo phase all resident, whichever needs more. From the planner's
 * parts with no budget (plan_for_spec's sizes do not depend on it). 0
 * with *budget, or -1 after saying why. */
static int choose_budget_(const run_spec *p2r, int n_off, size_t *budget)
{
    char err[512];
    offload_plan pl;
    run_spec s = *p2r;
    s.device.memory_budget = 0;
    if (offload_plan_for_spec(&s, 0, &pl, err, sizeof err) != 0) {
        fprintf(stderr, P_ ": planning: %s\n", err);
        return -1;
    }
    size_t real = need_bytes_(&pl, pl.n_slots - n_off);
    size_t pseudo = need_bytes_(pl.pseudo, pl.pseudo->n_slots);
    *budget = real > pseudo ? real : pseudo;
    offload_plan_free(&pl);
    return 0;
}

/* ------------------------------------------------------------ main */

static void usage_(void)
{
    printf(
        "usage: p2r_offload [options]\n"
        "  --backend cpu|cuda  (cpu; cuda exits 77 without CUDA or a device)\n"
        "  --data DIR          shards train_*.bin / val_*.bin; when DIR has\n"
        "                      none, /usr/share/games/fortunes is prepared\n"
        "                      into it (default /tmp/m6-p2r-data)\n"
        "  --prepare           only prepare --data DIR (as above) and exit\n"
        "  --out DIR           also write DIR/scratch.csv and DIR/p2r.csv\n"
        "  --layers L --embd C --heads NH --seq T --batch B --steps N\n"
        "      cpu defaults: L 8, C 64, NH 4, T 64, B 8, 1200 steps\n"
        "      cuda defaults: L 24, C 1024, NH 16, T 1024, B 8, 300 steps\n"
        "  --lr LR (3e-3 cpu, 6e-4 cuda) --warmup N (steps/20)\n"
        "  --eval-every N (steps/20) --eval-batches N (8)\n"
        "  --pseudo-frac F     fraction of the steps in the pseudo phase (0.3)\n"
        "  --share-groups S    slots in the pseudo phase (1)\n"
        "  --offload-frac F    fraction of the Real model's slots offloaded\n"
        "                      under the chosen budget, in (0, 1] (0.75)\n"
        "  --budget BYTES      device.memory_budget as given instead\n"
        "  --seed N (1337)     --threads N  OpenMP/BLAS threads (all cores)\n");
}

static long lround_pos_(double x) { return (long)floor(x + 0.5); }

int main(int argc, char **argv)
{
    run_spec s;
    spec_defaults(&s);
    s.model = (model_config){.vocab_size = 256};
    s.train.batch_size = 0;
    s.train.steps = 0;
    s.train.lr = 0;
    s.train.warmup_steps = -1;
    s.train.eval_every = 0;
    s.train.eval_batches = 8;
    s.pseudo.share_groups = 1;
    double frac = 0.3, off_frac = 0.75;
    int prepare_only = 0;
    long long budget_arg = 0;
    const char *data = "/tmp/m6-p2r-data", *out = NULL;
    static const struct option opts[] = {
        P2R_TRAIN_OPTIONS, {"data", 1, 0, 'd'}, {"out", 1, 0, 'O'},
        {"backend", 1, 0, 'b'}, {"pseudo-frac", 1, 0, 'f'},
        {"share-groups", 1, 0, 'S'}, {"offload-frac", 1, 0, 'F'},
        {"budget", 1, 0, 'M'}, {"seed", 1, 0, 's'}, {"threads", 1, 0, 't'},
        {"prepare", 0, 0, 'P'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = p2r_next_option(P_, argc, argv, opts, &s)) != -1) {
        switch (o) {
        case 'd': data = optarg; break;
        case 'O': out = optarg; break;
        case 'P': prepare_only = 1; break;
        case 'b':
            s.device.backend = bench_choice_arg(P_, "backend", optarg, "cpu",
                                                "cuda")
                                   ? BACKEND_CUDA : BACKEND_CPU;
            break;
        case 'f': frac = bench_frac_arg(P_, "pseudo-frac", optarg, 0); break;
        case 'S': s.pseudo.share_groups = bench_int_arg(P_, "share-groups", optarg, 1); break;
        case 'F': off_frac = bench_frac_arg(P_, "offload-frac", optarg, 1); break;
        case 'M': {
            char *end;
            errno = 0;
            budget_arg = strtoll(optarg, &end, 10);
            if (end == optarg || *end || errno || budget_arg < 1) {
                fprintf(stderr, P_ ": --budget: want a byte count >= 1, got "
                                "\"%s\"\n", optarg);
                return 2;
            }
            break;
        }
        case 's': s.train.seed = (uint64_t)bench_int_arg(P_, "seed", optarg, 0); break;
        case 't': s.device.threads = bench_int_arg(P_, "threads", optarg, 1); break;
        default: bench_usage_exit(o, usage_);
        }
    }
    bench_no_operands(P_, argc, argv);
    /* the backend's defaults for what was not given */
    int cuda = s.device.backend == BACKEND_CUDA;
    model_config *m = &s.model;
    if (!m->n_layer) m->n_layer = cuda ? 24 : 8;
    if (!m->n_embd) m->n_embd = cuda ? 1024 : 64;
    if (!m->n_head) m->n_head = cuda ? 16 : 4;
    if (!m->seq_len) m->seq_len = cuda ? 1024 : 64;
    if (!s.train.batch_size) s.train.batch_size = 8;
    if (!s.train.steps) s.train.steps = cuda ? 300 : 1200;
    if (s.train.lr == 0) {
        s.train.lr = cuda ? 6e-4f : 3e-3f;
        s.train.min_lr = s.train.lr / 10;
    }
    if (s.train.warmup_steps < 0) s.train.warmup_steps = s.train.steps / 20;
    if (!s.train.eval_every)
        s.train.eval_every = s.train.steps >= 20 ? s.train.steps / 20 : 1;
    if (bench_shape_check(P_, m, s.pseudo.share_groups) < 0)
        return 2;
    if (s.pseudo.share_groups >= m->n_layer) {
        fprintf(stderr, P_ ": --share-groups %d: the pseudo model needs fewer "
                        "slots than --layers (%d)\n", s.pseudo.share_groups,
                m->n_layer);
        return 2;
    }
    long pseudo_steps = lround_pos_(frac * s.train.steps);
    if (pseudo_steps < 1 || pseudo_steps >= s.train.steps) {
        fprintf(stderr, P_ ": --pseudo-frac %g of %ld steps leaves a phase "
                        "without steps\n", frac, s.train.steps);
        return 2;
    }

    /* the data: DIR's shards, or fortunes prepared into DIR */
    char err[512], probe[1024];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/train_000000.bin", data);
    if (stat(probe, &st) != 0) {
        const char *in[] = {"/usr/share/games/fortunes"};
        prepare_stats ps;
        if (data_prepare(data, in, 1, 0.1, 100000000, &ps, NULL, NULL, err,
                         sizeof err) != 0) {
            fprintf(stderr, P_ ": preparing fortunes into %s: %s\n"
                            "(install Debian's fortunes, or pass --data)\n",
                    data, err);
            return 1;
        }
    }
    if (prepare_only) {
        printf(P_ ": shards in %s\n", data);
        return 0;
    }
    snprintf(s.data.train, sizeof s.data.train, "%s/train_*.bin", data);
    snprintf(s.data.val, sizeof s.data.val, "%s/val_*.bin", data);

    run_spec scratch = s, p2r = s;
    scratch.pseudo.steps = 0;
    p2r.pseudo.steps = pseudo_steps;
    int L = m->n_layer;
    int n_off = (int)lround_pos_(off_frac * L);
    if (n_off < 1)
        n_off = 1;
    size_t budget = (size_t)budget_arg;
    if (!budget && choose_budget_(&p2r, n_off, &budget) != 0)
        return 1;
    scratch.device.memory_budget = p2r.device.memory_budget = budget;

    /* the plan both runs train under: print it, check its placements */
    offload_plan pl;
    if (offload_plan_for_spec(&p2r, 0, &pl, err, sizeof err) != 0) {
        fprintf(stderr, P_ ": planning: %s\n", err);
        return 1;
    }
    printf(P_ ": backend=%s L=%d C=%d NH=%d T=%d B=%d steps=%ld lr=%g "
           "seed=%llu; p2r: S=%d for %ld steps; budget %zu bytes (%.2f MiB)%s\n",
           cuda ? "cuda" : "cpu", L, m->n_embd, m->n_head, m->seq_len,
           s.train.batch_size, s.train.steps, s.train.lr,
           (unsigned long long)s.train.seed, s.pseudo.share_groups,
           pseudo_steps, budget, budget / 1048576.0,
           budget_arg ? " (--budget)" : "");
    printf("planner: min budget (every slot offloaded) %zu bytes, one "
           "resident slot %zu bytes, one staging buffer %zu bytes\n",
           pl.min_budget_bytes, pl.slot_bytes, pl.staging_bytes);
    offload_plan_print(stdout, &pl, 0);
    int bad_plan = pl.pseudo->n_offloaded != 0 || pl.n_offloaded == 0;
    if (bad_plan)
        fprintf(stderr, P_ ": budget %zu bytes: the pseudo phase has %d of %d "
                        "slots offloaded and the real phase %d of %d: want "
                        "none and some\n", budget, pl.pseudo->n_offloaded,
                pl.pseudo->n_slots, pl.n_offloaded, pl.n_slots);
    else if (!budget_arg && pl.n_offloaded != n_off)
        printf("note: %d of %d real slots offloaded, not the %d asked for: "
               "the pseudo phase all resident needs more\n", pl.n_offloaded,
               L, n_off);
    offload_plan_free(&pl);
    if (bad_plan)
        return 1;
    fflush(stdout);

    /* after the plan (pure arithmetic, printed on any machine): cuda
     * without CUDA or a device skips; any other refusal is an error */
    if (ERR_INTO(err, trainer_check_spec(&p2r, &err_)) != 0) {
        if (cuda && (strstr(err, "built without CUDA") ||
                     strstr(err, "no CUDA device"))) {
            printf(P_ ": SKIP: %s\n", err);
            return 77;
        }
        fprintf(stderr, P_ ": %s\n", err);
        return 1;
    }

    run_rec a = {.name = "scratch"}, b = {.name = "p2r"};
    printf("training from scratch (real, offloaded)...\n");
    fflush(stdout);
    if (run_(&scratch, &a) != 0)
        return 1;
    printf("training pseudo-to-real (pseudo resident, then real offloaded)...\n");
    fflush(stdout);
    if (run_(&p2r, &b) != 0)
        return 1;
    if (out) {
        if (mkdir(out, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, P_ ": --out %s: %s\n", out, strerror(errno));
            return 1;
        }
        if (write_curve_(out, &a) != 0 || write_curve_(out, &b) != 0)
            return 1;
    }

    /* placements, as the trainer reported them */
    printf("\nplacements (resident/offloaded slots, reported after each step):\n");
    printf("  scratch  real   %d/%d over %ld steps%s (plan %d/%d)\n",
           a.resident[1], a.offloaded[1], a.steps[1],
           a.placement_varied[1] ? ", VARIED" : "", a.plan_resident[1],
           a.plan_offloaded[1]);
    printf("  p2r      pseudo %d/%d over %ld steps%s (plan %d/%d)\n",
           b.resident[0], b.offloaded[0], b.steps[0],
           b.placement_varied[0] ? ", VARIED" : "", b.plan_resident[0],
           b.plan_offloaded[0]);
    printf("  p2r      real   %d/%d over %ld steps%s (plan %d/%d; right after "
           "the delink %d/%d)\n", b.resident[1], b.offloaded[1], b.steps[1],
           b.placement_varied[1] ? ", VARIED" : "", b.plan_resident[1],
           b.plan_offloaded[1], b.delink_resident, b.delink_offloaded);
    printf("  before step 1: scratch %d/%d, p2r %d/%d\n", a.start_resident,
           a.start_offloaded, b.start_resident, b.start_offloaded);
    printf("peak device bytes (since the start): scratch %lld, p2r pseudo "
           "%lld, real %lld; budget %zu\n", (long long)a.peak_device[1],
           (long long)b.peak_device[0], (long long)b.peak_device[1], budget);
    printf("delink after step %ld, %.3f s\n", b.delink_step, b.delink_s);
    printf("tokens/s: scratch real %.0f; p2r pseudo %.0f, real %.0f\n",
           tok_s_(&a, 1), tok_s_(&b, 0), tok_s_(&b, 1));
    printf("copied: scratch h2d %.1f MiB d2h %.1f MiB (stall %.2f s); p2r "
           "pseudo h2d %.1f MiB, real h2d %.1f MiB d2h %.1f MiB (stall %.2f s)\n",
           a.h2d[1] / 1048576.0, a.d2h[1] / 1048576.0, a.stall_s[1],
           b.h2d[0] / 1048576.0, b.h2d[1] / 1048576.0, b.d2h[1] / 1048576.0,
           b.stall_s[1]);

    printf("\n%6s  %10s %8s  %10s %8s %s\n", "step", "scratch", "wall_s",
           "p2r", "wall_s", "phase");
    for (int i = 0; i < a.n || i < b.n; i++) {
        if (i < a.n)
            printf("%6ld  %10.4f %8.2f", a.step[i], a.val[i], a.wall[i]);
        else
            printf("%6s  %10s %8s", "", "", "");
        if (i < b.n)
            printf("  %10.4f %8.2f %s%s", b.val[i], b.wall[i],
                   phase_name(b.phase[i]),
                   b.step[i] == b.delink_step ? "  <- delink after" : "");
        printf("\n");
    }
    double target = a.val[a.n - 1];
    int ia = p2r_reach(a.val, a.n, target), ib = p2r_reach(b.val, b.n, target);
    double wa = a.wall[ia], wb = ib >= 0 ? b.wall[ib] : NAN;
    long sa = a.step[ia], sb = ib >= 0 ? b.step[ib] : -1;
    printf("\ntarget = scratch final val loss %.4f\n", target);
    printf("scratch reaches it at step %ld (%.2f s); p2r ", sa, wa);
    if (ib >= 0)
        printf("at step %ld (%.2f s): wall-clock ratio %.3f\n", sb, wb, wb / wa);
    else
        printf("never (final %.4f, %+.2f%%)\n", b.val[b.n - 1],
               100 * (b.val[b.n - 1] - target) / target);
    printf("total wall: scratch %.2f s, p2r %.2f s\n", a.total_wall,
           b.total_wall);
    printf("backend=%s layers=%d share_groups=%d budget_bytes=%zu "
           "steps=%ld scratch_steps=%ld p2r_steps=%ld pseudo_steps=%ld "
           "real_steps=%ld delink_step=%ld delink_s=%.4f "
           "scratch_resident=%d scratch_offloaded=%d "
           "pseudo_resident=%d pseudo_offloaded=%d "
           "real_resident=%d real_offloaded=%d placement_varied=%d "
           "peak_scratch_bytes=%lld peak_pseudo_bytes=%lld "
           "peak_real_bytes=%lld "
           "tok_s_scratch=%.0f tok_s_pseudo=%.0f tok_s_real=%.0f "
           "scratch_final_val=%.6f p2r_final_val=%.6f "
           "scratch_steps_to_target=%ld p2r_steps_to_target=%ld "
           "scratch_wall_to_target_s=%.3f p2r_wall_to_target_s=%.3f "
           "scratch_wall_s=%.3f p2r_wall_s=%.3f wall_ratio=%.4f\n",
           cuda ? "cuda" : "cpu", L, s.pseudo.share_groups, budget,
           s.train.steps, a.steps[0] + a.steps[1], b.steps[0] + b.steps[1],
           b.steps[0], b.steps[1], b.delink_step, b.delink_s,
           a.resident[1], a.offloaded[1], b.resident[0], b.offloaded[0],
           b.resident[1], b.offloaded[1],
           a.placement_varied[1] | b.placement_varied[0] |
               b.placement_varied[1],
           (long long)a.peak_device[1], (long long)b.peak_device[0],
           (long long)b.peak_device[1],
           tok_s_(&a, 1), tok_s_(&b, 0), tok_s_(&b, 1), target,
           b.val[b.n - 1], sa, sb, wa, wb, a.total_wall, b.total_wall,
           ib >= 0 ? wb / wa : NAN);
    run_free_(&a);
    run_free_(&b);
    return 0;
}
