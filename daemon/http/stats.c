/*
 * stats.c — the Prometheus figures (stats.h): a table of runs seen since
 * m6d started, each with its latest gauges and, per phase, its counters
 * and step-duration histogram; the daemon's request counters; and the
 * renderer of the text exposition format.
 */
#include "http/stats.h"

#include "common/clock.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Step-duration buckets, seconds (upper bounds; +Inf implied). */
static const double buckets_[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                  1,     2.5,  5,     10,   30,  60,  120};
enum { N_BUCKETS = sizeof buckets_ / sizeof buckets_[0] };

typedef struct {
    int seen;
    uint64_t steps, tokens, h2d_bytes, d2h_bytes;
    uint64_t bucket[N_BUCKETS];   /* observations <= buckets_[i] (not
                                   * cumulative; summed when rendered) */
    double sum;                    /* seconds */
} phase_counters;

typedef struct {
    int64_t id;
    char name[256];
    stats_step_rec last;           /* its name points at .name */
    double val_loss;               /* the latest validation pass's; NAN */
    phase_counters ph[2];
} run_stats;

typedef struct {
    char type[32], status[32];
    uint64_t n;
} request_count;

typedef struct {
    int code;
    uint64_t n;
} http_count;

struct http_stats {
    pthread_mutex_t mu;
    double start_unix, start_mono, peak_flops;
    char node[256];
    run_stats *runs;
    int n_runs, cap_runs;
    request_count *req;
    int n_req, cap_req;
    http_count http[16];
    int n_http;
    /* stats_set_gemm; gemm_library[0] 0: not set */
    char gemm_library[64], gemm_version[64], gemm_isa[64];
    int gemm_bf16_native, gemm_passed[2];  /* [0] fp32, [1] bf16 */
};

http_stats *stats_new(double start_unix, const char *node, double peak_flops)
{
    http_stats *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->start_unix = start_unix;
    s->start_mono = clock_mono_s();
    s->peak_flops = peak_flops;
    snprintf(s->node, sizeof s->node, "%s", node ? node : "");
    return s;
}

void stats_free(http_stats *s)
{
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    free(s->runs);
    free(s->req);
    free(s);
}

/* ---------------------------------------------------------------- updates */

void stats_set_gemm(http_stats *s, const char *library, const char *version,
                    const char *isa, int bf16_native, int fp32_passed,
                    int bf16_passed)
{
    pthread_mutex_lock(&s->mu);
    snprintf(s->gemm_library, sizeof s->gemm_library, "%s", library);
    snprintf(s->gemm_version, sizeof s->gemm_version, "%s", version);
    snprintf(s->gemm_isa, sizeof s->gemm_isa, "%s", isa);
    s->gemm_bf16_native = bf16_native != 0;
    s->gemm_passed[0] = fp32_passed != 0;
    s->gemm_passed[1] = bf16_passed != 0;
    pthread_mutex_unlock(&s->mu);
}

