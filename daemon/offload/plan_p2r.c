/*
 * plan_p2r.c — the Pseudo-to-Real cost model (plan_p2r.h has the formulas
 * and docs/DESIGN.md "Pseudo-to-Real cost model" their sources): step
 * times of both phases from the planner's placement, the wall-clock ratio
 * to a target loss, bench/p2r_sweep's CSV, and the printed forms.
 */
#include "offload/plan_p2r.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/facts.h"
#include "model/gpt.h"
#include "offload/intervals.h"

/* ------------------------------------------------------------ rates */

void p2r_rates_default(p2r_rates *r)
{
    *r = (p2r_rates){
        .gpu_flops = P2R_H200_BF16_TFLOPS * 1e12 * P2R_DEFAULT_MFU,
        .h2d_bytes_per_s = P2R_PCIE5_X16_GBPS * 1e9,
        .d2h_bytes_per_s = P2R_PCIE5_X16_GBPS * 1e9,
        .host_adam_bytes_per_s = P2R_HOST_ADAM_GBPS * 1e9,
        .nvlink_bytes_per_s = P2R_NVLINK4_GBPS * 1e9,
        .net_bytes_per_s = P2R_NDR400_GBPS * 1e9,
        .alltoall_latency_s = P2R_ALLTOALL_LATENCY_US * 1e-6,
        .nvlink_src = "default: NVLink 4 of an H200 SXM, one direction "
                      "(datasheet: 900 GB/s both ways)",
        .net_src = "default: one 400 Gb/s InfiniBand NDR port a GPU "
                   "(ConnectX-7, as in DGX H100/H200)",
        .latency_src = "default: an assumption; bench/moe_ep measures "
                       "this machine's",
        .gpu_src = "default: H200 SXM dense BF16 peak 990 TFLOP/s "
                   "(NVIDIA H200 datasheet) x MFU 0.4",
        .h2d_src = "default: PCIe 5.0 x16 link rate, one direction (32 GT/s "
                   "x 16 lanes x 128/130 / 8); achieved copies are lower, "
                   "measure with bench/gpu_offload",
        .d2h_src = "default: as host->device (PCIe 5.0 x16, full duplex)",
        .adam_src = "default: bench/offload_host 2026-11-30 (bench/"
                    "RESULTS.md, --params 256, 2 threads): direct from "
                    "bf16, low end of 24 to 27 GB/s",
    };
}

/* ------------------------------------------------------------ a step */

void p2r_phase_time(p2r_phase *ph, const p2r_rates *r)
{
    ph->t_compute = ph->flops / r->gpu_flops;
    ph->t_h2d = ph->h2d_bytes / r->h2d_bytes_per_s;
    ph->t_d2h = ph->d2h_bytes / r->d2h_bytes_per_s;
    ph->t_copy = ph->t_h2d > ph->t_d2h ? ph->t_h2d : ph->t_d2h;
    ph->t_adam = ph->adam_bytes / r->host_adam_bytes_per_s;
    /* the all-to-alls block the compute stream, not the copy streams or
     * the host threads */
    ph->t_alltoall = ph->ep_size > 1
                         ? model_ep_alltoall_seconds(
                               ph->alltoall_bytes, ph->alltoall_calls,
                               ph->ep_size, ph->ep_per_node,
                               r->nvlink_bytes_per_s, r->net_bytes_per_s,
                               r->alltoall_latency_s)
                         : 0;
    double device = ph->t_compute + ph->t_alltoall;
    double busy = device > ph->t_copy ? device : ph->t_copy;
    /* overlapped: the host update runs beside the whole step; else it
     * waits for the global norm and hides only behind the next forward's
     * layers on resident slots (a prefix: offloaded slots are a suffix) */
    double cap = ph->adam_overlaps
                     ? busy
                     : ph->t_compute / 3.0 *
                           (ph->n_layer > 0
                                ? (double)ph->resident_layers / ph->n_layer
                                : 0);
    ph->t_adam_exposed = ph->t_adam > cap ? ph->t_adam - cap : 0;
    ph->t_adam_hidden = ph->t_adam - ph->t_adam_exposed;
    ph->t_step = busy + ph->t_adam_exposed;
}

/* Bytes moved in one optimizer step of A microbatches (offload.h's
 * rule, the intervals the scheduler runs): W[s] bytes of slot s's
 * weights as they travel; cpu: a non-first backward interval fetches the
 * partial gradient too. drains[s]: gradient drains of slot s per step. */
static int traffic_(const int *slot_of, int L, int S,
                    const unsigned char *offloaded, long A, const double *W,
                    int cpu, double *h2d, double *d2h, double *drains)
{
    offload_interval *iv = malloc(2 * (size_t)L * sizeof *iv);
    int *at = malloc(2 * (size_t)L * sizeof(int));
    unsigned char *touched = calloc((size_t)S, 1);
    if (!iv || !at || !touched) {
        free(iv);
        free(at);
        free(touched);
        return -1;
    }
    *h2d = *d2h = 0;
    for (int s = 0; s < S; s++)
        drains[s] = 0;
    /* the first microbatch, the A - 2 between (each like the second), the
     * last: as plan.c counts */
    const double reps[3] = {1, A > 2 ? (double)(A - 2) : 0, A > 1 ? 1 : 0};
    for (int k = 0; k < 3; k++) {
        if (!reps[k])
            continue;
        int n = offload_cut_pass(slot_of, L, offloaded, 1, k == 2 || A == 1,
                                 touched, iv, at);
        for (int j = 0; j < n; j++) {
            int s = iv[j].slot;
            double up = W[s], down = 0;
            if (iv[j].has_bwd) {
                down = W[s];
                drains[s] += reps[k];
                if (iv[j].grad_from_host && cpu)
                    up += W[s];
            }
            *h2d += up * reps[k];
            *d2h += down * reps[k];
        }
    }
    free(iv);
    free(at);
    free(touched);
    return 0;
}

