/*
 * test_spec.c — the run spec: defaults, canonical JSON round trip, a full
 * spec, and a table of bad specs with the words their errors must hold.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec/spec.h"
#include "common/cpus.h"
#include "../common/test_main.h"

static void assert_contains(const char *hay, const char *needle)
{
    if (!strstr(hay, needle))
        fail_msg("error \"%s\" lacks \"%s\"", hay, needle);
}

static int parse(run_spec *s, const char *json, char *err, size_t errlen)
{
    return spec_parse(s, json, strlen(json), err, errlen);
}

/* JSON must be refused: fails the test if spec_parse accepts it, if its
 * message lacks want (exact: is not want) or if the spec it was given
 * changed (a refused spec is left untouched). */
static void refused_(const char *json, const char *want, int exact)
{
    char err[512] = "";
    run_spec s, before;
    spec_defaults(&s);
    before = s;
    if (parse(&s, json, err, sizeof err) != -1)
        fail_msg("accepted: %s", json);
    if (exact ? strcmp(err, want) != 0 : !strstr(err, want))
        fail_msg("%s:\n  got  \"%s\"\n  want \"%s\"", json, err, want);
    assert_memory_equal(&s, &before, sizeof s);
}

/* A spec with the defaults and the two required globs. */
static void minimal(run_spec *s)
{
    spec_defaults(s);
    strcpy(s->data.train, "data/train_*.bin");
    strcpy(s->data.val, "data/val_*.bin");
}

static void roundtrip(const run_spec *a)
{
    char err[512];
    char *j = spec_to_json(a);
    assert_non_null(j);
    run_spec b;
    memset(&b, 0xAB, sizeof b);
    if (parse(&b, j, err, sizeof err) != 0) fail_msg("%s\n%s", err, j);
    assert_memory_equal(a, &b, sizeof b);
    char *j2 = spec_to_json(&b);
    assert_string_equal(j, j2);
    assert_true(spec_hash(a) == spec_hash(&b));
    free(j);
    free(j2);
}

static void test_defaults(void **state)
{
    (void)state;
    run_spec s;
    spec_defaults(&s);
    assert_string_equal(s.name, "run");
    assert_int_equal(s.model.vocab_size, 256);
    assert_int_equal(s.model.n_layer, 6);
    assert_int_equal(s.model.n_head, 4);
    assert_int_equal(s.model.n_embd, 128);
    assert_int_equal(s.model.seq_len, 128);
    assert_int_equal(s.pseudo.share_groups, 1);
    assert_int_equal(s.pseudo.steps, 0);
    assert_int_equal(s.delink.optimizer, DELINK_OPT_COPY);
    assert_int_equal(s.train.steps, 1000);
    assert_int_equal(s.train.batch_size, 16);
    assert_true(s.train.lr == 1e-3f && s.train.min_lr == 1e-4f);
    assert_true(s.train.beta2 == 0.95f && s.train.eps == 1e-8f);
    assert_int_equal(s.train.seed, 1337);
    assert_int_equal(s.checkpoint.keep, 2);
    assert_int_equal(s.device.backend, BACKEND_CPU);
    assert_int_equal(s.offload.prefetch, 2);
    assert_int_equal(s.offload.host_threads, 0); /* auto */
    /* auto resolves to 2 on the CPU backend, and on cuda to the CPUs this
     * process may use less 2, within [1, 64] */
    assert_int_equal(spec_host_threads(&s), 2);
    {
        run_spec c = s;
        /* cpus_available: the affinity mask capped by the cgroup quota
         * (test_cpus checks it) */
        int want = cpus_available() - 2;
        want = want < 1 ? 1 : want > 64 ? 64 : want;
        c.device.backend = BACKEND_CUDA;
        assert_int_equal(spec_host_threads(&c), want);
        c.offload.host_threads = 5; /* explicit wins on either backend */
        assert_int_equal(spec_host_threads(&c), 5);
    }

    /* the defaults alone lack data.train */
    char err[512];
    assert_int_equal(parse(&s, "{}", err, sizeof err), -1);
    assert_contains(err, "data.train: required");

    /* with the two globs they round-trip to a memcmp-equal struct */
    minimal(&s);
    roundtrip(&s);
    /* and parsing only the globs gives exactly the defaults */
    run_spec p;
    assert_int_equal(parse(&p, "{\"data\": {\"train\": \"data/train_*.bin\","
                               " \"val\": \"data/val_*.bin\"}}",
                           err, sizeof err), 0);
    assert_memory_equal(&s, &p, sizeof s);
}

static void test_hash(void **state)
{
    (void)state;
    run_spec a, b;
    minimal(&a);
    minimal(&b);
    assert_true(spec_hash(&a) == spec_hash(&b));
    b.train.lr = nextafterf(b.train.lr, 1.0f);
    assert_true(spec_hash(&a) != spec_hash(&b));
    /* FNV-1a 64 of the canonical text, computed here independently */
    char *j = spec_to_json(&a);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = j; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ULL;
    }
    assert_true(h == spec_hash(&a));
    free(j);
}

/* A dense spec's hash is the one it had before model.moe existed, so old
 * checkpoints keep loading. The number was printed by spec_hash on main at
 * 193b4fa (before the MoE keys) for this exact text. */
static void test_hash_dense_pinned(void **state)
{
    (void)state;
    run_spec s;
    char err[512];
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t/*.bin\","
                               "\"val\":\"v/*.bin\"}}", err, sizeof err), 0);
    assert_true(spec_hash(&s) == 16354039838139344991ULL);
}

/* train.max_bad_steps: 5 by default and then left out of the canonical
 * JSON (the pinned hash above holds); another value is written, round-
 * trips and changes the hash; 0 is refused naming the key. */
static void test_max_bad_steps(void **state)
{
    (void)state;
    run_spec d, s, back;
    char err[512];
    const char *base = "{\"data\":{\"train\":\"t/*.bin\",\"val\":\"v/*.bin\"}";
    char text[256];
    snprintf(text, sizeof text, "%s}", base);
    assert_int_equal(parse(&d, text, err, sizeof err), 0);
    assert_int_equal(d.train.max_bad_steps, 5);
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "max_bad_steps"));
    free(j);
    snprintf(text, sizeof text, "%s,\"train\":{\"max_bad_steps\":3}}", base);
    assert_int_equal(parse(&s, text, err, sizeof err), 0);
    assert_int_equal(s.train.max_bad_steps, 3);
    assert_true(spec_hash(&s) != spec_hash(&d));
    j = spec_to_json(&s);
    assert_non_null(strstr(j, "\"max_bad_steps\": 3"));
    assert_int_equal(parse(&back, j, err, sizeof err), 0);
    assert_int_equal(back.train.max_bad_steps, 3);
    assert_true(spec_hash(&back) == spec_hash(&s));
    free(j);
    snprintf(text, sizeof text, "%s,\"train\":{\"max_bad_steps\":0}}", base);
    assert_int_equal(parse(&s, text, err, sizeof err), -1);
    assert_non_null(strstr(err, "train.max_bad_steps"));
}

/* pseudo.grad_scale and pseudo.lr_scale: sum and 1 by default and then
 * left out of the canonical JSON (the pinned hash above holds); other
 * values are written, round-trip and change the hash; bad values are
 * refused naming the key. */
