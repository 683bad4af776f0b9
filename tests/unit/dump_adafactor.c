/*
 * dump_adafactor.c — test helper for torch_adafactor.py: Adafactor steps
 * of a small model (daemon/model/gpt.c with gpt_adafactor, fp32), dumped
 * so that an independent float64 reference can redo the optimizer:
 *   OUT/steps.safetensors
 *     init.<name>      every parameter tensor before step 1
 *     grad<k>.<name>   step k's gradient (k = 0..STEPS-1), as backward
 *                      left it, before the global-norm clip
 *     scale<k>         (1) the clip factor that step applied (min(1,
 *                      clip / norm))
 *     final.<name>     every parameter tensor after the last step
 *   OUT/run.json       the hyperparameters
 * Tensors are the checkpoint's (gpt_slot_ckpt_tensors: an MoE slot's per
 * expert and per prototype gate), 2-D (rows, cols) or 1-D.
 *
 * usage: dump_adafactor OUT STEPS BETA1 CLIP_THRESHOLD SCALE_PARAMETER MOE
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/checkpoint.h"
#include "kernels.h"
#include "model/gpt.h"
#include "../common/dump_files.h"

#define MAX_TENSORS 256

typedef struct {
    char name[80];
    float *p;        /* in the model's params */
    size_t off, n;   /* floats from the params' start */
    int rows, cols;
} tens_;