/* The phase's share map and slot kinds (map[L], kind[S] malloc'd). */
static int map_of_(const model_config *c, int S, int **map,
                   unsigned char **kind, char *err, size_t errlen)
{
    int L = c->n_layer;
    *map = malloc((size_t)L * sizeof(int));
    *kind = calloc((size_t)S, 1);
    if (!*map || !*kind) {
        snprintf(err, errlen, "p2r plan: out of memory");
        goto fail;
    }
    if (gpt_default_share_map(c, S, *map) != 0) {
        snprintf(err, errlen, "p2r plan: no share map of %d slots for %d "
                 "layers", S, L);
        goto fail;
    }
    if (c->moe_experts > 0 &&
        gpt_slot_kinds(c, S, *map, *kind, err, errlen) != 0)
        goto fail;
    return 0;
fail:
    free(*map);
    free(*kind);
    *map = NULL;
    *kind = NULL;
    return -1;
}

/* The fields of ph both planners fill alike, from per-slot parameter
 * counts P[s] and the placement. */
static int fill_common_(const run_spec *spec, int S, int R, const int *map,
                        const double *P, int cpu, p2r_phase *ph, char *err,
                        size_t errlen)
{
    const model_config *c = &spec->model;
    int L = c->n_layer;
    unsigned char *off = calloc((size_t)S, 1);
    double *W = malloc((size_t)S * sizeof *W);
    double *dr = malloc((size_t)S * sizeof *dr);
    if (!off || !W || !dr) {
        free(off);
        free(W);
        free(dr);
        snprintf(err, errlen, "p2r plan: out of memory");
        return -1;
    }
    model_param_bytes pb = model_param_bytes_of(!cpu);
    for (int s = 0; s < S; s++) {
        off[s] = s >= R;
        W[s] = P[s] * pb.moved;  /* fp32 on cpu, bf16 on cuda */
    }
    ph->n_layer = L;
    ph->n_slots = S;
    ph->n_resident = R;
    ph->n_offloaded = S - R;
    ph->resident_layers = 0;
    for (int l = 0; l < L; l++)
        ph->resident_layers += !off[map[l]];
    int rc = traffic_(map, L, S, off, spec->train.grad_accum, W, cpu,
                      &ph->h2d_bytes, &ph->d2h_bytes, dr);
    ph->offloaded_params = ph->adam_bytes = 0;
    for (int s = R; s < S && rc == 0; s++) {
        int per = dr[s] > 1 ? pb.adam_accum : pb.adam_direct;
        ph->offloaded_params += P[s];
        ph->adam_bytes += P[s] * per;
    }
    /* no clipping: a slot's update starts when its gradient is final;
     * clipping: only the speculative update overlaps (auto counted as on:
     * the run decides at its start, from its host memory) */
    ph->adam_overlaps = spec->train.grad_clip <= 0 ||
                        spec->offload.speculative != SPEC_SPECULATIVE_OFF;
    ph->active_params = model_active_params(c);
    ph->flops_per_token = model_flops_per_token(c);
    free(off);
    free(W);
    free(dr);
    if (rc != 0)
        snprintf(err, errlen, "p2r plan: out of memory");
    return rc;
}

int p2r_phase_of_plan(const run_spec *spec, const offload_plan *p, int pseudo,
                      p2r_phase *out, char *err, size_t errlen)
{
    const model_config *c = &spec->model;
    memset(out, 0, sizeof *out);
    int S = p->n_slots, *map;
    unsigned char *kind;
    if (map_of_(c, S, &map, &kind, err, errlen) != 0)
        return -1;
    size_t ng, ss, ds = 0;
    gpt_layout_sizes(c, &ng, &ss);
    if (gpt_model_mixed(c)) {
        gpt_tensor tab[SLOT_NTENSORS_MAX];
        gpt_slot_layout(c, 0, tab, &ds);
    }
    double *P = malloc((size_t)S * sizeof *P);
    if (!P) {
        free(map);
        free(kind);
        snprintf(err, errlen, "p2r plan: out of memory");
        return -1;
    }
    /* a mixed model's dense slots at their own size (as plan.c) */
    for (int s = 0; s < S; s++)
        P[s] = (double)(gpt_model_mixed(c) && !kind[s] ? ds : ss);
    int rc = fill_common_(spec, S, p->n_resident, map, P,
                          p->backend == BACKEND_CPU, out, err, errlen);
    /* the planner's own figures, which these equal (test_p2r checks) */
    out->h2d_bytes = (double)p->h2d_bytes_per_step;
    out->d2h_bytes = (double)p->d2h_bytes_per_step;
    int world = spec_world_of_phase(spec, pseudo), B = spec->train.batch_size;
    int A = spec->train.grad_accum;
    if (world > 1 && spec_dp_split(spec, world, &B, &A) != 0)
        B = spec->train.batch_size, A = spec->train.grad_accum;
    out->devices = world > 1 ? world : 1;
    out->tokens = (double)B * c->seq_len * A;
    out->flops = out->flops_per_token * out->tokens;
    free(P);
    free(map);
    free(kind);
    return rc;
}

