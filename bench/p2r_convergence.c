/*
 * p2r_convergence.c — does Pseudo-to-Real pay? Trains the same model on the
 * same text with the same seed and total steps twice: from scratch (S = L
 * throughout) and Pseudo-to-Real (S = share_groups for the first
 * pseudo_frac of the steps, then delink). Prints both validation-loss curves,
 * the step and wall-clock at which each first reaches the scratch run's
 * final loss, and their ratios. Ends with one key=value line.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_util.h"
#include "p2r_run.h"
#include "client/corpus/corpus.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

#define P_ "p2r_convergence" /* program name in messages */

typedef struct {
    int n;
    long *step;
    double *wall, *val;
    double final_val, total_wall;
    long delink_step;
} curve;

static void on_eval_(void *ctx, long step, double val, double wall_s)
{
    curve *c = ctx;
    c->step[c->n] = step;
    c->wall[c->n] = wall_s;
    c->val[c->n] = val;
    c->n++;
}

static int run_(const run_spec *s, curve *c)
{
    c->n = 0;
    c->step = calloc((size_t)s->train.steps + 1, sizeof(long));
    c->wall = calloc((size_t)s->train.steps + 1, sizeof(double));
    c->val = calloc((size_t)s->train.steps + 1, sizeof(double));
    if (!c->step || !c->wall || !c->val) {
        fprintf(stderr, P_ ": out of memory\n");
        return -1;
    }
    if (p2r_train(P_, s, on_eval_, c, &c->total_wall, &c->delink_step) != 0)
        return -1;
    c->final_val = c->val[c->n - 1];
    return 0;
}

static void usage_(void)
{
    printf(
        "usage: p2r_convergence [options]\n"
        "  --data DIR          shards train_*.bin / val_*.bin (default: prepare\n"
        "                      /usr/share/games/fortunes into /tmp/m6-p2r-data)\n"
        "  --layers L (6) --embd C (128) --heads NH (4) --seq T (128)\n"
        "  --batch B (16) --steps N (1000) --lr LR (3e-3) --warmup N (30)\n"
        "  (defaults: the shape of examples/fortunes-p2r.json)\n"
        "  --pseudo-frac F     fraction of steps in the pseudo phase (0.3)\n"
        "  --share-groups S    slots in the pseudo phase (1)\n"
        "  --delink-optimizer copy|reset (copy)   --rewarm N (0)\n"
        "  --grad-scale sum|mean  a shared slot's gradient in the pseudo\n"
        "                      phase: sum or mean over its layers (sum)\n"
        "  --pseudo-lr-scale X lr multiplier of the pseudo phase, > 0 (1)\n"
        "  --eval-every N (50) --eval-batches N (16) --seed N (1337)\n"
        "  --threads N         OpenMP/BLAS threads (all cores)\n"
        "  --precision P       fp32 or bf16: device.precision (fp32)\n"
        "  --optimizer adamw|adafactor (adamw; adafactor with its defaults,\n"
        "                      no first moment)\n"
        "  --master fp32|bf16  optimizer.master: the master weights (fp32)\n");
}

static const char *grad_scale_name_(const run_spec *s)
{
    return s->pseudo.grad_scale == GRAD_SCALE_MEAN ? "mean" : "sum";
}

