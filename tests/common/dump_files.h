/*
 * dump_files.h — the two files the oracle dumpers (tests/unit/dump_model.c,
 * dump_adafactor.c, dump_p2r_steps.c) leave for their Python references: a
 * safetensors file of tensors (ckpt/checkpoint.h's writer) and a JSON side
 * file of the run's settings. Each fails with one line naming the program
 * and the path.
 */
#ifndef M6_TESTS_DUMP_FILES_H
#define M6_TESTS_DUMP_FILES_H

#include <stdio.h>

#include "ckpt/checkpoint.h"
#include "spec/spec.h"  /* model_config */

/* Write the n tensors ts (F32) to the safetensors file path: 0, or -1
 * after saying on stderr "prog: cannot write path: why". */
static inline int dump_tensors(const char *prog, const char *path,
                               const st_tensor *ts, int n)
{
    char err[256] = "";
    FILE *f = fopen(path, "wb");
    long w = f ? safetensors_write(f, ts, n, err, sizeof err) : -1;
    if (f && fclose(f) != 0)
        w = -1;
    if (w < 0) {
        fprintf(stderr, "%s: cannot write %s%s%s\n", prog, path,
                *err ? ": " : "", err);
        return -1;
    }
    return 0;
}

/* path opened for writing the JSON side file, or NULL after saying on
 * stderr "prog: cannot write path". */
static inline FILE *dump_json_open(const char *prog, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
    return f;
}

/* Open the side file's JSON object with the model's shape, as the oracles
 * read it: {"V", "L", "NH", "C", "T" (model c) and "B" (sequences per
 * microbatch); the caller writes the rest (each member after a ", ") and
 * the closing brace. */
static inline void dump_json_shape(FILE *f, const model_config *c, int B)
{
    fprintf(f, "{\"V\": %d, \"L\": %d, \"NH\": %d, \"C\": %d, \"T\": %d, "
               "\"B\": %d", c->vocab_size, c->n_layer, c->n_head, c->n_embd,
            c->seq_len, B);
}

#endif /* M6_TESTS_DUMP_FILES_H */
