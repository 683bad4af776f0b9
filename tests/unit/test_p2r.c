/*
 * test_p2r.c — the Pseudo-to-Real cost model (daemon/offload/plan_p2r.c)
 * against values worked out by hand in the comments: model FLOPs of small
 * dense and MoE shapes, a step's time terms for known bytes and rates,
 * the bytes moved per step for a placement with a known number of
 * offloaded slots (and the planner's own count, which they must equal),
 * the wall-clock ratio and the break-even steps ratio plugged back in,
 * bench/p2r_sweep's CSV (mean over seeds, "never", malformed files), and
 * the errors of bad input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the statics too (traffic_) */
#include "../../daemon/offload/plan_p2r.c"
#include "../common/test_main.h"

#define TOL 1e-9

static void near_(double got, double want, double rel, const char *what)
{
    if (!(fabs(got - want) <= rel * fmax(1.0, fabs(want)))) {
        fprintf(stderr, "%s: got %.17g, want %.17g\n", what, got, want);
        fail();
    }
}

/* A spec from JSON text over the defaults. */
static void spec_of_(run_spec *s, const char *json)
{
    char err[512];
    if (spec_parse(s, json, strlen(json), err, sizeof err) != 0) {
        fprintf(stderr, "spec: %s\n", err);
        fail();
    }
}

/* L 2, C 16, NH 2, T 8, V 64; B 2; 4 steps, 1 pseudo (S 1). */
static const char *small_ =
    "{\"data\": {\"train\": \"/nonexistent/train_*.bin\", "
    "\"val\": \"/nonexistent/val_*.bin\"}, "
    "\"model\": {\"vocab_size\": 64, \"n_layer\": 2, \"n_head\": 2, "
    "\"n_embd\": 16, \"seq_len\": 8}, \"pseudo\": {\"share_groups\": 1, "
    "\"steps\": 1}, \"train\": {\"steps\": 4, \"batch_size\": 2, "
    "\"grad_accum\": 1, \"warmup_steps\": 0}, \"device\": {\"backend\": "
    "\"cuda\"}}";

static void test_flops(void **st)
{
    (void)st;
    run_spec s;
    spec_of_(&s, small_);
    /* a block: attention 4C^2 + 8C = 1024 + 128 = 1152, MLP 8C^2 + 5C =
     * 2048 + 80 = 2128; two blocks 6560; LM head VC = 1024: N = 7584 */
    near_(model_active_params(&s.model), 7584, TOL, "dense N");
    /* 6 N + 12 L C T = 45504 + 12 * 2 * 16 * 8 = 45504 + 3072 */
    near_(model_flops_per_token(&s.model), 48576, TOL, "dense FLOPs/token");
    /* MoE every block, E 4 in k 2 prototypes, H 32: gate EC + E = 68,
     * expert 2HC + H + C = 1024 + 48 = 1072, k of them 2144; a block
     * 1152 + 68 + 2144 = 3364; two 6728 + VC 1024 = 7752 */
    model_config c = s.model;
    c.moe_experts = 4;
    c.moe_prototypes = 2;
    c.moe_every = 1;
    c.moe_hidden = 32;
    near_(model_active_params(&c), 7752, TOL, "MoE N");
    near_(model_flops_per_token(&c), 6 * 7752 + 3072, TOL, "MoE FLOPs/token");
}

