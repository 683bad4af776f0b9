/*
 * test_offload_plan.c — the offload planner (offload/plan.c,
 * plan_cluster.c) against byte counts made here by hand from the shapes:
 * dense, MoE and mixed models on cpu and cuda, resident and offloaded
 * slots, staging buffers, bytes moved per step, the printed plan (table
 * and JSON), and the M6-10T shape on one device and at paper scale.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cpus.h"
#include "common/node_share.h"
#include "offload/test_hooks.h"
#include "offload/offload.h"
#include "../common/test_main.h"

static size_t pad16_(size_t n) { return (n + 15) / 16 * 16; }

/* offload_plan_print's output as a string (caller frees) */
static char *plan_string_(const offload_plan *p, int json)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    offload_plan_print(f, p, json);
    fclose(f);
    return buf;
}

/* offload_plan_print's JSON, parsed (caller json_decref's) */
static json_t *plan_json_(const offload_plan *p)
{
    char *buf = plan_string_(p, 1);
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    free(buf);
    assert_non_null(j);
    return j;
}

/* offload_plan_print's table, echoed to stdout (caller frees) */
static char *plan_text_(const offload_plan *p)
{
    char *buf = plan_string_(p, 0);
    printf("%s", buf);
    return buf;
}

/* V 64, L 4, NH 2, C 16, T 8, microbatch 2, accum 2, prefetch 2, counted
 * here from the shapes, independently of gpt.c. */
/* An MoE slot and the MoE activations, counted by hand: E = 4 experts in
 * k = 2 prototypes of hidden size H = 24, every block MoE. */
static void test_plan_hand_counted_moe(void **state)
{
    (void)state;
    const size_t V = 64, L = 4, NH = 2, C = 16, T = 8, B = 2, BT = B * T;
    const size_t E = 4, K = 2, H = 24, F = sizeof(float);
    /* ln_1, c_attn, attn c_proj, ln_2 (2C + 3C^2 + 3C + C^2 + C + 2C =
     * 4C^2 + 8C), experts W1 (E,H,C), b1 (E,H), W2 (E,C,H), b2 (E,C), gate
     * (E,C) and (E): 1024 + 128 + 4 * 808 + 64 + 4 = 4452, padded 4464 */
    size_t slot = pad16_(4 * C * C + 8 * C + E * (2 * H * C + H + C) +
                         E * C + E);
    assert_int_equal(slot, 4464);
    /* the dense activations without the MLP's fch, fch_gelu, dfch and
     * dfch_gelu, then per layer probs (N,E), lse, expert, slot (N,k),
     * counts, routed (E), offset (E+1), row_token (N*k), xe, ye (N*k,C),
     * hpre, hact (N*k,H), and one layer's dye, dxe, dh1, dh2, dlogits */
    size_t NKr = BT * K;
    size_t acts[] = {
        BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C,
        L * B * NH * T * T, L * BT * C, L * BT * C, L * BT, L * BT,
        L * BT * C, BT * C, BT, BT, BT * V, BT * V, BT,
        BT * C, BT * C, BT * C, BT * 3 * C, B * NH * T * T,
        BT * V, BT * C, BT,
        L * BT * E, L * NKr, L * NKr, L * NKr, L * E, L * E, L * (E + 1),
        L * NKr, L * NKr * C, L * NKr * C, L * NKr * H, L * NKr * H,
        NKr * C, NKr * C, NKr * H, NKr * H, BT * E,
    };
    size_t act = 0;
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        act += pad16_(acts[i]);
    offload_plan_input in = {
        .model = {.vocab_size = 64, .n_layer = 4, .n_head = 2, .n_embd = 16,
                  .seq_len = 8, .moe_experts = 4, .moe_prototypes = 2,
                  .moe_every = 1, .moe_hidden = 24,
                  .moe_capacity_factor = 1.25f,
                  .moe_eval_capacity_factor = 2.0f},
        .n_slots = 4, .slot_of = NULL, .batch_size = 2, .grad_accum = 1,
        .prefetch = 2, .backend = BACKEND_CPU, .budget = 0,
    };
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    /* weights, gradients and both AdamW moments of every expert */
    assert_int_equal(p.slot_bytes, 4 * slot * F);
    assert_int_equal(p.staging_bytes, 2 * slot * F);
    assert_int_equal(p.act_bytes, act * F);
    offload_plan_free(&p);
}

/* The M6-10T shape: 48 blocks, C 1024, T 1024, V 50000, 10,240 experts
 * of H 9984 in 80 prototypes, MoE in every block. */
static model_config m6_10t_model_(void)
{
    return (model_config){.vocab_size = 50000, .n_layer = 48, .n_head = 16,
                          .n_embd = 1024, .seq_len = 1024,
                          .moe_experts = 10240, .moe_prototypes = 80,
                          .moe_every = 1, .moe_hidden = 9984,
                          .moe_capacity_factor = 1.25f,
                          .moe_eval_capacity_factor = 2.0f,
                          .moe_aux_coef = 0.01f, .moe_z_coef = 0.001f};
}

/* The whole M6-10T shape (48 blocks, C 1024, 10,240 experts of H 9984 in
 * 80 prototypes) plans: each slot holds 4C^2 + 8C + E(2HC + H + C) + EC +
 * E = 209,507,076,096 parameters (a multiple of 16), 10.06e12 over the 48
 * slots, at 16 bytes each with gradients and AdamW moments. */
