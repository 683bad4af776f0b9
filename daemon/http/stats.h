/*
 * stats.h — the figures m6d exports at GET /metrics (Prometheus text
 * exposition format 0.0.4): per run, what the runner thread
 * published after each step; per daemon, uptime, start time and the
 * control-socket requests by type and status.
 *
 * Threads: stats_step is called by the runner thread after a
 * step, stats_request by the control server (libuv's loop and thread pool),
 * stats_http and stats_render by libmicrohttpd's thread. Every call takes
 * one mutex, held for a copy or an add (stats_render: while it formats,
 * microseconds per run) and nothing else: the HTTP thread never touches
 * the trainer, and a scrape never waits on a training step.
 *
 * Counters (`_total`, the histogram's buckets, sum and count) only grow
 * while m6d runs; a restart starts them again at 0 with a new
 * process_start_time_seconds, as Prometheus' rate() expects.
 */
#ifndef M6_HTTP_STATS_H
#define M6_HTTP_STATS_H

#include <stddef.h>
#include <stdint.h>

typedef struct http_stats http_stats;

/* One step as the runner recorded it. Units are base units (seconds,
 * bytes, tokens); NAN where a figure does not apply (no validation pass,
 * nothing copied, a dense model's MoE figures). */
typedef struct {
    int64_t run_id;
    const char *name;          /* the run's name (spec "name") */
    int phase;                 /* 0 pseudo, 1 real */
    long step;                 /* optimizer steps done (1-based) */
    double train_loss, val_loss, lr, grad_norm;  /* nats; val NAN: none */
    double tokens_per_s;       /* the trainer's: tokens / step wall time */
    long tokens;               /* training tokens of the step, B*T*accum */
    double step_seconds;       /* wall seconds the runner waited for it */
    double flops_per_token;    /* model FLOPs per training token
                                * (model/facts.h model_flops_per_token);
                                * 0 unknown */
    int resident_slots, offloaded_slots;
    int64_t device_bytes_in_use, peak_device_bytes;
    uint64_t h2d_bytes, d2h_bytes;  /* copied by this step, each way */
    double copy_hidden_fraction;    /* NAN: nothing copied */
    int moe;                   /* the MoE figures below are set */
    double moe_aux_loss, moe_dropped_fraction;
    double moe_load_min, moe_load_max, moe_load_cv; /* tokens per expert,
                                * one layer and microbatch */
    /* the whole step over every rank (trainer.h step_moe's step_* and
     * experts_idle): tokens of one (MoE block, expert), fewest and most;
     * the pairs with none; (token, prototype) pairs dropped; pairs idle
     * for train.expert_idle_steps steps. -1: unknown (not exported) */
    long moe_step_tokens_min, moe_step_tokens_max, moe_step_experts_empty;
    long moe_step_dropped, moe_experts_idle;
} stats_step_rec;

/* A new set of figures; start_unix: the process start (unix seconds,
 * process_start_time_seconds), taken by the caller at start-up. node: the
 * value of the `node` label (this machine's host name). peak_flops: the
 * device's peak FLOP/s for MFU (0: m6_mfu_ratio is not exported). NULL
 * when out of memory. */
http_stats *stats_new(double start_unix, const char *node, double peak_flops);
void stats_free(http_stats *s);

/* What multiplies in the CPU engine (gemm_describe, kernels.h): library,
 * version, isa (copied; each cut at 63 bytes), whether bf16 runs on bf16
 * instructions (bf16_native 1) or is emulated, and whether each
 * precision's start-up self-check passed (gemm_ready). Exported as
 * m6_cpu_gemm_info, one series per precision (label precision="fp32" or
 * "bf16", emulated="1" for bf16 without bf16 instructions): 1 passed, 0
 * failed (CPU runs in that precision are then refused); not exported
 * until set. */
void stats_set_gemm(http_stats *s, const char *library, const char *version,
                    const char *isa, int bf16_native, int fp32_passed,
                    int bf16_passed);

/* Publish a step (s NULL: nothing). */
void stats_step(http_stats *s, const stats_step_rec *r);

/* Count one control-socket request: type the request's name ("status",
 * "submit", ...; "malformed" when it did not decode), status the reply's
 * ("ok", "not_found", ...). Both are copied (at most 31 bytes kept).
 * s NULL: nothing. */
void stats_request(http_stats *s, const char *type, const char *status);

/* Count one HTTP response of the metrics server by status code. */
void stats_http(http_stats *s, int code);

/* The exposition text into a malloc'd buffer (*out, *len). 0, or -1 when
 * out of memory. */
int stats_render(http_stats *s, char **out, size_t *len);

#endif /* M6_HTTP_STATS_H */
