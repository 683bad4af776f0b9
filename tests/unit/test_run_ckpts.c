/*
 * test_run_ckpts.c — keeping a run's checkpoints (daemon/runner/run_ckpts.c)
 * removes and renames only inside the run's checkpoint directory. m6.db has
 * other writers (dashboards, an operator's sqlite3), so a checkpoints row may
 * name any path; run_ckpts must treat such a row as a row to drop, never
 * as a directory to delete.
 *
 *  1. Prune: a tiny trainer's checkpoint saved with keep = 1 while the DB
 *     also holds an older row naming a directory outside the run's
 *     checkpoint directory (with a file in it), and an older row naming a
 *     step-N directory inside it: the outside directory and its file are
 *     still there, the inside one is gone, both rows are dropped, the new
 *     checkpoint is the run's only row and its directory exists.
 *  2. Restore: a row (newest) naming an outside path that does not load
 *     (a plain directory): the restore skips it without renaming it (no
 *     <path>.bad appears, the path is unchanged), drops its row, and loads
 *     the older real checkpoint.
 *  3. Lookalikes are outside: <dir>/step-5/.., <dir>/step-5x, <dir>x/step-5
 *     and a step-N of another run survive a prune.
 *  4. Set aside only: a resumable run with no checkpoint row whose
 *     directory holds lookalikes (step-7.badx, step-8.bad.tmp, step-9x.bad)
 *     starts fresh (0); with step-3.bad-2 and step-5.bad there as well,
 *     the restore says none loads (1), counting 2, the newest step-5.bad,
 *     and --from-scratch (forget_gone) starts fresh again. The names
 *     checked are those run_ckpts_quarantine writes, made here by hand.
 *  5. Keep counts what is on disk: with keep 2 and the newest checkpoint's
 *     directory deleted by hand, the next save keeps the older one (two on
 *     disk, the gone one's row kept); the save after drops both.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "runner/run_ckpts.h"
#include "common/paths.h"
#include "state/state.h"
#include "train/trainer.h"
#include "../common/synth_data.h"

static char dir_[256];     /* temporary: data, state DB, runs/, outside/ */