/* Every tensor of g (plain layout) with its checkpoint name. */
static int tensors_(const gpt_model *g, tens_ *out)
{
    int n = 0;
    for (int i = 0; i < GLOB_NTENSORS; i++, n++) {
        const gpt_tensor *t = &g->glob[i];
        snprintf(out[n].name, sizeof out[n].name, "%.60s", t->name);
        out[n].off = t->offset;
        out[n].rows = t->rows;
        out[n].cols = t->cols;
    }
    for (int s = 0; s < g->S; s++) {
        gpt_ckpt_tensor ct[MAX_TENSORS];
        int nt = gpt_slot_ckpt_tensors(&g->cfg, g->slot_moe[s], NULL);
        if (nt > MAX_TENSORS || n + nt > MAX_TENSORS)
            return -1;
        gpt_slot_ckpt_tensors(&g->cfg, g->slot_moe[s], ct);
        for (int i = 0; i < nt; i++, n++) {
            snprintf(out[n].name, sizeof out[n].name, "slots.%d.%.47s", s,
                     ct[i].name);
            out[n].off = g->n_global + g->slot_off[s] + ct[i].offset;
            out[n].rows = ct[i].rows;
            out[n].cols = ct[i].cols;
        }
    }
    for (int i = 0; i < n; i++)
        out[i].n = (size_t)out[i].rows * (out[i].cols ? out[i].cols : 1);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: dump_adafactor OUT STEPS BETA1 "
                        "CLIP_THRESHOLD SCALE_PARAMETER MOE\n");
        return 2;
    }
    const char *out = argv[1];
    int steps = atoi(argv[2]), moe = atoi(argv[6]);
    if (steps < 1 || steps > 50)
        return 2;
    model_config cfg = {.vocab_size = 61, .n_layer = 2, .n_head = 2,
                        .n_embd = 16, .seq_len = 8, .moe_experts = 0,
                        .moe_prototypes = 1, .moe_every = 1,
                        .moe_hidden = 0, .moe_capacity_factor = 2.0f,
                        .moe_eval_capacity_factor = 2.0f,
                        .moe_aux_coef = 0.01f, .moe_z_coef = 0.001f};
    if (moe) {
        cfg.moe_experts = 4;
        cfg.moe_prototypes = 2;
        cfg.moe_hidden = 24;
    }
    int B = 3, T = cfg.seq_len, S = 2;
    float lr = 0.01f, wd = 0.1f, clip = 1.0f;
    adafactor_hparams h = {lr, (float)atof(argv[3]), 0.8f,
                           (float)atof(argv[4]), 1e-30f, 1e-3f,
                           atoi(argv[5]), 1.0f};
    gpt_optim o = {1, h.beta1 > 0, 0, 0, 0};
    gpt_model g;
    if (gpt_create_optim(&g, &cfg, S, B, NULL, &o) != 0) {
        perror("dump_adafactor: gpt_create_optim");
        return 1;
    }
    gpt_init_weights(&g, 42);
    static tens_ ts[MAX_TENSORS];
    int nt = tensors_(&g, ts);
    if (nt < 0)
        return 1;
    size_t np = g.n_params;
    /* init, steps x grads, scales, final */
    float *mem = malloc((size_t)(steps + 2) * np * sizeof(float));
    float *scales = malloc((size_t)steps * sizeof(float));
    size_t nst = (size_t)(steps + 2) * nt + steps;
    st_tensor *st = calloc(nst, sizeof *st);
    char (*names)[100] = calloc(nst, sizeof *names);
    int32_t *inp = malloc((size_t)B * T * sizeof *inp);
    int32_t *tgt = malloc((size_t)B * T * sizeof *tgt);
    if (!mem || !scales || !st || !names || !inp || !tgt)
        return 1;
    memcpy(mem, g.params, np * sizeof(float));
    unsigned long long rng = 7;
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < B * T; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            inp[i] = (int32_t)((rng >> 33) % (unsigned)cfg.vocab_size);
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            tgt[i] = (int32_t)((rng >> 33) % (unsigned)cfg.vocab_size);
        }
        gpt_zero_grad(&g);
        gpt_forward(&g, inp, tgt, B);
        gpt_backward(&g, inp, tgt, B, 1.0f / (float)(B * T));
        gpt_grads_settle(&g);
        float norm = gpt_grad_norm(&g);
        h.grad_scale = norm > clip ? clip / norm : 1.0f;
        scales[k] = h.grad_scale;
        memcpy(mem + (size_t)(k + 1) * np, g.grads, np * sizeof(float));
        if (gpt_adafactor(&g, &h, wd) != 0) {
            perror("dump_adafactor: gpt_adafactor");
            return 1;
        }
    }
    memcpy(mem + (size_t)(steps + 1) * np, g.params, np * sizeof(float));
    int n = 0;
    for (int b = 0; b < steps + 2; b++)
        for (int i = 0; i < nt; i++, n++) {
            if (b == 0)
                snprintf(names[n], sizeof names[0], "init.%.79s", ts[i].name);
            else if (b == steps + 1)
                snprintf(names[n], sizeof names[0], "final.%.79s", ts[i].name);
            else
                snprintf(names[n], sizeof names[0], "grad%d.%.79s", b - 1,
                         ts[i].name);
            st[n] = (st_tensor){names[n], mem + (size_t)b * np + ts[i].off,
                                ts[i].cols ? 2 : 1,
                                {ts[i].rows, ts[i].cols}};
        }
    for (int k = 0; k < steps; k++, n++) {
        snprintf(names[n], sizeof names[0], "scale%d", k);
        st[n] = (st_tensor){names[n], scales + k, 1, {1, 0}};
    }
    char path[512];
    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/steps.safetensors", out);
    if (dump_tensors("dump_adafactor", path, st, n) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/run.json", out);
    FILE *f = dump_json_open("dump_adafactor", path);
    if (!f)
        return 1;
    fprintf(f, "{\"steps\": %d, \"lr\": %.9g, \"wd\": %.9g, \"beta1\": %.9g, "
               "\"decay_rate\": %.9g, \"clip_threshold\": %.9g, "
               "\"eps1\": %.9g, \"eps2\": %.9g, \"scale_parameter\": %d}\n",
            steps, (double)lr, (double)wd, (double)h.beta1,
            (double)h.decay_rate, (double)h.clip_threshold, (double)h.eps1,
            (double)h.eps2, h.scale_parameter);
    fclose(f);
    gpt_free(&g);
    free(mem);
    free(scales);
    free(st);
    free(names);
    free(inp);
    free(tgt);
    return 0;
}