static void test_plan_m6_10t(void **state)
{
    (void)state;
    run_spec s;
    spec_defaults(&s);
    s.model = m6_10t_model_();
    s.train.batch_size = 1;
    s.pseudo.share_groups = 4;
    s.pseudo.steps = 10;
    s.device.memory_budget = (size_t)4 << 40;
    offload_plan p;
    char err[1024];
    if (offload_plan_for_spec(&s, 0, &p, err, sizeof err) != 0)
        fail_msg("plan: %s", err);
    const size_t per_slot = 209507076096ULL;
    assert_true(p.slot_bytes == 16 * per_slot);
    assert_int_equal(p.n_slots, 48);
    assert_true(p.n_offloaded == 48);
    assert_true(p.peak_device_bytes <= s.device.memory_budget);
    offload_plan_free(&p);
}

/* The mixed model of the two tests below: V 64, L 4, NH 2, C 16, T 8, MoE
 * every 2nd block (E 4 in k = 2 prototypes, H 24), a slot per layer,
 * microbatch 2, no budget. */
static offload_plan_input mixed_input_(backend_kind backend)
{
    return (offload_plan_input){
        .model = {.vocab_size = 64, .n_layer = 4, .n_head = 2, .n_embd = 16,
                  .seq_len = 8, .moe_experts = 4, .moe_prototypes = 2,
                  .moe_every = 2, .moe_hidden = 24,
                  .moe_capacity_factor = 1.0f,
                  .moe_eval_capacity_factor = 1.0f},
        .n_slots = 4, .slot_of = NULL, .batch_size = 2, .grad_accum = 1,
        .prefetch = 1, .backend = backend, .budget = 0};
}

/* A mixed model (MoE every 2nd of 4 blocks, C 16, E 4, H 24) plans its
 * dense and MoE slots at their own sizes, counted here by hand: dense
 * 12C^2 + 13C = 3280 floats, MoE 4C^2 + 8C + E(2HC + H + C) + EC + E =
 * 4452, padded 4464; 16 bytes each on cpu (params, grads, m, v). Two slots
 * of the pseudo phase are one of each kind; offloaded slots count at
 * their own size on the host and in the bytes moved. */
static void test_plan_mixed_kinds(void **state)
{
    (void)state;
    offload_plan_input in = mixed_input_(BACKEND_CPU);
    const size_t dense = 16 * 3280, moe = 16 * 4464;
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.slot_bytes, moe);
    assert_int_equal(p.peak_device_bytes - p.global_bytes - p.act_bytes,
                     2 * dense + 2 * moe);
    offload_plan_free(&p);
    in.n_slots = 2;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.peak_device_bytes - p.global_bytes - p.act_bytes,
                     dense + moe);
    size_t all = p.peak_device_bytes;
    offload_plan_free(&p);
    in.n_slots = 1;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "at least one slot of each kind"));
    /* a budget 1 byte short of all resident: the last slot (MoE) goes
     * to the host, and with it a staging buffer of the largest kind */
    in.n_slots = 2;
    in.budget = all - 1;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_resident, 1);
    assert_int_equal(p.host_bytes, moe);
    /* staging: weights + grads, 8 bytes a float of the MoE slot */
    assert_int_equal(p.peak_device_bytes, all - moe + 8 * 4464);
    /* one microbatch, the MoE slot (W = 4464 floats of 4 bytes) used by
     * layers 1 and 3: layer 1's forward fetches W; layer 3's forward and
     * backward share a fetch and drain; layer 1's backward fetches W and
     * the partial gradient W, and drains: h2d 4W, d2h 2W */
    assert_int_equal(p.h2d_bytes_per_step, 4 * 4 * 4464);
    assert_int_equal(p.d2h_bytes_per_step, 2 * 4 * 4464);
    offload_plan_free(&p);
}

/* The same mixed model on cuda (model.moe.every > 1 and offloaded MoE
 * slots on the GPU): its dense and MoE slots at their own sizes, 16 bytes
 * a parameter on the device (bf16 weights and gradient, fp32 master, m,
 * v), 20 on the host for an offloaded one (4 of them pinned: the bf16
 * copies), a staging buffer of the largest kind (bf16 weights + gradient,
 * 4 bytes a float), and bf16 slots moved: counted by hand as above. */
static void test_plan_mixed_kinds_cuda(void **state)
{
    (void)state;
    offload_plan_input in = mixed_input_(BACKEND_CUDA);
    const size_t dense = 16 * 3280, moe = 16 * 4464;
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.slot_bytes, moe);
    assert_int_equal(p.peak_device_bytes - p.global_bytes - p.act_bytes -
                         p.workspace_bytes,
                     2 * dense + 2 * moe);
    offload_plan_free(&p);
    in.n_slots = 2;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    size_t all = p.peak_device_bytes;
    offload_plan_free(&p);
    /* 1 byte short: the MoE slot to the host, one staging buffer */
    in.budget = all - 1;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_resident, 1);
    assert_int_equal(p.host_bytes, 20 * 4464);
    assert_int_equal(p.pinned_bytes, 4 * 4464);
    assert_int_equal(p.peak_device_bytes, all - moe + 4 * 4464);
    /* the MoE slot (layers 1 and 3) in bf16 (W = 2 * 4464 bytes): fetched
     * for layer 1's forward, once for layer 3's forward and backward, and
     * for layer 1's backward; drained after layer 3's backward and layer
     * 1's (no partial gradient comes back: the host accumulates) */
    assert_int_equal(p.h2d_bytes_per_step, 3 * 2 * 4464);
    assert_int_equal(p.d2h_bytes_per_step, 2 * 2 * 4464);
    offload_plan_free(&p);
    /* both offloaded (a budget of the globals, activations, workspace
     * and one staging buffer): each at its own size on the host */
    in.budget = all - moe - dense + 4 * 4464;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_resident, 0);
    assert_int_equal(p.host_bytes, 20 * (3280 + 4464));
    assert_int_equal(p.pinned_bytes, 4 * (3280 + 4464));
    offload_plan_free(&p);
}