int p2r_phase_of_cluster(const run_spec *spec, const cluster_input *in,
                         const cluster_phase *cp, p2r_phase *out, char *err,
                         size_t errlen)
{
    const model_config *c = &spec->model;
    memset(out, 0, sizeof *out);
    if (cp->fit == CLUSTER_NO_FIT) {
        snprintf(err, errlen, "the %d-slot phase does not fit %d devices "
                 "(short of %llu bytes of %s): no step time", cp->n_slots,
                 cp->devices, (unsigned long long)cp->shortfall_bytes,
                 cp->short_of_host ? "host memory per node"
                                   : "memory per device");
        return -1;
    }
    int S = cp->n_slots, *map;
    unsigned char *kind;
    if (map_of_(c, S, &map, &kind, err, errlen) != 0)
        return -1;
    double *P = malloc((size_t)S * sizeof *P);
    int rc = -1;
    if (P) {
        for (int s = 0; s < S; s++)
            P[s] = (double)cp->slot_params[kind[s]];
        rc = fill_common_(spec, S, cp->n_resident, map, P, 0, out, err,
                          errlen);
    } else {
        snprintf(err, errlen, "p2r plan: out of memory");
    }
    out->devices = in->nodes * in->gpus_per_node;
    out->tokens = (double)spec->train.batch_size * c->seq_len *
                  spec->train.grad_accum;
    if (c->moe_experts > 0 && cp->devices > 1) { /* experts on every device */
        out->ep_size = cp->devices;
        out->ep_per_node = in->gpus_per_node;
        out->alltoall_bytes = cp->alltoall_bytes;
        out->alltoall_calls = (double)cp->n_moe_layers *
                              spec->train.grad_accum * MODEL_EP_ALLTOALLS;
    }
    out->flops = out->flops_per_token * out->tokens;
    free(P);
    free(map);
    free(kind);
    return rc;
}

/* ------------------------------------------------------------ wall-clock */

double p2r_break_even(double t_pseudo, double t_real, double P, double N_s)
{
    /* wall_p2r(R) is continuous and increasing, P t_pseudo at R = P/N_s:
     * the crossing is before the delink when that is already past
     * scratch's wall-clock */
    if (P * t_pseudo >= N_s * t_real)
        return t_real / t_pseudo;
    return 1 + P / N_s * (1 - t_pseudo / t_real);
}

int p2r_wall_fill(p2r_wall *w, double t_pseudo, double t_real, char *err,
                  size_t errlen)
{
    if (!(t_pseudo > 0) || !(t_real > 0) || !(w->pseudo_steps > 0) ||
        !(w->scratch_steps > 0) || !(w->never || w->steps_ratio >= 0)) {
        snprintf(err, errlen, "p2r plan: want positive step times, pseudo "
                 "steps and scratch steps and a steps ratio >= 0 (got "
                 "t_pseudo %g s, t_real %g s, P %g, N_s %g, R %g)", t_pseudo,
                 t_real, w->pseudo_steps, w->scratch_steps, w->steps_ratio);
        return -1;
    }
    double P = w->pseudo_steps, Ns = w->scratch_steps;
    w->wall_scratch_s = Ns * t_real;
    w->break_even = p2r_break_even(t_pseudo, t_real, P, Ns);
    if (w->never) {
        w->p2r_steps = w->wall_p2r_s = w->wall_ratio = 0;
        return 0;
    }
    double Np = w->steps_ratio * Ns;
    w->p2r_steps = Np;
    w->wall_p2r_s = Np >= P ? P * t_pseudo + (Np - P) * t_real
                            : Np * t_pseudo;
    w->wall_ratio = w->wall_p2r_s / w->wall_scratch_s;
    return 0;
}

/* ------------------------------------------------------------ the sweep */

enum { F_CORPUS, F_SEED, F_SHARE, F_PFRAC, F_DOPT, F_RFRAC, F_GSCALE,
       F_LRSCALE, F_STEPS, F_STT = 12, F_SRATIO = 14, F_NFIELDS = 18 };
static const char *const field_names_[F_NFIELDS] = {
    "corpus", "seed", "share_groups", "pseudo_frac", "delink_optimizer",
    "rewarm_frac", "grad_scale", "pseudo_lr_scale", "steps", "final_val",
    "scratch_final_val", "final_val_ratio", "steps_to_target",
    "scratch_steps_to_target", "step_ratio", "wall_s", "scratch_wall_s",
    "wall_ratio"};

static int feq_(double a, double b)
{
    return fabs(a - b) <= 5e-6 * fmax(fabs(a), fabs(b)) + 1e-12;
}

static int num_(const char *s, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *s && !*end && errno != ERANGE && isfinite(*v) ? 0 : -1;
}

static int int_(const char *s, long *v)
{
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    return *s && !*end && errno != ERANGE ? 0 : -1;
}

