/*
 * test_model.c — the model and trainer: sharing, delink, determinism,
 * checkpoint round trips. References are independent of the code under
 * test: per-layer gradients from an unshared model, AdamW by hand in double,
 * bitwise equality where the method promises it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels.h"
#include "model/gpt.h"
#include "model/facts.h"
#include "ckpt/checkpoint.h"
#include "train/data.h"
#include "train/trainer.h"
#define FIXTURE_NAME "model"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

static const model_config small_ = {.vocab_size = 29, .n_layer = 3,
                                    .n_head = 2, .n_embd = 16, .seq_len = 8};

/* ---------------------------------------------------------- sharing */

/* S=1: the shared slot's gradient equals the sum of the per-layer gradients
 * of an unshared model holding the same weights in every layer, and one
 * AdamW step equals the update computed by hand from that summed gradient. */
static void test_shared_gradient_and_update(void **state)
{
    (void)state;
    const int B = 2, T = small_.seq_len, L = small_.n_layer;
    gpt_model sh, un;
    assert_int_equal(gpt_create(&sh, &small_, 1, B), 0);
    assert_int_equal(gpt_create(&un, &small_, L, B), 0);
    /* exactly one set of weights and moments */
    assert_int_equal(sh.n_params, sh.n_global + sh.slot_size);
    gpt_init_weights(&sh, 5);
    memcpy(un.params, sh.params, sh.n_global * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(gpt_slot_ptr(&un, un.params, l), gpt_slot_ptr(&sh, sh.params, 0),
               sh.slot_size * sizeof(float));
    int32_t inp[2 * 8], tgt[2 * 8];
    synth_random_batch(inp, tgt, B * T, small_.vocab_size, 11);

    gpt_zero_grad(&sh);
    gpt_zero_grad(&un);
    float l1 = gpt_forward(&sh, inp, tgt, B);
    float l2 = gpt_forward(&un, inp, tgt, B);
    assert_true(l1 == l2); /* same function, same ops: bitwise */
    gpt_backward(&sh, inp, tgt, B, 1.0f / (B * T));
    gpt_backward(&un, inp, tgt, B, 1.0f / (B * T));

    /* summed per-layer gradient, in double */
    size_t ns = sh.slot_size;
    double *gsum = calloc(ns, sizeof(double));
    for (int l = 0; l < L; l++) {
        const float *gl = gpt_slot_ptr(&un, un.grads, l);
        for (size_t i = 0; i < ns; i++)
            gsum[i] += gl[i];
    }
    const float *gs = gpt_slot_ptr(&sh, sh.grads, 0);
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < ns; i++) {
        maxref = fmax(maxref, fabs(gsum[i]));
        maxdiff = fmax(maxdiff, fabs(gsum[i] - gs[i]));
    }
    /* fp32 sums in a different order: relative 1e-5 */
    assert_true(maxref > 0);
    assert_true(maxdiff <= 1e-5 * maxref);

    /* one AdamW step by hand (t=1: mhat = g, vhat = g^2) */
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *before = malloc(ns * sizeof(float));
    memcpy(before, gpt_slot_ptr(&sh, sh.params, 0), ns * sizeof(float));
    gpt_adamw(&sh, lr, b1, b2, eps, wd, 1.0f);
    assert_int_equal(sh.adam_t_slot[0], 1);
    const float *after = gpt_slot_ptr(&sh, sh.params, 0);
    for (int k = 0; k < SLOT_NTENSORS; k++) {
        const gpt_tensor *t = &sh.slot[k];
        for (size_t j = 0; j < t->numel; j++) {
            size_t i = t->offset + j;
            double g = gsum[i], p = before[i];
            double m = (1 - b1) * g, v = (1 - b2) * g * g;
            double mh = m / (1 - b1), vh = v / (1 - b2);
            double want = p - lr * (mh / (sqrt(vh) + eps) +
                                    (t->decay ? wd : 0) * p);
            /* |update| <= lr; fp32 grad error makes g/|g| flip only for
             * |g| ~ 1e-9, which these shapes do not produce. */
            assert_true(fabs(after[i] - want) <= 1e-5 * fmax(1.0, fabs(want)));
        }
    }
    free(before);
    free(gsum);
    gpt_free(&sh);
    gpt_free(&un);
}

/* gpt_zero_grad leaves a dense slot's weight matrices unwritten and marks
 * them; the first backward stores them. Checked against a model that
 * never ran gpt_zero_grad (zeroed at creation, so every backward adds):
 * over NaN-filled gradients, zero_grad then two microbatches of a shared
 * slot (3 layers: the first stores, the other five layer passes add) give
 * the same bits; and a norm taken with no backward after zero_grad is 0,
 * not the NaN left in the unwritten matrices. */
static void test_zero_grad_marks_and_stores(void **state)
{
    (void)state;
    const int B = 2, T = small_.seq_len;
    gpt_model ref, g;
    assert_int_equal(gpt_create(&ref, &small_, 1, B), 0);
    assert_int_equal(gpt_create(&g, &small_, 1, B), 0);
    gpt_init_weights(&ref, 8);
    memcpy(g.params, ref.params, ref.n_local * sizeof(float));
    for (size_t i = 0; i < g.n_local; i++)
        g.grads[i] = NAN;
    gpt_zero_grad(&g);
    assert_int_equal(g.dw_fresh[0], 1);
    assert_true(gpt_grad_norm(&g) == 0.0f);

    for (size_t i = 0; i < g.n_local; i++)
        g.grads[i] = NAN;
    gpt_zero_grad(&g);
    int32_t inp[2 * 8], tgt[2 * 8];
    for (int k = 0; k < 2; k++) {
        synth_random_batch(inp, tgt, B * T, small_.vocab_size, 40 + k);
        gpt_forward(&ref, inp, tgt, B);
        gpt_backward(&ref, inp, tgt, B, 0.5f / (B * T));
        gpt_forward(&g, inp, tgt, B);
        gpt_backward(&g, inp, tgt, B, 0.5f / (B * T));
        assert_int_equal(g.dw_fresh[0], 0);
    }
    assert_memory_equal(g.grads, ref.grads, g.n_local * sizeof(float));
    assert_true(gpt_grad_norm(&g) > 0.0f);
    gpt_free(&ref);
    gpt_free(&g);
}

