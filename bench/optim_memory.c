/*
 * optim_memory.c — the bytes per parameter of the CPU model's weights and
 * optimizer state as the allocator reports them (malloc_usable_size of
 * each buffer gpt_create_optim made, and mallinfo2's in-use bytes around
 * the whole model), and of the weights in a checkpoint file (its size on
 * disk), for AdamW and Adafactor without a first moment, each with fp32
 * and bf16 master weights (optimizer.master), on a matrix-heavy model.
 * Measured, not computed: model/facts.h says what they should be.
 *
 *   optim_memory [--embd C] [--layers L]
 *
 * Ends with one key=value line.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "model/facts.h"
#include "model/gpt.h"

static size_t usable_(const void *p) { return p ? malloc_usable_size((void *)p) : 0; }

static size_t in_use_(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Bytes of a checkpoint file holding g's weights (globals and every
 * slot as one tensor each), BF16 with bf16 masters: stat of the file. */
static long ckpt_bytes_(const gpt_model *g, const char *path)
{
    int n = 1 + g->S;
    st_tensor *ts = calloc((size_t)n, sizeof *ts);
    unsigned char *bf = calloc((size_t)n, 1);
    char (*names)[32] = calloc((size_t)n, sizeof *names);
    if (!ts || !bf || !names)
        return -1;
    snprintf(names[0], sizeof names[0], "globals");
    ts[0] = (st_tensor){names[0], g->params, 1, {(long)g->n_global, 0}};
    for (int s = 0; s < g->S; s++) {
        snprintf(names[1 + s], sizeof names[0], "slot.%d", s);
        ts[1 + s] = (st_tensor){names[1 + s], g->slots[s].params, 1,
                                {(long)gpt_slot_floats(g, s), 0}};
    }
    memset(bf, g->master_bf16, (size_t)n);
    FILE *f = fopen(path, "wb");
    char err[256];
    long rc = f ? safetensors_write_dtypes(f, ts, bf, n, err, sizeof err) : -1;
    if (f)
        fclose(f);
    if (rc < 0)
        fprintf(stderr, "optim_memory: %s: %s\n", path, f ? err : "open");
    struct stat st;
    long size = rc >= 0 && stat(path, &st) == 0 ? (long)st.st_size : -1;
    unlink(path);
    free(ts);
    free(bf);
    free(names);
    return size;
}

int main(int argc, char **argv)
{
    model_config c = {.vocab_size = 256, .n_layer = 4, .n_head = 8,
                      .n_embd = 512, .seq_len = 64};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--embd") == 0)
            c.n_embd = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--layers") == 0)
            c.n_layer = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: optim_memory [--embd C] [--layers L]\n");
            return 2;
        }
    }
    if (c.n_embd < 8 || c.n_embd % c.n_head || c.n_layer < 1) {
        fprintf(stderr, "optim_memory: --embd must be a multiple of 8, "
                "--layers >= 1\n");
        return 2;
    }
    size_t P = model_params(&c, c.n_layer);
    printf("model: V %d, L %d, C %d, T %d: %zu parameters (%.1f%% in "
           "matrices of the blocks)\n", c.vocab_size, c.n_layer, c.n_embd,
           c.seq_len, P,
           100.0 * 12.0 * c.n_embd * c.n_embd * c.n_layer / (double)P);
    static const char *names[4] = {"adamw fp32", "adamw bf16",
                                   "adafactor b1=0 fp32",
                                   "adafactor b1=0 bf16"};
    double per[4];
    char path[64];
    snprintf(path, sizeof path, "/tmp/optim_memory.%d", (int)getpid());
    printf("%-20s %12s %12s %12s %10s %12s %10s\n", "setting", "weights B",
           "optim B", "w+optim B/p", "model B/p", "ckpt w B", "ckpt B/p");
    for (int k = 0; k < 4; k++) {
        gpt_optim o = {k >= 2, 0, k % 2, 1337, 0};
        gpt_model g;
        size_t before = in_use_();
        if (gpt_create_optim(&g, &c, c.n_layer, 1, NULL, &o) != 0) {
            perror("optim_memory: gpt_create_optim");
            return 1;
        }
        size_t whole = in_use_() - before;
        gpt_init_weights(&g, 1337);
        size_t w = usable_(g.params), opt = usable_(g.m) + usable_(g.v);
        long ck = ckpt_bytes_(&g, path);
        per[k] = (double)(w + opt) / (double)P;
        printf("%-20s %12zu %12zu %12.3f %10.3f %12ld %10.3f\n", names[k], w,
               opt, per[k], (double)whole / (double)P, ck,
               (double)ck / (double)P);
        gpt_free(&g);
        if (ck < 0)
            return 1;
    }
    printf("(w+optim: malloc_usable_size of params, m, v; model: mallinfo2 "
           "in-use growth over gpt_create_optim, gradients and activations "
           "included; ckpt: the weights' safetensors file)\n");
    printf("ratios of weights+optimizer bytes: adamw bf16/fp32 %.3f, "
           "adafactor b1=0 fp32/adamw fp32 %.3f, adafactor b1=0 bf16/adamw "
           "fp32 %.3f\n", per[1] / per[0], per[2] / per[0], per[3] / per[0]);
    printf("adamw_fp32=%.3f adamw_bf16=%.3f adafactor_fp32=%.3f "
           "adafactor_bf16=%.3f\n", per[0], per[1], per[2], per[3]);
    return 0;
}