/* Append "item" to a ", "-separated list in buf unless it is there. */
static void add_distinct_(char *buf, size_t len, const char *item)
{
    size_t n = strlen(buf), k = strlen(item);
    for (const char *p = buf; (p = strstr(p, item)); p++)
        if ((p == buf || p[-1] == ' ') && (p[k] == ',' || p[k] == 0))
            return;
    if (n + k + 3 < len)
        snprintf(buf + n, len - n, "%s%s", n ? ", " : "", item);
    else if (n + 5 < len && (n < 3 || strcmp(buf + n - 3, "...") != 0))
        snprintf(buf + n, len - n, ", ...");
}

int p2r_sweep_lookup(const char *path, const p2r_sweep_key *key,
                     p2r_sweep_match *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--sweep %s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL, corpora[512] = "", settings[1024] = "";
    char other[128] = "";
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = -1, seen_setting = 0, any_rows = 0;
    double sum = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (lineno == 1) {
            if (strcmp(line, P2R_SWEEP_HEADER) != 0) {
                snprintf(err, errlen, "--sweep %s:1: not bench/p2r_sweep's "
                         "CSV: want the header \"%s\"", path,
                         P2R_SWEEP_HEADER);
                goto out;
            }
            continue;
        }
        if (n == 0)
            continue;  /* a blank line (the end of the file) */
        char *fld[F_NFIELDS], *p = line;
        int nf = 0;
        for (;;) {
            char *comma = strchr(p, ',');
            if (nf < F_NFIELDS)
                fld[nf] = p;
            nf++;
            if (!comma)
                break;
            *comma = 0;
            p = comma + 1;
        }
        if (nf != F_NFIELDS) {
            snprintf(err, errlen, "--sweep %s:%ld: %d fields, want %d",
                     path, lineno, nf, F_NFIELDS);
            goto out;
        }
        double pf, rf, lrs, sr = 0;
        long seed, share, stt;
        int bad = -1;
        if (!fld[F_CORPUS][0]) bad = F_CORPUS;
        else if (int_(fld[F_SEED], &seed)) bad = F_SEED;
        else if (int_(fld[F_SHARE], &share) || share < 1) bad = F_SHARE;
        else if (num_(fld[F_PFRAC], &pf) || pf < 0 || pf > 1) bad = F_PFRAC;
        else if (strcmp(fld[F_DOPT], "copy") && strcmp(fld[F_DOPT], "reset"))
            bad = F_DOPT;
        else if (num_(fld[F_RFRAC], &rf) || rf < 0 || rf > 1) bad = F_RFRAC;
        else if (strcmp(fld[F_GSCALE], "sum") && strcmp(fld[F_GSCALE], "mean"))
            bad = F_GSCALE;
        else if (num_(fld[F_LRSCALE], &lrs) || lrs <= 0) bad = F_LRSCALE;
        else if (int_(fld[F_STT], &stt) || stt < -1) bad = F_STT;
        else if (strcmp(fld[F_SRATIO], "never") == 0 ? stt != -1
                 : num_(fld[F_SRATIO], &sr) || sr < 0 || stt == -1)
            bad = F_SRATIO;
        if (bad >= 0) {
            snprintf(err, errlen, "--sweep %s:%ld: field %s: bad value "
                     "\"%s\"%s", path, lineno, field_names_[bad], fld[bad],
                     bad == F_SRATIO ? " (a number when steps_to_target >= "
                     "0, \"never\" when it is -1)" : "");
            goto out;
        }
        any_rows = 1;
        add_distinct_(corpora, sizeof corpora, fld[F_CORPUS]);
        if (strcmp(fld[F_CORPUS], key->corpus) != 0)
            continue;
        char set[160];
        snprintf(set, sizeof set, "%s/%s/%s/%s", fld[F_SHARE], fld[F_PFRAC],
                 fld[F_DOPT], fld[F_RFRAC]);
        add_distinct_(settings, sizeof settings, set);
        if (share != key->share_groups || !feq_(pf, key->pseudo_frac) ||
            strcmp(fld[F_DOPT], key->delink_optimizer) != 0 ||
            !feq_(rf, key->rewarm_frac))
            continue;
        if (key->grad_scale && strcmp(fld[F_GSCALE], key->grad_scale) != 0)
            continue;
        if (key->pseudo_lr_scale >= 0 && !feq_(lrs, key->pseudo_lr_scale))
            continue;
        if (!seen_setting) {
            seen_setting = 1;
            snprintf(m->grad_scale, sizeof m->grad_scale, "%s",
                     fld[F_GSCALE]);
            m->pseudo_lr_scale = lrs;
        } else if (strcmp(m->grad_scale, fld[F_GSCALE]) != 0 ||
                   !feq_(m->pseudo_lr_scale, lrs)) {
            snprintf(other, sizeof other, "grad_scale %s, pseudo_lr_scale "
                     "%s", fld[F_GSCALE], fld[F_LRSCALE]);
        }
        m->rows++;
        if (stt == -1)
            m->never++;
        else
            sum += sr;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "--sweep %s: %s", path, strerror(errno));
        goto out;
    }
    if (lineno == 0) {
        snprintf(err, errlen, "--sweep %s: empty file (want bench/"
                 "p2r_sweep's CSV)", path);
        goto out;
    }
    if (!any_rows) {
        snprintf(err, errlen, "--sweep %s: no rows after the header", path);
        goto out;
    }
    if (other[0]) {
        snprintf(err, errlen, "--sweep %s: rows of several pseudo-phase "
                 "settings match (grad_scale %s, pseudo_lr_scale %g and "
                 "%s): choose one with --grad-scale and --pseudo-lr-scale",
                 path, m->grad_scale, m->pseudo_lr_scale, other);
        goto out;
    }
    if (m->rows == 0) {
        char want[160];
        snprintf(want, sizeof want, "share_groups %d, pseudo_frac %g, "
                 "delink_optimizer %s, rewarm_frac %g", key->share_groups,
                 key->pseudo_frac, key->delink_optimizer, key->rewarm_frac);
        if (!settings[0])
            snprintf(err, errlen, "--sweep %s: no rows of corpus \"%s\" "
                     "(--corpus); the file has: %s", path, key->corpus,
                     corpora);
        else
            snprintf(err, errlen, "--sweep %s: no row of corpus \"%s\" "
                     "with the spec's %s%s; the corpus has "
                     "(share_groups/pseudo_frac/delink_optimizer/"
                     "rewarm_frac): %s", path, key->corpus, want,
                     key->grad_scale || key->pseudo_lr_scale >= 0
                         ? " (and the --grad-scale / --pseudo-lr-scale "
                           "given)" : "", settings);
        goto out;
    }
    if (m->rows > m->never)
        m->mean_step_ratio = sum / (m->rows - m->never);
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------ the plan */