/* The Pseudo-to-Real keys a spec with a pseudo phase leaves out: S = L/2
 * (at least 1; 2 for a mixed dense/MoE model) and a re-warmup over 5% of
 * train.steps, at most the real phase; explicit values and specs without
 * a pseudo phase keep theirs; the resolved values stand in the canonical
 * JSON (a stored run re-parses to the same struct and hash). */
static void test_p2r_defaults(void **state)
{
    (void)state;
    static const struct {
        const char *model, *pseudo, *delink;
        long steps;
        int want_S;
        long want_rewarm;
    } cases[] = {
        {"\"n_layer\":6", "\"steps\":100", "", 1000, 3, 50},
        {"\"n_layer\":7", "\"steps\":100", "", 990, 3, 50},   /* 49.5: 50 */
        {"\"n_layer\":1", "\"steps\":10", "", 100, 1, 5},
        {"\"n_layer\":4", "\"steps\":98", "", 100, 2, 2},     /* room 2 */
        {"\"n_layer\":3,\"moe\":{\"num_experts\":2,\"every\":2}",
         "\"steps\":10", "", 100, 2, 5},
        {"\"n_layer\":6", "\"steps\":100,\"share_groups\":1",
         "\"rewarm_steps\":0", 1000, 1, 0},                      /* explicit */
        {"\"n_layer\":6", "\"steps\":0", "", 1000, 1, 0},      /* scratch */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512], err[512];
        snprintf(text, sizeof text,
                 "{\"data\":{\"train\":\"t/*.bin\",\"val\":\"v/*.bin\"},"
                 "\"model\":{%s,\"n_head\":2,\"n_embd\":16},"
                 "\"pseudo\":{%s},\"delink\":{%s},\"train\":{\"steps\":%ld}}",
                 cases[i].model, cases[i].pseudo, cases[i].delink, cases[i].steps);
        run_spec s;
        if (parse(&s, text, err, sizeof err) != 0)
            fail_msg("case %zu: %s\n%s", i, err, text);
        if (s.pseudo.share_groups != cases[i].want_S ||
            s.delink.rewarm_steps != cases[i].want_rewarm)
            fail_msg("case %zu: S %d rewarm %ld, want %d %ld", i,
                     s.pseudo.share_groups, s.delink.rewarm_steps,
                     cases[i].want_S, cases[i].want_rewarm);
        roundtrip(&s);
    }
}

static void test_pseudo_knobs(void **state)
{
    (void)state;
    run_spec d, s, back;
    char err[512];
    const char *base = "{\"data\":{\"train\":\"t/*.bin\",\"val\":\"v/*.bin\"}";
    char text[256];
    snprintf(text, sizeof text, "%s}", base);
    assert_int_equal(parse(&d, text, err, sizeof err), 0);
    assert_int_equal(d.pseudo.grad_scale, GRAD_SCALE_SUM);
    assert_true(d.pseudo.lr_scale == 1.0f);
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "grad_scale"));
    assert_null(strstr(j, "lr_scale"));
    free(j);
    /* explicit defaults: the same spec, the same hash */
    snprintf(text, sizeof text, "%s,\"pseudo\":{\"grad_scale\":\"sum\","
             "\"lr_scale\":1}}", base);
    assert_int_equal(parse(&s, text, err, sizeof err), 0);
    assert_true(spec_hash(&s) == spec_hash(&d));
    snprintf(text, sizeof text, "%s,\"pseudo\":{\"grad_scale\":\"mean\","
             "\"lr_scale\":0.5}}", base);
    assert_int_equal(parse(&s, text, err, sizeof err), 0);
    assert_int_equal(s.pseudo.grad_scale, GRAD_SCALE_MEAN);
    assert_true(s.pseudo.lr_scale == 0.5f);
    assert_true(spec_hash(&s) != spec_hash(&d));
    j = spec_to_json(&s);
    assert_non_null(strstr(j, "\"grad_scale\": \"mean\""));
    assert_non_null(strstr(j, "\"lr_scale\": 0.5"));
    assert_int_equal(parse(&back, j, err, sizeof err), 0);
    assert_int_equal(back.pseudo.grad_scale, GRAD_SCALE_MEAN);
    assert_true(back.pseudo.lr_scale == 0.5f);
    assert_true(spec_hash(&back) == spec_hash(&s));
    free(j);
    /* one alone changes the hash too */
    snprintf(text, sizeof text, "%s,\"pseudo\":{\"lr_scale\":2}}", base);
    assert_int_equal(parse(&s, text, err, sizeof err), 0);
    assert_true(spec_hash(&s) != spec_hash(&d));
    static const char *const bad[][2] = {
        {"\"grad_scale\":\"avg\"", "pseudo.grad_scale"},
        {"\"grad_scale\":1", "pseudo.grad_scale"},
        {"\"lr_scale\":0", "pseudo.lr_scale"},
        {"\"lr_scale\":-1", "pseudo.lr_scale"},
        {"\"lr_scale\":\"x\"", "pseudo.lr_scale"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "%s,\"pseudo\":{%s}}", base, bad[i][0]);
        err[0] = 0;
        assert_int_equal(parse(&s, text, err, sizeof err), -1);
        assert_contains(err, bad[i][1]);
    }
    /* "avg": the error lists what is accepted */
    snprintf(text, sizeof text, "%s,\"pseudo\":{\"grad_scale\":\"avg\"}}",
             base);
    assert_int_equal(parse(&s, text, err, sizeof err), -1);
    assert_contains(err, "mean");
}

/* model.moe parses, round-trips, and changes the hash; the M6-10T shape
 * (48 layers, C 1024, H 9984, 10,240 experts in 80 prototypes) parses. */
static void test_moe(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512];
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"model\":{\"n_layer\":48,\"n_embd\":1024,\"n_head\":16,"
        "\"vocab_size\":50000,\"seq_len\":1024,\"moe\":{\"num_experts\":"
        "10240,\"prototypes\":80,\"expert_hidden\":9984}},"
        "\"train\":{\"batch_size\":1}}", err, sizeof err), 0);
    assert_int_equal(s.model.moe_experts, 10240);
    assert_int_equal(s.model.moe_prototypes, 80);
    assert_int_equal(s.model.moe_hidden, 9984);
    assert_int_equal(s.model.moe_every, 1);
    assert_true(s.model.moe_capacity_factor == 1.25f);
    assert_true(s.model.moe_eval_capacity_factor == 2.0f);
    assert_true(s.model.moe_aux_coef == 0.01f);
    assert_true(s.model.moe_z_coef == 0.001f);
    roundtrip(&s);
    assert_int_equal(parse(&d, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"model\":{\"n_layer\":48,\"n_embd\":1024,\"n_head\":16,"
        "\"vocab_size\":50000,\"seq_len\":1024},"
        "\"train\":{\"batch_size\":1}}", err, sizeof err), 0);
    assert_true(spec_hash(&s) != spec_hash(&d));
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "moe"));
    free(j);
    /* every 2 with a pseudo phase of 2 slots (one of each kind) parses */
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"model\":{\"n_layer\":6,\"moe\":{\"num_experts\":4,"
        "\"every\":2}},\"pseudo\":{\"share_groups\":2,\"steps\":5},"
        "\"train\":{\"steps\":10}}", err, sizeof err), 0);
    assert_int_equal(s.model.moe_every, 2);
    roundtrip(&s);
    /* the cuda backend takes mixed models and offloaded MoE slots too */
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"model\":{\"n_layer\":4,\"moe\":{\"num_experts\":8,"
        "\"every\":2}},\"device\":{\"backend\":\"cuda\","
        "\"memory_budget\":\"1GiB\"}}", err, sizeof err), 0);
    assert_int_equal(s.device.backend, BACKEND_CUDA);
    assert_int_equal(s.model.moe_every, 2);
}

