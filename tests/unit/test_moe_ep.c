/*
 * test_moe_ep.c — the expert-parallel MoE layer (train/moe_ep.h) against
 * the one-rank layer (kernels.h: moe_route, moe_forward, moe_aux_losses,
 * moe_backward, itself checked against PyTorch by torch_reference).
 *
 * P ranks (processes of this binary over Gloo on loopback, rank_procs.h),
 * each with its own N tokens and the same weights; E = 6 experts in k = 2
 * prototypes, spread by model_expert_range (P = 4: 1, 2, 1, 2 experts).
 * On every rank the reference is the one-rank layer over that rank's
 * tokens with all E experts; the experts' weight gradients of the
 * reference are summed over the ranks (an all-reduce), as the owner sums
 * them over its senders. Checked on every rank: out, dx, the router's
 * gradients and aux/z against its reference; its experts' gradients
 * against the summed ones (to the rounding of GEMMs over differently
 * grouped rows: 1e-5 of the largest value).
 *
 *   even   the router as drawn (capacity drops some pairs), P = 2, 3, 4
 *   skew   the gate's bias sends every token to experts 0 and 3, so at
 *          P = 3 rank 2's experts get no row: their gradients must be
 *          exactly zero, and rank 2 still enters every all-to-all
 *
 * Exit 77 when m6 was built without Gloo.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model/facts.h"
#include "train/moe_ep.h"
#include "../common/rank_procs.h"

enum { N = 40, C = 16, E = 6, K = 2, H = 24 };
#define TOL 1e-5

static uint64_t rng_;
static float uniform_(void)  /* [-0.3, 0.3) */
{
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return (float)((double)(rng_ >> 11) / 9007199254740992.0 * 0.6 - 0.3);
}

/* every buffer of a rank, freed at its end */
static void *held_[96];
static int n_held_;

static void *zeroed_(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p || n_held_ == (int)(sizeof held_ / sizeof held_[0])) {
        fprintf(stderr, "out of memory (or of held_ slots)\n");
        exit(1);
    }
    return held_[n_held_++] = p;
}

static void free_held_(void)
{
    while (n_held_ > 0)
        free(held_[--n_held_]);
}

static float *fill_(size_t n, uint64_t seed)
{
    float *p = zeroed_(n, sizeof *p);
    rng_ = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        p[i] = uniform_();
    return p;
}

/* max |a - b| over n, against TOL times the largest |b| (at least 1e-3) */
static int close_(const char *what, int rank, const float *a, const float *b,
                  size_t n)
{
    double worst = 0, big = 1e-3;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs((double)b[i]));
    }
    if (worst <= TOL * big)
        return 1;
    fprintf(stderr, "FAIL: rank %d: %s differs by %.3g (largest %.3g)\n",
            rank, what, worst, big);
    return 0;
}