static void test_phase_time(void **st)
{
    (void)st;
    p2r_rates r = {.gpu_flops = 1e12, .h2d_bytes_per_s = 2e9,
                   .d2h_bytes_per_s = 1e9, .host_adam_bytes_per_s = 2.4e9};
    p2r_phase ph = {.n_layer = 6, .resident_layers = 3, .flops = 1e12,
                    .h2d_bytes = 3e9, .d2h_bytes = 1e9, .adam_bytes = 4.8e9,
                    .adam_overlaps = 1};
    p2r_phase_time(&ph, &r);
    /* compute 1 s; h2d 1.5 s, d2h 1 s, copy 1.5 s; AdamW 2 s */
    near_(ph.t_compute, 1, TOL, "t_compute");
    near_(ph.t_h2d, 1.5, TOL, "t_h2d");
    near_(ph.t_d2h, 1, TOL, "t_d2h");
    near_(ph.t_copy, 1.5, TOL, "t_copy");
    near_(ph.t_adam, 2, TOL, "t_adam");
    /* overlapped: max(1, 1.5, 2) = 2, 0.5 s of AdamW exposed */
    near_(ph.t_step, 2, TOL, "t_step overlapped");
    near_(ph.t_adam_exposed, 0.5, TOL, "exposed overlapped");
    /* not overlapped: hidden behind forward (1/3 s) over 3 of 6 layers =
     * 1/6 s; exposed 2 - 1/6; step 1.5 + 11/6 = 10/3 */
    ph.adam_overlaps = 0;
    p2r_phase_time(&ph, &r);
    near_(ph.t_adam_hidden, 1.0 / 6, TOL, "hidden");
    near_(ph.t_step, 10.0 / 3, TOL, "t_step not overlapped");
    /* nothing offloaded: the step is the compute */
    p2r_phase z = {.n_layer = 2, .resident_layers = 2, .flops = 5e11};
    p2r_phase_time(&z, &r);
    near_(z.t_step, 0.5, TOL, "resident step");
    /* experts over 16 devices, 8 a node: 8 of 15 peers away; 1.5e9 B a
     * step: 0.8e9 over the network at 1e9 (0.8 s), 0.7e9 over NVLink at
     * 1e10 (0.07 s); 40 calls of 1 ms: t_alltoall 0.84 s, after the 0.5 s
     * of compute on the device: 1.34 s */
    r.nvlink_bytes_per_s = 1e10;
    r.net_bytes_per_s = 1e9;
    r.alltoall_latency_s = 1e-3;
    z.ep_size = 16;
    z.ep_per_node = 8;
    z.alltoall_bytes = 1.5e9;
    z.alltoall_calls = 40;
    p2r_phase_time(&z, &r);
    near_(z.t_alltoall, 0.84, TOL, "t_alltoall");
    near_(z.t_step, 1.34, TOL, "step with the all-to-alls");
    /* the host update overlaps them as it does the compute: 2 s of AdamW
     * over 1.34 s of device time is a 2 s step; copies likewise (3 s) */
    z.adam_bytes = 4.8e9;
    z.adam_overlaps = 1;
    p2r_phase_time(&z, &r);
    near_(z.t_step, 2, TOL, "AdamW beside the all-to-alls");
    z.h2d_bytes = 6e9;
    p2r_phase_time(&z, &r);
    near_(z.t_step, 3, TOL, "copies beside the all-to-alls");
}

/* The spec's real phase planned with slot 1 of 2 offloaded: the budget is
 * what the planner itself says one resident slot needs. */
static void plan_one_offloaded_(const run_spec *s, offload_plan *p)
{
    char err[512];
    offload_plan all;
    assert_int_equal(offload_plan_for_spec(s, 0, &all, err, sizeof err), 0);
    size_t budget = all.global_bytes + all.act_bytes + all.workspace_bytes +
                    all.slot_bytes + all.staging_bytes;
    offload_plan_free(&all);
    assert_int_equal(offload_plan_for_spec(s, budget, p, err, sizeof err), 0);
    assert_int_equal(p->n_offloaded, 1);
}

