/*
 * test_offload_spec.c — the speculative clipped update of offloaded slots
 * (offload.speculative, offload.h) on the CPU backend, and the planner's
 * count of its second buffers.
 *
 * The reference for the weights is the fully resident run (no offload
 * code at all): runs with speculation on and off must give its losses,
 * weights and AdamW moments bit for bit, with a clip the norm never
 * reaches, one it always exceeds (every step redone) and one in between.
 * The redo count is checked against the steps whose recorded gradient norm
 * exceeds the clip, counted here from the norms.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gpt.h"
#include "offload/offload.h"
#include "offload/test_hooks.h"
#include "train/trainer.h"
#define FIXTURE_NAME "offload-spec"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

#define STEPS 12

static run_spec spec6_(int accum)
{
    run_spec s = synth_tiny_spec(tmpdir_, 6, STEPS, 0);
    s.train.grad_accum = accum;
    s.offload.prefetch = 2;
    s.offload.host_threads = 2;
    s.device.threads = 1;
    return s;
}

static void run_(trainer *t, float *loss, float *norm)
{
    char err[256];
    while (trainer_step_count(t) < STEPS) {
        step_result r;
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0)
            fail_msg("step: %s", err);
        loss[r.step - 1] = r.train_loss;
        norm[r.step - 1] = r.grad_norm;
    }
}

/* clip < 0: the median of the resident run's norms (some steps over, some
 * under); else the clip itself. */
static void check_case_(int resident, int accum, float clip, int wait)
{
    offload_test_spec_wait(wait);
    run_spec plain = spec6_(accum);
    float l0[STEPS], n0[STEPS], l1[STEPS], n1[STEPS], l2[STEPS], n2[STEPS];
    if (clip < 0) {
        plain.train.grad_clip = 0; /* first the norms, unclipped */
        trainer *t = fixture_trainer(&plain);
        run_(t, l0, n0);
        trainer_free(t);
        float s[STEPS];
        memcpy(s, n0, sizeof s);
        for (int i = 0; i < STEPS; i++) /* insertion sort */
            for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
                float x = s[j];
                s[j] = s[j - 1];
                s[j - 1] = x;
            }
        clip = 0.5f * (s[STEPS / 2 - 1] + s[STEPS / 2]);
    }
    plain.train.grad_clip = clip;
    run_spec off = plain, spec = plain;
    off.device.memory_budget = fixture_budget_for(&plain, resident);
    off.offload.speculative = SPEC_SPECULATIVE_OFF;
    spec.device.memory_budget = off.device.memory_budget;
    spec.offload.speculative = SPEC_SPECULATIVE_ON;

    trainer *ta = fixture_trainer(&plain), *tb = fixture_trainer(&off), *tc = fixture_trainer(&spec);
    run_(ta, l0, n0);
    run_(tb, l1, n1);
    run_(tc, l2, n2);
    assert_memory_equal(l0, l1, sizeof l0);
    assert_memory_equal(l0, l2, sizeof l0);
    assert_memory_equal(n0, n2, sizeof n0);
    fixture_assert_same_state(ta, tb);
    fixture_assert_same_state(ta, tc);

    int over = 0;
    for (int i = 0; i < STEPS; i++)
        over += n0[i] > clip;
    offload_stats st;
    assert_int_equal(trainer_offload_stats(tb, &st), 0);
    assert_int_equal(st.n_resident, resident);
    assert_int_equal(st.speculative, 0);
    assert_int_equal(st.spec_steps, 0);
    assert_int_equal(st.spec_bytes, 0);
    assert_int_equal(trainer_offload_stats(tc, &st), 0);
    assert_int_equal(st.speculative, 1);
    assert_int_equal(st.spec_steps, STEPS);
    assert_int_equal(st.redo_steps, over);
    if (wait) /* each redone slot update restored from the second buffers */
        assert_int_equal(st.spec_restores, (uint64_t)over * (6 - resident));
    offload_test_spec_wait(0);
    /* 12 bytes per offloaded parameter (slot_size with its padding) */
    size_t ng, ss;
    gpt_layout_sizes(&plain.model, &ng, &ss);
    assert_int_equal(st.spec_bytes, (size_t)(6 - resident) * 12 * ss);
    const offload_plan *p = trainer_plan(tc);
    assert_non_null(p);
    assert_int_equal(p->speculative, 1);
    print_message("  resident %d, accum %d, clip %g: %d of %d steps over "
                  "the clip, %llu redone (%llu slot updates from the second "
                  "buffers)\n", resident, accum, (double)clip, over, STEPS,
                  (unsigned long long)st.redo_steps,
                  (unsigned long long)st.spec_restores);
    trainer_free(ta);
    trainer_free(tb);
    trainer_free(tc);
}