/* The M6-10T plan at paper scale: 64 nodes x 8 devices of 32
 * GiB, 512 GiB of host memory per node, the pseudo phase S = 1. Every
 * figure by hand from the config (V 50000, T 1024, C 1024, E 10240, H
 * 9984, L 48) and the bytes per parameter of mixed-precision AdamW: 16 on
 * the device (bf16 weights 2, fp32 master 4, bf16 gradients 2, fp32 m and
 * v 8), 4 per staging buffer (bf16 weights and gradients), 20 on the host
 * (fp32 master 4 + pinned bf16 2, fp32 gradient accumulator 4 + pinned
 * bf16 2, m and v 8). Experts spread over the 512 devices (20 of each MoE
 * slot per device), everything else replicated. */
static void test_plan_at_scale_m6_10t(void **state)
{
    (void)state;
    run_spec s;
    spec_defaults(&s);
    s.model = m6_10t_model_();
    s.pseudo.share_groups = 1;
    s.pseudo.steps = 10;
    s.offload.prefetch = 2;
    const uint64_t V = 50000, T = 1024, C = 1024, E = 10240, H = 9984;
    const uint64_t L = 48, D = 64 * 8, GiB = 1ull << 30;
    uint64_t glob = V * C + T * C + 2 * C;            /* 52,250,624 */
    uint64_t attn = 3 * C * C + 3 * C + C * C + C + 4 * C;
    uint64_t gate = E * C + E, expert = H * C + H + C * H + C;
    uint64_t total = glob + L * (attn + gate + E * expert);
    assert_true(total == 10056391903232ull);          /* about 1.0e13 */
    uint64_t epd = E / D;                             /* 20 */
    uint64_t share = attn + gate + epd * expert;      /* one slot, a device */
    cluster_input in = {.nodes = 64, .gpus_per_node = 8,
                        .device_memory = 32 * GiB, .host_memory = 512 * GiB,
                        .prefetch = 2};
    cluster_plan cp;
    char err[512];
    if (cluster_plan_for_spec(&s, &in, &cp, err, sizeof err) != 0)
        fail_msg("plan: %s", err);
    assert_true(cp.has_pseudo);
    /* pseudo: one slot, all of it resident: 16 (glob + share) bytes */
    const cluster_phase *ps = &cp.pseudo;
    assert_int_equal(ps->n_slots, 1);
    assert_true(ps->experts_per_device == 20);
    assert_true(ps->total_params == glob + attn + gate + E * expert);
    assert_true(ps->device_params == glob + share);
    assert_true(ps->dev_total == 16 * (glob + share));  /* 7.09 GiB */
    assert_true(ps->dev_weights == 6 * (glob + share));
    assert_true(ps->dev_grads == 2 * (glob + share));
    assert_true(ps->dev_optim == 8 * (glob + share));
    assert_true(ps->host_total == 0);
    assert_int_equal(ps->fit, CLUSTER_FITS_RESIDENT);
    /* real: 48 slots; resident all would be 16 (glob + 48 share) = 304 GiB;
     * R resident with 2 staging buffers of 4 * share: the largest R with
     * 16 glob + 16 R share + 8 share <= 32 GiB is 4 */
    const cluster_phase *re = &cp.real;
    assert_true(re->total_params == total);
    assert_true(re->device_params == glob + L * share);
    assert_true(re->all_resident_bytes == 16 * (glob + L * share));
    assert_true(re->all_resident_bytes > 32 * GiB);
    uint64_t R = (32 * GiB - 16 * glob - 8 * share) / (16 * share);
    assert_int_equal(R, 4);
    assert_int_equal(re->n_resident, (int)R);
    assert_int_equal(re->n_offloaded, (int)(L - R));
    assert_int_equal(re->n_staging, 2);
    assert_true(re->dev_total == 16 * (glob + R * share) + 8 * share);
    assert_true(re->dev_total <= 32 * GiB);
    uint64_t off = (L - R) * share;
    assert_true(re->host_total == 20 * off);
    assert_true(re->node_host_total == 8 * 20 * off);   /* 2.71 TiB */
    /* with AdamW's fp32 state the 44 offloaded slots need more host
     * memory than 512 GiB per node: the real phase fits only with
     * offloading, and only on nodes with the host memory for it */
    assert_int_equal(re->fit, CLUSTER_NO_FIT);
    assert_true(re->short_of_host);
    assert_true(re->shortfall_bytes == 8 * 20 * off - 512 * GiB);
    in.host_memory = 3ull << 40;                          /* 3 TiB */
    assert_int_equal(cluster_plan_for_spec(&s, &in, &cp, err, sizeof err), 0);
    assert_int_equal(cp.real.fit, CLUSTER_FITS_OFFLOADED);
    assert_int_equal(cp.pseudo.fit, CLUSTER_FITS_RESIDENT);
    /* a device too small even with every slot offloaded */
    in.device_memory = GiB / 2;
    assert_int_equal(cluster_plan_for_spec(&s, &in, &cp, err, sizeof err), 0);
    assert_int_equal(cp.real.fit, CLUSTER_NO_FIT);
    assert_false(cp.real.short_of_host);
    assert_true(cp.real.shortfall_bytes == 16 * glob + 8 * share - GiB / 2);
    in.nodes = 0;
    assert_int_equal(cluster_plan_for_spec(&s, &in, &cp, err, sizeof err), -1);
    assert_non_null(strstr(err, "nodes >= 1"));
}

/* Experts that do not divide over the devices: ceil(E/D) per device; a
 * mixed model's dense slots replicated whole (hand-counted). */