static void test_phase_of_plan(void **st)
{
    (void)st;
    run_spec s;
    char err[512];
    spec_of_(&s, small_);
    offload_plan p;
    plan_one_offloaded_(&s, &p);
    p2r_phase ph;
    assert_int_equal(p2r_phase_of_plan(&s, &p, 0, &ph, err, sizeof err), 0);
    /* slot size 12C^2 + 13C = 3280 (a multiple of 16); bf16 W = 6560
     * bytes. k = 1, A = 1: h2d (2k-1)W = 6560, d2h kW = 6560. Layer 1 is
     * offloaded (forward and backward in one interval), layer 0 not. */
    assert_int_equal(ph.n_offloaded, 1);
    assert_int_equal(ph.resident_layers, 1);
    near_(ph.h2d_bytes, 6560, TOL, "h2d");
    near_(ph.d2h_bytes, 6560, TOL, "d2h");
    near_(ph.offloaded_params, 3280, TOL, "offloaded params");
    /* one drain: the direct path, 30 bytes per parameter */
    near_(ph.adam_bytes, 3280.0 * 30, TOL, "adam bytes");
    /* B T A = 2 * 8 * 1 tokens of 48576 FLOPs */
    near_(ph.tokens, 16, TOL, "tokens");
    near_(ph.flops, 16 * 48576.0, TOL, "flops");
    /* grad_clip 1 (default) and offload.speculative auto: overlapped */
    assert_int_equal(ph.adam_overlaps, 1);
    offload_plan_free(&p);

    /* A = 3: h2d A(2k-1)W = 3W, d2h AkW = 3W; three drains: the fp32
     * accumulator, 36 bytes per parameter; and the planner agrees */
    s.train.grad_accum = 3;
    plan_one_offloaded_(&s, &p);
    assert_int_equal(p2r_phase_of_plan(&s, &p, 0, &ph, err, sizeof err), 0);
    near_(ph.h2d_bytes, 3 * 6560.0, TOL, "h2d A 3");
    near_(ph.d2h_bytes, 3 * 6560.0, TOL, "d2h A 3");
    near_(ph.adam_bytes, 3280.0 * 36, TOL, "adam bytes A 3");
    near_(ph.tokens, 48, TOL, "tokens A 3");
    offload_plan_free(&p);

    /* speculative off with clipping: not overlapped */
    s.train.grad_accum = 1;
    s.offload.speculative = SPEC_SPECULATIVE_OFF;
    plan_one_offloaded_(&s, &p);
    assert_int_equal(p2r_phase_of_plan(&s, &p, 0, &ph, err, sizeof err), 0);
    assert_int_equal(ph.adam_overlaps, 0);
    offload_plan_free(&p);
}

/* traffic_ against offload.h's closed forms, cpu and cuda, and against
 * the planner's count (which m6ctl prints) */
static void test_traffic(void **st)
{
    (void)st;
    int map[4] = {0, 1, 2, 3};
    unsigned char off[4] = {0, 0, 1, 1};   /* k = 2 */
    double W[4] = {10, 10, 10, 10}, h2d, d2h, dr[4];
    /* cpu, A 3: h2d A(2k-1)W + (A-1)kW = 90 + 40, d2h AkW = 60 */
    assert_int_equal(traffic_(map, 4, 4, off, 3, W, 1, &h2d, &d2h, dr), 0);
    near_(h2d, 130, TOL, "cpu h2d");
    near_(d2h, 60, TOL, "cpu d2h");
    near_(dr[3], 3, TOL, "drains");
    near_(dr[0], 0, TOL, "resident drains");
    /* cuda: h2d A(2k-1)W = 90 */
    assert_int_equal(traffic_(map, 4, 4, off, 3, W, 0, &h2d, &d2h, dr), 0);
    near_(h2d, 90, TOL, "cuda h2d");
    near_(d2h, 60, TOL, "cuda d2h");
    /* S 1 over 2 layers, offloaded: one interval (forward and backward
     * adjacent), one fetch and one drain per microbatch */
    int map1[2] = {0, 0};
    unsigned char off1[1] = {1};
    double W1[1] = {7};
    assert_int_equal(traffic_(map1, 2, 1, off1, 2, W1, 0, &h2d, &d2h, dr), 0);
    near_(h2d, 14, TOL, "S 1 h2d");
    near_(dr[0], 2, TOL, "S 1 drains");

    /* the cpu planner's count for the same spec on cpu */
    run_spec s;
    char err[512];
    spec_of_(&s, small_);
    s.device.backend = BACKEND_CPU;
    s.train.grad_accum = 2;
    offload_plan p;
    plan_one_offloaded_(&s, &p);
    p2r_phase ph;
    assert_int_equal(p2r_phase_of_plan(&s, &p, 0, &ph, err, sizeof err), 0);
    int mp[2] = {0, 1};
    unsigned char of[2] = {0, 1};
    double w2[2] = {3280 * 4.0, 3280 * 4.0};
    assert_int_equal(traffic_(mp, 2, 2, of, 2, w2, 1, &h2d, &d2h, dr), 0);
    near_(h2d, (double)p.h2d_bytes_per_step, TOL, "traffic_ = planner h2d");
    near_(d2h, (double)p.d2h_bytes_per_step, TOL, "traffic_ = planner d2h");
    /* cpu A 2, k 1: h2d 2W + W, fp32 W = 13120 */
    near_(ph.h2d_bytes, 3 * 13120.0, TOL, "cpu h2d by hand");
    near_(ph.adam_bytes, 3280.0 * 28, TOL, "cpu adam bytes");
    offload_plan_free(&p);
}

