/*
 * bench_args.h — the shape and timing options the training benchmarks share
 * (cpu_train.c, gpu_train.cu): plain C, usable from nvcc too.
 */
#ifndef M6_BENCH_ARGS_H
#define M6_BENCH_ARGS_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"  /* model_config */

/* getopt_long entries (put them first in the benchmark's option table). */
#define BENCH_SHAPE_OPTIONS                                                  \
    {"layers", 1, 0, 'L'}, {"embd", 1, 0, 'C'}, {"heads", 1, 0, 'H'},        \
    {"seq", 1, 0, 'T'}, {"batch", 1, 0, 'B'}, {"vocab", 1, 0, 'V'},          \
    {"share", 1, 0, 'S'}, {"steps", 1, 0, 'n'}, {"warmup", 1, 0, 'w'},       \
    {"peak-n", 1, 0, 'p'}

/* The integer value of option --name: all of arg, in [lo, INT_MAX];
 * otherwise says so on stderr (prog: --name: ...) and exits 2 (usage). */
static inline int bench_int_arg(const char *prog, const char *name,
                                const char *arg, int lo)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || errno || v < lo || v > INT_MAX) {
        fprintf(stderr, "%s: --%s: want an integer >= %d, got \"%s\"\n",
                prog, name, lo, arg);
        exit(2);
    }
    return (int)v;
}

/* The real number in arg, in [lo, hi], or exit 2 naming --name. */
static inline double bench_real_arg(const char *prog, const char *name,
                                    const char *arg, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: --%s: want a number in [%g, %g], got \"%s\"\n",
                prog, name, lo, hi, arg);
        exit(2);
    }
    return v;
}

/* The fraction in arg, strictly between 0 and 1 (one_ok: in (0, 1]), or
 * exit 2 naming --name. */
static inline double bench_frac_arg(const char *prog, const char *name,
                                    const char *arg, int one_ok)
{
    double v = bench_real_arg(prog, name, arg, 0, 1);
    if (v == 0 || (v == 1 && !one_ok)) {
        fprintf(stderr, "%s: --%s: want a fraction %s, got \"%s\"\n", prog,
                name, one_ok ? "in (0, 1]" : "strictly between 0 and 1", arg);
        exit(2);
    }
    return v;
}

/* Which of the two words a and b arg is: 0 for a, 1 for b; otherwise says
 * so on stderr (prog: --name: want a or b, got "arg") and exits 2. */
static inline int bench_choice_arg(const char *prog, const char *name,
                                   const char *arg, const char *a,
                                   const char *b)
{
    if (strcmp(arg, a) == 0)
        return 0;
    if (strcmp(arg, b) == 0)
        return 1;
    fprintf(stderr, "%s: --%s: want %s or %s, got \"%s\"\n", prog, name, a,
            b, arg);
    exit(2);
}

/* bench_choice_arg with a value for each word: va for a, vb for b. */
static inline int bench_pick_arg(const char *prog, const char *name,
                                 const char *arg, const char *a, int va,
                                 const char *b, int vb)
{
    return bench_choice_arg(prog, name, arg, a, b) ? vb : va;
}

/* The end of a benchmark's option switch, for an option o that is none of
 * its own: --help ('h') prints usage on stdout and exits 0; anything else
 * (getopt_long has named it on stderr) prints usage and exits 2. */
static inline void bench_usage_exit(int o, void (*usage)(void))
{
    usage();
    exit(o == 'h' ? 0 : 2);
}

/* After getopt_long: benchmarks take options only, so a stray argument (a
 * typo such as "--steps 5 10") exits 2 instead of running the default
 * benchmark. */
static inline void bench_no_operands(const char *prog, int argc, char **argv)
{
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument \"%s\" (options only; see "
                "--help)\n", prog, argv[optind]);
        exit(2);
    }
}

/* What an option of a benchmark's table parses into. */
typedef enum { BENCH_OPT_INT, BENCH_OPT_REAL, BENCH_OPT_TEXT } bench_opt_kind;

/* One option of a benchmark's table: --name VALUE, parsed by kind into dst
 * (int *, double * or const char **): an integer >= lo (bench_int_arg), a
 * real number in [lo, hi] (bench_real_arg), or the text itself. */
typedef struct {
    const char *name;
    bench_opt_kind kind;
    void *dst;
    double lo, hi;
} bench_opt;

/* Entries of a bench_opt table. */
#define BENCH_INT(name, dst, lo) {name, BENCH_OPT_INT, dst, lo, 0}
#define BENCH_REAL(name, dst, lo, hi) {name, BENCH_OPT_REAL, dst, lo, hi}
#define BENCH_TEXT(name, dst) {name, BENCH_OPT_TEXT, dst, 0, 0}