/* With mu held: the run's entry, made if new; NULL when out of memory. */
static run_stats *run_locked_(http_stats *s, int64_t id)
{
    for (int i = 0; i < s->n_runs; i++)
        if (s->runs[i].id == id) return &s->runs[i];
    if (s->n_runs == s->cap_runs) {
        int cap = s->cap_runs ? 2 * s->cap_runs : 8;
        run_stats *n = realloc(s->runs, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        s->runs = n;
        s->cap_runs = cap;
    }
    run_stats *r = &s->runs[s->n_runs++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->val_loss = NAN;
    return r;
}

void stats_step(http_stats *s, const stats_step_rec *rec)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    run_stats *r = run_locked_(s, rec->run_id);
    if (r) {
        snprintf(r->name, sizeof r->name, "%s", rec->name ? rec->name : "");
        r->last = *rec;
        r->last.name = r->name;
        if (!isnan(rec->val_loss)) r->val_loss = rec->val_loss;
        phase_counters *p = &r->ph[rec->phase ? 1 : 0];
        p->seen = 1;
        p->steps++;
        p->tokens += rec->tokens > 0 ? (uint64_t)rec->tokens : 0;
        p->h2d_bytes += rec->h2d_bytes;
        p->d2h_bytes += rec->d2h_bytes;
        double d = rec->step_seconds >= 0 ? rec->step_seconds : 0;
        for (int i = 0; i < N_BUCKETS; i++)
            if (d <= buckets_[i]) {
                p->bucket[i]++;
                break;
            }
        p->sum += d;
    }
    pthread_mutex_unlock(&s->mu);
}

void stats_request(http_stats *s, const char *type, const char *status)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    request_count *c = NULL;
    for (int i = 0; i < s->n_req && !c; i++)
        if (!strncmp(s->req[i].type, type, sizeof c->type - 1) &&
            !strncmp(s->req[i].status, status, sizeof c->status - 1))
            c = &s->req[i];
    if (!c && s->n_req == s->cap_req) {
        int cap = s->cap_req ? 2 * s->cap_req : 16;
        request_count *n = realloc(s->req, (size_t)cap * sizeof *n);
        if (n) {
            s->req = n;
            s->cap_req = cap;
        }
    }
    if (!c && s->n_req < s->cap_req) {
        c = &s->req[s->n_req++];
        memset(c, 0, sizeof *c);
        snprintf(c->type, sizeof c->type, "%s", type);
        snprintf(c->status, sizeof c->status, "%s", status);
    }
    if (c) c->n++;
    pthread_mutex_unlock(&s->mu);
}

void stats_http(http_stats *s, int code)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    int i;
    for (i = 0; i < s->n_http && s->http[i].code != code; i++)
        ;
    if (i == s->n_http && s->n_http < (int)(sizeof s->http / sizeof s->http[0]))
        s->http[s->n_http++] = (http_count){.code = code};
    if (i < s->n_http) s->http[i].n++;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- render */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf;