/* delink.policy: the defaults; plateau parses, round-trips and changes the
 * hash; "step" written out or left out is the same spec (the pinned dense
 * hash above is of a spec without the key). */
static void test_delink_policy(void **state)
{
    (void)state;
    run_spec s, d, e;
    char err[512];
    minimal(&d);
    assert_int_equal(d.delink.policy, DELINK_AT_STEP);
    assert_true(d.delink.min_delta == 0.01f);
    assert_int_equal(d.delink.patience, 3);
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"data/train_*.bin\","
        "\"val\":\"data/val_*.bin\"},\"pseudo\":{\"steps\":100},"
        "\"delink\":{\"policy\":\"plateau\",\"min_delta\":0.25,"
        "\"patience\":7}}", err, sizeof err), 0);
    assert_int_equal(s.delink.policy, DELINK_AT_PLATEAU);
    assert_true(s.delink.min_delta == 0.25f);
    assert_int_equal(s.delink.patience, 7);
    roundtrip(&s);
    char *j = spec_to_json(&s);
    assert_contains(j, "\"policy\": \"plateau\"");
    assert_contains(j, "\"min_delta\": 0.25");
    assert_contains(j, "\"patience\": 7");
    free(j);
    assert_int_equal(parse(&e, "{\"data\":{\"train\":\"data/train_*.bin\","
        "\"val\":\"data/val_*.bin\"},\"pseudo\":{\"steps\":100}}", err,
        sizeof err), 0);
    assert_true(spec_hash(&s) != spec_hash(&e));
    /* plateau at the default min_delta and patience still differs */
    e.delink.policy = DELINK_AT_PLATEAU;
    roundtrip(&e);
    run_spec f;
    assert_int_equal(parse(&f, "{\"data\":{\"train\":\"data/train_*.bin\","
        "\"val\":\"data/val_*.bin\"},\"delink\":{\"policy\":\"step\"}}",
        err, sizeof err), 0);
    assert_memory_equal(&f, &d, sizeof f);
    assert_true(spec_hash(&f) == spec_hash(&d));
    j = spec_to_json(&f);
    assert_null(strstr(j, "policy"));
    assert_null(strstr(j, "min_delta"));
    assert_null(strstr(j, "patience"));
    free(j);
}

/* nodes.*: defaults leave the canonical JSON (and the hash) as before;
 * set, they round-trip and change the hash; the batch split of
 * spec_dp_split against hand-worked cases. */
static void test_nodes(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512];
    assert_int_equal(parse(&d, "{\"data\":{\"train\":\"t\",\"val\":\"v\"}}",
                           err, sizeof err), 0);
    assert_int_equal(d.nodes.world_size, 1);
    assert_int_equal(d.nodes.pseudo_world_size, 0);
    assert_int_equal(d.nodes.timeout, 30);
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "nodes"));
    free(j);
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"pseudo\":{\"steps\":10},\"train\":{\"batch_size\":6,"
        "\"grad_accum\":4},\"nodes\":{\"world_size\":3,"
        "\"pseudo_world_size\":2,\"timeout\":5}}", err, sizeof err), 0);
    assert_int_equal(s.nodes.world_size, 3);
    assert_int_equal(s.nodes.pseudo_world_size, 2);
    assert_int_equal(s.nodes.timeout, 5);
    roundtrip(&s);
    assert_true(spec_hash(&s) != spec_hash(&d));
    assert_int_equal(spec_world_of_phase(&s, 1), 2);
    assert_int_equal(spec_world_of_phase(&s, 0), 3);
    /* cuda ranks without a budget are accepted (staged or NCCL) */
    run_spec cu;
    assert_int_equal(parse(&cu, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"backend\":\"cuda\"},\"train\":{\"grad_accum\":2},"
        "\"nodes\":{\"world_size\":2}}", err, sizeof err), 0);
    assert_int_equal(cu.device.backend, BACKEND_CUDA);
    /* B 6, accum 4: world 2 divides accum (2 microbatches of 6), world 3
     * only B (4 microbatches of 2), world 4 accum (1 of 6), 5 neither */
    int b, a;
    assert_int_equal(spec_dp_split(&s, 2, &b, &a), 0);
    assert_int_equal(b, 6); assert_int_equal(a, 2);
    assert_int_equal(spec_dp_split(&s, 3, &b, &a), 0);
    assert_int_equal(b, 2); assert_int_equal(a, 4);
    assert_int_equal(spec_dp_split(&s, 4, &b, &a), 0);
    assert_int_equal(b, 6); assert_int_equal(a, 1);
    assert_int_equal(spec_dp_split(&s, 5, &b, &a), -1);
    assert_int_equal(spec_dp_split(&s, 1, &b, &a), 0);
    assert_int_equal(b, 6); assert_int_equal(a, 4);
}

/* optimizer.shard: false by default and then absent from the canonical
 * JSON (older specs keep their hash); true (or 1) parsed, written and
 * hashed; refused by name where it is not implemented. */
static void test_optimizer_shard(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512];
    const char *base = "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
                       "\"nodes\":{\"world_size\":2},\"optimizer\":"
                       "{\"shard\":%s}%s}";
    char j[512];
    snprintf(j, sizeof j, base, "false", "");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(d.optimizer.shard, 0);
    char *w = spec_to_json(&d);
    assert_null(strstr(w, "shard"));
    free(w);
    snprintf(j, sizeof j, base, "true", "");
    assert_int_equal(parse(&s, j, err, sizeof err), 0);
    assert_int_equal(s.optimizer.shard, 1);
    roundtrip(&s);
    assert_true(spec_hash(&s) != spec_hash(&d));
    snprintf(j, sizeof j, base, "1", "");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(d.optimizer.shard, 1);
    /* a word for a switch: the error says what it takes */
    snprintf(j, sizeof j, base, "\"yes\"", "");
    assert_int_equal(parse(&d, j, err, sizeof err), -1);
    assert_contains(err, "optimizer.shard: must be true or false (or 1, 0)");
    static const struct { const char *extra, *want; } bad[] = {
        {",\"device\":{\"backend\":\"cuda\"}", "device.backend \"cuda\""},
        {",\"device\":{\"memory_budget\":100000000},\"offload\":"
         "{\"speculative\":\"on\"}", "offload.speculative \"on\""},
    };
    for (int i = 0; i < 2; i++) {
        snprintf(j, sizeof j, base, "true", bad[i].extra);
        assert_int_equal(parse(&d, j, err, sizeof err), -1);
        assert_contains(err, "optimizer.shard");
        assert_contains(err, bad[i].want);
    }
    /* bf16 masters shard (each element rounded as unsharded) */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
             "\"nodes\":{\"world_size\":2},\"optimizer\":{\"shard\":true,"
             "\"master\":\"bf16\"}}");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(spec_gpt_optim(&d).master_bf16, 1);
    /* Adafactor on an MoE model: refused by name */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
             "\"model\":{\"moe\":{\"num_experts\":4,\"prototypes\":2}},"
             "\"nodes\":{\"world_size\":2},\"optimizer\":{\"shard\":true,"
             "\"name\":\"adafactor\"}}");
    assert_int_equal(parse(&d, j, err, sizeof err), -1);
    assert_contains(err, "optimizer.shard");
    assert_contains(err, "MoE model");
    /* with offloading: the state on the host (spec_gpt_optim says so),
     * without: where the slots are */
    snprintf(j, sizeof j, base, "true",
             ",\"device\":{\"memory_budget\":100000000}");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(spec_gpt_optim(&d).state_on_host, 1);
    snprintf(j, sizeof j, base, "true", "");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(spec_gpt_optim(&d).state_on_host, 0);
    snprintf(j, sizeof j, base, "false",
             ",\"device\":{\"memory_budget\":100000000}");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(spec_gpt_optim(&d).state_on_host, 0);
    /* Adafactor shards (by whole tensors) */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
             "\"nodes\":{\"world_size\":2},\"optimizer\":{\"shard\":true,"
             "\"name\":\"adafactor\"}}");
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(d.optimizer.shard, 1);
    roundtrip(&d);
    snprintf(j, sizeof j, base, "2", "");
    assert_int_equal(parse(&d, j, err, sizeof err), -1);
    assert_contains(err, "optimizer.shard");
}

