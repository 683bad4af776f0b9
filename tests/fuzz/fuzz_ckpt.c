/*
 * fuzz_ckpt.c — libFuzzer target: checkpoint loading. The daemon's
 * trainer_load (daemon/train/trainer.c: meta.json, then model.safetensors
 * and optimizer.safetensors through daemon/ckpt/checkpoint.c) and m6ctl
 * export's reader of the same directory (weights_load, client/export.c),
 * on arbitrary file contents.
 *
 * The input is the three files joined by the line "\n--m6fuzz--\n":
 * meta.json, model.safetensors, optimizer.safetensors (a part left out is
 * an empty file; nothing after a third separator). They are written to a
 * checkpoint dir and loaded into a tiny CPU trainer (2 layers, C 16, V 64;
 * made fresh for each input, as loading re-lays its slots) and read by
 * weights_load with the same model.
 *
 * Beyond "no crash, no sanitizer report": a refusal has a message; and
 * when both readers accept the files, they hold the same parameters: the
 * trainer's (trainer_copy_state) equal weights_load's, bit for bit. A
 * violation aborts.
 *
 * Seeds: M6_FUZZ_CKPT_SEED=FILE runs the trainer M6_FUZZ_CKPT_STEPS steps
 * (default 2; delinked after the second, as the phase policy would), writes its checkpoint with
 * trainer_save (the code's own writer), joins its files into FILE and
 * exits: tests/fuzz/corpus/ckpt/pseudo (2 steps) and real (3) were made
 * so; the others are cut or broken copies of them.
 * Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/export.h"
#include "common/log.h"
#include "train/data.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "fuzz_util.h"

#define SEP "\n--m6fuzz--\n"

static char dir_[256];
static run_spec spec_;
static const char *const files_[3] = {"meta.json", "model.safetensors",
                                      "optimizer.safetensors"};

static void fail_(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_ckpt: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    abort();
}

/* A shard of n tokens (ids < 64) in the llm.c layout (data.h). */
static void shard_(const char *path, int n)
{
    FILE *f = fopen(path, "wb");
    if (!f) fail_("cannot write", path);
    int32_t hdr[256] = {SHARD_MAGIC, SHARD_VERSION, n};
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)((i * 7 + i / 5) % 64);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

/* A trainer on the tiny spec; the data globs are relative ("t/..."), so
 * the spec (and its hash, in meta.json) is the same in every temp dir. */
static trainer *trainer_(void)
{
    int cwd = open(".", O_RDONLY | O_DIRECTORY);
    if (cwd < 0 || chdir(dir_) != 0) fail_("chdir", dir_);
    m6_err e = M6_ERR_NONE;
    trainer *t = trainer_create(&spec_, &e);
    if (!t) fail_("trainer_create", e.msg);
    if (fchdir(cwd) != 0) fail_("fchdir", NULL);
    close(cwd);
    return t;
}

static void rm_dir_(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (dir_[0] && system(cmd) != 0) fprintf(stderr, "fuzz_ckpt: rm %s failed\n", dir_);
}

static void setup_(void)
{
    snprintf(dir_, sizeof dir_, "%s/m6fuzz-ckpt-XXXXXX", fuzz_tmpdir());
    if (!mkdtemp(dir_)) fail_("mkdtemp", NULL);
    atexit(rm_dir_);
    log_set_level(LOG_ERROR);
    char p[300];
    snprintf(p, sizeof p, "%s/t", dir_);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/t/train_0.bin", dir_);
    shard_(p, 4096);
    snprintf(p, sizeof p, "%s/t/val_0.bin", dir_);
    shard_(p, 1024);
    snprintf(p, sizeof p, "%s/ck", dir_);
    mkdir(p, 0700);
    static const char json[] =
        "{\"name\": \"fuzz\", \"data\": {\"train\": \"t/train_*.bin\", "
        "\"val\": \"t/val_*.bin\"}, \"model\": {\"vocab_size\": 64, "
        "\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 2, \"seq_len\": 8}, "
        "\"pseudo\": {\"steps\": 2}, \"train\": {\"steps\": 4, "
        "\"batch_size\": 2, \"seed\": 3}, \"device\": {\"threads\": 1}}";
    char err[1024];
    if (spec_parse(&spec_, json, strlen(json), err, sizeof err) != 0)
        fail_("spec", err);
}

static void write_seed_(const char *out, int steps)
{
    trainer *t = trainer_();
    step_result r;
    m6_err e = M6_ERR_NONE;
    for (int i = 0; i < steps; i++) {
        if (i == 2) {  /* the phase policy's delink (runner.c) */
            char de[256];
            if (trainer_delink(t, de, sizeof de) != 0) fail_("trainer_delink", de);
        }
        if (trainer_step(t, &r, &e) != 0) fail_("trainer_step", e.msg);
    }
    char ck[300];
    snprintf(ck, sizeof ck, "%s/seed", dir_);
    if (trainer_save(t, ck, &e) < 0) fail_("trainer_save", e.msg);
    FILE *o = fopen(out, "wb");
    if (!o) fail_("cannot write", out);
    for (int i = 0; i < 3; i++) {
        char p[400];
        snprintf(p, sizeof p, "%s/%s", ck, files_[i]);
        FILE *f = fopen(p, "rb");
        if (!f) fail_("trainer_save left no", p);
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, o);
        fclose(f);
        if (i < 2) fputs(SEP, o);
    }
    fclose(o);
    trainer_free(t);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setup_();
    const char *seed = getenv("M6_FUZZ_CKPT_SEED");
    if (seed) {
        const char *n = getenv("M6_FUZZ_CKPT_STEPS");
        write_seed_(seed, n ? atoi(n) : 2);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char ck[300];
    snprintf(ck, sizeof ck, "%s/ck", dir_);
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < 3; i++) {
        const uint8_t *q = i < 2 ? memmem(p, (size_t)(end - p), SEP, strlen(SEP))
                                 : NULL;
        const uint8_t *stop = q ? q : end;
        char path[400];
        snprintf(path, sizeof path, "%s/%s", ck, files_[i]);
        FILE *f = fopen(path, "wb");
        if (!f) fail_("cannot write", path);
        fwrite(p, 1, (size_t)(stop - p), f);
        fclose(f);
        p = q ? q + strlen(SEP) : end;
    }

    trainer *t = trainer_();
    m6_err e = M6_ERR_NONE;
    int trc = trainer_load(t, ck, &e);
    if (trc != 0 && (!e.msg || !e.msg[0])) fail_("trainer_load refused without a message", NULL);
    m6_err_free(&e);

    m6_weights w;
    char err[2048];
    err[0] = 0;
    int wrc = weights_load(&w, ck, &spec_.model, err, sizeof err);
    if (wrc != 0 && !err[0]) fail_("weights_load refused without a message", NULL);

    if (trc == 0 && wrc == 0) {
        /* the same files, the same parameters */
        size_t n = trainer_copy_state(t, 0, NULL);
        size_t want = w.n_global + (size_t)w.S * w.slot_size;
        if (n != want) fail_("the readers disagree on the parameter count", NULL);
        float *a = malloc(n * sizeof *a);
        if (!a) fail_("out of memory", NULL);
        trainer_copy_state(t, 0, a);
        if (memcmp(a, w.params, n * sizeof *a) != 0)
            fail_("trainer_load and weights_load read different parameters", NULL);
        free(a);
    }
    if (wrc == 0) weights_free(&w);
    trainer_free(t);
    return 0;
}