static int rates_ok_(const p2r_rates *r, char *err, size_t errlen)
{
    const struct { const char *name; double v; } t[] = {
        {"--gpu-tflops", r->gpu_flops},
        {"--h2d-gbps", r->h2d_bytes_per_s},
        {"--d2h-gbps", r->d2h_bytes_per_s},
        {"--host-adam-gbps", r->host_adam_bytes_per_s},
        {"--nvlink-gbps", r->nvlink_bytes_per_s},
        {"--net-gbps", r->net_bytes_per_s},
    };
    if (!(r->alltoall_latency_s >= 0) || !isfinite(r->alltoall_latency_s)) {
        snprintf(err, errlen, "p2r plan: --alltoall-latency-us: want 0 or "
                 "more, got %g", r->alltoall_latency_s * 1e6);
        return -1;
    }
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!(t[i].v > 0) || !isfinite(t[i].v)) {
            snprintf(err, errlen, "p2r plan: %s: want a rate above 0, got "
                     "%g", t[i].name, t[i].v);
            return -1;
        }
    return 0;
}

int p2r_plan_for_spec(const run_spec *spec, const p2r_options *o,
                      p2r_report *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->rates = o->rates;
    out->backend = spec->device.backend;
    if (rates_ok_(&o->rates, err, errlen) != 0)
        return -1;
    if (spec->pseudo.steps <= 0) {
        snprintf(err, errlen, "plan --p2r: the spec has no pseudo phase "
                 "(pseudo.steps is 0): set pseudo.steps and "
                 "pseudo.share_groups to compare Pseudo-to-Real with "
                 "training from scratch");
        return -1;
    }
    char e2[768];
    if (o->cluster) {
        cluster_plan cp;
        out->cluster = 1;
        out->cin = *o->cluster;
        out->backend = BACKEND_CUDA;  /* the cluster plan's bytes */
        if (cluster_plan_for_spec(spec, o->cluster, &cp, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "%s", e2);
            return -1;
        }
        if (p2r_phase_of_cluster(spec, o->cluster, &cp.pseudo, &out->pseudo,
                                 e2, sizeof e2) != 0) {
            snprintf(err, errlen, "pseudo phase: %s", e2);
            return -1;
        }
        if (p2r_phase_of_cluster(spec, o->cluster, &cp.real, &out->real, e2,
                                 sizeof e2) != 0) {
            snprintf(err, errlen, "real phase: %s", e2);
            return -1;
        }
    } else {
        offload_plan p;
        if (offload_plan_for_spec(spec, o->budget_override, &p, e2,
                                  sizeof e2) != 0) {
            snprintf(err, errlen, "%s", e2);
            return -1;
        }
        out->unbudgeted = p.budget_bytes == 0;
        out->ep_unpriced = spec->model.moe_experts > 0 &&
                                   spec->nodes.expert_parallel > 1
                               ? spec->nodes.expert_parallel
                               : 0;
        int rc = p2r_phase_of_plan(spec, p.pseudo, 1, &out->pseudo, e2,
                                   sizeof e2);
        if (rc == 0)
            rc = p2r_phase_of_plan(spec, &p, 0, &out->real, e2, sizeof e2);
        offload_plan_free(&p);
        if (rc != 0) {
            snprintf(err, errlen, "%s", e2);
            return -1;
        }
    }
    p2r_phase_time(&out->pseudo, &o->rates);
    p2r_phase_time(&out->real, &o->rates);
    out->step_ratio = out->pseudo.t_step / out->real.t_step;
    out->plateau = spec->delink.policy == DELINK_AT_PLATEAU;

    p2r_wall *w = &out->wall;
    w->pseudo_steps = (double)spec->pseudo.steps;
    w->scratch_steps = (double)(o->scratch_steps > 0 ? o->scratch_steps
                                                     : spec->train.steps);
    w->steps_ratio = 1.0;
    out->steps_ratio_src = "default, equal steps";
    if (o->sweep) {
        if (o->steps_ratio >= 0) {
            snprintf(err, errlen, "plan --p2r: --steps-ratio and --sweep "
                     "both give the steps ratio; give one");
            return -1;
        }
        if (!o->corpus || !o->corpus[0]) {
            snprintf(err, errlen, "plan --p2r: --sweep needs --corpus NAME "
                     "(the sweep's corpus column)");
            return -1;
        }
        static const char *const dopt[] = {"copy", "reset"};
        double Ns_spec = (double)spec->train.steps;
        p2r_sweep_key k = {
            .corpus = o->corpus,
            .share_groups = spec->pseudo.share_groups,
            .pseudo_frac = (double)spec->pseudo.steps / Ns_spec,
            .delink_optimizer = dopt[spec->delink.optimizer == DELINK_OPT_RESET],
            .rewarm_frac = (double)spec->delink.rewarm_steps / Ns_spec,
            .grad_scale = o->grad_scale,
            .pseudo_lr_scale = o->pseudo_lr_scale,
        };
        if (p2r_sweep_lookup(o->sweep, &k, &out->sweep, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "%s", e2);
            return -1;
        }
        out->sweep_path = o->sweep;
        out->corpus = o->corpus;
        w->never = out->sweep.never > 0;
        w->steps_ratio = out->sweep.mean_step_ratio;
        out->steps_ratio_src = "the sweep: mean step_ratio over seeds";
    } else if (o->steps_ratio >= 0) {
        w->steps_ratio = o->steps_ratio;
        out->steps_ratio_src = "--steps-ratio";
    }
    if (p2r_wall_fill(w, out->pseudo.t_step, out->real.t_step, e2,
                      sizeof e2) != 0) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ printing */

/* "12.3 ms", "4.56 s", "789 us" */
static const char *secs_(char *buf, size_t len, double s)
{
    if (s == 0)
        snprintf(buf, len, "0");
    else if (s < 1e-3)
        snprintf(buf, len, "%.3g us", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.4g ms", s * 1e3);
    else if (s < 3600 * 10)
        snprintf(buf, len, "%.4g s", s);
    else
        snprintf(buf, len, "%.4g h", s / 3600);
    return buf;
}

static json_t *phase_json_(const p2r_phase *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "n_layer", json_integer(p->n_layer));
    json_object_set_new(o, "n_slots", json_integer(p->n_slots));
    json_object_set_new(o, "n_resident", json_integer(p->n_resident));
    json_object_set_new(o, "n_offloaded", json_integer(p->n_offloaded));
    json_object_set_new(o, "resident_layers",
                        json_integer(p->resident_layers));
    json_object_set_new(o, "devices", json_integer(p->devices));
    json_object_set_new(o, "tokens_per_step", json_real(p->tokens));
    json_object_set_new(o, "active_params", json_real(p->active_params));
    json_object_set_new(o, "flops_per_token", json_real(p->flops_per_token));
    json_object_set_new(o, "flops_per_step", json_real(p->flops));
    json_object_set_new(o, "h2d_bytes_per_step", json_real(p->h2d_bytes));
    json_object_set_new(o, "d2h_bytes_per_step", json_real(p->d2h_bytes));
    json_object_set_new(o, "offloaded_params", json_real(p->offloaded_params));
    json_object_set_new(o, "host_adam_bytes_per_step",
                        json_real(p->adam_bytes));
    json_object_set_new(o, "host_adam_overlaps",
                        json_boolean(p->adam_overlaps));
    json_object_set_new(o, "t_compute_s", json_real(p->t_compute));
    json_object_set_new(o, "t_h2d_s", json_real(p->t_h2d));
    json_object_set_new(o, "t_d2h_s", json_real(p->t_d2h));
    json_object_set_new(o, "t_copy_s", json_real(p->t_copy));
    json_object_set_new(o, "t_host_adam_s", json_real(p->t_adam));
    json_object_set_new(o, "t_host_adam_hidden_s",
                        json_real(p->t_adam_hidden));
    json_object_set_new(o, "t_host_adam_exposed_s",
                        json_real(p->t_adam_exposed));
    json_object_set_new(o, "alltoall_bytes_per_step",
                        json_real(p->alltoall_bytes));
    json_object_set_new(o, "alltoall_calls_per_step",
                        json_real(p->alltoall_calls));
    json_object_set_new(o, "t_alltoall_s", json_real(p->t_alltoall));
    json_object_set_new(o, "t_step_s", json_real(p->t_step));
    return o;
}

static void print_json_(FILE *f, const p2r_report *r)
{
    const p2r_rates *q = &r->rates;
    const p2r_wall *w = &r->wall;
    json_t *o = json_object();
    json_object_set_new(o, "planner", json_string(r->cluster ? "cluster"
                                                             : "single"));
    json_object_set_new(o, "backend", json_string(r->backend == BACKEND_CUDA
                                                      ? "cuda" : "cpu"));
    if (r->cluster) {
        json_object_set_new(o, "nodes", json_integer(r->cin.nodes));
        json_object_set_new(o, "gpus_per_node",
                            json_integer(r->cin.gpus_per_node));
    }
    /* each rate, and where it came from */
    const struct { const char *key, *src_key; double v; const char *src; }
        rates[] = {
        {"gpu_flops", "gpu_flops_source", q->gpu_flops, q->gpu_src},
        {"h2d_bytes_per_s", "h2d_source", q->h2d_bytes_per_s, q->h2d_src},
        {"d2h_bytes_per_s", "d2h_source", q->d2h_bytes_per_s, q->d2h_src},
        {"host_adam_bytes_per_s", "host_adam_source",
         q->host_adam_bytes_per_s, q->adam_src},
        {"nvlink_bytes_per_s", "nvlink_source", q->nvlink_bytes_per_s,
         q->nvlink_src},
        {"net_bytes_per_s", "net_source", q->net_bytes_per_s, q->net_src},
        {"alltoall_latency_s", "alltoall_latency_source",
         q->alltoall_latency_s, q->latency_src}};
    json_t *rt = json_object();
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        json_object_set_new(rt, rates[i].key, json_real(rates[i].v));
        json_object_set_new(rt, rates[i].src_key, json_string(rates[i].src));
    }
    json_object_set_new(o, "rates", rt);
    json_object_set_new(o, "flops_formula",
                        json_string("6 N + 12 L C T per token (PaLM, "
                                    "appendix B)"));
    json_object_set_new(o, "pseudo", phase_json_(&r->pseudo));
    json_object_set_new(o, "real", phase_json_(&r->real));
    json_object_set_new(o, "step_time_ratio", json_real(r->step_ratio));
    json_object_set_new(o, "pseudo_steps", json_real(w->pseudo_steps));
    json_object_set_new(o, "scratch_steps", json_real(w->scratch_steps));
    json_object_set_new(o, "steps_ratio",
                        w->never ? json_null() : json_real(w->steps_ratio));
    json_object_set_new(o, "steps_ratio_source",
                        json_string(r->steps_ratio_src));
    json_object_set_new(o, "reaches_target", json_boolean(!w->never));
    json_object_set_new(o, "p2r_steps",
                        w->never ? json_null() : json_real(w->p2r_steps));
    json_object_set_new(o, "wall_scratch_s", json_real(w->wall_scratch_s));
    json_object_set_new(o, "wall_p2r_s",
                        w->never ? json_null() : json_real(w->wall_p2r_s));
    json_object_set_new(o, "wall_ratio",
                        w->never ? json_null() : json_real(w->wall_ratio));
    json_object_set_new(o, "break_even_steps_ratio",
                        json_real(w->break_even));
    json_object_set_new(o, "delink_policy_plateau", json_boolean(r->plateau));
    if (r->sweep_path) {
        json_t *s = json_object();
        json_object_set_new(s, "file", json_string(r->sweep_path));
        json_object_set_new(s, "corpus", json_string(r->corpus));
        json_object_set_new(s, "rows", json_integer(r->sweep.rows));
        json_object_set_new(s, "never", json_integer(r->sweep.never));
        json_object_set_new(s, "grad_scale", json_string(r->sweep.grad_scale));
        json_object_set_new(s, "pseudo_lr_scale",
                            json_real(r->sweep.pseudo_lr_scale));
        json_object_set_new(o, "sweep", s);
    }
    char *d = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                JSON_REAL_PRECISION(17));
    fprintf(f, "%s\n", d ? d : "{}");
    free(d);
    json_decref(o);
}

