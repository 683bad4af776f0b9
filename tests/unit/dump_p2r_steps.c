/*
 * dump_p2r_steps.c — test helper for torch_p2r_steps.py: a short
 * Pseudo-to-Real run through the trainer (CPU backend) on synthetic
 * shards, with pseudo.grad_scale and pseudo.lr_scale as given, dumped so
 * that PyTorch can redo every step independently:
 *   OUT/init/    the checkpoint before step 1 (weights; moments zero)
 *   OUT/final/   the checkpoint after the last step
 *   OUT/batches.safetensors  step k's windows: "step<k>.inputs" and
 *                ".targets", (grad_accum*B, T) as floats, in microbatch
 *                order
 *   OUT/run.json the spec's shape and optimizer keys, and per step the
 *                lr, gradient norm and loss the trainer reported
 * The run delinks (delink.optimizer copy) when the step count reaches
 * pseudo.steps, as the runner does.
 *
 * usage: dump_p2r_steps OUT sum|mean LR_SCALE S STEPS PSEUDO_STEPS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/checkpoint.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"
#include "../common/dump_files.h"

#define MAX_STEPS 32

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: dump_p2r_steps OUT sum|mean LR_SCALE S "
                        "STEPS PSEUDO_STEPS\n");
        return 2;
    }
    const char *out = argv[1];
    long steps = atol(argv[5]), P = atol(argv[6]);
    if (steps < 1 || steps > MAX_STEPS || P < 0 || P > steps) {
        fprintf(stderr, "dump_p2r_steps: STEPS in [1, %d], PSEUDO_STEPS in "
                        "[0, STEPS]\n", MAX_STEPS);
        return 2;
    }
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/m6-p2r-steps-XXXXXX");
    if (synth_shards(dir, 20000) != 0)
        return 1;
    run_spec s = synth_tiny_spec(dir, 3, steps, P);
    s.pseudo.share_groups = atoi(argv[4]);
    s.pseudo.grad_scale = strcmp(argv[2], "mean") == 0 ? GRAD_SCALE_MEAN
                                                       : GRAD_SCALE_SUM;
    s.pseudo.lr_scale = (float)atof(argv[3]);
    s.train.grad_clip = 1.0f;
    s.device.threads = 1;
    char err[512], path[600];
    trainer *t = ERR_INTO(err, trainer_create(&s, &err_));
    if (!t) {
        fprintf(stderr, "dump_p2r_steps: %s\n", err);
        return 1;
    }
    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/init", out);
    if (ERR_INTO(err, trainer_save(t, path, &err_)) < 0) {
        fprintf(stderr, "dump_p2r_steps: %s\n", err);
        return 1;
    }
    token_set ts;
    if (token_set_open_buf(&ts, s.data.train, s.model.vocab_size, err,
                           sizeof err) != 0) {
        fprintf(stderr, "dump_p2r_steps: %s\n", err);
        return 1;
    }
    int T = s.model.seq_len, nwin = s.train.grad_accum * s.train.batch_size;
    float *tok = malloc((size_t)steps * 2 * nwin * T * sizeof(float));
    st_tensor *tens = calloc((size_t)steps * 2, sizeof *tens);
    char (*names)[32] = calloc((size_t)steps * 2, sizeof *names);
    float lr[MAX_STEPS], norm[MAX_STEPS], loss[MAX_STEPS];
    size_t win[256];
    uint16_t row[256];
    for (long k = 0; k < steps; k++) {
        if (trainer_phase(t) == PHASE_PSEUDO && trainer_step_count(t) == P &&
            trainer_delink(t, err, sizeof err) != 0) {
            fprintf(stderr, "dump_p2r_steps: %s\n", err);
            return 1;
        }
        step_result r;
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0) {
            fprintf(stderr, "dump_p2r_steps: %s\n", err);
            return 1;
        }
        lr[k] = r.lr;
        norm[k] = r.grad_norm;
        loss[k] = r.train_loss;
        if (trainer_step_windows(t, win) != (size_t)nwin)
            return 1;
        float *in = tok + (size_t)k * 2 * nwin * T, *tg = in + nwin * T;
        for (int w = 0; w < nwin; w++) {
            if (token_set_read_buf(&ts, win[w], row, (size_t)T + 1, err,
                                   sizeof err) != 0) {
                fprintf(stderr, "dump_p2r_steps: %s\n", err);
                return 1;
            }
            for (int j = 0; j < T; j++) {
                in[w * T + j] = row[j];
                tg[w * T + j] = row[j + 1];
            }
        }
        snprintf(names[2 * k], sizeof names[0], "step%ld.inputs", k);
        snprintf(names[2 * k + 1], sizeof names[0], "step%ld.targets", k);
        tens[2 * k] = (st_tensor){names[2 * k], in, 2, {nwin, T}};
        tens[2 * k + 1] = (st_tensor){names[2 * k + 1], tg, 2, {nwin, T}};
    }
    token_set_close(&ts);
    snprintf(path, sizeof path, "%s/final", out);
    if (ERR_INTO(err, trainer_save(t, path, &err_)) < 0) {
        fprintf(stderr, "dump_p2r_steps: %s\n", err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/batches.safetensors", out);
    if (dump_tensors("dump_p2r_steps", path, tens, (int)(2 * steps)) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/run.json", out);
    FILE *f = dump_json_open("dump_p2r_steps", path);
    if (!f)
        return 1;
    dump_json_shape(f, &s.model, s.train.batch_size);
    fprintf(f, ", \"A\": %d, \"S\": %d, \"steps\": %ld, "
               "\"pseudo_steps\": %ld, \"grad_scale\": \"%s\", "
               "\"lr_scale\": %.9g, \"lr\": %.9g, \"min_lr\": %.9g, "
               "\"warmup\": %ld, \"rewarm\": %ld, \"beta1\": %.9g, "
               "\"beta2\": %.9g, \"eps\": %.9g, \"wd\": %.9g, "
               "\"clip\": %.9g",
            s.train.grad_accum,
            s.pseudo.share_groups, steps, P, argv[2],
            (double)s.pseudo.lr_scale, (double)s.train.lr,
            (double)s.train.min_lr, s.train.warmup_steps,
            s.delink.rewarm_steps, (double)s.train.beta1,
            (double)s.train.beta2, (double)s.train.eps,
            (double)s.train.weight_decay, (double)s.train.grad_clip);
    const char *key[3] = {"step_lr", "step_norm", "step_loss"};
    const float *val[3] = {lr, norm, loss};
    for (int i = 0; i < 3; i++) {
        fprintf(f, ", \"%s\": [", key[i]);
        for (long k = 0; k < steps; k++)
            fprintf(f, "%s%.9g", k ? ", " : "", (double)val[i][k]);
        fprintf(f, "]");
    }
    fprintf(f, "}\n");
    fclose(f);
    trainer_free(t);
    free(tok);
    free(tens);
    free(names);
    synth_remove(dir);
    printf("dump_p2r_steps: %s lr_scale %s S %s: %ld steps (delink at %ld) "
           "-> %s\n", argv[2], argv[3], argv[4], steps, P, out);
    return 0;
}
