/*
 * test_facts.c — model/facts.h against the model and a hand count. For a
 * dense, an all-MoE and a mixed model, each in its Real (S = L) and Pseudo
 * form: model_param_floats against the size of the parameter block gpt.c
 * actually allocates (gpt_model.n_params), and every count and the FLOPs
 * per token against numbers worked out by hand below from the tensor
 * shapes (not from layout.c), with the padding to 16 floats done here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "model/facts.h"
#include "model/gpt.h"
#include "../common/test_main.h"

/* The shapes of every case: V = 50, C = 12 (NH 2), T = 7; chosen so that
 * no region is a multiple of 16 floats and the padding shows.
 *
 * globals: wte 50*12 = 600, wpe 7*12 = 84, ln_f 2*12 = 24 -> 708
 *          (embeddings 684), padded 720
 * dense slot: ln_1 24, c_attn 36*12 + 36 = 468, attn c_proj 144 + 12 = 156,
 *          ln_2 24, c_fc 48*12 + 48 = 624, mlp c_proj 12*48 + 12 = 588
 *          -> 1884, padded 1888
 * MoE slot (E 4, k 2, H 10): ln_1, c_attn, c_proj, ln_2 as above = 672;
 *          one expert: c_fc 10*12 + 10 = 130, c_proj 12*10 + 12 = 132 ->
 *          262, four 1048; gate 4*12 + 4 = 52 -> 1772, padded 1776
 *          (110.75 * 16)
 * per token (N): LM head 600; a dense block 1884; an MoE block 672 + gate
 *          52 + 2 experts 524 = 1248
 * FLOPs per token: 6 N + 12 L C T; 12 C T = 12 * 12 * 7 = 1008 per layer.
 */
typedef struct {
    const char *name;
    model_config cfg;
    int S_pseudo;
    size_t params_real, params_pseudo;   /* unpadded */
    size_t floats_real, floats_pseudo;   /* the allocation */
    size_t slot_dense, slot_moe;
    double active, flops;
} case_;

static model_config cfg_(int L, int E, int every)
{
    return (model_config){
        .vocab_size = 50, .n_layer = L, .n_head = 2, .n_embd = 12,
        .seq_len = 7, .moe_experts = E, .moe_prototypes = E ? 2 : 0,
        .moe_every = every, .moe_hidden = E ? 10 : 0,
        .moe_capacity_factor = 1.25f, .moe_eval_capacity_factor = 2,
        .moe_aux_coef = 0.01f};
}

static const case_ *cases_(int *n)
{
    static case_ c[3];
    /* dense, L 3; Pseudo S 1 */
    c[0] = (case_){"dense", cfg_(3, 0, 0), 1,
                   708 + 3 * 1884, 708 + 1884,
                   720 + 3 * 1888, 720 + 1888,
                   1884, 1884,
                   600 + 3 * 1884, 6.0 * (600 + 3 * 1884) + 3 * 1008};
    /* all MoE, L 2; Pseudo S 1 */
    c[1] = (case_){"moe", cfg_(2, 4, 1), 1,
                   708 + 2 * 1772, 708 + 1772,
                   720 + 2 * 1776, 720 + 1776,
                   1884, 1772,
                   600 + 2 * 1248, 6.0 * (600 + 2 * 1248) + 2 * 1008};
    /* mixed, L 4, MoE in layers 1 and 3; Pseudo S 2 (one slot of each
     * kind: gpt_default_share_map) */
    c[2] = (case_){"mixed", cfg_(4, 4, 2), 2,
                   708 + 2 * 1884 + 2 * 1772, 708 + 1884 + 1772,
                   720 + 2 * 1888 + 2 * 1776, 720 + 1888 + 1776,
                   1884, 1772,
                   600 + 2 * 1884 + 2 * 1248,
                   6.0 * (600 + 2 * 1884 + 2 * 1248) + 4 * 1008};
    *n = 3;
    return c;
}

/* The size of the parameter block gpt.c allocates for cfg with S slots. */
static size_t allocated_(const model_config *cfg, int S)
{
    gpt_model g;
    memset(&g, 0, sizeof g);
    assert_int_equal(gpt_create(&g, cfg, S, 1), 0);
    size_t n = g.n_params;
    gpt_free(&g);
    return n;
}