static void test_wall(void **st)
{
    (void)st;
    char err[256];
    /* t_pseudo 1, t_real 4, P 250, N_s 1000, R 1.1: N_p 1100; P2R 250 +
     * 850 * 4 = 3650, scratch 4000: 0.9125. Break-even 1 + 0.25 (1 -
     * 0.25) = 1.1875 */
    p2r_wall w = {.pseudo_steps = 250, .scratch_steps = 1000,
                  .steps_ratio = 1.1};
    assert_int_equal(p2r_wall_fill(&w, 1, 4, err, sizeof err), 0);
    near_(w.p2r_steps, 1100, TOL, "N_p");
    near_(w.wall_p2r_s, 3650, TOL, "wall p2r");
    near_(w.wall_scratch_s, 4000, TOL, "wall scratch");
    near_(w.wall_ratio, 0.9125, TOL, "wall ratio");
    near_(w.break_even, 1.1875, TOL, "break-even");
    /* plugged back: equal wall-clock */
    const double cases[][4] = {  /* t_pseudo, t_real, P, N_s */
        {1, 4, 250, 1000}, {2, 1, 250, 1000}, {4, 1, 500, 1000},
        {0.3, 0.7, 30, 90},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double *c = cases[i];
        double R = p2r_break_even(c[0], c[1], c[2], c[3]);
        p2r_wall b = {.pseudo_steps = c[2], .scratch_steps = c[3],
                      .steps_ratio = R};
        assert_int_equal(p2r_wall_fill(&b, c[0], c[1], err, sizeof err), 0);
        near_(b.wall_ratio, 1, 1e-12, "break-even plugged back");
    }
    /* t_pseudo 4, t_real 1, P 500: P t_pseudo 2000 >= 1000: the crossing
     * is before the delink, R* = 1/4 (N_p 250 pseudo steps of 4 s) */
    near_(p2r_break_even(4, 1, 500, 1000), 0.25, TOL, "break-even early");
    /* reached before the delink: N_p t_pseudo */
    p2r_wall e = {.pseudo_steps = 500, .scratch_steps = 1000,
                  .steps_ratio = 0.2};
    assert_int_equal(p2r_wall_fill(&e, 1, 2, err, sizeof err), 0);
    near_(e.wall_p2r_s, 200, TOL, "wall before delink");
    /* never: no ratio, break-even still */
    p2r_wall n = {.pseudo_steps = 250, .scratch_steps = 1000, .never = 1};
    assert_int_equal(p2r_wall_fill(&n, 1, 4, err, sizeof err), 0);
    assert_true(n.wall_ratio == 0);
    near_(n.break_even, 1.1875, TOL, "break-even never");
    /* bad input */
    p2r_wall bad = {.pseudo_steps = 250, .scratch_steps = 1000,
                    .steps_ratio = -1};
    assert_int_equal(p2r_wall_fill(&bad, 1, 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "steps ratio"));
    bad.steps_ratio = 1;
    assert_int_equal(p2r_wall_fill(&bad, 0, 4, err, sizeof err), -1);
}

static char dir_[64];