static void put_(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

/* A label value with \, " and newline escaped, as the format wants. */
static void esc_(char *out, size_t len, const char *v)
{
    size_t o = 0;
    for (; *v && o + 3 < len; v++) {
        if (*v == '\\' || *v == '"') {
            out[o++] = '\\';
            out[o++] = *v;
        } else if (*v == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *v;
        }
    }
    out[o] = 0;
}

/* A sample value: shortest round trip; NaN and infinities spelled as the
 * format has them. */
static const char *num_(char *buf, size_t len, double v)
{
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    if (v == floor(v) && fabs(v) < 9007199254740992.0) { /* 2^53: exact */
        snprintf(buf, len, "%.0f", v);
        return buf;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, len, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

static void family_(sbuf *b, const char *name, const char *type,
                    const char *help)
{
    put_(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The labels of a run (and a phase, ph >= 0), into lab. */
static void run_labels_(const http_stats *s, const run_stats *r, int ph,
                        char *lab, size_t len)
{
    char name[600], node[600];
    esc_(name, sizeof name, r->name);
    esc_(node, sizeof node, s->node);
    if (ph >= 0)
        snprintf(lab, len, "run=\"%lld\",name=\"%s\",node=\"%s\",phase=\"%s\"",
                 (long long)r->id, name, node, ph ? "real" : "pseudo");
    else
        snprintf(lab, len, "run=\"%lld\",name=\"%s\",node=\"%s\"",
                 (long long)r->id, name, node);
}

/* A gauge of every run: get returns the value, NAN to leave a run out. */
typedef double (*run_get)(const http_stats *s, const run_stats *r);

static void run_gauge_(sbuf *b, const http_stats *s, const char *name,
                       const char *help, run_get get)
{
    int any = 0;
    char lab[1600], nb[40];
    for (int i = 0; i < s->n_runs; i++) {
        double v = get(s, &s->runs[i]);
        if (isnan(v)) continue;
        if (!any++) family_(b, name, "gauge", help);
        run_labels_(s, &s->runs[i], -1, lab, sizeof lab);
        put_(b, "%s{%s} %s\n", name, lab, num_(nb, sizeof nb, v));
    }
}

#define G_(fn, expr)                                                      \
    static double fn(const http_stats *s, const run_stats *r)            \
    {                                                                     \
        (void)s;                                                          \
        return (expr);                                                    \
    }
G_(g_step_, (double)r->last.step)
G_(g_train_, r->last.train_loss)
G_(g_val_, r->val_loss)
G_(g_lr_, r->last.lr)
G_(g_gn_, r->last.grad_norm)
G_(g_tps_, r->last.tokens_per_s)
G_(g_flops_, r->last.flops_per_token > 0
                 ? r->last.flops_per_token * r->last.tokens_per_s : NAN)
G_(g_mfu_, r->last.flops_per_token > 0 && s->peak_flops > 0
               ? r->last.flops_per_token * r->last.tokens_per_s / s->peak_flops
               : NAN)
G_(g_res_, (double)r->last.resident_slots)
G_(g_off_, (double)r->last.offloaded_slots)
G_(g_inuse_, (double)r->last.device_bytes_in_use)
G_(g_peak_, (double)r->last.peak_device_bytes)
G_(g_hidden_, r->last.copy_hidden_fraction)
G_(g_aux_, r->last.moe ? r->last.moe_aux_loss : NAN)
G_(g_drop_, r->last.moe ? r->last.moe_dropped_fraction : NAN)
G_(g_lmin_, r->last.moe ? r->last.moe_load_min : NAN)
G_(g_lmax_, r->last.moe ? r->last.moe_load_max : NAN)
G_(g_lcv_, r->last.moe ? r->last.moe_load_cv : NAN)
/* the step's per-expert counts: -1 unknown */
#define G_COUNT_(fn, field)                                               \
    G_(fn, r->last.moe && r->last.field >= 0 ? (double)r->last.field : NAN)
G_COUNT_(g_smin_, moe_step_tokens_min)
G_COUNT_(g_smax_, moe_step_tokens_max)
G_COUNT_(g_sempty_, moe_step_experts_empty)
G_COUNT_(g_sdrop_, moe_step_dropped)
G_COUNT_(g_idle_, moe_experts_idle)
#undef G_COUNT_
#undef G_

/* A counter of every run and phase it trained in. */
static void run_counter_(sbuf *b, const http_stats *s, const char *name,
                         const char *help, size_t off)
{
    char lab[1600];
    if (!s->n_runs) return;
    family_(b, name, "counter", help);
    for (int i = 0; i < s->n_runs; i++)
        for (int ph = 0; ph < 2; ph++) {
            const phase_counters *p = &s->runs[i].ph[ph];
            if (!p->seen) continue;
            run_labels_(s, &s->runs[i], ph, lab, sizeof lab);
            put_(b, "%s{%s} %llu\n", name, lab,
                 (unsigned long long)*(const uint64_t *)((const char *)p + off));
        }
}

/* A gauge of every run: its name, help text and value. */
typedef struct {
    const char *name, *help;
    run_get get;
} gauge_def_;

/* The gauges of /metrics, in the order they are written, by group. */
static const gauge_def_ step_gauges_[] = {
    {"m6_run_step",
     "Optimizer steps the run has done.", g_step_},
    {"m6_train_loss",
     "Training loss of the latest step, nats per token.", g_train_},
    {"m6_val_loss",
     "Validation loss of the latest evaluation, nats per token.", g_val_},
    {"m6_learning_rate",
     "Learning rate of the latest step.", g_lr_},
    {"m6_grad_norm",
     "Global L2 norm of the gradient before clipping, latest step.", g_gn_},
    {"m6_tokens_per_second",
     "Training tokens per second of the latest step.", g_tps_},
    {"m6_model_flops_per_second",
     "Model FLOP/s of the latest step (6N + 12LCT per token).", g_flops_},
    {"m6_mfu_ratio",
     "Model FLOPs utilisation of the latest step against --metrics-peak-flops.", g_mfu_},
};
static const gauge_def_ placement_gauges_[] = {
    {"m6_resident_slots",
     "Parameter slots resident on the device.", g_res_},
    {"m6_offloaded_slots",
     "Parameter slots offloaded to host memory.", g_off_},
    {"m6_device_bytes_in_use",
     "Device bytes in use after the latest step.", g_inuse_},
    {"m6_device_peak_bytes",
     "Most device bytes in use at once since the run's trainer was made.", g_peak_},
};
static const gauge_def_ copy_moe_gauges_[] = {
    {"m6_copy_hidden_ratio",
     "Fraction of the latest step's copy time hidden behind compute.", g_hidden_},
    {"m6_moe_aux_loss",
     "MoE load-balancing loss of the latest step (before its coefficient).", g_aux_},
    {"m6_moe_dropped_ratio",
     "Fraction of (token, prototype) pairs dropped by capacity, latest step.", g_drop_},
    {"m6_moe_expert_load_min_tokens",
     "Fewest tokens one expert processed in one layer and microbatch, latest step.", g_lmin_},
    {"m6_moe_expert_load_max_tokens",
     "Most tokens one expert processed in one layer and microbatch, latest step.", g_lmax_},
    {"m6_moe_expert_load_cv",
     "Coefficient of variation of the tokens per expert, latest step.", g_lcv_},
    {"m6_moe_step_expert_tokens_min",
     "Fewest tokens one expert of one MoE block processed in the latest step, all ranks.", g_smin_},
    {"m6_moe_step_expert_tokens_max",
     "Most tokens one expert of one MoE block processed in the latest step, all ranks.", g_smax_},
    {"m6_moe_step_experts_empty",
     "Experts (of all MoE blocks) that processed no token in the latest step, all ranks.", g_sempty_},
    {"m6_moe_step_dropped_pairs",
     "(token, prototype) pairs dropped by capacity in the latest step, all ranks.", g_sdrop_},
    {"m6_moe_experts_idle",
     "Experts with no token for train.expert_idle_steps steps or more, latest step.", g_idle_},
};

static void gauges_(sbuf *b, const http_stats *s, const gauge_def_ *g,
                    size_t n)
{
    for (size_t i = 0; i < n; i++)
        run_gauge_(b, s, g[i].name, g[i].help, g[i].get);
}

static void render_locked_(sbuf *b, const http_stats *s)
{
    char nb[40], lab[1600];
    family_(b, "process_start_time_seconds", "gauge",
            "Start time of the m6d process since the Unix epoch, in seconds.");
    put_(b, "process_start_time_seconds %s\n", num_(nb, sizeof nb, s->start_unix));
    family_(b, "m6_uptime_seconds", "gauge", "Seconds since m6d started.");
    put_(b, "m6_uptime_seconds %s\n", num_(nb, sizeof nb, clock_mono_s() - s->start_mono));
    family_(b, "m6_control_requests_total", "counter",
            "Control-socket requests answered, by request type and reply status.");
    for (int i = 0; i < s->n_req; i++) {
        char t[80], st[80];
        esc_(t, sizeof t, s->req[i].type);
        esc_(st, sizeof st, s->req[i].status);
        put_(b, "m6_control_requests_total{type=\"%s\",status=\"%s\"} %llu\n", t,
             st, (unsigned long long)s->req[i].n);
    }
    family_(b, "m6_http_requests_total", "counter",
            "HTTP requests of the metrics server answered, by status code.");
    for (int i = 0; i < s->n_http; i++)
        put_(b, "m6_http_requests_total{code=\"%d\"} %llu\n", s->http[i].code,
             (unsigned long long)s->http[i].n);
    if (s->gemm_library[0]) {
        char node[600], l[140], v[140], isa[140];
        esc_(node, sizeof node, s->node);
        esc_(l, sizeof l, s->gemm_library);
        esc_(v, sizeof v, s->gemm_version);
        esc_(isa, sizeof isa, s->gemm_isa);
        family_(b, "m6_cpu_gemm_info", "gauge",
                "The CPU engine's GEMM library, its version and the "
                "instruction set it dispatches to, per precision "
                "(device.precision; emulated=\"1\": bf16 without bf16 "
                "instructions): 1 when its start-up self-check passed, 0 "
                "when it failed (CPU runs in that precision are then "
                "refused).");
        for (int p = 0; p < 2; p++)
            put_(b, "m6_cpu_gemm_info{node=\"%s\",library=\"%s\","
                 "version=\"%s\",isa=\"%s\",precision=\"%s\","
                 "emulated=\"%d\"} %d\n", node, l, v, isa,
                 p ? "bf16" : "fp32", p && !s->gemm_bf16_native,
                 s->gemm_passed[p]);
    }

    /* per run */
    if (s->n_runs) {
        family_(b, "m6_run_phase", "gauge",
                "1 for the phase the run is in (pseudo: shared slots; real: "
                "delinked), 0 for the other.");
        for (int i = 0; i < s->n_runs; i++)
            for (int ph = 0; ph < 2; ph++) {
                run_labels_(s, &s->runs[i], ph, lab, sizeof lab);
                put_(b, "m6_run_phase{%s} %d\n", lab,
                     (s->runs[i].last.phase ? 1 : 0) == ph);
            }
    }
    gauges_(b, s, step_gauges_, sizeof step_gauges_ / sizeof step_gauges_[0]);
    run_counter_(b, s, "m6_steps_total", "Steps trained by this m6d, by phase.",
                 offsetof(phase_counters, steps));
    run_counter_(b, s, "m6_tokens_total", "Training tokens processed by this m6d, by phase.",
                 offsetof(phase_counters, tokens));

    if (s->n_runs) {
        const char *h = "m6_step_duration_seconds";
        family_(b, h, "histogram", "Wall seconds of a training step, as the runner waited for it.");
        for (int i = 0; i < s->n_runs; i++)
            for (int ph = 0; ph < 2; ph++) {
                const phase_counters *p = &s->runs[i].ph[ph];
                if (!p->seen) continue;
                run_labels_(s, &s->runs[i], ph, lab, sizeof lab);
                uint64_t cum = 0;
                for (int k = 0; k < N_BUCKETS; k++) {
                    cum += p->bucket[k];
                    put_(b, "%s_bucket{%s,le=\"%s\"} %llu\n", h, lab,
                         num_(nb, sizeof nb, buckets_[k]), (unsigned long long)cum);
                }
                put_(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", h, lab,
                     (unsigned long long)p->steps);
                put_(b, "%s_sum{%s} %s\n", h, lab, num_(nb, sizeof nb, p->sum));
                put_(b, "%s_count{%s} %llu\n", h, lab, (unsigned long long)p->steps);
            }
    }
    gauges_(b, s, placement_gauges_, sizeof placement_gauges_ / sizeof placement_gauges_[0]);
    run_counter_(b, s, "m6_host_to_device_bytes_total", "Bytes copied host to device by offloading, by phase.",
                 offsetof(phase_counters, h2d_bytes));
    run_counter_(b, s, "m6_device_to_host_bytes_total", "Bytes copied device to host by offloading, by phase.",
                 offsetof(phase_counters, d2h_bytes));
    gauges_(b, s, copy_moe_gauges_, sizeof copy_moe_gauges_ / sizeof copy_moe_gauges_[0]);
}

int stats_render(http_stats *s, char **out, size_t *len)
{
    sbuf b = {.buf = malloc(8192), .cap = 8192};
    if (!b.buf) return -1;
    b.buf[0] = 0;
    pthread_mutex_lock(&s->mu);
    render_locked_(&b, s);
    pthread_mutex_unlock(&s->mu);
    if (b.oom) {
        free(b.buf);
        return -1;
    }
    *out = b.buf;
    *len = b.len;
    return 0;
}
