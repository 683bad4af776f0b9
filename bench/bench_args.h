/*
 * bench_args.h — the shape and timing options the training benchmarks share
 * (cpu_train.c, gpu_train.cu): plain C, usable from nvcc too.
 */
#ifndef M6_BENCH_ARGS_H
#define M6_BENCH_ARGS_H

#include <getopt.h>
#include <stdlib.h>

#include "train/spec.h"  /* model_config */

/* getopt_long entries (put them first in the benchmark's option table). */
#define BENCH_SHAPE_OPTIONS                                                  \
    {"layers", 1, 0, 'L'}, {"embd", 1, 0, 'C'}, {"heads", 1, 0, 'H'},        \
    {"seq", 1, 0, 'T'}, {"batch", 1, 0, 'B'}, {"vocab", 1, 0, 'V'},          \
    {"share", 1, 0, 'S'}, {"steps", 1, 0, 'n'}, {"warmup", 1, 0, 'w'},       \
    {"peak-n", 1, 0, 'p'}

/* Apply option o (from getopt_long) with argument arg: 1 when it was one of
 * BENCH_SHAPE_OPTIONS, 0 when the benchmark must handle it. c: model shape
 * (L, C, NH, T, V); B: sequences per microbatch; S: share groups (0: L);
 * steps, warmup: timed and untimed steps; peak_n: sgemm/GEMM peak size. */
static inline int bench_shape_option(int o, const char *arg, model_config *c,
                                     int *B, int *S, int *steps, int *warmup,
                                     int *peak_n)
{
    switch (o) {
    case 'L': c->n_layer = atoi(arg); return 1;
    case 'C': c->n_embd = atoi(arg); return 1;
    case 'H': c->n_head = atoi(arg); return 1;
    case 'T': c->seq_len = atoi(arg); return 1;
    case 'V': c->vocab_size = atoi(arg); return 1;
    case 'B': *B = atoi(arg); return 1;
    case 'S': *S = atoi(arg); return 1;
    case 'n': *steps = atoi(arg); return 1;
    case 'w': *warmup = atoi(arg); return 1;
    case 'p': *peak_n = atoi(arg); return 1;
    default: return 0;
    }
}

#endif /* M6_BENCH_ARGS_H */