/* ---------------------------------------------------------- delink */

static void train_steps_(gpt_model *g, int n, int B, uint64_t seed)
{
    int T = g->cfg.seq_len;
    int32_t *inp = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
    for (int s = 0; s < n; s++) {
        synth_random_batch(inp, tgt, B * T, g->cfg.vocab_size, seed + s);
        gpt_zero_grad(g);
        gpt_forward(g, inp, tgt, B);
        gpt_backward(g, inp, tgt, B, 1.0f / (B * T));
        gpt_adamw(g, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
    }
    free(inp);
    free(tgt);
}

/* Layer l's output (residual3, (B,T,C) at g->B) after a forward pass. */
static const float *layer_out_(const gpt_model *g, int l)
{
    return g->a.residual3 + (size_t)l * g->B * g->T * g->cfg.n_embd;
}

/* After a delink to S = L slots, layer l must read slot l and no other
 * layer may read it. Checked two ways, each failing for a share map left
 * at the slot a layer shared before (slot 0 of a dense or MoE model, the
 * first slot of its kind in a mixed one), whole or for one layer:
 *  - forward, slot by slot: one weight of slot l alone moved (its
 *    attention projection's first bias, +0.5) changes layer l's output
 *    and the loss and leaves the outputs of layers 0..l-1 bitwise as they
 *    were. Over every l that pins slot_of[l] = l: layer l reads slot l,
 *    and no earlier layer does.
 *  - backward: loss and gradients bitwise those of an unshared model
 *    made by gpt_create with S = L (its map checked to be the identity
 *    here) holding the same weights: same kernels, same order. The slots
 *    must already differ (train a step after the delink): right after it
 *    every slot holds the same bytes and any map computes the same.
 * Needs B == g->B. */
static void assert_layers_own_slots_(gpt_model *g, const int32_t *inp,
                                     const int32_t *tgt, int B)
{
    const model_config *c = &g->cfg;
    const int L = c->n_layer;
    const size_t out = (size_t)B * g->T * c->n_embd;
    assert_int_equal(B, g->B);
    assert_int_equal(g->S, L);
    for (int l = 0; l < L; l++)
        assert_int_equal(g->slot_moe[l], model_layer_is_moe(c, l));

    float base = gpt_forward(g, inp, tgt, B);
    float *ref = malloc((size_t)L * out * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(ref + l * out, layer_out_(g, l), out * sizeof(float));
    for (int l = 0; l < L; l++) {
        float *w = gpt_slot_ptr(g, g->params, l) +
                   gpt_slot_tensors(g, l)[SLOT_ATTPROJ_B].offset;
        float keep = *w;
        *w += 0.5f;
        float moved = gpt_forward(g, inp, tgt, B);
        *w = keep;
        for (int j = 0; j < l; j++)
            if (memcmp(layer_out_(g, j), ref + j * out, out * sizeof(float)))
                fail_msg("slot %d moved: layer %d's output changed (it must "
                         "read slot %d only)", l, j, j);
        if (!memcmp(layer_out_(g, l), ref + l * out, out * sizeof(float)))
            fail_msg("slot %d moved: layer %d's output did not change (it "
                     "does not read slot %d)", l, l, l);
        if (moved == base)
            fail_msg("slot %d moved: the loss did not change", l);
    }
    assert_true(gpt_forward(g, inp, tgt, B) == base); /* restored */

    gpt_model un;
    assert_int_equal(gpt_create(&un, c, L, B), 0);
    for (int l = 0; l < L; l++) {
        assert_int_equal(un.slot_of[l], l);
        assert_int_equal(un.slot_moe[l], model_layer_is_moe(c, l));
        assert_int_equal(gpt_slot_floats(&un, l), gpt_slot_floats(g, l));
    }
    assert_int_equal(un.n_global, g->n_global);
    memcpy(un.params, g->params, g->n_global * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(gpt_slot_ptr(&un, un.params, l), gpt_slot_ptr(g, g->params, l),
               gpt_slot_floats(g, l) * sizeof(float));
    gpt_zero_grad(g);
    gpt_zero_grad(&un);
    float lg = gpt_forward(g, inp, tgt, B), lu = gpt_forward(&un, inp, tgt, B);
    if (lg != lu)
        fail_msg("loss %.9g after the delink, %.9g unshared", lg, lu);
    gpt_backward(g, inp, tgt, B, 1.0f / (float)(B * g->T));
    gpt_backward(&un, inp, tgt, B, 1.0f / (float)(B * g->T));
    assert_memory_equal(un.grads, g->grads, g->n_global * sizeof(float));
    for (int l = 0; l < L; l++)
        if (memcmp(gpt_slot_ptr(&un, un.grads, l), gpt_slot_ptr(g, g->grads, l),
                   gpt_slot_floats(g, l) * sizeof(float)))
            fail_msg("slot %d's gradient is not the unshared layer %d's", l, l);
    gpt_free(&un);
    free(ref);
}

/* A 3-layer model of cfg in one shared slot (S = 1), initialised with
 * seed 3 and trained 3 steps of microbatch B, and a random batch (seed
 * 999) of B * T tokens into inp, tgt (room for 16). */
static void shared_trained_(gpt_model *g, const model_config *cfg, int B,
                            int32_t *inp, int32_t *tgt)
{
    assert_int_equal(cfg->n_layer, 3);
    assert_true(B * cfg->seq_len <= 16);
    assert_int_equal(gpt_create(g, cfg, 1, B), 0);
    gpt_init_weights(g, 3);
    train_steps_(g, 3, B, 100);
    synth_random_batch(inp, tgt, B * cfg->seq_len, cfg->vocab_size, 999);
}

/* Delinks g (3 layers in one slot) to a slot per layer, optimizer state
 * copied: every slot keeps the shared slot's AdamW step count. */
static void delink_keeps_adam_t_(gpt_model *g)
{
    long t_before = g->adam_t_slot[0];
    int map[3] = {0, 1, 2}, src[3] = {0, 0, 0};
    assert_int_equal(gpt_reslot(g, 3, map, src, 0), 0);
    assert_int_equal(g->S, 3);
    for (int l = 0; l < 3; l++)
        assert_int_equal(g->adam_t_slot[l], t_before);
}

static void test_delink_preserves_function(void **state)
{
    (void)state;
    const int B = 2;
    gpt_model g;
    int32_t inp[16], tgt[16];
    shared_trained_(&g, &small_, B, inp, tgt);
    float before = gpt_forward(&g, inp, tgt, B);
    delink_keeps_adam_t_(&g);
    float after = gpt_forward(&g, inp, tgt, B);
    assert_true(before == after); /* bitwise */

    /* each layer its own slot from here on */
    train_steps_(&g, 1, B, 200);
    assert_layers_own_slots_(&g, inp, tgt, B);
    gpt_free(&g);
}

static void test_delink_reset_zeroes_moments(void **state)
{
    (void)state;
    gpt_model g;
    assert_int_equal(gpt_create(&g, &small_, 1, 2), 0);
    gpt_init_weights(&g, 3);
    train_steps_(&g, 2, 2, 1);
    int map[3] = {0, 1, 2}, src[3] = {0, 0, 0};
    assert_int_equal(gpt_reslot(&g, 3, map, src, 1), 0);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(g.adam_t_slot[s], 0);
        const float *m = gpt_slot_ptr(&g, g.m, s);
        for (size_t i = 0; i < g.slot_size; i++)
            assert_true(m[i] == 0.0f);
    }
    assert_int_equal(g.adam_t_global, 2); /* globals are not delinked */
    gpt_free(&g);
}

/* ---------------------------------------------------------- MoE */

/* small_ with every block MoE: E = 4 experts in k = 2 prototypes, H = 12,
 * a capacity factor of 1 (so some tokens are dropped). */
static model_config moe_cfg_(void)
{
    model_config c = small_;
    synth_tiny_moe(&c, 1, 12, 1.0f);
    return c;
}

/* The MoE slot: the dense MLP replaced by the experts and the gate, with
 * the shapes of gpt.h, counted by hand. */
static void test_moe_layout(void **state)
{
    (void)state;
    model_config c = moe_cfg_();
    gpt_model g;
    assert_int_equal(gpt_create(&g, &c, 1, 2), 0);
    const size_t C = 16, H = 12, E = 4;
    size_t want = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C /* ln, attn */
                  + E * H * C + E * H + E * C * H + E * C      /* experts */
                  + E * C + E;                                  /* gate */
    assert_int_equal(g.slot_size, (want + 15) / 16 * 16);
    assert_string_equal(g.slot[SLOT_FC_W].name, "moe.experts.c_fc.weight");
    assert_int_equal(g.slot[SLOT_FC_W].rows, (int)(E * H));
    assert_int_equal(g.slot[SLOT_FCPROJ_W].rows, (int)(E * C));
    assert_int_equal(g.slot[SLOT_FCPROJ_W].cols, (int)H);
    assert_string_equal(g.slot[SLOT_GATE_W].name, "moe.gate.weight");
    assert_int_equal(g.slot[SLOT_GATE_B].numel, E);
    assert_int_equal(gpt_slot_ntensors(&c), SLOT_NTENSORS_MAX);
    gpt_free(&g);
}

/* Expert parallelism (cfg.moe_ep_size P): a rank's MoE slot holds its
 * experts only (model_expert_range: E = 4 over P = 3 is 1, 1, 2), named
 * by their global index, with the whole model's initial values bit for
 * bit; everything else is the whole model's. The slot is shorter by the
 * other experts' floats, counted by hand. */
static void test_moe_expert_parallel_layout(void **state)
{
    (void)state;
    model_config c = moe_cfg_();
    gpt_model all, g;
    assert_int_equal(gpt_create(&all, &c, 2, 2), 0);
    gpt_init_weights(&all, 7);
    const size_t C = 16, H = 12, E = 4, per = 2 * H * C + H + C;
    int na = gpt_slot_ckpt_tensors(&c, 1, NULL);
    gpt_ckpt_tensor *ta = calloc((size_t)na, sizeof *ta);
    gpt_slot_ckpt_tensors(&c, 1, ta);
    for (int q = 0; q < 3; q++) {
        model_config cq = c;
        cq.moe_ep_size = 3;
        cq.moe_ep_rank = q;
        int first, El = model_expert_range((int)E, 3, q, &first);
        assert_int_equal(model_local_experts(&cq, &first), El);
        assert_int_equal(gpt_create(&g, &cq, 2, 2), 0);
        gpt_init_weights(&g, 7);
        size_t unpadded = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C
                          + (size_t)El * per + E * C + E;
        assert_int_equal(g.slot_size, (unpadded + 15) / 16 * 16);
        assert_memory_equal(g.params, all.params, g.n_global * sizeof(float));
        int n = gpt_slot_ckpt_tensors(&cq, 1, NULL);
        assert_int_equal(n, 8 + 2 * 2 + 4 * El);
        gpt_ckpt_tensor *t = calloc((size_t)n, sizeof *t);
        gpt_slot_ckpt_tensors(&cq, 1, t);
        char want[48];
        snprintf(want, sizeof want, "moe.experts.%d.c_fc.weight", first);
        int seen_first = 0;
        for (int i = 0; i < n; i++) {
            int j = 0;
            while (j < na && strcmp(ta[j].name, t[i].name) != 0)
                j++;
            if (j == na)
                fail_msg("rank %d: tensor %s not in the whole model", q,
                         t[i].name);
            seen_first |= strcmp(t[i].name, want) == 0;
            size_t len = (size_t)t[i].rows * (t[i].cols ? t[i].cols : 1);
            for (int s = 0; s < 2; s++)
                assert_memory_equal(g.slots[s].params + t[i].offset,
                                    all.slots[s].params + ta[j].offset,
                                    len * sizeof(float));
        }
        assert_true(seen_first);
        free(t);
        gpt_free(&g);
    }
    free(ta);
    gpt_free(&all);
}

/* MoE: the delink keeps the loss on the same batch bitwise, routing
 * included, and each layer reads its own slot (experts, gate and all)
 * after it (assert_layers_own_slots_). The
 * router's facts are recorded and the aux loss is in [1, E/k]-ish range
 * (>= 1 - rounding by Cauchy-Schwarz is not guaranteed for top-1, so only
 * positivity and the Ep bound are checked). */
static void test_moe_delink_preserves_function(void **state)
{
    (void)state;
    model_config c = moe_cfg_();
    const int B = 2, T = c.seq_len, L = c.n_layer;
    gpt_model g;
    int32_t inp[16], tgt[16];
    shared_trained_(&g, &c, B, inp, tgt);
    gpt_moe_stats_reset(&g);
    float before = gpt_forward(&g, inp, tgt, B);
    gpt_moe_stats st = g.moe_stats;
    assert_int_equal(st.layers, L);
    assert_int_equal(st.pairs, (long)L * B * T * 2);
    assert_int_equal(st.load_n, (long)L * 4);
    assert_true(st.aux_sum > 0 && st.aux_sum / L <= 2.0 + 1e-6);
    assert_true(st.z_sum > 0);
    /* capacity ceil(1.0 * 16 / 2) = 8: no expert processes more */
    assert_int_equal(g.moe_capacity, 8);
    assert_true(st.load_max <= 8);
    delink_keeps_adam_t_(&g);
    gpt_moe_stats_reset(&g);
    float after = gpt_forward(&g, inp, tgt, B);
    assert_true(before == after); /* bitwise */
    assert_true(g.moe_stats.aux_sum == st.aux_sum);
    assert_int_equal(g.moe_stats.dropped, st.dropped);

    train_steps_(&g, 1, B, 200);
    assert_layers_own_slots_(&g, inp, tgt, B);
    gpt_free(&g);
}

/* A mixed model (model.moe.every 2 on 4 layers: blocks 1 and 3 MoE, 0 and
 * 2 dense). Slot sizes counted by hand from the shapes (C 16, E 4, H 12,
 * padded to 16 floats): dense 12C^2 + 13C = 3280; MoE: attention and
 * LayerNorms 4C^2 + 8C = 1152, the experts E(2HC + H + C) = 1648 and the
 * gate EC + E = 68 -> 2868, padded 2880. The share map of 2 slots is [0,1,0,1]; S = 1 is
 * refused; a reslot copying a slot of the other kind is refused and
 * changes nothing; the delink keeps the loss bitwise; each layer, dense
 * or MoE, reads its own slot after it (assert_layers_own_slots_). */
static void test_mixed_delink_preserves_function(void **state)
{
    (void)state;
    model_config c = moe_cfg_();
    c.n_layer = 4;
    c.moe_every = 2;
    const int B = 2, T = c.seq_len, L = 4;
    gpt_model g;
    assert_int_equal(gpt_create(&g, &c, 1, B), -1);
    assert_int_equal(gpt_create(&g, &c, 2, B), 0);
    int want_map[4] = {0, 1, 0, 1};
    assert_memory_equal(g.slot_of, want_map, sizeof want_map);
    assert_int_equal(g.slot_moe[0], 0);
    assert_int_equal(g.slot_moe[1], 1);
    assert_int_equal(g.kind_size[0], 3280);
    assert_int_equal(g.kind_size[1], 2880);
    assert_int_equal(g.n_params, g.n_global + 3280 + 2880);
    assert_string_equal(gpt_slot_tensors(&g, 0)[SLOT_FC_W].name,
                        "mlp.c_fc.weight");
    assert_string_equal(gpt_slot_tensors(&g, 1)[SLOT_FC_W].name,
                        "moe.experts.c_fc.weight");
    gpt_init_weights(&g, 3);
    train_steps_(&g, 3, B, 100);
    int32_t inp[16], tgt[16];
    synth_random_batch(inp, tgt, B * T, c.vocab_size, 999);
    gpt_moe_stats_reset(&g);
    float before = gpt_forward(&g, inp, tgt, B);
    assert_int_equal(g.moe_stats.layers, 2);  /* MoE blocks 1 and 3 only */
    long dropped = g.moe_stats.dropped;

    int map[4] = {0, 1, 2, 3}, wrong[4] = {0, 1, 1, 1}, src[4] = {0, 1, 0, 1};
    assert_int_equal(gpt_reslot(&g, L, map, wrong, 0), -1);
    assert_int_equal(g.S, 2);
    assert_true(gpt_forward(&g, inp, tgt, B) == before);
    assert_int_equal(gpt_reslot(&g, L, map, src, 0), 0);
    for (int l = 0; l < L; l++)
        assert_int_equal(g.slot_moe[l], l % 2);
    gpt_moe_stats_reset(&g);
    float after = gpt_forward(&g, inp, tgt, B);
    assert_true(before == after); /* bitwise */
    assert_int_equal(g.moe_stats.dropped, dropped);

    train_steps_(&g, 1, B, 200);
    assert_layers_own_slots_(&g, inp, tgt, B);
    gpt_free(&g);
}

/* The aux and z losses reach the gradient with their coefficients:
 * the gradient with coefficients (a, z) minus that with (0, 0) is linear
 * in them (twice the coefficients, twice the difference), and it is not
 * zero for the gate. The LM loss does not depend on them. */
static void test_moe_aux_in_gradient(void **state)
{
    (void)state;
    const int B = 2, T = small_.seq_len;
    int32_t inp[16], tgt[16];
    synth_random_batch(inp, tgt, B * T, small_.vocab_size, 5);
    float *gr[3];
    float loss[3];
    size_t n = 0, gate = 0;
    for (int i = 0; i < 3; i++) {
        model_config c = moe_cfg_();
        c.moe_aux_coef = 0.5f * (float)i;
        c.moe_z_coef = 0.25f * (float)i;
        gpt_model g;
        assert_int_equal(gpt_create(&g, &c, 3, B), 0);
        gpt_init_weights(&g, 9);
        gpt_zero_grad(&g);
        loss[i] = gpt_forward(&g, inp, tgt, B);
        gpt_backward(&g, inp, tgt, B, 1.0f / (float)(B * T));
        n = g.n_params;
        gate = g.n_global + g.slot[SLOT_GATE_W].offset;
        gr[i] = malloc(n * sizeof(float));
        memcpy(gr[i], g.grads, n * sizeof(float));
        gpt_free(&g);
    }
    assert_true(loss[0] == loss[1] && loss[1] == loss[2]);
    double d1 = 0, d2 = 0, worst = 0;
    for (size_t j = 0; j < n; j++) {
        double a = (double)gr[1][j] - gr[0][j], b = (double)gr[2][j] - gr[0][j];
        d1 += a * a;
        d2 += b * b;
        double e = fabs(b - 2 * a);
        if (e > worst) worst = e;
    }
    assert_true(d1 > 0);
    assert_true(fabs(sqrt(d2) / sqrt(d1) - 2.0) < 1e-3);
    assert_true(worst < 1e-5);
    assert_true(gr[1][gate] != gr[0][gate]);
    for (int i = 0; i < 3; i++)
        free(gr[i]);
}

/* ---------------------------------------------------------- trainer */

static run_spec tiny_spec_(long steps, long pseudo_steps)
{
    return synth_tiny_spec(tmpdir_, 3, steps, pseudo_steps);
}

static void test_determinism_50_steps(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(50, 20);
    float a[50], b[50];
    trainer *t1 = fixture_trainer(&s);
    fixture_run_steps(t1, &s, 50, a, NULL);
    trainer *t2 = fixture_trainer(&s);
    fixture_run_steps(t2, &s, 50, b, NULL);
    assert_memory_equal(a, b, sizeof a);
    assert_true(a[49] < a[0]); /* it learns */
    assert_int_equal(trainer_phase(t1), PHASE_REAL);
    assert_int_equal(trainer_delink_step(t1), 20);
    trainer_free(t1);
    trainer_free(t2);
}

static void test_delink_keeps_loss_in_trainer(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(20, 10);
    float l[20];
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 10, l, NULL);
    fixture_delink_keeps_loss(t, 1, 3);
    trainer_free(t);
}

/* save at step 15 (after a delink at 10), continue to 30; a fresh trainer
 * loading the checkpoint gives the same losses for steps 16..30 bitwise. */
static void test_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10);
    float a[30];
    char err[256], dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-15", tmpdir_);
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 15, a, NULL);
    long bytes = fixture_save(t, dir);
    assert_true(bytes > 0);
    assert_true(ERR_INTO(err, trainer_save(t, dir, &err_)) < 0); /* exists */
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);

    t = fixture_resume(&s, dir, 15);
    assert_int_equal(trainer_phase(t), PHASE_REAL);
    assert_int_equal(trainer_n_slots(t), 3);
    fixture_finish_same(t, &s, 30, a);

    /* a checkpoint from another spec is refused */
    s.train.lr *= 2;
    t = fixture_trainer(&s);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir, &err_)), 0);
    assert_non_null(strstr(err, "spec hash"));
    trainer_free(t);
    s.train.lr /= 2;

    /* the nodes' layout is not in the hash: the checkpoint resumes at
     * another world size, with the same losses */
    run_spec w = s;
    w.nodes.world_size = 2;
    w.nodes.timeout = 7;
    t = fixture_resume(&w, dir, 15);
    fixture_finish_same(t, &w, 30, a);

    /* a checkpoint hashed with its layout (as before) loads at that
     * layout only: its meta.json's hash made the old way, here */
    run_spec o = w;
    o.nodes.expert_parallel = 1;
    char path[600], old[32];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    snprintf(old, sizeof old, "%016llx", (unsigned long long)spec_hash(&o));
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    char meta[1 << 16];
    size_t n = fread(meta, 1, sizeof meta - 1, f);
    meta[n] = 0;
    char *h = strstr(meta, "\"spec_hash\"");
    assert_non_null(h);
    h = strchr(h + 11, '"');
    assert_non_null(h);
    memcpy(h + 1, old, 16);
    rewind(f);
    assert_int_equal(fwrite(meta, 1, n, f), n);
    fclose(f);
    t = fixture_resume(&w, dir, 15);
    trainer_free(t);
    t = fixture_trainer(&s);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir, &err_)), 0);
    assert_non_null(strstr(err, "spec hash"));
    trainer_free(t);
}