static void test_plan_at_scale_mixed(void **state)
{
    (void)state;
    run_spec s;
    spec_defaults(&s);
    s.model = (model_config){.vocab_size = 64, .n_layer = 4, .n_head = 2,
                             .n_embd = 16, .seq_len = 8, .moe_experts = 10,
                             .moe_prototypes = 2, .moe_every = 2,
                             .moe_hidden = 24, .moe_capacity_factor = 1.0f,
                             .moe_eval_capacity_factor = 1.0f};
    s.pseudo.share_groups = 2;
    s.pseudo.steps = 5;
    const uint64_t C = 16, E = 10, H = 24;
    uint64_t glob = 64 * C + 8 * C + 2 * C;
    uint64_t attn = 4 * C * C + 8 * C, mlp = 8 * C * C + 5 * C;
    uint64_t gate = E * C + E, expert = 2 * H * C + H + C;
    cluster_input in = {.nodes = 1, .gpus_per_node = 4,
                        .device_memory = 1ull << 30, .host_memory = 0,
                        .prefetch = 1};
    cluster_plan cp;
    char err[512];
    assert_int_equal(cluster_plan_for_spec(&s, &in, &cp, err, sizeof err), 0);
    assert_true(cp.real.experts_per_device == 3);   /* ceil(10 / 4) */
    assert_int_equal(cp.real.n_moe_slots, 2);
    assert_true(cp.real.device_params ==
                glob + 2 * (attn + mlp) + 2 * (attn + gate + 3 * expert));
    assert_true(cp.real.total_params ==
                glob + 2 * (attn + mlp) + 2 * (attn + gate + E * expert));
    assert_true(cp.pseudo.device_params ==
                glob + (attn + mlp) + (attn + gate + 3 * expert));
    assert_int_equal(cp.pseudo.fit, CLUSTER_FITS_RESIDENT);
    s.pseudo.share_groups = 1;  /* one slot cannot hold both kinds */
    assert_int_equal(cluster_plan_for_spec(&s, &in, &cp, err, sizeof err), -1);
    assert_non_null(strstr(err, "pseudo phase"));
}

/* optimizer.shard at D = 4 on the hand-counted model below: each rank
 * keeps weights 4 + gradients 4 bytes a parameter and a quarter of
 * AdamW's m and v (8 / 4 = 2): 10 bytes a parameter, by hand; with a
 * budget (offloading) the state lives on the host (state_on_host): 8
 * bytes a parameter on the device and in an offloaded slot's block, and
 * a quarter of the whole model's 8 on the host (a plan with a budget but
 * without state_on_host is refused). */
static void test_plan_sharded(void **state)
{
    (void)state;
    size_t n_global = 1184, slot = 3280;  /* as in test_plan_hand_counted */
    offload_plan_input in = {
        .model = {.vocab_size = 64, .n_layer = 4, .n_head = 2, .n_embd = 16,
                  .seq_len = 8},
        .n_slots = 4, .slot_of = NULL, .batch_size = 2, .grad_accum = 2,
        .prefetch = 2, .backend = BACKEND_CPU, .budget = 0,
        .shard_world = 4,
    };
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.global_bytes, 10 * n_global);
    assert_int_equal(p.slot_bytes, 10 * slot);
    offload_plan_free(&p);
    in.budget = (size_t)1 << 30;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "optimizer.shard"));
    in.optim.state_on_host = 1;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 0);
    assert_int_equal(p.global_bytes, 8 * n_global);
    assert_int_equal(p.slot_bytes, 8 * slot);
    size_t hstate = 8 * (n_global + 4 * slot) / 4;
    assert_int_equal(p.host_state_bytes, hstate);
    assert_int_equal(p.host_bytes, hstate);
    assert_int_equal(p.speculative, 0);
    /* room for two slots and one staging buffer (prefetch 1) beside the
     * globals and activations: the other two offloaded, 8 bytes a
     * parameter each */
    size_t act = p.act_bytes;
    offload_plan_free(&p);
    in.prefetch = 1;
    in.budget = 8 * n_global + 3 * 8 * slot + act;
    in.clipped = 1;
    in.speculative = SPEC_SPECULATIVE_AUTO;
    in.host_limit = (size_t)1 << 40;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 2);
    assert_int_equal(p.host_slot_bytes, 8 * slot);
    assert_int_equal(p.host_bytes, 2 * 8 * slot + hstate);
    assert_int_equal(p.speculative, 0);  /* it copies a slot's state */
    offload_plan_free(&p);
    in.optim.state_on_host = 0;
    in.prefetch = 2;
    /* from a spec: the real phase's world, the pseudo phase's own */
    run_spec sp;
    spec_defaults(&sp);
    sp.optimizer.shard = 1;
    sp.nodes.world_size = 4;
    sp.nodes.pseudo_world_size = 2;
    assert_int_equal(offload_plan_input_of(&sp).shard_world, 4);
    sp.optimizer.shard = 0;
    assert_int_equal(offload_plan_input_of(&sp).shard_world, 1);
    /* expert parallelism P = 2: over the 2 ranks holding the same
     * experts */
    sp.optimizer.shard = 1;
    sp.nodes.expert_parallel = 2;
    assert_int_equal(offload_plan_input_of(&sp).shard_world, 2);
}

/* A spec with nodes.expert_parallel: the plan carries a rank's own model
 * (its experts only) beside the whole one, counted by hand as in
 * test_plan_hand_counted_moe: E = 4 in k = 2, H = 24, C 16, every block
 * MoE; at P = 3 the ranks hold 1, 1 and 2 experts (model_expert_range),
 * and the plan is the largest's. */
