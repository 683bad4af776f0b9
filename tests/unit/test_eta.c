/* test_eta.c — watch's ETA (client/eta.c) on hand-made poll timelines whose
 * true time left is known in closed form. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "client/eta.h"
#include "../common/test_main.h"

/* A steady 4 steps/s, polled each second: after the start-up span the ETA
 * is exactly the steps left / 4. */
static void test_steady_rate(void **state)
{
    (void)state;
    static eta_window w;
    eta_reset(&w);
    const long long total = 10000;
    assert_true(eta_update(&w, 0, total, 0.0) < 0); /* one poll: no span */
    assert_true(eta_update(&w, 4, total, 1.0) < 0); /* under ETA_MIN_S */
    for (int t = 2; t <= 600; t++) {
        long long step = 4LL * t;
        double eta = eta_update(&w, step, total, (double)t);
        assert_true(fabs(eta - (double)(total - step) / 4.0) < 1e-6);
    }
}

/* Steps at 3/s with a 60-s evaluation every 100 steps (polled each second).
 * The true average rate is 100 steps per (100/3 + 60) s. The old 30-s
 * window read the pause alone (1 step per 30 s: an ETA 28x too long). The
 * estimate must stay within a factor 2 of the average-rate ETA at every
 * poll after the first full cycle. */
static void test_eval_pauses(void **state)
{
    (void)state;
    static eta_window w;
    eta_reset(&w);
    const long long total = 100000;
    const double cycle = 100.0 / 3.0 + 60.0;
    const double avg_rate = 100.0 / cycle;
    double worst = 1.0;
    for (int t = 0; t < 2000; t++) {
        double in = fmod((double)t, cycle);
        long long done = (long long)((double)t / cycle) * 100;
        long long step = done + (in < 100.0 / 3.0 ? (long long)(in * 3.0) : 100);
        double eta = eta_update(&w, step, total, (double)t);
        if (t < 2 * (int)cycle) continue;
        double truth = (double)(total - step) / avg_rate;
        double ratio = eta / truth;
        if (ratio < 1) ratio = 1 / ratio;
        if (ratio > worst) worst = ratio;
    }
    print_message("eval pauses: worst ETA off by a factor %.2f\n", worst);
    assert_true(worst < 2.0);
}

/* A run that goes back (resumed from an earlier checkpoint) restarts the
 * window: the next estimate uses only polls after the jump. */
static void test_step_back_restarts(void **state)
{
    (void)state;
    static eta_window w;
    eta_reset(&w);
    for (int t = 0; t <= 100; t++) eta_update(&w, 10LL * t, 5000, (double)t);
    /* back to step 500, then 1 step/s */
    assert_true(eta_update(&w, 500, 5000, 101.0) < 0);
    assert_true(eta_update(&w, 501, 5000, 102.0) < 0); /* 1 s: under ETA_MIN_S */
    double eta = eta_update(&w, 502, 5000, 103.0);
    assert_true(fabs(eta - (5000.0 - 502.0) / 1.0) < 1e-6);
}

TEST_MAIN(
    cmocka_unit_test(test_steady_rate),
    cmocka_unit_test(test_eval_pauses),
    cmocka_unit_test(test_step_back_restarts))