/* device.precision bf16: save at 15 (after a delink at 10), resume: the
 * losses of 16..30 are bitwise those of the uninterrupted bf16 run, even
 * with an fp32 trainer stepping in between (each pass sets its own
 * precision). The bf16 losses are not the fp32 ones (the setting took
 * effect) but within 1% of them over 30 steps of the tiny model. */
static void test_bf16_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10), s32 = s;
    s.device.precision = PRECISION_BF16;
    float a[30], f[30];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-bf16-15", tmpdir_);
    trainer *t32 = fixture_trainer(&s32);
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 15, a, NULL);
    assert_true(fixture_save(t, dir) > 0);
    fixture_run_steps(t32, &s32, 30, f, NULL);  /* fp32 between bf16 steps */
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);
    trainer_free(t32);
    assert_memory_not_equal(a, f, sizeof a);
    for (int i = 0; i < 30; i++)
        if (!(fabsf(a[i] - f[i]) <= 0.01f * f[i]))
            fail_msg("step %d: bf16 loss %.6f, fp32 %.6f: more than 1%% "
                     "apart", i + 1, (double)a[i], (double)f[i]);

    t = fixture_resume(&s, dir, 15);
    assert_int_equal(trainer_phase(t), PHASE_REAL);
    fixture_finish_same(t, &s, 30, a);
    /* the trainer's passes leave the process's precision as they found
     * it: kernels called directly after a bf16 run stay fp32 */
    assert_int_equal(gemm_get_precision(), GEMM_FP32);
}