/* check(c, L, S) for every case c: L its Real slot count (n_layer), S
 * its Pseudo one. */
static void each_case_(void (*check)(const case_ *c, int L, int S))
{
    int n;
    const case_ *c = cases_(&n);
    for (int i = 0; i < n; i++)
        check(&c[i], c[i].cfg.n_layer, c[i].S_pseudo);
}

static void against_allocation_(const case_ *c, int L, int S)
{
    const model_config *m = &c->cfg;
    printf("# %s: real %zu floats, pseudo (S=%d) %zu\n", c->name,
           allocated_(m, L), S, allocated_(m, S));
    assert_int_equal(model_param_floats(m, L, NULL), allocated_(m, L));
    assert_int_equal(model_param_floats(m, S, NULL), allocated_(m, S));
    /* the allocation, and the facts, against the hand count */
    assert_int_equal(allocated_(m, L), c->floats_real);
    assert_int_equal(allocated_(m, S), c->floats_pseudo);
}

static void test_against_allocation(void **st)
{
    (void)st;
    each_case_(against_allocation_);
}

/* Optimizer state: model_optim_floats against gpt.c's allocation
 * (gpt_optim_bytes: the sizes of m and v as allocated) and, for
 * Adafactor's second moment, a hand count (rows + cols a matrix, n a
 * vector):
 *   globals: wte 50 + 12, wpe 7 + 12, ln_f 24 -> 105
 *   dense slot: ln_1 24, c_attn 36 + 12 + 36, attn c_proj 12 + 12 + 12,
 *     ln_2 24, c_fc 48 + 12 + 48, mlp c_proj 12 + 48 + 12 -> 348
 *   MoE slot: ln_1, c_attn, c_proj, ln_2 168; 2 prototype gates (2 x 12)
 *     2 + 12 + 2 each -> 32; 4 experts c_fc (10 x 12) 22 + 10, c_proj
 *     (12 x 10) 22 + 12 -> 66 each, 264 -> 464 */
static void optimizer_state_(const case_ *c, int L, int S)
{
    (void)S;
    const model_config *m = &c->cfg;
    const size_t hand_v[3] = {105, 348, 464};   /* globals, dense, MoE */
    for (int opt = 0; opt < 3; opt++) {
        gpt_optim o = {opt > 0, opt == 2, 0, 0, 0};
        gpt_model g;
        memset(&g, 0, sizeof g);
        assert_int_equal(gpt_create_optim(&g, m, L, 1, NULL, &o), 0);
        size_t want = model_optim_floats(m, -1, &o);
        for (int s = 0; s < L; s++)
            want += model_optim_floats(m, g.slot_moe[s], &o);
        printf("# %s, %s: %zu bytes of optimizer state\n", c->name,
               opt == 0 ? "AdamW" : opt == 1 ? "Adafactor"
                                             : "Adafactor with m",
               gpt_optim_bytes(&g));
        assert_int_equal(gpt_optim_bytes(&g), want * sizeof(float));
        if (opt == 1) {
            /* and by part: an MoE slot's 464 = 168 + 32 (gates) + 4 x 66 */
            model_af_floats af;
            assert_int_equal(model_af_state_floats(m, &af), 0);
            assert_int_equal(af.global, hand_v[0]);
            assert_int_equal(af.dense_slot, hand_v[1]);
            if (m->moe_experts > 0) {
                assert_int_equal(af.expert, 66);
                assert_int_equal(af.moe_shared, 168 + 32);
            }
            assert_int_equal(model_optim_floats(m, -1, &o), hand_v[0]);
            for (int s = 0; s < L; s++)
                assert_int_equal(model_optim_floats(m, g.slot_moe[s], &o),
                                 hand_v[1 + g.slot_moe[s]]);
        }
        if (opt == 0)
            assert_int_equal(gpt_optim_bytes(&g),
                             2 * c->floats_real * sizeof(float));
        gpt_free(&g);
    }
}

static void test_optimizer_state(void **st)
{
    (void)st;
    each_case_(optimizer_state_);
}