/* argv parsed by the table opts[0..n) (n <= 32) plus --help, for a
 * benchmark with no other options: each value lands in its dst as it
 * comes. --help prints usage on stdout and exits 0; an unknown option
 * prints usage on stderr and exits 2, as do a bad value (naming its option)
 * and a stray operand (bench_no_operands). prog: the name in messages. */
static inline void bench_parse(const char *prog, int argc, char **argv,
                               const bench_opt *opts, int n,
                               const char *usage)
{
    struct option lo[34];
    if (n > 32)
        n = 32;
    for (int i = 0; i < n; i++)
        lo[i] = (struct option){opts[i].name, required_argument, 0, 256 + i};
    lo[n] = (struct option){"help", no_argument, 0, 'h'};
    lo[n + 1] = (struct option){0, 0, 0, 0};
    int o;
    while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (o < 256 || o >= 256 + n) {
            fputs(usage, o == 'h' ? stdout : stderr);
            exit(o == 'h' ? 0 : 2);
        }
        const bench_opt *b = &opts[o - 256];
        if (b->kind == BENCH_OPT_INT)
            *(int *)b->dst = bench_int_arg(prog, b->name, optarg, (int)b->lo);
        else if (b->kind == BENCH_OPT_REAL)
            *(double *)b->dst = bench_real_arg(prog, b->name, optarg, b->lo,
                                               b->hi);
        else
            *(const char **)b->dst = optarg;
    }
    bench_no_operands(prog, argc, argv);
}

/* Apply option o (from getopt_long) with argument arg: 1 when it was one of
 * BENCH_SHAPE_OPTIONS, 0 when the benchmark must handle it. c: model shape
 * (L, C, NH, T, V); B: sequences per microbatch; S: share groups (0: L);
 * steps, warmup: timed and untimed steps; peak_n: sgemm/GEMM peak size (0:
 * none). A value that is not a whole number in range exits 2 with the
 * option named (bench_int_arg). */
static inline int bench_shape_option(const char *prog, int o, const char *arg,
                                     model_config *c, int *B, int *S,
                                     int *steps, int *warmup, int *peak_n)
{
    switch (o) {
    case 'L': c->n_layer = bench_int_arg(prog, "layers", arg, 1); return 1;
    case 'C': c->n_embd = bench_int_arg(prog, "embd", arg, 1); return 1;
    case 'H': c->n_head = bench_int_arg(prog, "heads", arg, 1); return 1;
    case 'T': c->seq_len = bench_int_arg(prog, "seq", arg, 1); return 1;
    case 'V': c->vocab_size = bench_int_arg(prog, "vocab", arg, 2); return 1;
    case 'B': *B = bench_int_arg(prog, "batch", arg, 1); return 1;
    case 'S': *S = bench_int_arg(prog, "share", arg, 1); return 1;
    case 'n': *steps = bench_int_arg(prog, "steps", arg, 1); return 1;
    case 'w': *warmup = bench_int_arg(prog, "warmup", arg, 0); return 1;
    case 'p': *peak_n = bench_int_arg(prog, "peak-n", arg, 0); return 1;
    default: return 0;
    }
}

/* getopt_long over argv with the table opts (short options: only "h"),
 * applying every option of BENCH_SHAPE_OPTIONS as it comes
 * (bench_shape_option, to the same c, B, S, steps, warmup and peak_n):
 * the next option the benchmark handles itself, or -1 when there are none
 * left. */
static inline int bench_next_option(const char *prog, int argc, char **argv,
                                    const struct option *opts,
                                    model_config *c, int *B, int *S,
                                    int *steps, int *warmup, int *peak_n)
{
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1)
        if (!bench_shape_option(prog, o, optarg, c, B, S, steps, warmup,
                                peak_n))
            return o;
    return -1;
}

/* The relations between the shape options: 0, or -1 after saying on stderr
 * which one does not hold. S: share groups, already defaulted to L. */
static inline int bench_shape_check(const char *prog, const model_config *c,
                                    int S)
{
    if (c->n_embd % c->n_head) {
        fprintf(stderr, "%s: --embd %d is not a multiple of --heads %d\n",
                prog, c->n_embd, c->n_head);
        return -1;
    }
    if (S > c->n_layer) {
        fprintf(stderr, "%s: %d share groups (slots), more than --layers "
                "(%d)\n", prog, S, c->n_layer);
        return -1;
    }
    return 0;
}

/* After the option loop of a benchmark on BENCH_SHAPE_OPTIONS: no stray
 * operand (bench_no_operands), *S (share groups; 0 when not given)
 * defaulted to c's n_layer, and the shape relations hold
 * (bench_shape_check). 0, or -1 after saying on stderr which one does
 * not (the benchmark exits 2). */
static inline int bench_shape_done(const char *prog, int argc, char **argv,
                                   const model_config *c, int *S)
{
    bench_no_operands(prog, argc, argv);
    if (*S <= 0)
        *S = c->n_layer;
    return bench_shape_check(prog, c, *S);
}

#endif /* M6_BENCH_ARGS_H */
