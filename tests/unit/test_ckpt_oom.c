/*
 * test_ckpt_oom.c — trainer_load when memory runs out: each allocation
 * that train/trainer_ckpt.c makes while loading a checkpoint is made to
 * fail in turn (the first, the second, ...), and every load must then fail
 * with an error naming the checkpoint, not crash; with none failing, the
 * load succeeds and the trainer stands at the saved step.
 *
 * trainer_ckpt.c is compiled into this test with malloc and calloc routed
 * to stubs that fail on the Nth call: running out of memory at one chosen
 * allocation cannot be asked of the system.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/test_main.h"

static long fail_at_ = -1; /* the call that fails; -1: none */
static long calls_;        /* calls since the count was reset */

static void *oom_malloc_(size_t n)
{
    return fail_at_ >= 0 && calls_++ == fail_at_ ? NULL : malloc(n);
}

static void *oom_calloc_(size_t k, size_t n)
{
    return fail_at_ >= 0 && calls_++ == fail_at_ ? NULL : calloc(k, n);
}

#define malloc oom_malloc_
#define calloc oom_calloc_
#include "../../daemon/train/trainer_ckpt.c"
#undef malloc
#undef calloc

#define FIXTURE_NAME "ckpt_oom"
#include "../common/trainer_fixture.h"

static void test_load_out_of_memory(void **st)
{
    (void)st;
    run_spec s = synth_tiny_spec(tmpdir_, 4, 20, 0);
    s.device.threads = 1;
    trainer *t = fixture_trainer(&s);
    step_result r;
    for (int i = 0; i < 3; i++) {
        char err[512];
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0)
            fail_msg("step: %s", err);
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir_);
    assert_true(fixture_save(t, dir) > 0);
    trainer_free(t);

    long k;
    for (k = 0; k < 10000; k++) {
        trainer *u = fixture_trainer(&s);
        char err[512] = "";
        calls_ = 0;
        fail_at_ = k;
        int rc = ERR_INTO(err, trainer_load(u, dir, &err_));
        fail_at_ = -1;
        if (calls_ <= k) { /* fewer allocations than k: none failed */
            assert_int_equal(rc, 0);
            assert_int_equal(trainer_step_count(u), 3);
            trainer_free(u);
            break;
        }
        if (rc == 0)
            fail_msg("allocation %ld of the load failed, and the load "
                     "said it succeeded", k);
        if (!strstr(err, dir))
            fail_msg("allocation %ld failed: the error '%s' does not name "
                     "the checkpoint", k, err);
        trainer_free(u);
    }
    /* the load allocates (the share map and its source slots at least) */
    if (k < 2)
        fail_msg("the load made %ld allocations in trainer_ckpt.c", k);
    print_message("trainer_load: %ld allocations, each made to fail in turn\n",
                  k);
    assert_int_equal(synth_remove(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
