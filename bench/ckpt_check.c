/*
 * ckpt_check.c — do checkpoints load? For bench/crash_soak: builds the
 * trainer of a run's spec once and loads each checkpoint directory given
 * into it with trainer_load (meta.json, both safetensors files, the spec
 * hash), as m6d would on a restart.
 *
 *   ckpt_check SPEC.json DIR...
 *
 * SPEC.json: the run's spec as m6d stored it (runs.spec in m6.db), whose
 * hash the checkpoints carry.
 *
 * One line per directory ("ok STEP DIR" or "bad DIR: why"), then
 * checkpoints=N bad=M; exit 0 when every one loads, 1 otherwise, 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"
#include "train/trainer.h"

static char *slurp_(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (n + 4096 > cap) {
            char *nb = realloc(buf, cap = 2 * cap + 4096);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        r = fread(buf + n, 1, cap - n, f);
        n += r;
    } while (r > 0);
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ckpt_check SPEC.json DIR...\n");
        return 2;
    }
    size_t len;
    char *json = slurp_(argv[1], &len);
    if (!json) {
        fprintf(stderr, "ckpt_check: %s: cannot read\n", argv[1]);
        return 2;
    }
    run_spec spec;
    char e[1024];
    if (spec_parse(&spec, json, len, e, sizeof e) != 0) {
        fprintf(stderr, "ckpt_check: %s: %s\n", argv[1], e);
        return 2;
    }
    free(json);
    m6_err err = M6_ERR_NONE;
    trainer *t = trainer_create(&spec, &err);
    if (!t) {
        fprintf(stderr, "ckpt_check: trainer_create: %s\n", m6_err_msg(&err));
        return 2;
    }
    int bad = 0;
    for (int i = 2; i < argc; i++) {
        if (trainer_load(t, argv[i], &err) != 0) {
            printf("bad %s: %s\n", argv[i], m6_err_msg(&err));
            bad++;
            /* a failed load may leave the model undefined: a new one */
            trainer_free(t);
            if (!(t = trainer_create(&spec, &err))) {
                fprintf(stderr, "ckpt_check: trainer_create: %s\n",
                        m6_err_msg(&err));
                return 2;
            }
        } else {
            printf("ok %ld %s\n", trainer_step_count(t), argv[i]);
        }
    }
    trainer_free(t);
    m6_err_free(&err);
    printf("checkpoints=%d bad=%d\n", argc - 2, bad);
    return bad ? 1 : 0;
}