static void hand_counts_(const case_ *c, int L, int S)
{
    const model_config *m = &c->cfg;
    printf("# %s\n", c->name);
    assert_int_equal(model_global_params(m), 708);
    assert_int_equal(model_embedding_params(m), 684);
    assert_int_equal(model_slot_params(m, 0), c->slot_dense);
    assert_int_equal(model_slot_params(m, 1), c->slot_moe);
    assert_int_equal(model_params(m, L), c->params_real);
    assert_int_equal(model_params(m, S), c->params_pseudo);
    assert_float_equal(model_active_params(m), c->active, 0);
    assert_float_equal(model_flops_per_token(m), c->flops, 0);
}

static void test_hand_counts(void **st)
{
    (void)st;
    each_case_(hand_counts_);
}

/* The block parts (hand count in the comment at the top) and the bytes
 * per parameter: each total the sum of its parts, and the CPU model's
 * resident figure the four fp32 buffers gpt.c allocates (params, grads,
 * m, v: 4 * 4 bytes per float of n_params). */
static void test_parts_and_bytes(void **st)
{
    (void)st;
    model_config m = cfg_(4, 4, 2);
    model_block_parts p = model_block_parts_of(&m);
    assert_int_equal(p.attn, 672);
    assert_int_equal(p.mlp, 624 + 588);
    assert_int_equal(p.gate, 52);
    assert_int_equal(p.expert, 262);
    model_config d = cfg_(3, 0, 0);
    p = model_block_parts_of(&d);
    assert_int_equal(p.attn + p.mlp, 1884);
    assert_int_equal(p.gate, 0);
    assert_int_equal(p.expert, 0);
    for (int cuda = 0; cuda < 2; cuda++) {
        model_param_bytes b = model_param_bytes_of(cuda);
        assert_int_equal(b.resident, b.weights + b.grads + b.optim);
        assert_int_equal(b.host, b.host_weights + b.host_grads + b.optim);
        assert_true(b.pinned <= b.host && b.spec_pinned <= b.spec_host);
        assert_int_equal(b.resident, 4 * sizeof(float));
        assert_int_equal(b.moved, cuda ? 2 : 4); /* bf16, fp32 */
        assert_int_equal(b.staging, 2 * b.moved); /* weights + grads */
        /* each optimizer setting (facts.h model_param_bytes_for), by
         * hand: Adafactor's m 4 or none; bf16 masters 4 bytes less on
         * the CUDA model (no fp32 master), nothing less on the CPU one */
        for (int k = 0; k < 6; k++) {
            gpt_optim o = {k >= 2, k >= 4, k % 2, 0, 0};
            model_param_bytes x = model_param_bytes_for(cuda, &o);
            int optim = k < 2 ? 8 : k < 4 ? 0 : 4;
            int w = cuda ? (k % 2 ? 2 : 6) : 4;
            int hw = cuda ? (k % 2 ? 2 : 6) : 4;
            assert_int_equal(x.optim, optim);
            assert_int_equal(x.weights, w);
            assert_int_equal(x.host_weights, hw);
            assert_int_equal(x.grads, b.grads);
            assert_int_equal(x.resident, w + b.grads + optim);
            assert_int_equal(x.host, hw + b.host_grads + optim);
        }
        gpt_optim fp = {0, 0, 0, 0, 0};
        model_param_bytes y = model_param_bytes_for(cuda, &fp);
        assert_memory_equal(&y, &b, sizeof y);
    }
}

/* S out of range, or a share map that puts layers of two kinds in one
 * slot: 0, not a count. */
static void test_bad_input(void **st)
{
    (void)st;
    model_config m = cfg_(4, 4, 2);
    assert_int_equal(model_params(&m, 0), 0);
    assert_int_equal(model_params(&m, 5), 0);
    assert_int_equal(model_param_floats(&m, 0, NULL), 0);
    /* a mixed model cannot have one slot for both kinds */
    assert_int_equal(model_param_floats(&m, 1, NULL), 0);
    int bad[4] = {0, 0, 1, 1}; /* slot 0 holds a dense and an MoE layer */
    assert_int_equal(model_param_floats(&m, 2, bad), 0);
}