static const char *write_csv_(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

#define ROW_(corpus, seed, share, pf, opt, rf, gs, lrs, stt, sr)            \
    corpus "," seed "," share "," pf "," opt "," rf "," gs "," lrs          \
    ",1000,2.0,2.0,1.0," stt ",900," sr ",10,10,1.0\n"

static void test_sweep(void **st)
{
    (void)st;
    char err[1024];
    snprintf(dir_, sizeof dir_, "/tmp/m6-test-p2r.XXXXXX");
    assert_non_null(mkdtemp(dir_));
    const char *ok = write_csv_("ok.csv",
        P2R_SWEEP_HEADER "\n"
        ROW_("fortunes", "1337", "1", "0.25", "copy", "0", "sum", "1", "810", "0.9")
        ROW_("fortunes", "7", "1", "0.25", "copy", "0", "sum", "1", "990", "1.1")
        ROW_("fortunes", "1337", "2", "0.25", "copy", "0", "sum", "1", "-1", "never")
        ROW_("fortunes", "7", "2", "0.25", "copy", "0", "sum", "1", "950", "1.05")
        ROW_("foldoc", "1337", "1", "0.25", "copy", "0", "sum", "1", "-1", "never")
        ROW_("fortunes", "1337", "1", "0.1", "reset", "0.05", "mean", "2", "850", "0.7"));
    p2r_sweep_key k = {.corpus = "fortunes", .share_groups = 1,
                       .pseudo_frac = 0.25, .delink_optimizer = "copy",
                       .rewarm_frac = 0, .pseudo_lr_scale = -1};
    p2r_sweep_match m;
    assert_int_equal(p2r_sweep_lookup(ok, &k, &m, err, sizeof err), 0);
    assert_int_equal(m.rows, 2);
    assert_int_equal(m.never, 0);
    near_(m.mean_step_ratio, 1.0, TOL, "mean of 0.9 and 1.1");
    assert_string_equal(m.grad_scale, "sum");
    /* one seed never reached it */
    k.share_groups = 2;
    assert_int_equal(p2r_sweep_lookup(ok, &k, &m, err, sizeof err), 0);
    assert_int_equal(m.rows, 2);
    assert_int_equal(m.never, 1);
    /* 1/10 as %g prints it; the other settings */
    k = (p2r_sweep_key){.corpus = "fortunes", .share_groups = 1,
                        .pseudo_frac = 100.0 / 1000, .delink_optimizer = "reset",
                        .rewarm_frac = 50.0 / 1000, .pseudo_lr_scale = -1};
    assert_int_equal(p2r_sweep_lookup(ok, &k, &m, err, sizeof err), 0);
    near_(m.mean_step_ratio, 0.7, TOL, "reset row");
    assert_string_equal(m.grad_scale, "mean");
    /* no such setting: the error lists what the corpus has */
    k.pseudo_frac = 0.3;
    assert_int_equal(p2r_sweep_lookup(ok, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "no row of corpus \"fortunes\""));
    assert_non_null(strstr(err, "1/0.25/copy/0"));
    /* no such corpus */
    k.corpus = "wiki";
    assert_int_equal(p2r_sweep_lookup(ok, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "fortunes, foldoc"));
    /* a filter leaves out the other setting */
    const char *two = write_csv_("two.csv",
        P2R_SWEEP_HEADER "\n"
        ROW_("fortunes", "1", "1", "0.3", "copy", "0", "sum", "1", "900", "0.9")
        ROW_("fortunes", "1", "1", "0.3", "copy", "0", "mean", "1", "700", "0.7"));
    k = (p2r_sweep_key){.corpus = "fortunes", .share_groups = 1,
                        .pseudo_frac = 0.3, .delink_optimizer = "copy",
                        .pseudo_lr_scale = -1};
    assert_int_equal(p2r_sweep_lookup(two, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "--grad-scale"));
    k.grad_scale = "mean";
    assert_int_equal(p2r_sweep_lookup(two, &k, &m, err, sizeof err), 0);
    near_(m.mean_step_ratio, 0.7, TOL, "filtered");
    /* malformed files */
    const struct { const char *text, *want; } bad[] = {
        {"corpus,seed\n", ":1: not bench/p2r_sweep's CSV"},
        {"", "empty file"},
        {P2R_SWEEP_HEADER "\n", "no rows"},
        {P2R_SWEEP_HEADER "\nfortunes,1,1\n", ":2: 3 fields, want 18"},
        {P2R_SWEEP_HEADER "\n"
         ROW_("fortunes", "1", "1", "0.3", "copy", "0", "sum", "1", "900", "fast"),
         ":2: field step_ratio: bad value \"fast\""},
        {P2R_SWEEP_HEADER "\n"
         ROW_("fortunes", "1", "1", "0.3", "copy", "0", "sum", "1", "900", "never"),
         "field step_ratio"},
        {P2R_SWEEP_HEADER "\n"
         ROW_("fortunes", "1", "1", "0.3", "keep", "0", "sum", "1", "900", "1"),
         "field delink_optimizer: bad value \"keep\""},
        {P2R_SWEEP_HEADER "\n"
         ROW_("fortunes", "1", "x", "0.3", "copy", "0", "sum", "1", "900", "1"),
         "field share_groups"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = write_csv_("bad.csv", bad[i].text);
        assert_int_equal(p2r_sweep_lookup(p, &k, &m, err, sizeof err), -1);
        if (!strstr(err, bad[i].want)) {
            fprintf(stderr, "case %zu: %s\n", i, err);
            fail();
        }
    }
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none.csv", dir_);
    assert_int_equal(p2r_sweep_lookup(missing, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "No such file"));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    assert_int_equal(system(cmd), 0);
}

/* The whole model on the small spec, one slot offloaded in the real
 * phase: times and ratios by hand from the figures above. */
static void test_plan_for_spec(void **st)
{
    (void)st;
    run_spec s;
    char err[1024];
    spec_of_(&s, small_);
    offload_plan p;
    plan_one_offloaded_(&s, &p);
    size_t budget = p.budget_bytes;
    offload_plan_free(&p);
    p2r_options o = {.budget_override = budget, .steps_ratio = 1.5,
                     .pseudo_lr_scale = -1};
    /* rates chosen so each term is round: compute 16 * 48576 FLOPs at
     * 777216 FLOP/s = 1 s; h2d 6560 B at 3280 B/s = 2 s; d2h 6560 at
     * 6560 B/s = 1 s; AdamW 98400 B at 32800 B/s = 3 s */
    o.rates = (p2r_rates){.gpu_flops = 777216, .h2d_bytes_per_s = 3280,
                          .d2h_bytes_per_s = 6560,
                          .host_adam_bytes_per_s = 32800,
                          .nvlink_bytes_per_s = 1, .net_bytes_per_s = 1};
    p2r_report r;  /* (one device: no all-to-all, the link rates unused) */
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), 0);
    /* the pseudo phase (S 1) fits the budget: resident, 1 s */
    assert_int_equal(r.pseudo.n_offloaded, 0);
    near_(r.pseudo.t_step, 1, TOL, "t_pseudo");
    near_(r.real.t_compute, 1, TOL, "real compute");
    near_(r.real.t_copy, 2, TOL, "real copy");
    near_(r.real.t_adam, 3, TOL, "real adam");
    near_(r.real.t_step, 3, TOL, "t_real (overlapped: max)");
    near_(r.step_ratio, 1.0 / 3, TOL, "step ratio");
    /* P 1, N_s 4, R 1.5: N_p 6; P2R 1 * 1 + 5 * 3 = 16, scratch 12 */
    near_(r.wall.wall_p2r_s, 16, TOL, "wall p2r");
    near_(r.wall.wall_scratch_s, 12, TOL, "wall scratch");
    near_(r.wall.wall_ratio, 16.0 / 12, TOL, "wall ratio");
    /* 1 + (1/4)(1 - 1/3) = 7/6 */
    near_(r.wall.break_even, 7.0 / 6, TOL, "break-even");
    /* --scratch-steps 8: P2R 1 + 11 * 3 = 34 against 24 */
    o.scratch_steps = 8;
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), 0);
    near_(r.wall.wall_ratio, 34.0 / 24, TOL, "wall ratio N_s 8");

    /* the JSON form carries the figures */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    p2r_print(f, &r, 1);
    fclose(f);
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    assert_non_null(j);
    near_(json_real_value(json_object_get(json_object_get(j, "real"),
                                          "t_step_s")), 3, TOL, "json t_real");
    near_(json_real_value(json_object_get(j, "wall_ratio")), 34.0 / 24, TOL,
          "json wall ratio");
    json_decref(j);
    free(buf);

    /* errors: a negative rate, both sources of R, no pseudo phase */
    o.rates.h2d_bytes_per_s = -1;
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--h2d-gbps"));
    o.rates.h2d_bytes_per_s = 3280;
    o.sweep = "/nonexistent.csv";
    o.corpus = "fortunes";
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--steps-ratio and --sweep"));
    o.steps_ratio = -1;
    o.corpus = NULL;
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--corpus"));
    o.sweep = NULL;
    s.pseudo.steps = 0;
    assert_int_equal(p2r_plan_for_spec(&s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "pseudo.steps"));
}

TEST_MAIN(
    cmocka_unit_test(test_flops),
    cmocka_unit_test(test_phase_time),
    cmocka_unit_test(test_phase_of_plan),
    cmocka_unit_test(test_traffic),
    cmocka_unit_test(test_wall),
    cmocka_unit_test(test_sweep),
    cmocka_unit_test(test_plan_for_spec))