int main(int argc, char **argv)
{
    run_spec s = p2r_default_spec((p2r_defaults){
        .n_embd = 128, .seq_len = 128, .batch = 16, .steps = 1000,
        .warmup = 30, .eval_every = 50, .eval_batches = 16});
    double frac = 0.3;
    const char *data = NULL;
    static const struct option opts[] = {
        P2R_TRAIN_OPTIONS, {"data", 1, 0, 'd'},
        {"pseudo-frac", 1, 0, 'f'}, {"share-groups", 1, 0, 'S'},
        {"delink-optimizer", 1, 0, 'o'}, {"rewarm", 1, 0, 'r'},
        {"grad-scale", 1, 0, 'g'}, {"pseudo-lr-scale", 1, 0, 'x'},
        {"seed", 1, 0, 's'}, {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'},
        {"precision", 1, 0, 'P'}, {"optimizer", 1, 0, 'O'},
        {"master", 1, 0, 'M'},
        {0, 0, 0, 0}};
    int o;
    while ((o = p2r_next_option(P_, argc, argv, opts, &s)) != -1) {
        switch (o) {
        case 'd': data = optarg; break;
        case 'f': frac = bench_frac_arg(P_, "pseudo-frac", optarg, 0); break;
        case 'S': s.pseudo.share_groups = bench_int_arg(P_, "share-groups", optarg, 1); break;
        case 'o':
            s.delink.optimizer = bench_pick_arg(P_, "delink-optimizer", optarg,
                "copy", DELINK_OPT_COPY, "reset", DELINK_OPT_RESET);
            break;
        case 'r': s.delink.rewarm_steps = bench_int_arg(P_, "rewarm", optarg, 0); break;
        case 'g':
            s.pseudo.grad_scale = bench_pick_arg(P_, "grad-scale", optarg,
                "sum", GRAD_SCALE_SUM, "mean", GRAD_SCALE_MEAN);
            break;
        case 'x':
            s.pseudo.lr_scale = (float)bench_real_arg(P_, "pseudo-lr-scale",
                                                      optarg, 1e-6, 1e6);
            break;
        case 's': s.train.seed = (uint64_t)bench_int_arg(P_, "seed", optarg, 0); break;
        case 't': s.device.threads = bench_int_arg(P_, "threads", optarg, 1); break;
        case 'P':
            s.device.precision = bench_pick_arg(P_, "precision", optarg,
                spec_precision_name(PRECISION_FP32), PRECISION_FP32,
                spec_precision_name(PRECISION_BF16), PRECISION_BF16);
            break;
        case 'O':
            s.optimizer.name = bench_pick_arg(P_, "optimizer", optarg,
                spec_optimizer_name(OPTIMIZER_ADAMW), OPTIMIZER_ADAMW,
                spec_optimizer_name(OPTIMIZER_ADAFACTOR), OPTIMIZER_ADAFACTOR);
            break;
        case 'M':
            s.optimizer.master = bench_pick_arg(P_, "master", optarg,
                spec_master_name(MASTER_FP32), MASTER_FP32,
                spec_master_name(MASTER_BF16), MASTER_BF16);
            break;
        default: bench_usage_exit(o, usage_);
        }
    }
    bench_no_operands(P_, argc, argv);
    if (bench_shape_check(P_, &s.model, s.pseudo.share_groups) < 0)
        return 2;
    char err[512], dir[512];
    if (!data) {
        snprintf(dir, sizeof dir, "/tmp/m6-p2r-data");
        struct stat st;
        snprintf(s.data.train, sizeof s.data.train, "%s/train_000000.bin", dir);
        if (stat(s.data.train, &st) != 0) {
            const char *in[] = {"/usr/share/games/fortunes"};
            prepare_stats ps;
            if (data_prepare(dir, in, 1, 0.1, 100000000, &ps, NULL, NULL, err,
                             sizeof err) != 0) {
                fprintf(stderr, "p2r_convergence: preparing fortunes: %s\n"
                                "(install Debian's fortunes, or pass --data)\n",
                        err);
                return 1;
            }
        }
        data = dir;
    }
    snprintf(s.data.train, sizeof s.data.train, "%s/train_*.bin", data);
    snprintf(s.data.val, sizeof s.data.val, "%s/val_*.bin", data);

    run_spec scratch = s, p2r = s;
    scratch.pseudo.steps = 0;
    p2r.pseudo.steps = (long)(frac * s.train.steps);
    printf("p2r_convergence: L=%d C=%d NH=%d T=%d B=%d steps=%ld lr=%g; "
           "p2r: S=%d for %ld steps, delink optimizer=%s rewarm=%ld "
           "grad_scale=%s pseudo_lr_scale=%g optimizer=%s master=%s\n",
           s.model.n_layer, s.model.n_embd, s.model.n_head, s.model.seq_len,
           s.train.batch_size, s.train.steps, s.train.lr, s.pseudo.share_groups,
           p2r.pseudo.steps,
           s.delink.optimizer == DELINK_OPT_RESET ? "reset" : "copy",
           s.delink.rewarm_steps, grad_scale_name_(&s),
           (double)s.pseudo.lr_scale, spec_optimizer_name(s.optimizer.name),
           spec_master_name(s.optimizer.master));
    curve a, b;
    printf("training from scratch...\n");
    fflush(stdout);
    if (run_(&scratch, &a) != 0)
        return 1;
    printf("training pseudo-to-real...\n");
    fflush(stdout);
    if (run_(&p2r, &b) != 0)
        return 1;

    printf("\n%6s  %10s %8s  %10s %8s\n", "step", "scratch", "wall_s",
           "p2r", "wall_s");
    for (int i = 0; i < a.n && i < b.n; i++)
        printf("%6ld  %10.4f %8.1f  %10.4f %8.1f%s\n", a.step[i], a.val[i],
               a.wall[i], b.val[i], b.wall[i],
               b.step[i] == b.delink_step ? "  <- delink" : "");
    double target = a.final_val;
    int ia = p2r_reach(a.val, a.n, target), ib = p2r_reach(b.val, b.n, target);
    long sa = a.step[ia], sb = ib >= 0 ? b.step[ib] : -1;
    double wa = a.wall[ia], wb = ib >= 0 ? b.wall[ib] : NAN;
    printf("\ntarget = scratch final val loss %.4f\n", target);
    printf("scratch reaches it at step %ld (%.1f s); p2r ", sa, wa);
    if (ib >= 0)
        printf("at step %ld (%.1f s)\n", sb, wb);
    else
        printf("never (final %.4f, %+.2f%%)\n", b.final_val,
               100 * (b.final_val - target) / target);
    printf("total wall: scratch %.1f s, p2r %.1f s\n", a.total_wall, b.total_wall);
    printf("scratch_final_val=%.4f p2r_final_val=%.4f final_val_ratio=%.4f "
           "scratch_steps_to_target=%ld p2r_steps_to_target=%ld step_ratio=%.3f "
           "scratch_wall_s=%.1f p2r_wall_s=%.1f wall_to_target_ratio=%.3f "
           "pseudo_steps=%ld share_groups=%d grad_scale=%s "
           "pseudo_lr_scale=%g precision=%s optimizer=%s master=%s\n",
           a.final_val, b.final_val, b.final_val / a.final_val, sa, sb,
           ib >= 0 ? (double)sb / sa : NAN, a.total_wall, b.total_wall,
           ib >= 0 ? wb / wa : NAN, p2r.pseudo.steps, s.pseudo.share_groups,
           grad_scale_name_(&s), (double)s.pseudo.lr_scale,
           spec_precision_name(spec_precision(&s)),
           spec_optimizer_name(s.optimizer.name),
           spec_master_name(s.optimizer.master));
    return 0;
}