/* The checkpoint in dir names each tensor of `has` (a whole, quoted name
 * in its header) and nothing containing any of `lacks`; both lists end
 * with NULL. */
static void check_ckpt_names_(const char *dir, const char *const *has,
                              const char *const *lacks)
{
    const char *head = fixture_ckpt_header(dir);
    char nm[160];
    for (; *has; has++) {
        snprintf(nm, sizeof nm, "\"%s\"", *has);
        if (!strstr(head, nm))
            fail_msg("checkpoint in %s: no tensor %s", dir, nm);
    }
    for (; *lacks; lacks++)
        if (strstr(head, *lacks))
            fail_msg("checkpoint in %s: names %s", dir, *lacks);
}

/* MoE through the trainer: save at 15 (after the delink at 10), resume:
 * the losses of 16..30 are bitwise those of the uninterrupted run; the
 * checkpoint names the experts and the gate; every step reports MoE
 * facts, a dense run none. */
static void test_moe_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10);
    synth_tiny_moe(&s.model, 1, 24, 1.25f);
    float a[30];
    char err[256], dir[512];
    snprintf(dir, sizeof dir, "%s/moe-ckpt-15", tmpdir_);
    trainer *t = fixture_trainer(&s);
    step_result r;
    assert_int_equal(ERR_INTO(err, trainer_step(t, &r, &err_)), 0);
    a[0] = r.train_loss;
    assert_true(r.moe.present);
    assert_true(r.moe.aux_loss > 0.5 && r.moe.aux_loss < 2.0 + 1e-6);
    assert_true(r.moe.z_loss > 0 && isfinite(r.moe.z_loss));
    assert_true(r.moe.dropped_fraction >= 0 && r.moe.dropped_fraction < 1);
    assert_true(r.moe.load_min <= r.moe.load_max);
    /* capacity ceil(1.25 * 64 / 2) = 40 tokens per expert */
    assert_true(r.moe.load_max <= 40);
    assert_true(r.moe.load_cv >= 0);
    fixture_run_steps(t, &s, 15, a, NULL);
    fixture_save(t, dir);
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);

    /* per expert and per prototype's gate (gpt.h: gpt_slot_ckpt_tensors) */
    check_ckpt_names_(dir,
                      (const char *[]){"slots.2.moe.experts.3.c_fc.weight",
                                       "slots.2.moe.gate.1.weight", NULL},
                      (const char *[]){"slots.2.moe.experts.c_fc.weight",
                                       "mlp.c_fc", NULL});

    t = fixture_resume(&s, dir, 15);
    fixture_finish_same(t, &s, 30, a);

    run_spec d = tiny_spec_(2, 0);
    t = fixture_trainer(&d);
    assert_int_equal(ERR_INTO(err, trainer_step(t, &r, &err_)), 0);
    assert_false(r.moe.present);
    trainer_free(t);
}