static int exists_(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void mkfile_(const char *dir, const char *name)
{
    char p[16384];
    assert_int_equal(paths_mkdir_p(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("keep me\n", f);
    fclose(f);
}

static trainer *trainer_(void)
{
    run_spec s = synth_tiny_spec(dir_, 2, 10, 0);
    m6_err err = M6_ERR_NONE;
    trainer *t = trainer_create(&s, &err);
    if (!t)
        fail_msg("trainer_create: %s", m6_err_msg(&err));
    step_result r;
    assert_int_equal(trainer_step(t, &r, &err), 0);
    return t;
}

static int rows_(state *st, int64_t run, ckpt_row **rows)
{
    int n = -1;
    assert_int_equal(state_checkpoints_list(st, run, rows, &n), 0);
    return n;
}

static void test_prune_and_restore(void **unused)
{
    (void)unused;
    char db[512], runs[512], outside[512], cdir[4096], inside[4200];
    snprintf(db, sizeof db, "%s/m6.db", dir_);
    snprintf(runs, sizeof runs, "%s/runs", dir_);
    snprintf(outside, sizeof outside, "%s/outside", dir_);
    char why[256];
    state *st = state_open(db, why, sizeof why);
    if (!st)
        fail_msg("state_open: %s", why);
    int64_t run = state_run_insert(st, "r", "{}", 10, 0, NULL);
    assert_true(run > 0);
    run_ckpts s = {st, runs};
    run_ckpts_dir(&s, run, cdir, sizeof cdir);

    printf("1. prune with rows naming an outside and an inside directory\n");
    mkfile_(outside, "precious");
    snprintf(inside, sizeof inside, "%s/step-0", cdir);
    mkfile_(inside, "old");
    /* older than the trainer's step 1, so pruned first with keep 1 */
    assert_int_equal(state_checkpoint_add(st, run, -2, outside, 1), 0);
    assert_int_equal(state_checkpoint_add(st, run, 0, inside, 1), 0);
    trainer *t = trainer_();
    m6_err err = M6_ERR_NONE;
    assert_int_equal(run_ckpts_save(&s, run, t, 1, "every", &err), 0);
    char precious[600];
    snprintf(precious, sizeof precious, "%s/precious", outside);
    assert_true(exists_(outside) && exists_(precious));
    assert_false(exists_(inside));
    ckpt_row *rows;
    int n = rows_(st, run, &rows);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].step, 1);
    assert_true(exists_(rows[0].path));
    free(rows);

    printf("2. restore past a newer row naming an outside path\n");
    assert_int_equal(state_checkpoint_add(st, run, 9, outside, 1), 0);
    run_spec spec = synth_tiny_spec(dir_, 2, 10, 0);
    trainer *t2 = trainer_create(&spec, &err);
    assert_non_null(t2);
    long step = -1;
    m6_err lost = M6_ERR_NONE;
    int rc = run_ckpts_restore(&s, run, &spec, &t2, NULL, &step, 0, &err,
                               &lost);
    assert_int_equal(rc, 0);
    assert_int_equal(step, 1);
    char bad[600];
    snprintf(bad, sizeof bad, "%s.bad", outside);
    assert_true(exists_(outside) && exists_(precious));
    assert_false(exists_(bad));
    n = rows_(st, run, &rows);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].step, 1);
    free(rows);

    printf("3. lookalike paths survive a prune\n");
    const char *fmt[] = {"%s/step-5/..", "%s/step-5x", "%sx/step-5"};
    char look[3][4300];
    for (int i = 0; i < 3; i++) {
        snprintf(look[i], sizeof look[i], fmt[i], cdir);
        mkfile_(look[i], "precious");
        assert_int_equal(state_checkpoint_add(st, run, -10 - i, look[i], 1),
                         0);
    }
    char other[4200];
    run_ckpts_dir(&s, run + 1, other, sizeof other);
    strcat(other, "/step-3");
    mkfile_(other, "precious");
    assert_int_equal(state_checkpoint_add(st, run, -20, other, 1), 0);
    assert_int_equal(trainer_step(t, &(step_result){0}, &err), 0);
    assert_int_equal(run_ckpts_save(&s, run, t, 1, "every", &err), 0);
    for (int i = 0; i < 3; i++) {
        char f[16384];
        snprintf(f, sizeof f, "%s/precious", look[i]);
        assert_true(exists_(f));
    }
    char of[8192];
    snprintf(of, sizeof of, "%s/precious", other);
    assert_true(exists_(of));
    assert_true(exists_(cdir)); /* step-5/.. is cdir itself */
    n = rows_(st, run, &rows);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].step, 2);
    free(rows);

    printf("4. a run with set-aside checkpoints only\n");
    int64_t run4 = state_run_insert(st, "r4", "{}", 10, 0, NULL);
    assert_true(run4 > 0);
    char cdir4[4096];
    run_ckpts_dir(&s, run4, cdir4, sizeof cdir4);
    const char *looks[] = {"step-7.badx", "step-8.bad.tmp", "step-9x.bad"};
    for (int i = 0; i < 3; i++) {
        char d[8192];
        snprintf(d, sizeof d, "%s/%s", cdir4, looks[i]);
        mkfile_(d, "x");
    }
    int data_rc = 0;
    trainer *t4 = trainer_create_resumable(&spec, &data_rc, &err);
    assert_non_null(t4);
    rc = run_ckpts_restore(&s, run4, &spec, &t4, &data_rc, &step, 0, &err,
                           &lost);
    printf("   lookalikes only: rc %d step %ld\n", rc, step);
    assert_int_equal(rc, 0);
    assert_int_equal(step, -1);
    trainer_free(t4);
    const char *aside[] = {"step-3.bad-2", "step-5.bad"};
    for (int i = 0; i < 2; i++) {
        char d[8192];
        snprintf(d, sizeof d, "%s/%s", cdir4, aside[i]);
        mkfile_(d, "x");
    }
    t4 = trainer_create_resumable(&spec, &data_rc, &err);
    assert_non_null(t4);
    rc = run_ckpts_restore(&s, run4, &spec, &t4, &data_rc, &step, 0, &err,
                           &lost);
    printf("   set aside: rc %d: %s\n", rc, m6_err_msg(&lost));
    assert_int_equal(rc, 1);
    assert_int_equal(lost.code, M6_ENOCKPT);
    assert_non_null(strstr(m6_err_msg(&lost), "set aside (2, the newest as "
                                              "step-5.bad)"));
    m6_err_free(&lost);
    trainer_free(t4);
    t4 = trainer_create_resumable(&spec, &data_rc, &err);
    assert_non_null(t4);
    rc = run_ckpts_restore(&s, run4, &spec, &t4, &data_rc, &step, 1, &err,
                           &lost);
    assert_int_equal(rc, 0);
    trainer_free(t4);

    printf("5. keep 2 with the newest checkpoint deleted by hand\n");
    int64_t run5 = state_run_insert(st, "r5", "{}", 10, 0, NULL);
    assert_true(run5 > 0);
    long s0 = trainer_step_count(t);
    assert_int_equal(run_ckpts_save(&s, run5, t, 2, "every", &err), 0);
    assert_int_equal(trainer_step(t, &(step_result){0}, &err), 0);
    assert_int_equal(run_ckpts_save(&s, run5, t, 2, "every", &err), 0);
    n = rows_(st, run5, &rows);
    assert_int_equal(n, 2);
    char gone[4200], first[4200];
    snprintf(first, sizeof first, "%s", rows[0].path);
    snprintf(gone, sizeof gone, "%s", rows[1].path);
    free(rows);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", gone);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(trainer_step(t, &(step_result){0}, &err), 0);
    assert_int_equal(run_ckpts_save(&s, run5, t, 2, "every", &err), 0);
    /* two on disk still: the first and the new; the gone one's row kept */
    assert_true(exists_(first));
    n = rows_(st, run5, &rows);
    printf("   rows after the save: %d (steps %lld..%lld)\n", n,
           (long long)rows[0].step, (long long)rows[n - 1].step);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].step, s0);
    free(rows);
    assert_int_equal(trainer_step(t, &(step_result){0}, &err), 0);
    assert_int_equal(run_ckpts_save(&s, run5, t, 2, "every", &err), 0);
    /* now the two newest are there: the older two rows go */
    assert_false(exists_(first));
    n = rows_(st, run5, &rows);
    assert_int_equal(n, 2);
    assert_int_equal(rows[0].step, s0 + 2);
    assert_true(exists_(rows[0].path) && exists_(rows[1].path));
    free(rows);

    trainer_free(t);
    trainer_free(t2);
    state_close(st);
}