/* Expert parallelism's split, by hand: E 10 over P 4 is 2, 3, 2, 3 from
 * experts 0, 2, 5, 7; E 3 over P 5 leaves ranks 0 and 2 without one; the
 * last rank's share is the largest, ceil(E / P), as the plan says. */
static void test_expert_ranges(void **state)
{
    (void)state;
    const int first10[4] = {0, 2, 5, 7}, n10[4] = {2, 3, 2, 3};
    const int first3[5] = {0, 0, 1, 1, 2}, n3[5] = {0, 1, 0, 1, 1};
    for (int q = 0; q < 4; q++) {
        int f, n = model_expert_range(10, 4, q, &f);
        assert_int_equal(f, first10[q]);
        assert_int_equal(n, n10[q]);
    }
    for (int q = 0; q < 5; q++) {
        int f, n = model_expert_range(3, 5, q, &f);
        assert_int_equal(f, first3[q]);
        assert_int_equal(n, n3[q]);
    }
    int f;
    assert_int_equal(model_expert_range(10240, 512, 511, &f), 20);
    assert_int_equal(model_expert_range(10240, 512, 0, &f), 20);
    assert_int_equal(model_expert_range(10241, 512, 511, &f), 21);
    assert_int_equal(f, 10220);
}

/* The all-to-all bytes of one MoE layer's step, by hand: N 10 tokens, k
 * 2, C 3, E 4 over P 2 (rank 0 holds experts 0-1): 20 rows, half to
 * rank 1, four times, 3 floats of 4 bytes: 480; plus 2 int32 counts.
 * E 10 over P 4, rank 1 holds 3: 7/10 of 20 rows x 4 x 3 x 2 bytes (bf16)
 * = 336, plus 7 counts = 364. P 1: nothing. */
static void test_ep_alltoall_bytes(void **state)
{
    (void)state;
    assert_float_equal(model_ep_alltoall_bytes(10, 2, 3, 4, 2, 0, 4), 488.0,
                       1e-9);
    assert_float_equal(model_ep_alltoall_bytes(10, 2, 3, 10, 4, 1, 2), 364.0,
                       1e-9);
    assert_float_equal(model_ep_alltoall_bytes(10, 2, 3, 4, 1, 0, 4), 0.0,
                       0.0);
}

/* model_ep_alltoall_seconds by hand: latency per call, then the slower of
 * the two links, the bytes split by where the P - 1 peers are */
static void test_ep_alltoall_seconds(void **state)
{
    (void)state;
    /* one node of 4: 10 calls x 1 ms + 3e9 B / 1e9 B/s = 3.01 s */
    assert_float_equal(model_ep_alltoall_seconds(3e9, 10, 4, 8, 1e9, 1e8,
                                                 1e-3), 3.01, 1e-12);
    /* 16 ranks, 4 a node: 12 of 15 peers away; 3e9 B: 2.4e9 over the
     * network at 1e9 (2.4 s), 0.6e9 inside at 2e9 (0.3 s): 2.4 + 5 x 0 */
    assert_float_equal(model_ep_alltoall_seconds(3e9, 5, 16, 4, 2e9, 1e9, 0),
                       2.4, 1e-12);
    /* the inside link the slower: 0.6e9 / 1e8 = 6 s */
    assert_float_equal(model_ep_alltoall_seconds(3e9, 5, 16, 4, 1e8, 1e9, 0),
                       6.0, 1e-12);
    /* one rank a node: every peer away */
    assert_float_equal(model_ep_alltoall_seconds(2e9, 0, 3, 1, 1e12, 1e9, 1),
                       2.0, 1e-12);
    /* no group: the calls' latency alone */
    assert_float_equal(model_ep_alltoall_seconds(2e9, 3, 1, 8, 1e9, 1e9, 0.5),
                       1.5, 1e-12);
}

TEST_MAIN(
    cmocka_unit_test(test_against_allocation),
    cmocka_unit_test(test_optimizer_state),
    cmocka_unit_test(test_ep_alltoall_bytes),
    cmocka_unit_test(test_ep_alltoall_seconds),
    cmocka_unit_test(test_hand_counts),
    cmocka_unit_test(test_parts_and_bytes),
    cmocka_unit_test(test_bad_input),
    cmocka_unit_test(test_expert_ranges))