/* A mixed MoE run through the trainer (4 layers, MoE every 2nd block, a
 * pseudo phase of 2 slots, delink at 10): save at 15, resume: the losses
 * of 16..30 are bitwise the uninterrupted run's. The checkpoint names the
 * dense slots' MLP and each MoE slot's experts and prototype gates, and a
 * named expert's tensor holds that expert's rows, bitwise: expert e's
 * c_fc.weight is rows e*H .. (e+1)*H-1 of the slot's (E*H, C) block, at
 * the slot's offset in the plain layout (globals, then slots 0..3 of
 * kinds dense, MoE, dense, MoE, each padded to 16 floats). */
static void test_mixed_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = synth_tiny_spec(tmpdir_, 4, 30, 10);
    s.pseudo.share_groups = 2;
    synth_tiny_moe(&s.model, 2, 24, 1.25f);
    float a[30];
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/mixed-ckpt-15", tmpdir_);
    trainer *t = fixture_trainer(&s);
    assert_int_equal(trainer_n_slots(t), 2);
    fixture_run_steps(t, &s, 15, a, NULL);
    assert_int_equal(trainer_n_slots(t), 4);
    fixture_save(t, dir);
    size_t n = trainer_copy_state(t, 0, NULL);
    float *params = malloc(n * sizeof(float));
    assert_int_equal(trainer_copy_state(t, 0, params), n);
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);

    /* by hand: C 16, V 256, T 16, H 24, E 4 */
    const size_t C = 16, H = 24, E = 4;
    size_t n_global = 256 * C + 16 * C + 2 * C;               /* 4384 */
    size_t dense = 12 * C * C + 13 * C;                       /* 3280 */
    size_t moe = 4 * C * C + 8 * C + E * (2 * H * C + H + C) + E * C + E;
    moe = (moe + 15) / 16 * 16;                               /* 4464 */
    assert_int_equal(n, n_global + 2 * dense + 2 * moe);
    size_t slot3 = n_global + dense + moe + dense;
    size_t fc_w = 4 * C * C + 8 * C;   /* after ln_1, attn, ln_2 */
    float want[24 * 16], got[24 * 16];
    memcpy(want, params + slot3 + fc_w + 2 * H * C, sizeof want);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file sf;
    char e2[512];
    assert_int_equal(safetensors_open(&sf, path, e2, sizeof e2), 0);
    assert_int_equal(safetensors_get(&sf, "slots.3.moe.experts.2.c_fc.weight",
                                     got, H * C, e2, sizeof e2), 0);
    assert_memory_equal(want, got, sizeof want);
    /* gate of prototype 1: rows 2..3 of the (E, C) gate, after the experts */
    size_t gate = fc_w + E * (2 * H * C + H + C);
    memcpy(want, params + slot3 + gate + 2 * C, 2 * C * sizeof(float));
    assert_int_equal(safetensors_get(&sf, "slots.3.moe.gate.1.weight", got,
                                     2 * C, e2, sizeof e2), 0);
    assert_memory_equal(want, got, 2 * C * sizeof(float));
    safetensors_close(&sf);
    free(params);
    check_ckpt_names_(dir,
                      (const char *[]){"slots.0.mlp.c_fc.weight",
                                       "slots.2.mlp.c_proj.bias",
                                       "slots.1.moe.experts.0.c_proj.weight",
                                       "slots.1.moe.gate.0.bias", NULL},
                      (const char *[]){"slots.0.moe", "slots.1.mlp", NULL});

    t = fixture_resume(&s, dir, 15);
    fixture_finish_same(t, &s, 30, a);
}