static void test_plan_expert_parallel_rank(void **state)
{
    (void)state;
    const size_t C = 16, E = 4, H = 24, F = sizeof(float);
    size_t dense = 4 * C * C + 8 * C, gate = E * C + E;
    size_t expert = 2 * H * C + H + C;
    run_spec sp;
    spec_defaults(&sp);
    sp.model = (model_config){.vocab_size = 64, .n_layer = 4, .n_head = 2,
                              .n_embd = 16, .seq_len = 8, .moe_experts = 4,
                              .moe_prototypes = 2, .moe_every = 1,
                              .moe_hidden = 24, .moe_capacity_factor = 1.25f,
                              .moe_eval_capacity_factor = 2.0f};
    sp.train.batch_size = 2;
    sp.train.grad_accum = 3;
    sp.nodes.world_size = 3;
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_spec(&sp, 0, &p, err, sizeof err), 0);
    assert_null(p.ep_rank);  /* no expert parallelism: none */
    offload_plan_free(&p);
    sp.nodes.expert_parallel = 3;
    if (offload_plan_for_spec(&sp, 0, &p, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(p.slot_bytes, 4 * pad16_(dense + E * expert + gate) * F);
    assert_non_null(p.ep_rank);
    assert_int_equal(p.ep_experts, 2);
    assert_int_equal(p.ep_rank->slot_bytes,
                     4 * pad16_(dense + 2 * expert + gate) * F);
    assert_int_equal(p.ep_rank->global_bytes, p.global_bytes);
    /* and in JSON, under its own key */
    json_t *j = plan_json_(&p);
    json_t *r = json_object_get(j, "expert_parallel_rank");
    assert_non_null(r);
    assert_int_equal(json_integer_value(json_object_get(
                         j, "expert_parallel_rank_experts")), 2);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(r, "breakdown"), "slot_bytes")),
                     (json_int_t)p.ep_rank->slot_bytes);
    json_decref(j);
    char *t = plan_text_(&p);
    assert_non_null(strstr(t, "a rank's own model once its group forms (2 "
                              "experts of each MoE slot"));
    free(t);
    offload_plan_free(&p);
}

static void test_plan_hand_counted(void **state)
{
    (void)state;
    const size_t V = 64, L = 4, NH = 2, C = 16, T = 8, B = 2, BT = B * T;
    const size_t F = sizeof(float);
    /* wte, wpe, ln_f weight and bias */
    size_t n_global = pad16_(V * C + T * C + 2 * C);
    assert_int_equal(n_global, 1184);
    /* ln_1 (2C), c_attn (3C*C + 3C), attn c_proj (C*C + C), ln_2 (2C),
     * c_fc (4C*C + 4C), mlp c_proj (4C*C + C) = 12C^2 + 13C */
    size_t slot = pad16_(12 * C * C + 13 * C);
    assert_int_equal(slot, 3280);
    /* activations: every tensor padded to 16 floats */
    size_t acts[] = {
        BT * C,                                   /* encoded */
        L * BT * C, L * BT, L * BT,               /* ln1, mean, rstd */
        L * BT * 3 * C, L * BT * C,               /* qkv, atty */
        L * B * NH * T * T, L * BT * C,           /* att, residual2 */
        L * BT * C, L * BT, L * BT,               /* ln2, mean, rstd */
        L * BT * 4 * C, L * BT * 4 * C,           /* fch, fch_gelu */
        L * BT * C,                               /* residual3 */
        BT * C, BT, BT,                           /* lnf, mean, rstd */
        BT * V, BT * V, BT,                       /* logits, probs, losses */
        BT * C, BT * C, BT * C, BT * 3 * C,       /* dres, dln, datty, dqkv */
        BT * 4 * C, BT * 4 * C, B * NH * T * T,   /* dfch, dfch_gelu, datt */
        BT * V, BT * C, BT,                       /* dlogits, dlnf, dlosses */
    };
    size_t act = 0;
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        act += pad16_(acts[i]);
    const size_t G = 4 * n_global * F, SL = 4 * slot * F, ST = 2 * slot * F;
    const size_t A = act * F, W = slot * F;

    offload_plan_input in = {
        .model = {.vocab_size = 64, .n_layer = 4, .n_head = 2, .n_embd = 16,
                  .seq_len = 8},
        .n_slots = 4, .slot_of = NULL, .batch_size = 2, .grad_accum = 2,
        .prefetch = 2, .backend = BACKEND_CPU, .budget = 0,
    };
    offload_plan p;
    char err[512];
    /* unlimited: all resident, nothing moves */
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.global_bytes, G);
    assert_int_equal(p.slot_bytes, SL);
    assert_int_equal(p.staging_bytes, ST);
    assert_int_equal(p.act_bytes, A);
    assert_int_equal(p.n_resident, 4);
    assert_int_equal(p.peak_device_bytes, G + A + 4 * SL);
    assert_int_equal(p.min_budget_bytes, G + A + 2 * ST);
    assert_int_equal(p.h2d_bytes_per_step, 0);
    assert_int_equal(p.d2h_bytes_per_step, 0);
    offload_plan_free(&p);

    /* room for 1 resident slot and 2 staging buffers: slots 1-3 offloaded.
     * Per microbatch: forward fetches 1,2,3; 3 stays for backward (one
     * interval); backward fetches 2,1: 5 weight fetches, 3 drains. The
     * second microbatch also fetches the 3 partial gradients:
     * h2d = 2*5W + 3W, d2h = 2*3W. */
    in.budget = G + A + SL + 2 * ST + 100;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_resident, 1);
    assert_int_equal(p.n_offloaded, 3);
    assert_int_equal(p.placement[0], OFFLOAD_RESIDENT);
    for (int s = 1; s < 4; s++)
        assert_int_equal(p.placement[s], OFFLOAD_OFFLOADED);
    assert_int_equal(p.n_staging, 2);
    assert_int_equal(p.peak_device_bytes, G + A + SL + 2 * ST);
    assert_int_equal(p.host_bytes, 3 * SL);
    assert_int_equal(p.pinned_bytes, 3 * SL); /* cpu: all of it pinned */
    assert_int_equal(p.h2d_bytes_per_step, 13 * W);
    assert_int_equal(p.d2h_bytes_per_step, 6 * W);

    /* printable: JSON with the documented fields */
    json_t *j = plan_json_(&p);
    assert_int_equal(json_array_size(json_object_get(j, "resident_slots")), 1);
    assert_int_equal(json_array_size(json_object_get(j, "offloaded_slots")), 3);
    assert_int_equal(json_integer_value(json_array_get(
                         json_object_get(j, "offloaded_slots"), 0)), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "peak_device_bytes")),
                     G + A + SL + 2 * ST);
    assert_int_equal(json_integer_value(json_object_get(j, "h2d_bytes_per_step")),
                     13 * W);
    assert_int_equal(json_integer_value(json_object_get(j, "d2h_bytes_per_step")),
                     6 * W);
    assert_int_equal(json_integer_value(json_object_get(j, "min_budget_bytes")),
                     G + A + 2 * ST);
    json_decref(j);
    char *buf = plan_text_(&p);
    assert_non_null(strstr(buf, "real"));
    assert_non_null(strstr(buf, "1-3"));
    free(buf);
    offload_plan_free(&p);

    /* Pseudo, one slot used by all 4 layers, offloaded: one interval spans
     * the whole microbatch: h2d = 2W (weights) + W (partial gradient of the
     * second microbatch), d2h = 2W; one staging buffer. */
    in.n_slots = 1;
    in.budget = G + A + ST;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 1);
    assert_int_equal(p.n_staging, 1);
    assert_int_equal(p.min_budget_bytes, G + A + ST);
    assert_int_equal(p.h2d_bytes_per_step, 3 * W);
    assert_int_equal(p.d2h_bytes_per_step, 2 * W);
    offload_plan_free(&p);

    /* an interleaved share map, both slots offloaded, one microbatch:
     * pass s0 s1 s0 s1 | s1 s0 s1 s0 -> 7 intervals (the middle s1 s1
     * merges); backward intervals s1 s0 s1 s0, the last two start from the
     * host's partial gradient: h2d = 7W + 2W, d2h = 4W */
    int map[4] = {0, 1, 0, 1};
    in.n_slots = 2;
    in.slot_of = map;
    in.grad_accum = 1;
    in.budget = G + A + 2 * ST;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 2);
    assert_int_equal(p.h2d_bytes_per_step, 9 * W);
    assert_int_equal(p.d2h_bytes_per_step, 4 * W);
    offload_plan_free(&p);

    /* CUDA reserves a workspace */
    in.backend = BACKEND_CUDA;
    in.budget = 0;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.workspace_bytes, 32u << 20);
    offload_plan_free(&p);
}