/* nodes.expert_parallel: 1 by default and then absent from the canonical
 * JSON (older specs keep their hash); P written, hashed, parsed; each
 * rule and each layout the engine does not build refused by name. */
static void test_expert_parallel(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512], j[768];
    const char *moe = "\"model\":{\"moe\":{\"num_experts\":4,"
                      "\"prototypes\":2}}";
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":2},\"nodes\":{\"world_size\":2}}",
             moe);
    assert_int_equal(parse(&d, j, err, sizeof err), 0);
    assert_int_equal(d.nodes.expert_parallel, 1);
    char *w = spec_to_json(&d);
    assert_null(strstr(w, "expert_parallel"));
    free(w);
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":2},\"nodes\":{\"world_size\":2,"
             "\"expert_parallel\":2}}", moe);
    if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(s.nodes.expert_parallel, 2);
    w = spec_to_json(&s);
    assert_non_null(strstr(w, "\"expert_parallel\": 2"));
    free(w);
    roundtrip(&s);
    assert_true(spec_hash(&s) != spec_hash(&d));
    /* replicas: world 4 as 2 groups of 2 */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":4},\"nodes\":{\"world_size\":4,"
             "\"expert_parallel\":2}}", moe);
    if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    /* Adafactor and bf16 masters: each expert's statistics are its own,
     * its rounding keyed by its place in the whole model */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":4},\"nodes\":{\"world_size\":2,"
             "\"expert_parallel\":2},\"optimizer\":{\"name\":"
             "\"adafactor\",\"master\":\"bf16\"}}", moe);
    if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    /* optimizer.shard over each expert's replicas */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":4},\"nodes\":{\"world_size\":4,"
             "\"expert_parallel\":2},\"optimizer\":{\"shard\":true}}", moe);
    if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    /* offloading: each rank's slots hold its experts */
    snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},%s,"
             "\"train\":{\"grad_accum\":4},\"nodes\":{\"world_size\":4,"
             "\"expert_parallel\":2},\"device\":{\"memory_budget\":"
             "100000000}}", moe);
    if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    /* a pseudo phase alone (the groups form at the delink) or in groups
     * of P */
    for (int pw = 1; pw <= 2; pw++) {
        snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
                 "%s,\"train\":{\"grad_accum\":4,\"steps\":20},"
                 "\"pseudo\":{\"steps\":5},\"nodes\":{\"world_size\":4,"
                 "\"pseudo_world_size\":%d,\"expert_parallel\":2}}", moe, pw);
        if (parse(&s, j, err, sizeof err) != 0) fail_msg("%s", err);
    }
    static const struct { const char *model, *train, *nodes, *extra, *want;
    } bad[] = {
        {"", "", "\"world_size\":2,\"expert_parallel\":2", "",
         "no MoE blocks"},
        {"\"moe\":{\"num_experts\":2}", "", "\"world_size\":4,"
         "\"expert_parallel\":4", "", "at most model.moe.num_experts (2)"},
        {"\"moe\":{\"num_experts\":4}", "", "\"world_size\":2,"
         "\"expert_parallel\":4", "", "must divide nodes.world_size (2)"},
        {"\"moe\":{\"num_experts\":4}", "", "\"world_size\":2,"
         "\"expert_parallel\":2", ",\"device\":{\"backend\":\"cuda\"}",
         "device.backend \"cuda\""},
        {"\"moe\":{\"num_experts\":4}", "", "\"world_size\":2,"
         "\"expert_parallel\":2", ",\"optimizer\":{\"shard\":true}",
         "set optimizer.shard to false, or nodes.world_size to a multiple "
         "of 2 (replicas)"},
        {"\"moe\":{\"num_experts\":4}", ",\"steps\":20,\"batch_size\":6",
         "\"world_size\":6,\"pseudo_world_size\":3,\"expert_parallel\":2",
         ",\"pseudo\":{\"steps\":5}", "nodes.pseudo_world_size"},
        {"\"moe\":{\"num_experts\":4}", ",\"eval_batches\":3",
         "\"world_size\":2,\"expert_parallel\":2", "",
         "train.eval_batches (3) must be a multiple of nodes.world_size (2)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(j, sizeof j, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
                 "\"model\":{%s},\"train\":{\"grad_accum\":4%s},"
                 "\"nodes\":{%s}%s}", bad[i].model, bad[i].train,
                 bad[i].nodes, bad[i].extra);
        if (parse(&d, j, err, sizeof err) != -1)
            fail_msg("accepted: %s", j);
        assert_contains(err, "nodes.expert_parallel");
        assert_contains(err, bad[i].want);
    }
}

/* offload.speculative: auto by default and then absent from the canonical
 * JSON (the hash of older specs stands); on/off written, hashed, parsed;
 * a wrong value named. */
static void test_offload_speculative(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512];
    assert_int_equal(parse(&d, "{\"data\":{\"train\":\"t\",\"val\":\"v\"}}",
                           err, sizeof err), 0);
    assert_int_equal(d.offload.speculative, SPEC_SPECULATIVE_AUTO);
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "speculative"));
    free(j);
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"offload\":{\"speculative\":\"auto\"}}", err, sizeof err), 0);
    assert_true(spec_hash(&s) == spec_hash(&d));
    const char *names[2] = {"on", "off"};
    int want[2] = {SPEC_SPECULATIVE_ON, SPEC_SPECULATIVE_OFF};
    for (int i = 0; i < 2; i++) {
        char txt[256];
        snprintf(txt, sizeof txt, "{\"data\":{\"train\":\"t\",\"val\":"
                 "\"v\"},\"offload\":{\"speculative\":\"%s\"}}", names[i]);
        assert_int_equal(parse(&s, txt, err, sizeof err), 0);
        assert_int_equal(s.offload.speculative, want[i]);
        j = spec_to_json(&s);
        assert_non_null(strstr(j, "\"speculative\""));
        free(j);
        roundtrip(&s);
        assert_true(spec_hash(&s) != spec_hash(&d));
    }
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"offload\":{\"speculative\":\"maybe\"}}", err, sizeof err), -1);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "offload.speculative"));
}