/* One row of the two-phase table: label, then pseudo and real. */
static void row_s_(FILE *f, const char *label, double a, double b)
{
    char x[32], y[32];
    fprintf(f, "  %-28s %16s %16s\n", label, secs_(x, sizeof x, a),
            secs_(y, sizeof y, b));
}

static void row_g_(FILE *f, const char *label, double a, double b)
{
    fprintf(f, "  %-28s %16.4g %16.4g\n", label, a, b);
}

void p2r_print(FILE *f, const p2r_report *r, int json)
{
    if (json) {
        print_json_(f, r);
        return;
    }
    const p2r_rates *q = &r->rates;
    const p2r_phase *ps = &r->pseudo, *re = &r->real;
    const p2r_wall *w = &r->wall;
    char a[32], b[32];
    fprintf(f, "Pseudo-to-Real cost model (docs/DESIGN.md \"Pseudo-to-Real "
            "cost model\")\n");
    if (r->cluster)
        fprintf(f, "placement: the plan at scale, %d nodes x %d devices; "
                "per device, the cuda model's bytes\n", r->cin.nodes,
                r->cin.gpus_per_node);
    else
        fprintf(f, "placement: the single-node planner, backend %s%s\n",
                r->backend == BACKEND_CUDA ? "cuda" : "cpu",
                r->backend == BACKEND_CUDA ? ""
                : " (its \"device\" is a budgeted pool of host memory: the "
                  "default rates are an H200 host's, pass this machine's)");
    if (r->unbudgeted)
        fprintf(f, "note: no device.memory_budget and no --device-memory: "
                "both phases are counted resident, so no offloading is "
                "priced and the steps differ only in compute; give "
                "--device-memory SIZE, or --nodes N --gpus-per-node G\n");
    if (r->ep_unpriced)
        fprintf(f, "note: nodes.expert_parallel %d: the experts' all-to-all "
                "is priced at scale only (the single-node planner plans one "
                "device); give --nodes N --gpus-per-node G\n",
                r->ep_unpriced);
    fprintf(f, "rates:\n");
    fprintf(f, "  compute       %9.4g TFLOP/s achieved  (%s)\n",
            q->gpu_flops / 1e12, q->gpu_src);
    fprintf(f, "  host->device  %9.4g GB/s  (%s)\n", q->h2d_bytes_per_s / 1e9,
            q->h2d_src);
    fprintf(f, "  device->host  %9.4g GB/s  (%s)\n", q->d2h_bytes_per_s / 1e9,
            q->d2h_src);
    fprintf(f, "  host AdamW    %9.4g GB/s  (%s)\n",
            q->host_adam_bytes_per_s / 1e9, q->adam_src);
    if (re->ep_size > 1 || ps->ep_size > 1) {
        fprintf(f, "  NVLink        %9.4g GB/s  (%s)\n",
                q->nvlink_bytes_per_s / 1e9, q->nvlink_src);
        fprintf(f, "  network       %9.4g GB/s  (%s)\n",
                q->net_bytes_per_s / 1e9, q->net_src);
        fprintf(f, "  all-to-all    %9.4g us a call  (%s)\n",
                q->alltoall_latency_s * 1e6, q->latency_src);
    }
    fprintf(f, "FLOPs per token = 6 N + 12 L C T (PaLM appendix B), N the "
            "parameters a token passes through\n");
    fprintf(f, "step = max(compute + the experts' all-to-alls, copy) + the "
            "host AdamW not hidden; %s\n",
            re->adam_overlaps
                ? "the host update overlaps the step (no clipping, or "
                  "offload.speculative on/auto: auto counted as on)"
                : "the host update waits for the global norm "
                  "(offload.speculative off) and hides only behind the next "
                  "forward's resident layers");
    fprintf(f, "\n  %-28s %16s %16s\n", "", "pseudo", "real");
    fprintf(f, "  %-28s %16d %16d\n", "slots", ps->n_slots, re->n_slots);
    snprintf(a, sizeof a, "%d / %d", ps->n_resident, ps->n_offloaded);
    snprintf(b, sizeof b, "%d / %d", re->n_resident, re->n_offloaded);
    fprintf(f, "  %-28s %16s %16s\n", "resident / offloaded", a, b);
    fprintf(f, "  %-28s %16d %16d\n", "layers on resident slots",
            ps->resident_layers, re->resident_layers);
    row_g_(f, "tokens per step (device)", ps->tokens, re->tokens);
    row_g_(f, "N, active params per token", ps->active_params,
           re->active_params);
    row_g_(f, "FLOPs per step", ps->flops, re->flops);
    row_g_(f, "host->device bytes per step", ps->h2d_bytes, re->h2d_bytes);
    row_g_(f, "device->host bytes per step", ps->d2h_bytes, re->d2h_bytes);
    row_g_(f, "offloaded params", ps->offloaded_params, re->offloaded_params);
    row_g_(f, "host AdamW bytes per step", ps->adam_bytes, re->adam_bytes);
    if (re->ep_size > 1 || ps->ep_size > 1) {
        row_g_(f, "all-to-all bytes per step", ps->alltoall_bytes,
               re->alltoall_bytes);
        row_g_(f, "all-to-all calls per step", ps->alltoall_calls,
               re->alltoall_calls);
    }
    row_s_(f, "compute", ps->t_compute, re->t_compute);
    row_s_(f, "host->device", ps->t_h2d, re->t_h2d);
    row_s_(f, "device->host", ps->t_d2h, re->t_d2h);
    row_s_(f, "copy = max of the two", ps->t_copy, re->t_copy);
    row_s_(f, "host AdamW", ps->t_adam, re->t_adam);
    row_s_(f, "  of which exposed", ps->t_adam_exposed, re->t_adam_exposed);
    if (re->ep_size > 1 || ps->ep_size > 1)
        row_s_(f, "all-to-all (experts)", ps->t_alltoall, re->t_alltoall);
    row_s_(f, "step", ps->t_step, re->t_step);
    fprintf(f, "\nstep time ratio t_pseudo / t_real = %.4f\n", r->step_ratio);
    fprintf(f, "to the target loss: scratch N_s = %.0f steps, P = %.0f "
            "pseudo steps%s\n", w->scratch_steps, w->pseudo_steps,
            r->plateau ? " (delink.policy plateau: P is pseudo.steps, the "
                         "earliest delink)" : "");
    if (r->sweep_path)
        fprintf(f, "  sweep %s, corpus %s: %d row%s (seeds) of this setting "
                "(grad_scale %s, pseudo_lr_scale %g)\n", r->sweep_path,
                r->corpus, r->sweep.rows, r->sweep.rows == 1 ? "" : "s",
                r->sweep.grad_scale, r->sweep.pseudo_lr_scale);
    fprintf(f, "  wall scratch = N_s t_real = %s\n",
            secs_(a, sizeof a, w->wall_scratch_s));
    if (w->never) {
        fprintf(f, "  Pseudo-to-Real never reached scratch's final loss in "
                "%d of %d seeds of the sweep: no wall-clock ratio (it does "
                "not get there)\n", r->sweep.never, r->sweep.rows);
    } else {
        fprintf(f, "  steps ratio R = N_p / N_s = %.4g (%s): N_p = %.0f\n",
                w->steps_ratio, r->steps_ratio_src, w->p2r_steps);
        fprintf(f, "  wall P2R = P t_pseudo + (N_p - P) t_real = %s\n",
                secs_(b, sizeof b, w->wall_p2r_s));
        fprintf(f, "  predicted wall ratio P2R / scratch = %.4f\n",
                w->wall_ratio);
    }
    fprintf(f, "  break-even steps ratio R* = %.4f: Pseudo-to-Real is "
            "faster to the target when N_p / N_s < R*\n", w->break_even);
}