/* The cuda accounting (offload.h): V 64 (Vp 128), L 4, NH 2, C 32, T 8,
 * microbatch 2, accum 2, prefetch 2; bf16 working copies and gradients,
 * fp32 master and moments; activations as gpt_cuda allocates them. Every
 * figure is counted here by hand from the shapes. */
static void test_plan_hand_counted_cuda(void **state)
{
    (void)state;
    /* globals: wte 128 x 32 (padded rows), wpe 8 x 32, ln_f 2 x 32 */
    const size_t n_global = 4096 + 256 + 64;           /* 4416, a multiple of 16 */
    /* one slot: 12 C^2 + 13 C = 12288 + 416 = 12704 (a multiple of 16) */
    const size_t slot = 12704;
    /* activations, bytes, each region rounded up to 256 (BT = 16):
     *   encoded 16*32*2                                  1024
     *   per layer ln1 qkv atty res2 ln2 fch fchg res3:
     *     (1+3+1+1+1+4+4+1) * 32 * 16 * 4 layers * 2  65536
     *   lnf 1024, logits 16*128*2 = 4096                  5120
     *   ln1/ln2 mean, rstd: 4 x (4*16*4 = 256)            1024
     *   lnf mean, rstd: 2 x (64 -> 256)                    512
     *   lse 4*2*2*8*4                                      512
     *   losses, dlosses: 2 x (64 -> 256)                   512
     *   dres dln datty dlnf 4 x 1024, dqkv 3072,
     *   dfch 4096 (dfchg 0: the GELU backward is fused)  11264
     *   scratch: max(matmul 1*128, layernorm 1*64,
     *     attention 2*2*8) = 128 floats                    512
     *   attention workspace (head size 16): max(B, NH) = 2
     *     items x 8 x 8 scores x (4 + 4 + 2)                1280
     *   red (1024 + 3) * 4 = 4108 -> 4352                 4352
     *   inp, tgt: 2 x (64 -> 256)                          512
     *   encoder plan (3*16 + 2) * 4 = 200 -> 256           256 */
    const size_t A = 1024 + 65536 + 5120 + 1024 + 512 + 512 + 512 + 11264 +
                     512 + 1280 + 4352 + 512 + 256;
    assert_int_equal(A, 92416);
    const size_t G = 16 * n_global, SL = 16 * slot, ST = 4 * slot;
    const size_t WS = 32u << 20, W = 2 * slot;

    model_config mc = {.vocab_size = 64, .n_layer = 4, .n_head = 2,
                       .n_embd = 32, .seq_len = 8};
    assert_int_equal(offload_cuda_act_bytes(&mc, 2), A);
    offload_plan_input in = {
        .model = mc, .n_slots = 4, .slot_of = NULL, .batch_size = 2,
        .grad_accum = 2, .prefetch = 2, .backend = BACKEND_CUDA, .budget = 0,
    };
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.global_bytes, 70656);
    assert_int_equal(p.global_bytes, G);
    assert_int_equal(p.slot_bytes, SL);
    assert_int_equal(p.staging_bytes, ST);
    assert_int_equal(p.act_bytes, A);
    assert_int_equal(p.workspace_bytes, WS);
    assert_int_equal(p.host_slot_bytes, 20 * slot);
    assert_int_equal(p.pinned_slot_bytes, 4 * slot);
    assert_int_equal(p.n_resident, 4);
    assert_int_equal(p.peak_device_bytes, G + A + 4 * SL + WS);
    assert_int_equal(p.min_budget_bytes, G + A + 2 * ST + WS);
    assert_int_equal(p.host_bytes, 0);
    assert_int_equal(p.pinned_bytes, 0);
    assert_int_equal(p.h2d_bytes_per_step, 0);
    offload_plan_free(&p);

    /* 1 resident, slots 1-3 offloaded. Per microbatch 5 weight fetches
     * (3's forward and backward share one) and 3 drains; no partial
     * gradient comes back (the host accumulates): h2d = 2*5W, d2h = 2*3W,
     * bf16 W. Host: 3 x (16 + 4) bytes per parameter, 3 x 4 pinned. */
    in.budget = G + A + SL + 2 * ST + WS + 100;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_resident, 1);
    assert_int_equal(p.n_offloaded, 3);
    assert_int_equal(p.n_staging, 2);
    assert_int_equal(p.peak_device_bytes, G + A + SL + 2 * ST + WS);
    assert_int_equal(p.h2d_bytes_per_step, 10 * W);
    assert_int_equal(p.d2h_bytes_per_step, 6 * W);
    offload_plan_free(&p);
    /* the same per microbatch for any grad_accum, counted without walking
     * every microbatch (a spec may ask for 2^31 - 1 of them) */
    static const int accums[] = {1, 3, 5, 2147483647};
    for (size_t k = 0; k < sizeof accums / sizeof accums[0]; k++) {
        in.grad_accum = accums[k];
        assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
        assert_true(p.h2d_bytes_per_step == (size_t)accums[k] * 5 * W);
        assert_true(p.d2h_bytes_per_step == (size_t)accums[k] * 3 * W);
        offload_plan_free(&p);
    }
    in.grad_accum = 2;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.h2d_bytes_per_step, 254080);
    assert_int_equal(p.host_bytes, 3 * 20 * slot);
    assert_int_equal(p.pinned_bytes, 3 * 4 * slot);
    assert_int_equal(p.pinned_bytes, 152448);

    json_t *j = plan_json_(&p);
    assert_string_equal(json_string_value(json_object_get(j, "backend")),
                        "cuda");
    assert_int_equal(json_integer_value(json_object_get(j, "host_bytes")),
                     3 * 20 * slot);
    assert_int_equal(json_integer_value(json_object_get(j, "pinned_bytes")),
                     3 * 4 * slot);
    assert_int_equal(json_integer_value(json_object_get(j, "h2d_bytes_per_step")),
                     10 * W);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(j, "breakdown"), "activations_bytes")),
                     A);
    json_decref(j);
    char *buf = plan_text_(&p);
    assert_non_null(strstr(buf, "pinned"));
    assert_non_null(strstr(buf, "744.38 KiB")); /* host: 762240 bytes */
    assert_non_null(strstr(buf, "148.88 KiB")); /* pinned: 152448 bytes */
    free(buf);
    offload_plan_free(&p);

    /* Pseudo, one slot for all 4 layers, offloaded: one interval per
     * microbatch: h2d = 2W, d2h = 2W (cpu would fetch one partial
     * gradient more) */
    in.n_slots = 1;
    in.budget = G + A + ST + WS;
    assert_int_equal(offload_plan_make(&in, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 1);
    assert_int_equal(p.h2d_bytes_per_step, 2 * W);
    assert_int_equal(p.d2h_bytes_per_step, 2 * W);
    offload_plan_free(&p);
}