/* device.precision: fp32 by default and then absent from the canonical
 * JSON (the pinned hash stands); bf16 written, hashed, parsed; on cuda the
 * run is bf16 whatever is left out, "bf16" is accepted and "fp32" is
 * refused by name; a wrong value is named. */
static void test_device_precision(void **state)
{
    (void)state;
    run_spec s, d;
    char err[512];
    assert_int_equal(parse(&d, "{\"data\":{\"train\":\"t\",\"val\":\"v\"}}",
                           err, sizeof err), 0);
    assert_int_equal(d.device.precision, PRECISION_FP32);
    assert_int_equal(spec_precision(&d), PRECISION_FP32);
    char *j = spec_to_json(&d);
    assert_null(strstr(j, "precision"));
    free(j);
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"precision\":\"fp32\"}}", err, sizeof err), 0);
    assert_true(spec_hash(&s) == spec_hash(&d));

    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"precision\":\"bf16\"}}", err, sizeof err), 0);
    assert_int_equal(s.device.precision, PRECISION_BF16);
    assert_int_equal(spec_precision(&s), PRECISION_BF16);
    assert_string_equal(spec_precision_name(spec_precision(&s)), "bf16");
    j = spec_to_json(&s);
    assert_non_null(strstr(j, "\"precision\": \"bf16\""));
    free(j);
    roundtrip(&s);
    assert_true(spec_hash(&s) != spec_hash(&d));

    /* cuda: bf16 whether written or not; fp32 refused by name */
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"backend\":\"cuda\"}}", err, sizeof err), 0);
    assert_int_equal(spec_precision(&s), PRECISION_BF16);
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"backend\":\"cuda\",\"precision\":\"bf16\"}}", err,
        sizeof err), 0);
    assert_int_equal(spec_precision(&s), PRECISION_BF16);
    roundtrip(&s);
    const char *fp32_cuda[2] = {
        "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"backend\":\"cuda\",\"precision\":\"fp32\"}}",
        /* the key before the backend: refused all the same */
        "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"precision\":\"fp32\",\"backend\":\"cuda\"}}"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(parse(&s, fp32_cuda[i], err, sizeof err), -1);
        printf("# %s\n", err);
        assert_contains(err, "device.precision: \"fp32\" is not available "
                             "on device.backend \"cuda\"");
    }
    assert_int_equal(parse(&s, "{\"data\":{\"train\":\"t\",\"val\":\"v\"},"
        "\"device\":{\"precision\":\"fp16\"}}", err, sizeof err), -1);
    printf("# %s\n", err);
    assert_contains(err, "device.precision: must be \"fp32\" or \"bf16\", "
                         "got \"fp16\"");
}

/* Every float survives spec_to_json → spec_parse bit for bit. */
static void test_float_roundtrip(void **state)
{
    (void)state;
    run_spec s;
    minimal(&s);
    uint32_t x = 12345;
    for (int i = 0; i < 2000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = (float)ldexp((double)(x >> 8) / (1 << 24), -(int)(x % 40));
        if (!(f > 0)) continue;
        s.train.lr = f;
        s.train.min_lr = f * 0.37f;
        s.train.eps = f;
        s.train.beta1 = fmodf(f * 7.1f, 1.0f);
        s.train.weight_decay = f * 1e10f;
        roundtrip(&s);
    }
    /* uint64 seeds above INT64_MAX travel as a decimal string */
    s.train.seed = UINT64_MAX;
    roundtrip(&s);
    s.device.memory_budget = (size_t)3 << 40;
    roundtrip(&s);
}

