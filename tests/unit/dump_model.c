/*
 * dump_model.c — test helper for torch_reference.py: builds a small model
 * with S slots, runs one forward+backward on a seeded random batch, and
 * writes weights, batch, loss and gradients to a safetensors file (plus the
 * config in a JSON sidecar). The Python side recomputes all of it with
 * PyTorch autograd, independently of this code.
 *
 * usage: dump_model [--bf16] OUT.safetensors S [L C NH T V B [E k H CF AUX Z
 *                   [EVERY]]]
 * (--bf16: the GEMMs in bf16, kernels.h's GEMM_BF16; the dumped config says
 * "precision")
 * (the second group: every block MoE, kernels.h "mixture of experts", with
 * E experts in k prototypes of hidden size H, capacity factor CF and the
 * aux and z loss coefficients; the dumped loss is the LM loss alone, the
 * gradients those of the training loss with both router losses; EVERY,
 * default 1, puts MoE in block l when (l+1) % EVERY == 0 and a dense MLP in
 * the others, slots of two kinds on gpt_default_share_map)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model/gpt.h"
#include "ckpt/checkpoint.h"
#include "../common/dump_files.h"

int main(int argc, char **argv)
{
    gemm_precision prec = GEMM_FP32;
    if (argc > 1 && strcmp(argv[1], "--bf16") == 0) {
        prec = GEMM_BF16;
        argv++;
        argc--;
    }
    gemm_set_precision(prec);
    if (argc < 3) {
        fprintf(stderr, "usage: dump_model OUT.safetensors S [L C NH T V B]\n");
        return 2;
    }
    model_config cfg = {.vocab_size = 37, .n_layer = 3, .n_head = 2,
                        .n_embd = 16, .seq_len = 8};
    int S = atoi(argv[2]), B = 3;
    if (argc >= 9) {
        cfg.n_layer = atoi(argv[3]);
        cfg.n_embd = atoi(argv[4]);
        cfg.n_head = atoi(argv[5]);
        cfg.seq_len = atoi(argv[6]);
        cfg.vocab_size = atoi(argv[7]);
        B = atoi(argv[8]);
    }
    if (argc >= 15) {
        cfg.moe_experts = atoi(argv[9]);
        cfg.moe_prototypes = atoi(argv[10]);
        cfg.moe_hidden = atoi(argv[11]);
        cfg.moe_every = 1;
        cfg.moe_capacity_factor = (float)atof(argv[12]);
        cfg.moe_eval_capacity_factor = cfg.moe_capacity_factor;
        cfg.moe_aux_coef = (float)atof(argv[13]);
        cfg.moe_z_coef = (float)atof(argv[14]);
        if (argc >= 16)
            cfg.moe_every = atoi(argv[15]);
    }
    gpt_model g;
    if (gpt_create(&g, &cfg, S, B) != 0) {
        perror("gpt_create");
        return 1;
    }
    gpt_init_weights(&g, 42);
    /* Larger-than-GPT-2 random LN params and biases so every path matters. */
    uint64_t x = 7;
    for (size_t i = 0; i < g.n_params; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float r = (float)((x >> 40) / (double)(1 << 24)) - 0.5f;
        g.params[i] += 0.1f * r;
    }
    int T = cfg.seq_len, BT = B * T;
    int32_t *inp = malloc(BT * sizeof(int32_t)), *tgt = malloc(BT * sizeof(int32_t));
    float *inpf = malloc(BT * sizeof(float)), *tgtf = malloc(BT * sizeof(float));
    for (int i = 0; i < BT; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        inp[i] = (int32_t)((x >> 33) % (uint64_t)cfg.vocab_size);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tgt[i] = (int32_t)((x >> 33) % (uint64_t)cfg.vocab_size);
        inpf[i] = (float)inp[i];
        tgtf[i] = (float)tgt[i];
    }
    gpt_zero_grad(&g);
    float loss = gpt_forward(&g, inp, tgt, B);
    gpt_backward(&g, inp, tgt, B, 1.0f / (float)BT);

    int per = GLOB_NTENSORS + S * SLOT_NTENSORS_MAX;
    st_tensor *ts = calloc((size_t)(2 * per + 3), sizeof *ts);
    char **names = calloc((size_t)(2 * per), sizeof *names);
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        float *buf = pass ? g.grads : g.params;
        const char *pre = pass ? "grad." : "";
        char nm[160];
        for (int i = 0; i < GLOB_NTENSORS; i++, n++) {
            gpt_tensor_name(nm, sizeof nm, pre, -1, &g.glob[i]);
            names[n] = strdup(nm);
            ts[n] = (st_tensor){names[n], buf + g.glob[i].offset,
                                g.glob[i].cols ? 2 : 1,
                                {g.glob[i].rows, g.glob[i].cols}};
        }
        for (int s = 0; s < S; s++)
            for (int i = 0; i < gpt_slot_ntensors_of(&g, s); i++, n++) {
                const gpt_tensor *st = &gpt_slot_tensors(&g, s)[i];
                gpt_tensor_name(nm, sizeof nm, pre, s, st);
                names[n] = strdup(nm);
                ts[n] = (st_tensor){names[n],
                                    gpt_slot_ptr(&g, buf, s) + st->offset,
                                    st->cols ? 2 : 1, {st->rows, st->cols}};
            }
    }
    ts[n++] = (st_tensor){"inputs", inpf, 2, {B, T}};
    ts[n++] = (st_tensor){"targets", tgtf, 2, {B, T}};
    ts[n++] = (st_tensor){"loss", &loss, 1, {1, 0}};
    if (dump_tensors("dump_model", argv[1], ts, n) < 0)
        return 1;
    char side[4096];
    snprintf(side, sizeof side, "%s.json", argv[1]);
    FILE *f = dump_json_open("dump_model", side);
    if (!f)
        return 1;
    dump_json_shape(f, &cfg, B);
    fprintf(f, ", \"S\": %d, \"E\": %d, \"k\": %d, \"H\": %d, "
               "\"CF\": %.9g, \"AUX\": %.9g, \"Z\": %.9g, \"dropped\": %ld, "
               "\"precision\": \"%s\", \"slot_of\": [",
            S, cfg.moe_experts, cfg.moe_prototypes,
            model_moe_hidden(&cfg), (double)cfg.moe_capacity_factor,
            (double)cfg.moe_aux_coef, (double)cfg.moe_z_coef,
            g.moe_stats.dropped, gemm_precision_name(prec));
    for (int l = 0; l < cfg.n_layer; l++)
        fprintf(f, "%s%d", l ? ", " : "", g.slot_of[l]);
    fprintf(f, "]}\n");
    fclose(f);
    printf("dump_model: S=%d loss=%.6f -> %s\n", S, loss, argv[1]);
    for (int i = 0; i < 2 * per && names[i]; i++)
        free(names[i]);
    free(names);
    free(ts);
    free(inp);
    free(tgt);
    free(inpf);
    free(tgtf);
    gpt_free(&g);
    return 0;
}
