/*
 * synth_data.h — test helper: a temporary directory of token shards holding
 * a synthetic, learnable byte stream (a repeated sentence with 1/16 random
 * letters), 3/4 train and 1/4 val, written with shard_write. Shared by the
 * engine tests (unit/) and the GPU trainer test (gpu/).
 */
#ifndef M6_TEST_SYNTH_DATA_H
#define M6_TEST_SYNTH_DATA_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/corpus/corpus.h"
#include "spec/spec.h"

/* Make dir (a mkdtemp template such as "/tmp/m6-test-XXXXXX", rewritten in
 * place) and write train_000000.bin and val_000000.bin of n tokens in all.
 * 0, or -1 with the reason on stderr. */
static inline int synth_shards(char *dir, size_t n)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    const char *text = "the quick brown fox jumps over the lazy dog. ";
    size_t tl = strlen(text);
    uint16_t *tok = malloc(n * sizeof(uint16_t));
    if (!tok)
        return -1;
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (s >> 60) == 0 ? (uint16_t)('a' + (s >> 33) % 26)
                                : (uint16_t)(unsigned char)text[i % tl];
    }
    char path[512], err[256];
    int rc = 0;
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    if (shard_write(path, tok, n * 3 / 4, err, sizeof err) != 0)
        rc = -1;
    snprintf(path, sizeof path, "%s/val_000000.bin", dir);
    if (rc == 0 && shard_write(path, tok + n * 3 / 4, n / 4, err, sizeof err) != 0)
        rc = -1;
    if (rc != 0)
        fprintf(stderr, "shard_write: %s\n", err);
    free(tok);
    return rc;
}

/* synth_shards of n tokens in a new directory /tmp/m6-PROG.XXXXXX, whose
 * name is left in dir (dirlen bytes): 0, or -1 after saying on stderr
 * "prog: cannot make temporary data". */
static inline int synth_shards_tmp(char *dir, size_t dirlen, const char *prog,
                                   size_t n)
{
    snprintf(dir, dirlen, "/tmp/m6-%s.XXXXXX", prog);
    if (synth_shards(dir, n) != 0) {
        fprintf(stderr, "%s: cannot make temporary data\n", prog);
        return -1;
    }
    return 0;
}

/* Point a spec's data globs at the shards in dir. */
static inline void synth_spec_data(run_spec *s, const char *dir)
{
    snprintf(s->data.train, sizeof s->data.train, "%s/train_*.bin", dir);
    snprintf(s->data.val, sizeof s->data.val, "%s/val_*.bin", dir);
}

/* The small spec the engine tests train: V 256, L layers of C 16 (2 heads),
 * T 16, B 4 x 2 microbatches, warmup 5, cosine 3e-3 -> 3e-4, eval every 10
 * steps over 2 batches, re-warm 3 steps after delink, data in dir. */
static inline run_spec synth_tiny_spec(const char *dir, int n_layer, long steps,
                                       long pseudo_steps)
{
    run_spec s;
    spec_defaults(&s);
    synth_spec_data(&s, dir);
    s.model = (model_config){.vocab_size = 256, .n_layer = n_layer,
                             .n_head = 2, .n_embd = 16, .seq_len = 16};
    s.pseudo.share_groups = 1;
    s.pseudo.steps = pseudo_steps;
    s.train.steps = steps;
    s.train.batch_size = 4;
    s.train.grad_accum = 2;
    s.train.lr = 3e-3f;
    s.train.min_lr = 3e-4f;
    s.train.warmup_steps = 5;
    s.train.eval_every = 10;
    s.train.eval_batches = 2;
    s.delink.rewarm_steps = 3;
    return s;
}

/* n random inputs and targets in [0, V) from seed (a 64-bit LCG, the high
 * bits of each state): the same batch for the same seed everywhere. */
static inline void synth_random_batch(int32_t *inp, int32_t *tgt, int n,
                                      int V, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        inp[i] = (int32_t)((seed >> 33) % (uint64_t)V);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tgt[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
}

/* Make m the MoE the engine tests train: E 4 experts in k 2 prototypes,
 * every `every`-th block MoE, expert hidden size `hidden`, capacity
 * factor `capacity` (2 at evaluation), router aux 0.01 and z 0.001. */
static inline void synth_tiny_moe(model_config *m, int every, int hidden,
                                  float capacity)
{
    m->moe_experts = 4;
    m->moe_prototypes = 2;
    m->moe_every = every;
    m->moe_hidden = hidden;
    m->moe_capacity_factor = capacity;
    m->moe_eval_capacity_factor = 2.0f;
    m->moe_aux_coef = 0.01f;
    m->moe_z_coef = 0.001f;
}

/* Remove dir and everything in it. 0 or -1. */
static inline int synth_remove(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