static void test_full_spec(void **state)
{
    (void)state;
    const char *json =
        "{\n"
        "  \"name\": \"fortunes-p2r\",\n"
        "  \"data\": {\"train\": \"runs/d/train_*.bin\", \"val\": \"runs/d/val_*.bin\"},\n"
        "  \"model\": {\"vocab_size\": 50257, \"n_layer\": 12, \"n_head\": 6,\n"
        "            \"n_embd\": 384, \"seq_len\": 256},\n"
        "  \"pseudo\": {\"share_groups\": 5, \"steps\": 300},\n"
        "  \"delink\": {\"optimizer\": \"reset\", \"rewarm_steps\": 20},\n"
        "  \"train\": {\"steps\": 900, \"batch_size\": 8, \"grad_accum\": 4,\n"
        "            \"lr\": 6e-4, \"min_lr\": 0, \"warmup_steps\": 0,\n"
        "            \"weight_decay\": 0, \"grad_clip\": 0, \"beta1\": 0,\n"
        "            \"beta2\": 0.999, \"eps\": 1e-6, \"seed\": \"18446744073709551615\",\n"
        "            \"eval_every\": 0, \"eval_batches\": 1},\n"
        "  \"checkpoint\": {\"every\": 50, \"keep\": 1},\n"
        "  \"device\": {\"backend\": \"cuda\", \"threads\": 3, \"memory_budget\": \"1.5GiB\"},\n"
        "  \"offload\": {\"prefetch\": 1, \"host_threads\": 7}\n"
        "}\n";
    run_spec s;
    char err[512];
    if (parse(&s, json, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(s.name, "fortunes-p2r");
    assert_string_equal(s.data.train, "runs/d/train_*.bin");
    assert_string_equal(s.data.val, "runs/d/val_*.bin");
    assert_int_equal(s.model.vocab_size, 50257);
    assert_int_equal(s.model.n_layer, 12);
    assert_int_equal(s.model.n_head, 6);
    assert_int_equal(s.model.n_embd, 384);
    assert_int_equal(s.model.seq_len, 256);
    assert_int_equal(s.pseudo.share_groups, 5);
    assert_int_equal(s.pseudo.steps, 300);
    assert_int_equal(s.delink.optimizer, DELINK_OPT_RESET);
    assert_int_equal(s.delink.rewarm_steps, 20);
    assert_int_equal(s.train.steps, 900);
    assert_int_equal(s.train.batch_size, 8);
    assert_int_equal(s.train.grad_accum, 4);
    assert_true(s.train.lr == 6e-4f);
    assert_true(s.train.min_lr == 0.0f);
    assert_int_equal(s.train.warmup_steps, 0);
    assert_true(s.train.weight_decay == 0.0f && s.train.grad_clip == 0.0f);
    assert_true(s.train.beta1 == 0.0f && s.train.beta2 == 0.999f);
    assert_true(s.train.eps == 1e-6f);
    assert_true(s.train.seed == UINT64_MAX);
    assert_int_equal(s.train.eval_every, 0);
    assert_int_equal(s.train.eval_batches, 1);
    assert_int_equal(s.checkpoint.every, 50);
    assert_int_equal(s.checkpoint.keep, 1);
    assert_int_equal(s.device.backend, BACKEND_CUDA);
    assert_int_equal(s.device.threads, 3);
    assert_int_equal(s.device.memory_budget, (size_t)3 << 29);
    assert_int_equal(s.offload.prefetch, 1);
    assert_int_equal(s.offload.host_threads, 7);
    roundtrip(&s);
}

static void test_memory_budget(void **state)
{
    (void)state;
    static const struct { const char *v; size_t bytes; } ok[] = {
        { "0", 0 },
        { "123456789", 123456789 },
        { "\"4096\"", 4096 },
        { "\"64KiB\"", 64 << 10 },
        { "\"8MiB\"", 8 << 20 },
        { "\"80GiB\"", (size_t)80 << 30 },
        { "\"2 GiB\"", (size_t)2 << 30 },
        { "\"500KB\"", 500000 },
        { "\"3MB\"", 3000000 },
        { "\"141GB\"", 141000000000ULL },
        { "\"0.5MiB\"", 1 << 19 },
        { "\"1.0\"", 1 },
        { "\"0.1KB\"", 100 },
        { "\"12gib\"", (size_t)12 << 30 },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char json[256], err[512];
        snprintf(json, sizeof json, "{\"data\": {\"train\": \"t\", \"val\": \"v\"},"
                 " \"device\": {\"memory_budget\": %s}}", ok[i].v);
        run_spec s;
        if (parse(&s, json, err, sizeof err) != 0) fail_msg("%s: %s", ok[i].v, err);
        if (s.device.memory_budget != ok[i].bytes)
            fail_msg("%s: got %zu, want %zu", ok[i].v, s.device.memory_budget,
                     ok[i].bytes);
    }
}

/* Bad specs: the data globs are supplied unless the case is about them. */
static void test_bad_specs(void **state)
{
    (void)state;
    static const struct { const char *body; const char *want; } bad[] = {
        /* unknown keys, with their full path */
        { "\"nmae\": \"x\"", "unknown key 'nmae'" },
        { "\"train\": {\"lrr\": 0.1}", "unknown key 'train.lrr'" },
        { "\"model\": {\"n_layers\": 2}", "unknown key 'model.n_layers'" },
        /* wrong types */
        { "\"model\": {\"n_layer\": 3.5}", "model.n_layer: must be an integer, got 3.5" },
        { "\"model\": {\"n_layer\": \"6\"}", "model.n_layer: must be an integer, got \"6\"" },
        { "\"train\": {\"lr\": \"fast\"}", "train.lr: must be a number" },
        { "\"train\": {\"steps\": true}", "train.steps: must be an integer" },
        { "\"model\": 3", "model: must be an object" },
        { "\"name\": 7", "name: must be a string" },
        { "\"device\": {\"threads\": null}", "device.threads: must be an integer" },
        /* out of range */
        { "\"train\": {\"steps\": 9223372036854775807}",
          "train.steps: must be in [1, 1000000000], got 9223372036854775807" },
        /* model.moe */
        { "\"model\": {\"moe\": {\"num_experts\": 6, \"prototypes\": 4}}",
          "model.moe.prototypes: must divide model.moe.num_experts (6 % 4 != 0)" },
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"capacity_factor\": -0.5}}",
          "model.moe.capacity_factor: must be >= 0, got -0.5" },
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"eval_capacity_factor\": -1}}",
          "model.moe.eval_capacity_factor: must be >= 0, got -1" },
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"every\": 7}}",
          "model.moe.every: must be in [1, model.n_layer = 6], got 7" },
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"every\": 0}}",
          "model.moe.every: must be >= 1, got 0" },
        /* the expert tensors' rows, E*H and E*C, must fit an int (hand
         * products: 100000 * 100000 = 10^10; 70000 * 40000 = 2.8 * 10^9) */
        { "\"model\": {\"n_embd\": 8, \"n_head\": 1, \"moe\": {\"num_experts\": "
          "100000, \"expert_hidden\": 100000}}",
          "model.moe.num_experts: 100000 experts of model.moe.expert_hidden "
          "100000 rows make 10000000000 rows in one expert tensor, more than "
          "2147483647" },
        { "\"model\": {\"n_embd\": 40000, \"n_head\": 1, \"n_layer\": 1, "
          "\"moe\": {\"num_experts\": 70000, \"expert_hidden\": 1}}",
          "model.moe.num_experts: 70000 experts of model.n_embd 40000 rows "
          "make 2800000000 rows in one expert tensor, more than 2147483647" },
        /* every 2: a mixed model, whose pseudo phase needs a slot of each
         * kind (left out, share_groups is L/2 = 3: test_p2r_defaults) */
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"every\": 2}}, "
          "\"pseudo\": {\"steps\": 10, \"share_groups\": 1}",
          "pseudo.share_groups: model.moe.every = 2 mixes dense and MoE "
          "blocks" },

        { "\"model\": {\"moe\": {\"num_experts\": -1}}",
          "model.moe.num_experts: must be >= 0, got -1" },
        { "\"model\": {\"moe\": {\"prototypes\": 2}}",
          "model.moe.prototypes: set, but model.moe.num_experts is 0" },
        { "\"model\": {\"moe\": {\"num_experts\": 8, \"experts\": 2}}",
          "unknown key 'model.moe.experts'" },
        { "\"model\": {\"moe\": 3}", "model.moe: must be an object" },
        /* delink.policy */
        { "\"delink\": {\"policy\": \"sometimes\"}",
          "delink.policy: must be \"step\" or \"plateau\", got \"sometimes\"" },
        { "\"pseudo\": {\"steps\": 10}, \"delink\": {\"policy\": \"plateau\", \"patience\": 0}",
          "delink.patience: must be >= 1, got 0" },
        { "\"pseudo\": {\"steps\": 10}, \"delink\": {\"policy\": \"plateau\", \"min_delta\": -0.5}",
          "delink.min_delta: must be >= 0, got -0.5" },
        { "\"delink\": {\"policy\": \"plateau\"}",
          "delink.policy: \"plateau\" needs a pseudo phase, but pseudo.steps is 0" },
        { "\"pseudo\": {\"steps\": 10}, \"train\": {\"eval_every\": 0}, \"delink\": {\"policy\": \"plateau\"}",
          "delink.policy: \"plateau\" watches the validation loss, but train.eval_every is 0" },
        { "\"delink\": {\"min_delta\": 0.5}",
          "delink.min_delta: set, but delink.policy is \"step\"" },
        { "\"delink\": {\"patience\": 2}",
          "delink.patience: set, but delink.policy is \"step\"" },
        /* nodes.*: data parallelism */
        { "\"nodes\": {\"world_size\": 0}", "nodes.world_size: must be in [1, 65536], got 0" },
        { "\"nodes\": {\"timeout\": 0}", "nodes.timeout: must be in [1, 86400], got 0" },
        { "\"nodes\": {\"world_size\": 3}",
          "nodes.world_size: 3 must divide train.grad_accum (1) or train.batch_size (16)" },
        { "\"nodes\": {\"world_size\": 2, \"pseudo_world_size\": 3}, \"pseudo\": {\"steps\": 5}",
          "nodes.pseudo_world_size: at most nodes.world_size (2), got 3" },
        { "\"nodes\": {\"world_size\": 2, \"pseudo_world_size\": 1}",
          "nodes.pseudo_world_size: set, but the run has no pseudo phase" },
        { "\"nodes\": {\"world_size\": 6, \"pseudo_world_size\": 4}, \"pseudo\": {\"steps\": 5}, \"train\": {\"batch_size\": 6}",
          "nodes.pseudo_world_size: 4 must divide train.grad_accum (1) or train.batch_size (6)" },
        { "\"nodes\": {\"world_size\": 2}, \"device\": {\"backend\": \"cuda\", \"memory_budget\": 1000000}",
          "nodes.world_size: 2 ranks on device.backend \"cuda\" cannot offload yet" },
        { "\"nodes\": {\"world_sise\": 2}", "unknown key 'nodes.world_sise' (did you mean 'nodes.world_size'?)" },
        { "\"model\": {\"vocab_size\": 65537}", "model.vocab_size: must be in [1, 65536], got 65537" },
        { "\"model\": {\"vocab_size\": 0}", "model.vocab_size: must be in [1, 65536], got 0" },
        { "\"model\": {\"n_layer\": 0}", "model.n_layer: must be >= 1, got 0" },
        { "\"model\": {\"seq_len\": -3}", "model.seq_len: must be >= 1, got -3" },
        { "\"model\": {\"n_embd\": 4294967296}", "model.n_embd: must be in [1, 2147483647], got 4294967296" },
        { "\"train\": {\"lr\": -1}", "train.lr: must be > 0, got -1" },
        { "\"train\": {\"lr\": 0}", "train.lr: must be > 0, got 0" },
        { "\"train\": {\"lr\": 1e-3, \"min_lr\": 1e-2}", "train.min_lr: must be in [0, train.lr" },
        { "\"train\": {\"min_lr\": -0.1}", "train.min_lr: must be >= 0" },
        { "\"train\": {\"beta1\": 1}", "train.beta1: must be in [0, 1), got 1" },
        { "\"train\": {\"beta2\": -0.5}", "train.beta2: must be in [0, 1)" },
        { "\"train\": {\"beta2\": 0.999999999}", "as a 32-bit float" },
        { "\"train\": {\"eps\": 0}", "train.eps: must be > 0" },
        { "\"train\": {\"grad_clip\": -1}", "train.grad_clip: must be >= 0" },
        { "\"train\": {\"weight_decay\": 1e39}", "train.weight_decay: 1e39 is out of range" },
        { "\"train\": {\"eval_batches\": 0}", "train.eval_batches: must be in [1, 1000000], got 0" },
        /* 2e9 batches is days of validation per pass (the tester's spec) */
        { "\"train\": {\"eval_batches\": 2000000000}",
          "train.eval_batches: must be in [1, 1000000], got 2000000000" },
        { "\"train\": {\"eval_batches\": 1000001}",
          "train.eval_batches: must be in [1, 1000000], got 1000001" },
        { "\"train\": {\"batch_size\": 0}", "train.batch_size: must be >= 1" },
        { "\"train\": {\"seed\": -1}", "train.seed: must be an integer in [0, 2^64)" },
        { "\"train\": {\"seed\": \"99999999999999999999\"}", "train.seed" },
        { "\"checkpoint\": {\"keep\": 0}", "checkpoint.keep: must be >= 1, got 0" },
        { "\"device\": {\"threads\": 100000}", "device.threads: must be in [0, 1024], got 100000" },
        { "\"offload\": {\"host_threads\": 257}", "offload.host_threads: must be in [0, 256], got 257" },
        { "\"offload\": {\"prefetch\": 65}", "offload.prefetch: must be in [1, 64], got 65" },
        { "\"offload\": {\"prefetch\": 0}", "offload.prefetch: must be in [1, 64], got 0" },
        { "\"device\": {\"threads\": -1}", "device.threads: must be in [0, 1024], got -1" },
        { "\"pseudo\": {\"share_groups\": 7}", "pseudo.share_groups: must be in [1, model.n_layer = 6], got 7" },
        { "\"pseudo\": {\"share_groups\": 0}", "pseudo.share_groups: must be >= 1" },
        { "\"pseudo\": {\"steps\": 1001}", "pseudo.steps: must be in [0, train.steps = 1000], got 1001" },
        { "\"pseudo\": {\"steps\": -1}", "pseudo.steps: must be >= 0" },
        /* heads must divide the width */
        { "\"model\": {\"n_embd\": 384, \"n_head\": 5}",
          "model.n_embd: must be divisible by model.n_head (384 % 5 != 0)" },
        /* shapes beyond the int GEMM dims / 1 PiB (defaults: B 16, T 128,
         * C 128, V 256; GPT-2's 12C^2+13C per layer: 4.26e14 parameters) */
        { "\"model\": {\"seq_len\": 2147483647}",
          "train.batch_size * model.seq_len: 34359738352 tokens per microbatch, at most 2147483647" },
        { "\"model\": {\"n_layer\": 2147483647}",
          "PiB (4.26e+14 parameters with gradients and AdamW moments, and the activations of a batch of 16 x 128 tokens)" },
        /* enums */
        { "\"delink\": {\"optimizer\": \"keep\"}",
          "delink.optimizer: must be \"copy\" or \"reset\", got \"keep\"" },
        { "\"device\": {\"backend\": \"tpu\"}", "device.backend: must be \"cpu\" or \"cuda\", got \"tpu\"" },
        /* memory budget */
        { "\"device\": {\"memory_budget\": \"12XB\"}", "device.memory_budget: bad size \"12XB\"" },
        { "\"device\": {\"memory_budget\": \"1PiB\"}", "bad size \"1PiB\" (want bytes, or a number with a suffix: B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)" },
        { "\"device\": {\"memory_budget\": \"GiB\"}", "device.memory_budget: bad size" },
        { "\"device\": {\"memory_budget\": \"1.GiB\"}", "device.memory_budget: bad size" },
        { "\"device\": {\"memory_budget\": \"1.5\"}", "device.memory_budget: bad size \"1.5\"" },
        { "\"device\": {\"memory_budget\": \"2.25B\"}", "device.memory_budget: bad size \"2.25B\"" },
        { "\"device\": {\"memory_budget\": -5}", "device.memory_budget: must be >= 0" },
        { "\"device\": {\"memory_budget\": 1.5}", "device.memory_budget: must be bytes" },
        { "\"device\": {\"memory_budget\": \"99999999999TiB\"}", "too large" },
        /* names are safe in paths */
        { "\"name\": \"../etc\"", "name: must be letters" },
        { "\"name\": \"\"", "name: must be letters" },
        { "\"name\": \"42\"", "not all digits" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"data\": {\"train\": \"t_*.bin\", \"val\": \"v_*.bin\"}, %s}",
                 bad[i].body);
        refused_(json, bad[i].want, 0);
    }

    /* cases that are not one added key */
    static const struct { const char *json; const char *want; } whole[] = {
        { "{\"data\": {\"val\": \"v\"}}", "data.train: required" },
        { "{\"data\": {\"train\": \"\", \"val\": \"v\"}}", "data.train: required" },
        { "{\"data\": {\"train\": \"t\"}}", "data.val: required" },
        { "{\"data\": {\"train\": \"t\", \"val\": \"v\",\n\n \"x\" 1}}", "line 3" },
        { "{\"data\": {\"train\": \"t\", \"val\": \"v\"},\n \"train\": {\"lr\": 1e-3,\n\"lr\": 2e-3}}",
          "duplicate" },
        { "[1, 2]", "must be a JSON object" },
        { "", "JSON syntax error at line" },
        { "{\"data\": {\"train\": \"t\", \"val\": \"v\"}} trailing", "JSON syntax error" },
        /* a UTF-8 byte order mark, named as such */
        { "\xef\xbb\xbf{\"data\": {\"train\": \"t\", \"val\": \"v\"}}",
          "line 1, column 1: the spec starts with a UTF-8 byte order mark (bytes EF BB BF)" },
        /* an integer past 64 bits: the key whose value it is, after
         * strings holding brackets and an escaped quote, and a closed
         * section before it */
        { "{\"data\": {\"train\": \"t{[\\\"\", \"val\": \"v]}\"},\n"
          "\"train\": {\"lr\": 1e-3, \"steps\": 99999999999999999999}}",
          "line 2, column 51: too big integer near '99999999999999999999' (the "
          "value of train.steps: an integer must fit in 64 bits)" },
        { "{\"model\": {\"n_layer\": -99999999999999999999}}",
          "too big negative integer (the value of model.n_layer: " },
        /* \u0000 named as the input's, not by jansson's flag */
        { "{\"name\": \"a\\u0000b\"}",
          "column 19: \\u0000 (a NUL character) is not allowed in a spec's "
          "strings" },
    };
    for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++)
        refused_(whole[i].json, whole[i].want, 0);

    /* a glob too long for the struct */
    char *json = malloc(4096);
    char glob[SPEC_STR + 1];
    memset(glob, 'a', SPEC_STR);
    glob[SPEC_STR] = '\0';
    snprintf(json, 4096, "{\"data\": {\"train\": \"%s\", \"val\": \"v\"}}", glob);
    char err[512];
    run_spec s;
    assert_int_equal(parse(&s, json, err, sizeof err), -1);
    assert_contains(err, "data.train: too long (1024 bytes, at most 1023)");
    free(json);
}