static int rank_main_(int argc, char **argv)
{
    (void)argc;
    int world = atoi(argv[4]), rank = atoi(argv[5]);
    const char *store_dir = argv[6], *scenario = argv[7];
    int skew = strcmp(scenario, "skew") == 0;
    m6_store st;
    file_store fs;
    m6_coll *g = rank_procs_group(store_dir, "ep", rank, world, 20000, &st,
                                  &fs);
    if (!g)
        return 1;
    moe_dims d = {N, C, E, K, H, moe_capacity(1.0, N, E, K), 0};
    /* the same weights on every rank, each rank's own tokens */
    float *wg = fill_((size_t)E * C, 1), *bg = fill_(E, 2);
    float *w1 = fill_((size_t)E * H * C, 3), *b1 = fill_((size_t)E * H, 4);
    float *w2 = fill_((size_t)E * C * H, 5), *b2 = fill_((size_t)E * C, 6);
    float *x = fill_((size_t)N * C, 100 + rank);
    float *dout = fill_((size_t)N * C, 200 + rank);
    if (skew) {
        bg[0] += 20.0f;  /* prototype 0 (experts 0-2): expert 0 */
        bg[3] += 20.0f;  /* prototype 1 (experts 3-5): expert 3 */
    }
    const float daux = 0.01f, dz = 0.001f;
    int ok = 1;

    /* the reference: the one-rank layer over this rank's tokens */
    size_t Nk = (size_t)N * K;
    float *probs = zeroed_((size_t)N * E, 4), *lse = zeroed_(Nk, 4);
    int32_t *expert = zeroed_(Nk, 4), *slot = zeroed_(Nk, 4),
            *counts = zeroed_(E, 4), *routed = zeroed_(E, 4),
            *offset = zeroed_(E + 1, 4), *row_token = zeroed_(Nk, 4);
    float *xe = zeroed_(Nk * C, 4), *hpre = zeroed_(Nk * H, 4),
          *hact = zeroed_(Nk * H, 4), *ye = zeroed_(Nk * C, 4),
          *dye = zeroed_(Nk * C, 4), *dh1 = zeroed_(Nk * H, 4),
          *dh2 = zeroed_(Nk * H, 4), *dxe = zeroed_(Nk * C, 4),
          *dlogits = zeroed_((size_t)N * E, 4);
    float *out_r = zeroed_((size_t)N * C, 4), *dx_r = zeroed_((size_t)N * C, 4),
          *dwg_r = zeroed_((size_t)E * C, 4), *dbg_r = zeroed_(E, 4),
          *dw1_r = zeroed_((size_t)E * H * C, 4), *db1_r = zeroed_((size_t)E * H, 4),
          *dw2_r = zeroed_((size_t)E * C * H, 4), *db2_r = zeroed_((size_t)E * C, 4);
    int drop_r = moe_route(probs, lse, expert, slot, counts, routed, offset,
                           row_token, x, wg, bg, &d);
    float aux_r, z_r;
    moe_forward(out_r, xe, hpre, hact, ye, x, probs, expert, slot, offset,
                row_token, w1, b1, w2, b2, &d);
    moe_aux_losses(&aux_r, &z_r, probs, lse, routed, &d);
    moe_backward(dx_r, dwg_r, dbg_r, dw1_r, db1_r, dw2_r, db2_r, dye, dh1,
                 dh2, dxe, dlogits, dout, x, probs, lse, expert, slot, routed,
                 offset, xe, hpre, hact, ye, wg, w1, w2, daux, dz, &d);
    /* the experts' gradients summed over the ranks' tokens */
    m6_err err = M6_ERR_NONE;
    float *sums[4] = {dw1_r, db1_r, dw2_r, db2_r};
    size_t per[4] = {(size_t)H * C, H, (size_t)C * H, C};
    for (int i = 0; i < 4; i++)
        if (m6_coll_allreduce_sum(g, sums[i], per[i] * E, &err) != 0) {
            fprintf(stderr, "rank %d: all-reduce: %s\n", rank,
                    m6_err_msg(&err));
            return 1;
        }

    /* expert parallel: this rank's experts only */
    moe_ep *m = moe_ep_create(&d, g, &err);
    if (!m) {
        fprintf(stderr, "rank %d: moe_ep_create: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    int first, El = moe_ep_local_experts(m, &first), want_first;
    ok &= El == model_expert_range(E, world, rank, &want_first) &&
          first == want_first;
    const float *lw[4] = {w1, b1, w2, b2};
    float *dl[4];
    for (int i = 0; i < 4; i++)
        dl[i] = zeroed_(per[i] * (El ? El : 1), 4);
    float *out = zeroed_((size_t)N * C, 4), *dx = zeroed_((size_t)N * C, 4),
          *dwg = zeroed_((size_t)E * C, 4), *dbg = zeroed_(E, 4);
    float aux, z;
    int drop;
    if (moe_ep_forward(m, out, &aux, &z, &drop, x, wg, bg,
                       lw[0] + per[0] * first, lw[1] + per[1] * first,
                       lw[2] + per[2] * first, lw[3] + per[3] * first,
                       &err) != 0 ||
        moe_ep_backward(m, dx, dwg, dbg, dl[0], dl[1], dl[2], dl[3], dout, x,
                        wg, lw[0] + per[0] * first, lw[2] + per[2] * first,
                        daux, dz, &err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    /* bytes sent, against the reference's routing: the rows this rank
     * routed to experts held elsewhere leave twice (inputs forward, output
     * gradients backward), and the rows the other ranks routed to this
     * rank's experts go back twice (outputs, input gradients), plus one
     * int32 count for each expert held elsewhere; 3 + 2 all-to-alls */
    moe_ep_stats es;
    moe_ep_get_stats(m, &es);
    float *all = zeroed_(E, 4);
    for (int e = 0; e < E; e++)
        all[e] = (float)counts[e];
    if (m6_coll_allreduce_sum(g, all, E, &err) != 0) {
        fprintf(stderr, "rank %d: all-reduce: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    uint64_t away = 0, back = 0;
    for (int e = 0; e < E; e++)
        if (e < first || e >= first + El)
            away += (uint64_t)counts[e];
        else
            back += (uint64_t)all[e] - (uint64_t)counts[e];
    uint64_t want_bytes = 2 * (away + back) * C * sizeof(float) +
                          (uint64_t)(E - El) * sizeof(int32_t);
    if (es.bytes_sent != want_bytes || es.calls != 5 || !(es.seconds >= 0)) {
        fprintf(stderr, "FAIL: rank %d: all-to-all stats %llu bytes in %llu "
                "calls, want %llu bytes (%llu rows away, %llu back) in 5\n",
                rank, (unsigned long long)es.bytes_sent,
                (unsigned long long)es.calls, (unsigned long long)want_bytes,
                (unsigned long long)away, (unsigned long long)back);
        ok = 0;
    }
    if (drop != drop_r || aux != aux_r || z != z_r) {
        fprintf(stderr, "FAIL: rank %d: dropped %d aux %.9g z %.9g, the one-"
                "rank layer %d %.9g %.9g\n", rank, drop, (double)aux,
                (double)z, drop_r, (double)aux_r, (double)z_r);
        ok = 0;
    }
    ok &= close_("out", rank, out, out_r, (size_t)N * C);
    ok &= close_("dx", rank, dx, dx_r, (size_t)N * C);
    ok &= close_("dwg", rank, dwg, dwg_r, (size_t)E * C);
    ok &= close_("dbg", rank, dbg, dbg_r, E);
    const char *names[4] = {"dw1", "db1", "dw2", "db2"};
    for (int i = 0; i < 4; i++)
        ok &= close_(names[i], rank, dl[i], sums[i] + per[i] * first,
                     per[i] * El);
    if (skew && world == 3 && rank == 2) {
        /* no token reached experts 4 and 5: exactly zero, here and in
         * the reference */
        for (int i = 0; i < 4; i++)
            for (size_t j = 0; j < per[i] * El; j++)
                if (dl[i][j] != 0.0f || sums[i][per[i] * first + j] != 0.0f) {
                    fprintf(stderr, "FAIL: rank 2: %s[%zu] = %g with no "
                            "token routed (reference %g)\n", names[i], j,
                            (double)dl[i][j],
                            (double)sums[i][per[i] * first + j]);
                    ok = 0;
                    break;
                }
    }
    printf("rank %d of %d %s: experts %d..%d, %d pairs dropped, %s\n", rank,
           world, scenario, first, first + El - 1, drop,
           ok ? "the one-rank layer's results" : "DIFFERS");
    moe_ep_free(m);
    m6_coll_destroy(g);
    m6_err_free(&err);
    free_held_();
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int rc = rank_procs_enter(argc, argv, 8, rank_main_, "moe-ep", 0);
    if (rc != RANK_PROCS_PARENT)
        return rc;
    const char *even[1] = {"even"}, *skew[1] = {"skew"};
    for (int P = 2; P <= 4; P++) {
        char tag[32];
        snprintf(tag, sizeof tag, "even%d", P);
        rank_procs_run(tag, "none", P, even, 1, 120, -1);
    }
    rank_procs_run("skew3", "none", 3, skew, 1, 120, -1);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rank_dir_);
    if (failures_ == 0 && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", rank_dir_);
    return failures_ ? 1 : 0;
}