static void test_spec_under_clip(void **state)
{
    (void)state;
    check_case_(1, 2, 1e6f, 0); /* never clipped: every step kept */
    check_case_(3, 1, 1e6f, 1);
}

static void test_spec_over_clip(void **state)
{
    (void)state;
    check_case_(1, 2, 1e-4f, 0); /* always clipped: every step redone */
    check_case_(1, 2, 1e-4f, 1);
    check_case_(3, 1, 1e-4f, 1);
}

static void test_spec_mixed(void **state)
{
    (void)state;
    check_case_(1, 2, -1.0f, 0);
    check_case_(1, 2, -1.0f, 1);
    check_case_(4, 1, -1.0f, 1);
}

/* The planner: the second buffers, counted by hand, and auto. */
static void test_plan_counts_second_buffers(void **state)
{
    (void)state;
    run_spec s = spec6_(1);
    size_t ng, ss;
    gpt_layout_sizes(&s.model, &ng, &ss);
    for (int cuda = 0; cuda < 2; cuda++) {
        offload_plan_input in = offload_plan_input_of(&s);
        in.backend = cuda ? BACKEND_CUDA : BACKEND_CPU;
        in.budget = 0;
        char err[512];
        offload_plan base, p;
        assert_int_equal(offload_plan_make(&in, &base, err, sizeof err), 0);
        in.budget = base.min_budget_bytes + 2 * base.slot_bytes; /* 4 off */
        in.speculative = SPEC_SPECULATIVE_OFF;
        in.clipped = 1;
        offload_plan_free(&base);
        assert_int_equal(offload_plan_make(&in, &base, err, sizeof err), 0);
        assert_int_equal(base.n_offloaded, 4);
        assert_int_equal(base.speculative, 0);
        size_t extra = 4 * (cuda ? 14 : 12) * ss;
        size_t extra_pin = cuda ? 4 * 2 * ss : 0;

        in.speculative = SPEC_SPECULATIVE_ON;
        assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
        assert_int_equal(p.speculative, 1);
        assert_int_equal(p.spec_slot_bytes, (cuda ? 14 : 12) * ss);
        assert_int_equal(p.host_bytes, base.host_bytes + extra);
        assert_int_equal(p.pinned_bytes, base.pinned_bytes + extra_pin);
        assert_int_equal(p.peak_device_bytes, base.peak_device_bytes);
        offload_plan_free(&p);

        /* no clipping: nothing to speculate on */
        in.clipped = 0;
        assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
        assert_int_equal(p.speculative, 0);
        assert_int_equal(p.host_bytes, base.host_bytes);
        offload_plan_free(&p);
        in.clipped = 1;

        /* auto: on exactly when everything fits the host limit */
        size_t need = base.host_bytes + extra +
                      (cuda ? 0 : base.peak_device_bytes);
        in.speculative = SPEC_SPECULATIVE_AUTO;
        size_t lims[4] = {0, need - 1, need, 2 * need};
        int want[4] = {0, 0, 1, 1};
        for (int i = 0; i < 4; i++) {
            in.host_limit = lims[i];
            assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
            assert_int_equal(p.speculative, want[i]);
            assert_int_equal(p.host_bytes,
                             base.host_bytes + (want[i] ? extra : 0));
            offload_plan_free(&p);
        }
        offload_plan_free(&base);
    }
}

/* auto through the trainer: a host limit that has no room turns it off
 * (the trainer plans with MemAvailable; here the planner with a limit of
 * the plan's own bytes less one, and a run started with it) */