/* ------------------------------------ a node's host memory among its ranks */

/* A cuda spec of world_size 2 with every slot it can offloaded: its
 * pinned bytes into *pinned. */
static run_spec two_rank_spec_(size_t *pinned)
{
    run_spec s;
    spec_defaults(&s);
    s.device.backend = BACKEND_CUDA;
    s.model = (model_config){.vocab_size = 256, .n_layer = 6, .n_head = 2,
                             .n_embd = 64, .seq_len = 16};
    s.pseudo.steps = 0;
    s.nodes.world_size = 2;
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    s.device.memory_budget = p.min_budget_bytes;
    offload_plan_free(&p);
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    assert_true(p.n_offloaded > 0);
    *pinned = p.pinned_bytes;
    offload_plan_free(&p);
    return s;
}

/* A node of 2 ranks: each rank of a 2-rank run must fit half of what the
 * node may lock; a run of one rank there, and any run on a node of one
 * rank, the whole. The refusal names the node, its ranks and the bytes
 * each has. */
static void test_node_share_pinned(void **state)
{
    (void)state;
    size_t P;
    run_spec s = two_rank_spec_(&P);
    char err[1024], warn[1024];
    node_share_set("t-node", 2);
    /* 2P lockable: P each, exactly the need */
    offload_test_set_pin_limit(2 * P);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), 0);
    /* 2P - 2: P - 1 each, one byte short */
    offload_test_set_pin_limit(2 * P - 2);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), -1);
    printf("# %s\n", err);
    char want[160];
    snprintf(want, sizeof want, "node t-node runs 2 ranks of this run, which "
             "share its lockable memory: ");
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "(%zu bytes) each", P - 1);
    assert_non_null(strstr(err, want));
    /* without the requirement: the same words as a warning */
    assert_int_equal(offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                   sizeof err), 0);
    assert_non_null(strstr(warn, "runs 2 ranks of this run"));
    /* a run of one rank on the node: all of it */
    run_spec one = s;
    one.nodes.world_size = 1;
    assert_int_equal(offload_check(&one, 0, OFFLOAD_REQUIRE_PINNED, NULL,
                                   warn, sizeof warn, err, sizeof err), 0);
    /* a node of one rank: all of it, the message as before */
    node_share_set("t-node", 1);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), 0);
    offload_test_set_pin_limit(P - 1);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), -1);
    assert_null(strstr(err, "ranks of this run"));
    offload_test_set_pin_limit(SIZE_MAX);
}