/* A dense run's checkpoint holds exactly the tensor names it always had
 * (gpt.h's list, written out here), so checkpoints of dense runs written
 * before experts had per-expert names load as before. */
static void test_dense_checkpoint_names_unchanged(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(2, 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dense-names", tmpdir_);
    trainer *t = fixture_trainer(&s);
    float l[2];
    fixture_run_steps(t, &s, 2, l, NULL);
    assert_true(fixture_save(t, dir) > 0);
    trainer_free(t);
    static const char *slot_names[] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
        "mlp.c_proj.bias"};
    const char *head = fixture_ckpt_header(dir);
    int count = 0;
    for (const char *p = head; (p = strstr(p, "\"data_offsets\"")); p++)
        count++;
    assert_int_equal(count, 4 + 3 * 12);
    const char *glob[] = {"wte", "wpe", "ln_f.weight", "ln_f.bias"};
    char nm[128];
    for (int i = 0; i < 4; i++) {
        snprintf(nm, sizeof nm, "\"%s\"", glob[i]);
        assert_non_null(strstr(head, nm));
    }
    for (int sl = 0; sl < 3; sl++)
        for (int i = 0; i < 12; i++) {
            snprintf(nm, sizeof nm, "\"slots.%d.%s\"", sl, slot_names[i]);
            if (!strstr(head, nm))
                fail_msg("missing %s", nm);
        }
}