static void test_auto_off_when_host_short(void **state)
{
    (void)state;
    run_spec s = spec6_(1);
    s.train.grad_clip = 1.0f;
    s.device.memory_budget = fixture_budget_for(&s, 1);
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_run(&s, 0, SIZE_MAX / 2, &p, err,
                                          sizeof err), 0);
    assert_int_equal(p.speculative, 1);
    size_t need = p.host_bytes + p.peak_device_bytes;
    offload_plan_free(&p);
    assert_int_equal(offload_plan_for_run(&s, 0, need - 1, &p, err,
                                          sizeof err), 0);
    assert_int_equal(p.speculative, 0);
    offload_plan_free(&p);
    assert_int_equal(offload_plan_for_run(&s, 0, need, &p, err, sizeof err),
                     0);
    assert_int_equal(p.speculative, 1);
    offload_plan_free(&p);
}

/* The host pool in chunks: blocks never straddle a chunk, a pool larger
 * than one chunk works, a block larger than the chunk gets its own, and
 * the pool's pinned and requested bytes match what was asked and what the
 * kernel reports locked (VmLck). */
static void test_pool_chunks(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), K = 256 * 1024;
    size_t before = offload_vm_locked();
    offload_pool *h = offload_host_pool_create_max(K, K);
    assert_non_null(h);
    enum { N = 10 };
    unsigned char *b[N + 1];
    for (int i = 0; i < N; i++) {
        b[i] = offload_pool_alloc(h, 100000);
        assert_non_null(b[i]);
        memset(b[i], i + 1, 100000);
    }
    /* 100032 bytes a block (64-byte rounding): 2 to a 256 KiB chunk */
    size_t big = 600 * 1024 + 5;
    b[N] = offload_pool_alloc(h, big);
    assert_non_null(b[N]);
    memset(b[N], 0x5a, big);
    for (int i = 0; i < N; i++) /* nothing overlapped */
        for (size_t k = 0; k < 100000; k += 997)
            assert_int_equal(b[i][k], i + 1);
    offload_pool_stats st;
    offload_pool_get_stats(h, &st);
    size_t big_chunk = (big + page - 1) / page * page;
    assert_int_equal(st.chunks, N / 2 + 1);
    assert_int_equal(st.capacity, (N / 2) * K + big_chunk);
    assert_int_equal(st.largest_chunk, big_chunk);
    assert_int_equal(st.requested, N * 100000 + big);
    assert_int_equal(st.in_use, N * 100032 + (big + 63) / 64 * 64);
    size_t after = offload_vm_locked();
    print_message("  host pool: %d chunks, %zu bytes requested, %zu in "
                  "use, %zu pinned by the pool, VmLck %+zd bytes\n",
                  st.chunks, st.requested, st.in_use, st.pinned,
                  before == SIZE_MAX || after == SIZE_MAX
                      ? (ssize_t)0 : (ssize_t)(after - before));
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer's mlock interceptor does nothing and returns 0 */
    int asan = 1;
#else
    int asan = 0;
#endif
    if (st.pinned == 0 || asan) {
        print_message("  (mlock refused here, or a no-op under "
                      "AddressSanitizer: pinned-vs-locked not checked)\n");
        before = SIZE_MAX;
    } else {
        assert_int_equal(st.pinned, st.capacity);
        if (before != SIZE_MAX && after != SIZE_MAX)
            assert_int_equal(after - before, st.pinned);
    }
    for (int i = 0; i <= N; i++)
        offload_pool_free(h, b[i]);
    offload_pool_get_stats(h, &st);
    assert_int_equal(st.requested, 0);
    assert_int_equal(st.in_use, 0);
    offload_pool_trim(h);
    offload_pool_get_stats(h, &st);
    assert_int_equal(st.chunks, 0);
    if (before != SIZE_MAX)
        assert_int_equal(offload_vm_locked(), before);
    offload_pool_destroy(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_chunks),
        cmocka_unit_test(test_plan_counts_second_buffers),
        cmocka_unit_test(test_auto_off_when_host_short),
        cmocka_unit_test(test_spec_under_clip),
        cmocka_unit_test(test_spec_over_clip),
        cmocka_unit_test(test_spec_mixed),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