/* The host memory check: a cpu run (everything resident, all of it host
 * memory) needing about 0.7 of what m6d may use fits a node of one rank
 * and is refused on a node of 2 ranks, each of which has half. The need
 * is sized from MemAvailable (capped by the cgroup) measured here; a
 * machine whose free memory moves by over a fifth meanwhile is measured
 * again (3 tries). */
static void test_node_share_host_memory(void **state)
{
    (void)state;
    char err[1024], warn[1024];
    run_spec s;
    spec_defaults(&s);
    s.pseudo.steps = 0;
    s.nodes.world_size = 2;
    s.train.batch_size = 1;
    s.model = (model_config){.vocab_size = 256, .n_layer = 1, .n_head = 16,
                             .n_embd = 1024, .seq_len = 16};
    offload_plan p;
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    size_t one = p.peak_device_bytes;
    offload_plan_free(&p);
    s.model.n_layer = 2;
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    size_t layer = p.peak_device_bytes - one;  /* a layer's bytes */
    offload_plan_free(&p);
    for (int attempt = 0; attempt < 3; attempt++) {
        size_t avail = offload_host_available();
        assert_true(avail > 0);
        s.model.n_layer = (int)((0.7 * (double)avail - (double)one) /
                                (double)layer) + 1;
        assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err),
                         0);
        size_t need = p.peak_device_bytes;
        offload_plan_free(&p);
        node_share_set("t-node", 1);
        int rc1 = offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                sizeof err);
        node_share_set("t-node", 2);
        int rc2 = offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                sizeof err);
        size_t after = offload_host_available();
        node_share_set(NULL, 1);
        if ((double)after < 0.8 * (double)avail ||
            (double)after > 1.2 * (double)avail) {
            printf("# free memory moved (%zu -> %zu bytes): again\n", avail,
                   after);
            continue;
        }
        printf("# need %zu of %zu bytes; 2 ranks: %s\n", need, avail, err);
        assert_int_equal(rc1, 0);
        assert_int_equal(rc2, -1);
        assert_non_null(strstr(err, "host memory: training needs"));
        assert_non_null(strstr(err, "node t-node runs 2 ranks of this run, "
                                    "which share its host memory: "));
        return;
    }
    fail_msg("free host memory kept moving by over a fifth");
}

/* Host AdamW threads (offload.host_threads 0, auto): the node's count
 * (2 on cpu; on cuda the CPUs m6d may use less 2, in [1, 64]) split among
 * a run's ranks on the node; an explicit count is each rank's as given. */
static void test_node_share_host_threads(void **state)
{
    (void)state;
    run_spec s;
    spec_defaults(&s);
    s.nodes.world_size = 4;
    node_share_set(NULL, 1);
    assert_int_equal(spec_host_threads(&s), 2);
    node_share_set(NULL, 2);
    assert_int_equal(spec_host_threads(&s), 1);  /* 2 / 2 */
    node_share_set(NULL, 4);
    assert_int_equal(spec_host_threads(&s), 1);  /* at least 1 */
    s.nodes.world_size = 1;  /* a run of one rank has the node's */
    assert_int_equal(spec_host_threads(&s), 2);
    s.device.backend = BACKEND_CUDA;
    s.nodes.world_size = 2;
    node_share_set(NULL, 2);
    long c = cpus_available() - 2;
    long node = c < 1 ? 1 : c > 64 ? 64 : c;
    assert_int_equal(spec_host_threads(&s), node / 2 < 1 ? 1 : node / 2);
    s.offload.host_threads = 6;  /* the operator's: per rank */
    assert_int_equal(spec_host_threads(&s), 6);
    node_share_set(NULL, 1);
}

TEST_MAIN(
    cmocka_unit_test(test_node_share_host_threads),
    cmocka_unit_test(test_node_share_pinned),
    cmocka_unit_test(test_node_share_host_memory),
    cmocka_unit_test(test_plan_hand_counted),
    cmocka_unit_test(test_plan_sharded),
    cmocka_unit_test(test_plan_expert_parallel_rank),
    cmocka_unit_test(test_plan_hand_counted_moe),
    cmocka_unit_test(test_plan_m6_10t),
    cmocka_unit_test(test_plan_mixed_kinds),
    cmocka_unit_test(test_plan_mixed_kinds_cuda),
    cmocka_unit_test(test_plan_at_scale_m6_10t),
    cmocka_unit_test(test_plan_at_scale_mixed),
    cmocka_unit_test(test_plan_hand_counted_cuda))