/* An unknown key names the nearest known one: a spelling slip (distance at
 * most a third of the key's length), the same key in another section, a
 * section name, or a synonym from other trainers; nothing when no key is
 * near. The expected messages are written out by hand. */
static void test_unknown_key_suggestion(void **state)
{
    (void)state;
    static const struct { const char *body; const char *want; } cases[] = {
        /* synonyms, which no distance reaches */
        { "\"train\": {\"learning_rate\": 0.1}",
          "unknown key 'train.learning_rate' (did you mean 'train.lr'?)" },
        { "\"model\": {\"hidden_size\": 64}",
          "unknown key 'model.hidden_size' (did you mean 'model.n_embd'?)" },
        { "\"train\": {\"max_steps\": 10}",
          "unknown key 'train.max_steps' (did you mean 'train.steps'?)" },
        /* a synonym written in the wrong section still finds its key */
        { "\"model\": {\"learning_rate\": 0.1}",
          "unknown key 'model.learning_rate' (did you mean 'train.lr'?)" },
        /* spelling: one edit, a swap of neighbours, case */
        { "\"train\": {\"lrr\": 0.1}",
          "unknown key 'train.lrr' (did you mean 'train.lr'?)" },
        { "\"nmae\": \"x\"", "unknown key 'nmae' (did you mean 'name'?)" },
        { "\"model\": {\"n_layers\": 2}",
          "unknown key 'model.n_layers' (did you mean 'model.n_layer'?)" },
        { "\"train\": {\"wramup_steps\": 5}",
          "unknown key 'train.wramup_steps' (did you mean 'train.warmup_steps'?)" },
        { "\"train\": {\"LR\": 0.1}",
          "unknown key 'train.LR' (did you mean 'train.lr'?)" },
        /* two edits in a key of 8 or more characters */
        { "\"checkpoint\": {\"keep_last\": 2}",
          "unknown key 'checkpoint.keep_last'" },
        { "\"model\": {\"vocabsiz\": 256}",
          "unknown key 'model.vocabsiz' (did you mean 'model.vocab_size'?)" },
        /* the right key in the wrong section, or at the top level */
        { "\"train\": {\"vocab_size\": 256}",
          "unknown key 'train.vocab_size' (did you mean 'model.vocab_size'?)" },
        { "\"lr\": 0.1", "unknown key 'lr' (did you mean 'train.lr'?)" },
        /* a misspelt section */
        { "\"trian\": {\"lr\": 0.1}",
          "unknown key 'trian' (did you mean 'train'?)" },
        { "\"checkpoints\": {\"every\": 10}",
          "unknown key 'checkpoints' (did you mean 'checkpoint'?)" },
        /* nothing near: no suggestion */
        { "\"train\": {\"foo\": 1}", "unknown key 'train.foo'" },
        { "\"train\": {\"momentum\": 0.9}", "unknown key 'train.momentum'" },
        { "\"zzzzzzzz\": 1", "unknown key 'zzzzzzzz'" },
        { "\"model\": {\"x\": 1}", "unknown key 'model.x'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"data\": {\"train\": \"t\", \"val\": \"v\"}, %s}",
                 cases[i].body);
        refused_(json, cases[i].want, 1);
    }
}