/* A run taken up again while its data is away (m6d restarting with the
 * shards moved): trainer_create refuses, trainer_create_resumable builds
 * the trainer without them and says why; the checkpoint loads, a step is
 * TRAINER_EDATA and so is a reopen while the data is still away; once it
 * is back, a reopen and the steps from 16 give the losses of the
 * uninterrupted run bitwise. */
static void test_resumable_without_data(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10);
    float a[30], b[30];
    char err[512], dir[512], away[300];
    snprintf(dir, sizeof dir, "%s/ckpt-r15", tmpdir_);
    snprintf(away, sizeof away, "%s.away", tmpdir_);
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 15, a, NULL);
    fixture_save(t, dir);
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);

    assert_int_equal(rename(tmpdir_, away), 0);
    assert_null(ERR_INTO(err, trainer_create(&s, &err_)));
    assert_non_null(strstr(err, "data.train: no files match"));
    int data_rc = 0;
    err[0] = 0;
    t = ERR_INTO(err, trainer_create_resumable(&s, &data_rc, &err_));
    assert_non_null(t);
    assert_int_equal(data_rc, TRAINER_EDATA);
    assert_non_null(strstr(err, "data.train: no files match"));
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-r15", away);
    fixture_load(t, ckpt);
    assert_int_equal(trainer_step_count(t), 15);
    step_result r;
    assert_int_equal(ERR_INTO(err, trainer_step(t, &r, &err_)), TRAINER_EDATA);
    assert_non_null(strstr(err, "data.train: not open"));
    assert_int_equal(trainer_step_count(t), 15);
    assert_true(isnan(trainer_probe_loss(t, 0)));
    assert_int_equal(ERR_INTO(err, trainer_reopen_data(t, &err_)), TRAINER_EDATA);
    assert_non_null(strstr(err, "no files match"));

    assert_int_equal(rename(away, tmpdir_), 0);
    assert_int_equal(ERR_INTO(err, trainer_reopen_data(t, &err_)), 0);
    fixture_run_steps(t, &s, 30, b, NULL);
    assert_memory_equal(a + 15, b + 15, 15 * sizeof(float));
    trainer_free(t);

    /* with its data there, it is trainer_create's trainer */
    data_rc = 1;
    t = ERR_INTO(err, trainer_create_resumable(&s, &data_rc, &err_));
    assert_non_null(t);
    assert_int_equal(data_rc, 0);
    trainer_free(t);
}

/* gpt_moe_stats_add over two calls, against sums by hand: the counts
 * {0, 3, 5} then {7, 1} give min 0, max 7, sum 16, sum of squares
 * 0 + 9 + 25 + 49 + 1 = 84, 5 experts seen, 1 empty. */
static void test_moe_stats_accumulate(void **state)
{
    (void)state;
    gpt_moe_stats st;
    memset(&st, 0, sizeof st);
    const int32_t a[] = {0, 3, 5}, b[] = {7, 1};
    gpt_moe_stats_add(&st, 1.25, 0.5, 1, 2, 16, a, 3, 0);
    gpt_moe_stats_add(&st, 0.75, 0.25, 2, 1, 8, b, 2, 0);
    assert_true(st.aux_sum == 2.0 && st.z_sum == 0.75);
    assert_int_equal(st.layers, 3);
    assert_int_equal(st.dropped, 3);
    assert_int_equal(st.pairs, 24);
    assert_int_equal(st.load_min, 0);
    assert_int_equal(st.load_max, 7);
    assert_true(st.load_sum == 16.0 && st.load_sumsq == 84.0);
    assert_int_equal(st.load_n, 5);
    assert_int_equal(st.empty, 1);
}

/* The whole step's per-expert figures of r against a count kept here
 * from its tokens of each (MoE block, expert): the least, the most, the
 * pairs with none; and the dropped count against the step's all_pairs
 * (token, prototype) pairs less the tokens processed, and against the
 * dropped fraction. */
static void check_step_tokens_(const step_result *r, long all_pairs)
{
    long lo = -1, hi = -1, empty = 0, sum = 0;
    for (size_t i = 0; i < r->moe.n_tokens; i++) {
        long k = (long)r->moe.tokens[i];
        lo = lo < 0 || k < lo ? k : lo;
        hi = k > hi ? k : hi;
        empty += k == 0;
        sum += k;
    }
    assert_true(r->moe.n_tokens > 0);
    assert_int_equal(r->moe.step_tokens_min, lo);
    assert_int_equal(r->moe.step_tokens_max, hi);
    assert_int_equal(r->moe.step_experts_empty, empty);
    assert_int_equal(r->moe.step_dropped, all_pairs - sum);
    assert_int_equal(r->moe.step_dropped,
                     lround(r->moe.dropped_fraction * (double)all_pairs));
}