/* flips bit `bit` of byte `at` of the file */
static void flip_(const char *path, long at, int bit)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    assert_true(fputc(c ^ (1 << bit), f) != EOF);
    assert_int_equal(fclose(f), 0);
}

/* The data's CRC-32 in the header: one flipped bit anywhere in the
 * tensors makes the file refuse to open, naming it; flipped back it opens
 * with the values written. A file cut short says truncated, with the
 * bytes its header needs and those it holds. A file without the key
 * (another writer's) opens as before. */
static void test_safetensors_crc(void **unused)
{
    (void)unused;
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/crc.safetensors", dir_);
    float a[6] = {1, -2, 3.5f, 0, 1e-3f, 7}, b[3] = {-1, 0.25f, 9};
    st_tensor ts[2] = {{"a", a, 2, {2, 3}}, {"b", b, 1, {3, 0}}};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    long len = safetensors_write(f, ts, 2, err, sizeof err);
    assert_true(len > 0);
    assert_int_equal(fclose(f), 0);
    long data = len - (long)sizeof a - (long)sizeof b;
    st_file sf;
    assert_int_equal(safetensors_open(&sf, path, err, sizeof err), 0);
    safetensors_close(&sf);
    long at[3] = {data, data + 13, len - 1};
    for (int i = 0; i < 3; i++) {
        flip_(path, at[i], i * 3);
        assert_int_equal(safetensors_open(&sf, path, err, sizeof err), -1);
        assert_non_null(strstr(err, "tensor data damaged"));
        assert_non_null(strstr(err, path));
        flip_(path, at[i], i * 3);
    }
    /* cut short by 5 bytes: truncated, with the sizes, not "damaged" */
    assert_int_equal(truncate(path, len - 5), 0);
    assert_int_equal(safetensors_open(&sf, path, err, sizeof err), -1);
    printf("cut: %s\n", err);
    char want[128];
    snprintf(want, sizeof want, "truncated: its tensors need %zu bytes of "
             "data, the file holds %zu", sizeof a + sizeof b,
             sizeof a + sizeof b - 5);
    assert_non_null(strstr(err, want));
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(safetensors_write(f, ts, 2, err, sizeof err), len);
    assert_int_equal(fclose(f), 0);
    float got[3];
    assert_int_equal(safetensors_open(&sf, path, err, sizeof err), 0);
    assert_int_equal(safetensors_get(&sf, "b", got, 3, err, sizeof err), 0);
    assert_memory_equal(got, b, sizeof b);
    safetensors_close(&sf);

    /* by hand, no checksum: 8-byte length, header, one F32 */
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                    "\"data_offsets\":[0,4]}}    ";
    uint64_t hl = strlen(h);
    float x = 42;
    f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, hl, f);
    fwrite(&x, 4, 1, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(safetensors_open(&sf, path, err, sizeof err), 0);
    assert_int_equal(safetensors_get(&sf, "x", got, 1, err, sizeof err), 0);
    assert_true(got[0] == 42);
    safetensors_close(&sf);
    unlink(path);
}

int main(void)
{
    if (synth_shards_tmp(dir_, sizeof dir_, "test_run_ckpts", 20000) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prune_and_restore),
        cmocka_unit_test(test_safetensors_crc),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    synth_remove(dir_);
    return rc;
}