static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/m6-test-spec-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\n  \"data\": {\"train\": \"t\", \"val\": \"v\"},\n"
                       "  \"model\": {\"n_layer\": 4,}\n}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    run_spec s;
    char err[512];
    assert_int_equal(spec_load_file(&s, path, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "line 3");

    FILE *f = fopen(path, "w");
    fputs("{\"data\": {\"train\": \"t\", \"val\": \"v\"}, \"model\": {\"n_layer\": 4}}",
          f);
    fclose(f);
    assert_int_equal(spec_load_file(&s, path, err, sizeof err), 0);
    assert_int_equal(s.model.n_layer, 4);

    f = fopen(path, "w");
    fputs("{\"data\": {\"train\": \"t\", \"val\": \"v\"}, \"train\": {\"lrr\": 1}}", f);
    fclose(f);
    assert_int_equal(spec_load_file(&s, path, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "unknown key 'train.lrr'");
    unlink(path);

    assert_int_equal(spec_load_file(&s, path, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "No such file");
}

TEST_MAIN(
    cmocka_unit_test(test_defaults),
    cmocka_unit_test(test_hash),
    cmocka_unit_test(test_hash_dense_pinned),
    cmocka_unit_test(test_device_precision),
    cmocka_unit_test(test_max_bad_steps),
    cmocka_unit_test(test_pseudo_knobs),
    cmocka_unit_test(test_moe),
    cmocka_unit_test(test_delink_policy),
    cmocka_unit_test(test_nodes),
    cmocka_unit_test(test_optimizer_shard),
    cmocka_unit_test(test_expert_parallel),
    cmocka_unit_test(test_offload_speculative),
    cmocka_unit_test(test_float_roundtrip),
    cmocka_unit_test(test_full_spec),
    cmocka_unit_test(test_memory_budget),
    cmocka_unit_test(test_bad_specs),
    cmocka_unit_test(test_p2r_defaults),
    cmocka_unit_test(test_load_file),
    cmocka_unit_test(test_unknown_key_suggestion))