/* Without train.expert_idle_steps (0) a step still has its tokens of each
 * (MoE block, expert) and the whole step's figures; no expert is counted
 * idle. 2 MoE blocks of E 4 experts in k 2 prototypes at capacity factor
 * 1 (tokens dropped), 2 microbatches of 4 x 16 tokens: 2 x 128 x 2 = 512
 * (token, prototype) pairs a step; some step must drop a pair (else the
 * count was not tried). */
static void test_step_tokens(void **state)
{
    (void)state;
    run_spec s = synth_tiny_spec(tmpdir_, 2, 4, 0);
    synth_tiny_moe(&s.model, 1, 16, 1.0f);
    s.train.expert_idle_steps = 0;
    trainer *t = fixture_trainer(&s);
    long dropped = 0;
    for (int k = 0; k < 4; k++) {
        step_result r;
        fixture_step(t, &r);
        assert_true(r.moe.present && r.moe.tokens != NULL);
        assert_int_equal(r.moe.n_tokens, 2 * 4);
        check_step_tokens_(&r, 2L * (2 * 4 * 16) * 2);
        assert_int_equal(r.moe.experts_idle, 0);
        assert_int_equal(r.moe.idle_new, 0);
        assert_int_equal(r.moe.idle_block, -1);
        dropped += r.moe.step_dropped;
    }
    assert_true(dropped > 0);
    trainer_free(t);
}

/* The tokens of each (MoE block, expert) a step reports, and the
 * experts idle for train.expert_idle_steps (3) steps, against a count kept
 * here from those tokens: 2 MoE blocks of E 16 experts in k 1 prototype,
 * 128 (token, prototype) pairs a step. The tokens of a block add up to
 * the pairs not dropped, and some expert must go idle in 12 steps (else
 * the check saw nothing). */
static void test_expert_idle(void **state)
{
    (void)state;
    run_spec s = synth_tiny_spec(tmpdir_, 2, 12, 0);
    synth_tiny_moe(&s.model, 1, 16, 1.0f);
    s.model.moe_experts = 16;
    s.model.moe_prototypes = 1;
    s.train.expert_idle_steps = 3;
    trainer *t = fixture_trainer(&s);
    const int Lm = 2, E = 16, pairs = 4 * 2 * 16;
    long idle[32] = {0}, seen_new = 0;
    for (int k = 0; k < 12; k++) {
        step_result r;
        fixture_step(t, &r);
        assert_true(r.moe.present && r.moe.tokens != NULL);
        assert_int_equal(r.moe.n_tokens, Lm * E);
        double sum = 0;
        long want_idle = 0, want_new = 0;
        int first = -1;
        for (int i = 0; i < Lm * E; i++) {
            assert_true(r.moe.tokens[i] >= 0);
            sum += r.moe.tokens[i];
            idle[i] = r.moe.tokens[i] > 0 ? 0 : idle[i] + 1;
            want_idle += idle[i] >= 3;
            if (idle[i] == 3 && want_new++ == 0)
                first = i;
        }
        /* pairs of both blocks, less the dropped ones */
        assert_float_equal(sum, Lm * pairs * (1.0 - r.moe.dropped_fraction),
                           1e-6);
        check_step_tokens_(&r, Lm * pairs);
        assert_int_equal(r.moe.experts_idle, want_idle);
        assert_int_equal(r.moe.idle_new, want_new);
        if (want_new) {
            assert_int_equal(r.moe.idle_block, first / E);
            assert_int_equal(r.moe.idle_expert, first % E);
        }
        seen_new += want_new;
    }
    assert_true(seen_new > 0);
    trainer_free(t);
}

/* The tokens of each (MoE block, expert), E 2 over 3 MoE blocks, by hand:
 * block 0 {1, 0}, then blocks 1 and 2 {0, 0, 4, 2}, then block 0 {3, 0}
 * give {4, 0, 0, 0, 4, 2}; gpt_moe_stats_clear zeroes them and keeps the
 * array. */
static void test_moe_stats_tokens(void **state)
{
    (void)state;
    double tokens[6];
    gpt_moe_stats st;
    memset(&st, 0, sizeof st);
    st.tokens = tokens;
    gpt_moe_stats_clear(&st, 6);
    const int32_t a[] = {1, 0}, b[] = {0, 0, 4, 2}, c[] = {3, 0};
    gpt_moe_stats_add(&st, 0, 0, 1, 0, 2, a, 2, 0);
    gpt_moe_stats_add(&st, 0, 0, 2, 0, 4, b, 4, 1);
    gpt_moe_stats_add(&st, 0, 0, 1, 0, 2, c, 2, 0);
    const double want[6] = {4, 0, 0, 0, 4, 2};
    for (int i = 0; i < 6; i++)
        assert_true(tokens[i] == want[i]);
    gpt_moe_stats_clear(&st, 6);
    assert_ptr_equal(st.tokens, tokens);
    for (int i = 0; i < 6; i++)
        assert_true(tokens[i] == 0);
    assert_int_equal(st.layers, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_gradient_and_update),
        cmocka_unit_test(test_zero_grad_marks_and_stores),
        cmocka_unit_test(test_delink_preserves_function),
        cmocka_unit_test(test_delink_reset_zeroes_moments),
        cmocka_unit_test(test_determinism_50_steps),
        cmocka_unit_test(test_delink_keeps_loss_in_trainer),
        cmocka_unit_test(test_checkpoint_resume_bitwise),
        cmocka_unit_test(test_bf16_checkpoint_resume_bitwise),
        cmocka_unit_test(test_resumable_without_data),
        cmocka_unit_test(test_moe_layout),
    cmocka_unit_test(test_moe_expert_parallel_layout),
        cmocka_unit_test(test_moe_stats_accumulate),
    cmocka_unit_test(test_moe_stats_tokens),
    cmocka_unit_test(test_expert_idle),
    cmocka_unit_test(test_step_tokens),
        cmocka_unit_test(test_moe_delink_preserves_function),
        cmocka_unit_test(test_moe_aux_in_gradient),
        cmocka_unit_test(test_moe_checkpoint_resume_bitwise),
        cmocka_unit_test(test_mixed_delink_preserves_function),
        cmocka_unit_test(test_mixed_checkpoint_resume_bitwise),
        cmocka_unit_test(test_dense_checkpoint_names_unchanged),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
