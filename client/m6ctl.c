/*
 * m6ctl.c — the operator's CLI for m6d. Table-driven: every subcommand is one
 * {name, handler, flags, usage, help} row; human and --json output come from
 * the same values; colour only on a tty; the exit code tells the truth
 * (0 ok, 1 error or run failed, 2 usage, 3 run stopped, 4 m6d unreachable).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/paths.h"
#include "control/frame.h"
#include "m6.pb-c.h"
#include "offload/offload.h"
#include "train/data.h"
#include "train/spec.h"

/* Exit status: 0 ok; 1 the daemon refused (its message on stderr; a RUN it
 * does not know included) or the watched run failed; 2 usage (a malformed
 * RUN included, for every command); 3 the watched run was stopped; 4 m6d
 * could not be reached, or the connection broke. */
enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_STOPPED = 3,
       EXIT_UNREACHABLE = 4 };

/* ----------------------------------------------------------------- globals */

static struct {
    char socket[4096];
    int json, csv, color;
    int fd;
    double interval;        /* watch poll period, seconds */
    double reconnect;       /* watch: seconds to retry an unreachable m6d */
    int transport_err;      /* the last failure was the connection's */
    int no_timeout;         /* submit: wait for the answer however long */
    int bar_open;           /* watch's progress line awaits its newline */
    int quiet;              /* don't print transport errors (watch retries) */
    size_t device_memory;   /* plan --device-memory, bytes (0: the spec's) */
    int plan_daemon;        /* plan --daemon: ask m6d */
    char out_dir[4096];     /* data prepare */
    double val_fraction;
    long shard_tokens;
} g = {.fd = -1, .interval = 0.5, .reconnect = 60, .val_fraction = 0.1};

/* End watch's progress line (a tty's \r-redrawn bar), if one is open. */
static void end_bar_(void)
{
    if (!g.bar_open) return;
    fputc('\n', stdout);
    fflush(stdout);
    g.bar_open = 0;
}

static void verrf_(const char *fmt, va_list ap)
{
    end_bar_();
    fputs("m6ctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

static void errf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf_(fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ client */

/* Longest wait for an answer (not for submit): m6d answers in milliseconds
 * even mid-step, so silence this long means a hung or stopped m6d. */
enum { RECV_TIMEOUT_S = 15 };

static int write_all_(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A broken connection: say so (unless quiet), mark it, drop the socket so
 * the next request reconnects. */
static void transport_fail_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void transport_fail_(const char *fmt, ...)
{
    if (!g.quiet) {
        va_list ap;
        va_start(ap, fmt);
        verrf_(fmt, ap);
        va_end(ap);
    }
    g.transport_err = 1;
    if (g.fd >= 0) close(g.fd);
    g.fd = -1;
}

/* Send one Request, read one Response (caller frees with
 * m6__response__free_unpacked). NULL on transport error (reported). */
static M6__Response *call_(const M6__Request *rq)
{
    size_t len;
    uint8_t *f = frame_pack(&rq->base, &len);
    if (!f) {
        errf_("request too large");
        return NULL;
    }
    int rc = write_all_(g.fd, f, len);
    free(f);
    if (rc < 0) {
        if (errno == EPIPE)
            transport_fail_("m6d closed the connection (%s): did it stop?", g.socket);
        else
            transport_fail_("write to %s: %s", g.socket, strerror(errno));
        return NULL;
    }
    frame_reader rd;
    frame_reader_init(&rd);
    M6__Response *resp = NULL;
    int said_waiting = 0;
    uint8_t buf[65536];
    for (;;) {
        const uint8_t *payload;
        size_t plen;
        frame_result fr = frame_reader_next(&rd, &payload, &plen);
        if (fr == FRAME_OK) {
            resp = m6__response__unpack(NULL, plen, payload);
            if (!resp) errf_("malformed response from m6d");
            break;
        }
        if (fr == FRAME_TOO_LARGE) {
            errf_("response of %zu bytes exceeds the frame limit", plen);
            break;
        }
        if (g.no_timeout && !said_waiting) {
            /* a submit of a large corpus: say why nothing happens yet */
            struct pollfd pfd = {.fd = g.fd, .events = POLLIN};
            if (poll(&pfd, 1, 2000) == 0 && !g.json)
                fprintf(stderr, "m6ctl: m6d is checking every shard of the spec "
                                "(header, size, token ids)...\n");
            said_waiting = 1;
        }
        ssize_t r = read(g.fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                transport_fail_("no answer from m6d at %s within %d s", g.socket,
                                RECV_TIMEOUT_S);
            else
                transport_fail_("m6d closed the connection%s%s", r < 0 ? ": " : "",
                                r < 0 ? strerror(errno) : "");
            break;
        }
        if (frame_reader_feed(&rd, buf, (size_t)r) < 0) {
            errf_("out of memory");
            break;
        }
    }
    frame_reader_free(&rd);
    return resp;
}

static int connect_(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(g.socket) >= sizeof sa.sun_path) {
        errf_("socket path too long: %s", g.socket);
        return -1;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.socket);
    g.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g.fd < 0 || connect(g.fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        transport_fail_("cannot reach m6d at %s: %s (is m6d running? --socket or "
                        "M6_SOCKET choose another socket)", g.socket, strerror(errno));
        return -1;
    }
    struct timeval tv = {.tv_sec = RECV_TIMEOUT_S};
    setsockopt(g.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    M6__Hello hello = M6__HELLO__INIT;
    hello.protocol_version = M6_PROTOCOL_VERSION;
    hello.client = (char *)"m6ctl " M6_VERSION;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = M6__REQUEST__BODY_HELLO;
    rq.hello = &hello;
    M6__Response *resp = call_(&rq);
    if (!resp) return -1;
    g.transport_err = 0;
    int ok = resp->status == M6__STATUS__STATUS_OK;
    if (!ok) errf_("%s", resp->message);
    m6__response__free_unpacked(resp, NULL);
    return ok ? 0 : -1;
}

/* Connect if needed, send, and check the status: NULL (message printed) if
 * the daemon refused. */
static M6__Response *request_(M6__Request *rq)
{
    if (g.fd < 0 && connect_() < 0) return NULL;
    M6__Response *resp = call_(rq);
    if (resp && resp->status != M6__STATUS__STATUS_OK) {
        errf_("%s", resp->message && *resp->message ? resp->message
                                                    : "request refused");
        m6__response__free_unpacked(resp, NULL);
        return NULL;
    }
    return resp;
}

/* RUN: a numeric id, or a name. */
static int parse_run_(const char *arg, M6__RunRef *ref)
{
    m6__run_ref__init(ref);
    if (*arg && strspn(arg, "0123456789") == strlen(arg)) {  /* an id */
        errno = 0;
        long long v = strtoll(arg, NULL, 10);
        if (!errno && v > 0) {
            ref->run_id = v;
            return 0;
        }
    } else if (spec_name_ok(arg)) {  /* "", " 1", "-1": no run's name */
        ref->name = (char *)arg;
        return 0;
    }
    errf_("RUN must be an id > 0 or a run name, got \"%s\"", arg);
    return -1;
}

/* --------------------------------------------------------------- rendering */

static const char *state_str_(M6__RunState s)
{
    switch (s) {
    case M6__RUN_STATE__RUN_STATE_QUEUED: return "queued";
    case M6__RUN_STATE__RUN_STATE_RUNNING: return "running";
    case M6__RUN_STATE__RUN_STATE_PAUSED: return "paused";
    case M6__RUN_STATE__RUN_STATE_COMPLETED: return "completed";
    case M6__RUN_STATE__RUN_STATE_FAILED: return "failed";
    case M6__RUN_STATE__RUN_STATE_STOPPED: return "stopped";
    default: return "unknown";
    }
}

static const char *state_color_(M6__RunState s)
{
    if (!g.color) return "";
    switch (s) {
    case M6__RUN_STATE__RUN_STATE_RUNNING: return "\033[32m";
    case M6__RUN_STATE__RUN_STATE_PAUSED: return "\033[33m";
    case M6__RUN_STATE__RUN_STATE_FAILED: return "\033[31m";
    case M6__RUN_STATE__RUN_STATE_COMPLETED: return "\033[1m";
    default: return "\033[2m";
    }
}
#define RESET_ (g.color ? "\033[0m" : "")

static const char *phase_str_(M6__Phase p)
{
    return p == M6__PHASE__PHASE_REAL ? "real" : "pseudo";
}

static json_t *jnum_(double v) { return isnan(v) || isinf(v) ? json_null() : json_real(v); }

static json_t *jcount_(int64_t v) { return v < 0 ? json_null() : json_integer(v); }

/* "157.1 MiB" */
static void fmt_bytes_(char *buf, size_t n, double v)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, n, "%.4g %s", v, unit[u]);
}

static json_t *run_json_(const M6__RunInfo *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(r->id));
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "state", json_string(state_str_(r->state)));
    json_object_set_new(o, "phase", json_string(phase_str_(r->phase)));
    json_object_set_new(o, "step", json_integer(r->step));
    json_object_set_new(o, "total_steps", json_integer(r->total_steps));
    json_object_set_new(o, "train_loss", jnum_(r->train_loss));
    json_object_set_new(o, "val_loss", jnum_(r->val_loss));
    json_object_set_new(o, "tokens_per_s", json_real(r->tokens_per_s));
    json_object_set_new(o, "lr", jnum_(r->lr));
    json_object_set_new(o, "pseudo_steps", json_integer(r->pseudo_steps));
    json_object_set_new(o, "delink_step",
                        r->delink_step >= 0 ? json_integer(r->delink_step) : json_null());
    json_object_set_new(o, "checkpoint_step",
                        r->checkpoint_step >= 0 ? json_integer(r->checkpoint_step) : json_null());
    json_object_set_new(o, "eta_s", r->eta_s >= 0 ? json_real(r->eta_s) : json_null());
    json_object_set_new(o, "created", json_real(r->created));
    json_object_set_new(o, "updated", json_real(r->updated));
    json_object_set_new(o, "error", r->error && *r->error ? json_string(r->error) : json_null());
    json_object_set_new(o, "resident_slots", json_integer(r->resident_slots));
    json_object_set_new(o, "offloaded_slots", json_integer(r->offloaded_slots));
    json_object_set_new(o, "device_bytes_in_use", json_integer(r->device_bytes_in_use));
    json_object_set_new(o, "peak_device_bytes", json_integer(r->peak_device_bytes));
    json_object_set_new(o, "device_budget_bytes", json_integer(r->device_budget_bytes));
    json_object_set_new(o, "h2d_gbps", jnum_(r->h2d_gbps));
    json_object_set_new(o, "d2h_gbps", jnum_(r->d2h_gbps));
    json_object_set_new(o, "copy_hidden_fraction", jnum_(r->copy_hidden_fraction));
    return o;
}

static void print_json_(json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
    json_decref(v);
}

static void fmt_loss_(char *buf, size_t n, double v)
{
    if (isnan(v)) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.4f", v);
}

/* Seconds as "42s", "3m05s" or "2h07m": rounded to whole seconds (or
 * minutes) first, so 179.6 s is "3m00s", not "2m60s". */
static void fmt_eta_(char *buf, size_t n, double s)
{
    if (s < 0) {
        snprintf(buf, n, "-");
        return;
    }
    long long t = llround(s);
    if (t < 60) snprintf(buf, n, "%llds", t);
    else if (t < 3600) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else {
        long long m = llround(s / 60);
        snprintf(buf, n, "%lldh%02lldm", m / 60, m % 60);
    }
}

/* "offload: 4/6 slots offloaded, peak 157.1 MiB of 160 MiB budget, h2d
 * 3.2 GB/s, 87% of copy time hidden"; nothing before the run has a sample. */
static void print_offload_(const M6__RunInfo *r)
{
    int n = r->resident_slots + r->offloaded_slots;
    char pk[32], bud[32];
    if (n <= 0) return;
    fmt_bytes_(pk, sizeof pk, (double)r->peak_device_bytes);
    if (r->device_budget_bytes <= 0) {
        printf("offload:      off (no budget): %d/%d slots resident, device %s\n",
               r->resident_slots, n, pk);
        return;
    }
    fmt_bytes_(bud, sizeof bud, (double)r->device_budget_bytes);
    printf("offload:      %d/%d slots offloaded, peak %s of %s budget", r->offloaded_slots, n,
           pk, bud);
    if (!isnan(r->h2d_gbps)) printf(", h2d %.3g GB/s", r->h2d_gbps);
    if (!isnan(r->d2h_gbps)) printf(", d2h %.3g GB/s", r->d2h_gbps);
    if (!isnan(r->copy_hidden_fraction))
        printf(", %.0f%% of copy time hidden", 100.0 * r->copy_hidden_fraction);
    else
        printf(", no copies in the last step");
    printf("\n");
}

static void print_run_(const M6__RunInfo *r)
{
    char tl[32], vl[32], eta[32];
    fmt_loss_(tl, sizeof tl, r->train_loss);
    fmt_loss_(vl, sizeof vl, r->val_loss);
    fmt_eta_(eta, sizeof eta, r->eta_s);
    printf("id:           %lld\n", (long long)r->id);
    printf("name:         %s\n", r->name);
    printf("state:        %s%s%s\n", state_color_(r->state), state_str_(r->state), RESET_);
    printf("phase:        %s", phase_str_(r->phase));
    if (r->delink_step >= 0) printf(" (delinked at step %lld)", (long long)r->delink_step);
    else if (r->pseudo_steps > 0) printf(" (delink at step %lld)", (long long)r->pseudo_steps);
    printf("\nstep:         %lld/%lld\n", (long long)r->step, (long long)r->total_steps);
    printf("train_loss:   %s\nval_loss:     %s\n", tl, vl);
    printf("tokens_per_s: %.0f\n", r->tokens_per_s);
    printf("eta:          %s\n", eta);
    if (r->checkpoint_step >= 0)
        printf("checkpoint:   step %lld\n", (long long)r->checkpoint_step);
    print_offload_(r);
    if (r->error && *r->error) printf("error:        %s\n", r->error);
}

/* ---------------------------------------------------------------- commands */

static M6__Response *run_request_(M6__Request__BodyCase which, const char *arg)
{
    M6__RunRef ref;
    if (parse_run_(arg, &ref) < 0) return NULL;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = which;
    rq.status = &ref;  /* union: the same pointer for every RunRef case */
    return request_(&rq);
}

/* Relative data globs in a spec are relative to the spec file's directory
 * (the current one for a spec on stdin; the daemon runs elsewhere): rewrite
 * them as absolute paths. A spec that does not parse (duplicate keys
 * included) is sent as it is, for the daemon to explain. Returns the
 * text to send (buf itself, or a new malloc'd string; buf then freed). */
static char *resolve_data_paths_(char *buf, const char *path)
{
    json_t *root = json_loads(buf, JSON_REJECT_DUPLICATES, NULL);
    json_t *data = root ? json_object_get(root, "data") : NULL;
    if (!json_is_object(data)) {
        json_decref(root);
        return buf;
    }
    /* a spec on stdin: relative to the current directory */
    char *spec_abs = strcmp(path, "-") == 0 ? getcwd(NULL, 0) : realpath(path, NULL);
    if (!spec_abs) {
        json_decref(root);
        return buf;
    }
    if (strcmp(path, "-") != 0)
        *strrchr(spec_abs, '/') = 0;
    const char *dir = spec_abs[0] ? spec_abs : "/";
    int changed = 0;
    const char *keys[] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(data, keys[i]);
        const char *g0 = json_string_value(v);
        if (!g0 || !g0[0] || g0[0] == '/')
            continue;
        size_t len = strlen(dir) + strlen(g0) + 2;
        char *abs = malloc(len);
        snprintf(abs, len, "%s/%s", dir, g0);
        json_object_set_new(data, keys[i], json_string(abs));
        free(abs);
        changed = 1;
    }
    free(spec_abs);
    char *out = changed ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!out)
        return buf;
    free(buf);
    return out;
}

/* A spec file (- for stdin) as text, with relative data globs made
 * absolute; NULL with the error printed. */
static char *read_spec_(const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        errf_("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            if (cap >= (8u << 20)) {
                errf_("%s: spec larger than 8 MiB", path);
                free(buf);
                buf = NULL;
                break;
            }
            char *nb = realloc(buf, (cap *= 2) + 1);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    if (buf && ferror(f)) {
        errf_("%s: %s", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    if (f != stdin) fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    return resolve_data_paths_(buf, path);
}

static int cmd_submit_(int argc, char **argv)
{
    const char *path = argv[0];
    char *buf = read_spec_(path);
    if (!buf) return EXIT_ERR;
    /* Hello with the usual time limit (a hung m6d is reported), then wait
     * for the answer to the submit however long the corpus check takes. */
    if (g.fd < 0 && connect_() < 0) {
        free(buf);
        return EXIT_ERR;
    }
    g.no_timeout = 1;
    struct timeval forever = {0, 0};
    setsockopt(g.fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
    M6__Submit sub = M6__SUBMIT__INIT;
    sub.spec_json = buf;
    sub.origin = (char *)path;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = M6__REQUEST__BODY_SUBMIT;
    rq.submit = &sub;
    M6__Response *resp = request_(&rq);
    free(buf);
    if (!resp) return EXIT_ERR;
    if (g.json) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(resp->submit->run_id));
        json_object_set_new(o, "name", json_string(resp->submit->name));
        print_json_(o);
    } else {
        printf("%lld\n", (long long)resp->submit->run_id);
    }
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_list_(int argc, char **argv)
{
    M6__ListRuns lr = M6__LIST_RUNS__INIT;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = M6__REQUEST__BODY_LIST;
    rq.list = &lr;
    M6__Response *resp = request_(&rq);
    if (!resp) return EXIT_ERR;
    M6__RunList *l = resp->list;
    if (g.json) {
        json_t *a = json_array();
        for (size_t i = 0; l && i < l->n_runs; i++) json_array_append_new(a, run_json_(l->runs[i]));
        print_json_(a);
    } else {
        printf("%-5s %-20s %-10s %-7s %-13s %-9s %-9s %s\n", "ID", "NAME", "STATE",
               "PHASE", "STEP", "LOSS", "VAL", "TOK/S");
        for (size_t i = 0; l && i < l->n_runs; i++) {
            const M6__RunInfo *r = l->runs[i];
            char step[40], tl[32], vl[32];
            snprintf(step, sizeof step, "%lld/%lld", (long long)r->step, (long long)r->total_steps);
            fmt_loss_(tl, sizeof tl, r->train_loss);
            fmt_loss_(vl, sizeof vl, r->val_loss);
            printf("%-5lld %-20.20s %s%-10s%s %-7s %-13s %-9s %-9s %.0f\n", (long long)r->id,
                   r->name, state_color_(r->state), state_str_(r->state), RESET_,
                   phase_str_(r->phase), step, tl, vl, r->tokens_per_s);
        }
    }
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_status_(int argc, char **argv)
{
    M6__Response *resp = run_request_(M6__REQUEST__BODY_STATUS, argv[0]);
    if (!resp) return EXIT_ERR;
    if (g.json) print_json_(run_json_(resp->run));
    else print_run_(resp->run);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int command_(M6__Request__BodyCase which, const char *arg)
{
    M6__Response *resp = run_request_(which, arg);
    if (!resp) return EXIT_ERR;
    if (g.json) {
        json_t *o = run_json_(resp->run);
        json_object_set_new(o, "message", json_string(resp->message));
        print_json_(o);
    } else {
        printf("%s\n", resp->message);
    }
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_pause_(int argc, char **argv) { return command_(M6__REQUEST__BODY_PAUSE, argv[0]); }
static int cmd_resume_(int argc, char **argv) { return command_(M6__REQUEST__BODY_RESUME, argv[0]); }
static int cmd_delink_(int argc, char **argv) { return command_(M6__REQUEST__BODY_DELINK, argv[0]); }
static int cmd_stop_(int argc, char **argv) { return command_(M6__REQUEST__BODY_STOP, argv[0]); }

static int same_loss_(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static int terminal_(M6__RunState s)
{
    return s == M6__RUN_STATE__RUN_STATE_COMPLETED || s == M6__RUN_STATE__RUN_STATE_FAILED ||
           s == M6__RUN_STATE__RUN_STATE_STOPPED;
}

/* A watch event: one JSON line {"event", "step"[, "last_seen_step"]}
 * with --json (last_seen < 0: none), else the printf-formatted text. */
static void print_event_(const char *event, long long step, long last_seen,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void print_event_(const char *event, long long step, long last_seen,
                         const char *fmt, ...)
{
    end_bar_();
    if (g.json) {
        json_t *o = json_object();
        json_object_set_new(o, "event", json_string(event));
        json_object_set_new(o, "step", json_integer(step));
        if (last_seen >= 0)
            json_object_set_new(o, "last_seen_step", json_integer(last_seen));
        char *js = json_dumps(o, JSON_COMPACT);
        puts(js);
        free(js);
        json_decref(o);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

static void watch_sigint_(int sig)
{
    (void)sig;
    if (write(STDOUT_FILENO, "\n", 1) < 0) _exit(130);  /* leave the bar's line */
    _exit(130);
}

static int cmd_watch_(int argc, char **argv)
{
    int tty = isatty(STDOUT_FILENO) && !g.json;
    if (tty) signal(SIGINT, watch_sigint_);
    long last_step = -1;
    int last_phase = -1;
    M6__RunState last_state = M6__RUN_STATE__RUN_STATE_UNSPECIFIED;
    double last_print = 0, last_val = NAN;
    int last_phase_seen = -1;
    double lost_at = -1;  /* when m6d became unreachable; -1: reachable */
    double created = -1;  /* the watched run's identity: creation time... */
    char name[256] = "";  /* ...and name (ids restart in a new state dir) */
    for (;;) {
        M6__Response *resp = run_request_(M6__REQUEST__BODY_STATUS, argv[0]);
        if (!resp && g.transport_err) {
            /* m6d restarting (systemd, an upgrade): keep trying. */
            if (lost_at < 0) {
                lost_at = clock_mono_s();
                end_bar_();
                if (g.reconnect > 0)
                    errf_("m6d unreachable; retrying for up to %.0f s (--reconnect)",
                          g.reconnect);
                g.quiet = 1;
            }
            if (clock_mono_s() - lost_at < g.reconnect) {
                struct timespec one = {1, 0};
                nanosleep(&one, NULL);
                continue;
            }
            if (g.reconnect > 0) errf_("m6d still unreachable after %.0f s", g.reconnect);
            return EXIT_UNREACHABLE;
        }
        if (!resp) {
            end_bar_();
            return EXIT_ERR;
        }
        const M6__RunInfo *r = resp->run;
        if (created < 0) {
            created = r->created;
            snprintf(name, sizeof name, "%s", r->name ? r->name : "");
        } else if (r->created != created || strcmp(name, r->name ? r->name : "") != 0) {
            end_bar_();
            errf_("run %lld on this m6d is another run (\"%s\", created %.0f) than the "
                  "one watched (\"%s\", created %.0f): was m6d restarted on another "
                  "state directory?", (long long)r->id, r->name, r->created, name, created);
            m6__response__free_unpacked(resp, NULL);
            return EXIT_ERR;
        }
        if (lost_at >= 0) {
            errf_("reconnected to m6d after %.0f s", clock_mono_s() - lost_at);
            lost_at = -1;
            g.quiet = 0;
        }
        /* Report the delink once: as it happens, or on attach if it already
         * happened (a fast run may pass it before watch starts). */
        if (last_phase != 1 && r->phase == M6__PHASE__PHASE_REAL && r->delink_step >= 0) {
            print_event_("delink", r->delink_step, -1,
                         "delinked at step %lld\n", (long long)r->delink_step);
        }
        if (last_step >= 0 && r->step < last_step) {
            /* m6d restarted and resumed from a checkpoint before last_step */
            print_event_("resumed", r->step, last_step,
                         "m6d resumed run %lld from an earlier checkpoint: the step went "
                         "back from %ld to %lld, and the steps after the checkpoint are "
                         "redone\n", (long long)r->id, last_step, (long long)r->step);
        }
        last_phase = r->phase == M6__PHASE__PHASE_REAL;
        int changed = r->step != last_step || r->state != last_state;
        char tl[32], vl[32], eta[32];
        fmt_loss_(tl, sizeof tl, r->train_loss);
        fmt_loss_(vl, sizeof vl, r->val_loss);
        fmt_eta_(eta, sizeof eta, r->eta_s);
        if (g.json && changed) {
            json_t *o = run_json_(r);
            char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            puts(s);
            free(s);
            json_decref(o);
        } else if (tty) {
            int width = 30;
            double frac = r->total_steps > 0 ? (double)r->step / (double)r->total_steps : 0;
            int fill = (int)(frac * width);
            char bar[64];
            for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
            bar[width] = 0;
            printf("\r\033[K[%s] %lld/%lld %s%s%s %s loss %s val %s %.0f tok/s ETA %s", bar,
                   (long long)r->step, (long long)r->total_steps, state_color_(r->state),
                   state_str_(r->state), RESET_, phase_str_(r->phase), tl, vl,
                   r->tokens_per_s, eta);
            g.bar_open = 1;
        } else if (changed && (r->state != last_state || (int)r->phase != last_phase_seen ||
                               !same_loss_(r->val_loss, last_val) || terminal_(r->state) ||
                               clock_mono_s() - last_print >= 10.0)) {
            /* Not a tty (a log): one line per eval, phase or state change,
             * and at least every 10 s, not one per step. */
            last_print = clock_mono_s();
            last_val = r->val_loss;
            last_phase_seen = (int)r->phase;
            printf("step %lld/%lld %s %s loss %s val %s tok/s %.0f eta %s\n", (long long)r->step,
                   (long long)r->total_steps, state_str_(r->state), phase_str_(r->phase), tl,
                   vl, r->tokens_per_s, eta);
        }
        if (!g.json && r->state != last_state &&
            r->state == M6__RUN_STATE__RUN_STATE_PAUSED && r->error && *r->error) {
            /* paused by m6d itself (a write failed, a shard went bad): why */
            end_bar_();
            printf("run %lld paused at step %lld: %s\n", (long long)r->id,
                   (long long)r->step, r->error);
        }
        fflush(stdout);
        last_step = r->step;
        last_state = r->state;
        if (terminal_(r->state)) {
            M6__RunState s = r->state;
            end_bar_();
            if (!g.json) {
                printf("run %lld %s at step %lld", (long long)r->id, state_str_(s),
                       (long long)r->step);
                if (r->error && *r->error) printf(": %s", r->error);
                printf("\n");
            }
            m6__response__free_unpacked(resp, NULL);
            return s == M6__RUN_STATE__RUN_STATE_COMPLETED ? EXIT_OK
                   : s == M6__RUN_STATE__RUN_STATE_STOPPED ? EXIT_STOPPED
                                                           : EXIT_ERR;
        }
        m6__response__free_unpacked(resp, NULL);
        struct timespec ts = {(time_t)g.interval,
                              (long)((g.interval - (double)(time_t)g.interval) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static int cmd_metrics_(int argc, char **argv)
{
    M6__RunRef ref;
    if (parse_run_(argv[0], &ref) < 0) return EXIT_ERR;  /* checked in main */
    M6__MetricsQuery q = M6__METRICS_QUERY__INIT;
    q.run = &ref;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = M6__REQUEST__BODY_METRICS;
    rq.metrics = &q;
    M6__Response *resp = request_(&rq);
    if (!resp) return EXIT_ERR;
    M6__MetricRows *m = resp->metrics;
    if (g.json) {
        json_t *a = json_array();
        for (size_t i = 0; i < m->n_rows; i++) {
            const M6__MetricRow *r = m->rows[i];
            json_t *o = json_object();
            json_object_set_new(o, "step", json_integer(r->step));
            json_object_set_new(o, "phase", json_string(phase_str_(r->phase)));
            json_object_set_new(o, "train_loss", jnum_(r->train_loss));
            json_object_set_new(o, "val_loss", jnum_(r->val_loss));
            json_object_set_new(o, "lr", jnum_(r->lr));
            json_object_set_new(o, "tokens_per_s", jnum_(r->tokens_per_s));
            json_object_set_new(o, "grad_norm", jnum_(r->grad_norm));
            json_object_set_new(o, "resident_slots", jcount_(r->resident_slots));
            json_object_set_new(o, "offloaded_slots", jcount_(r->offloaded_slots));
            json_object_set_new(o, "peak_device_bytes", jcount_(r->peak_device_bytes));
            json_object_set_new(o, "h2d_gbps", jnum_(r->h2d_gbps));
            json_object_set_new(o, "d2h_gbps", jnum_(r->d2h_gbps));
            json_object_set_new(o, "copy_hidden_fraction", jnum_(r->copy_hidden_fraction));
            json_array_append_new(a, o);
        }
        print_json_(a);
    } else {
        const char *sep = g.csv ? "," : " ";
        if (g.csv) printf("step,phase,train_loss,val_loss,lr,tokens_per_s,grad_norm,"
                          "resident_slots,offloaded_slots,peak_device_bytes,h2d_gbps,"
                          "d2h_gbps,copy_hidden_fraction\n");
        else printf("%6s %-6s %-12s %-12s %-12s %-10s %-10s %-7s %-10s %-8s %s\n", "STEP",
                    "PHASE", "TRAIN_LOSS", "VAL_LOSS", "LR", "TOK/S", "GRAD_NORM", "OFFL",
                    "PEAK", "H2D_GB/S", "HIDDEN");
        for (size_t i = 0; i < m->n_rows; i++) {
            const M6__MetricRow *r = m->rows[i];
            /* Unknown (NaN, or -1: not recorded) is empty in CSV, - else. */
            const char *none = g.csv ? "" : "-";
            char vl[32], res[16], off[32], pk[32], h2d[32], d2h[32], hid[32];
            if (isnan(r->val_loss)) snprintf(vl, sizeof vl, "%s", none);
            else snprintf(vl, sizeof vl, "%.9g", r->val_loss);
            if (r->resident_slots < 0) snprintf(res, sizeof res, "%s", none);
            else snprintf(res, sizeof res, "%d", r->resident_slots);
            if (r->offloaded_slots < 0 || r->resident_slots < 0) snprintf(off, sizeof off, "%s", none);
            else if (g.csv) snprintf(off, sizeof off, "%d", r->offloaded_slots);
            else snprintf(off, sizeof off, "%d/%d", r->offloaded_slots,
                          r->offloaded_slots + r->resident_slots);
            if (r->peak_device_bytes < 0) snprintf(pk, sizeof pk, "%s", none);
            else if (g.csv) snprintf(pk, sizeof pk, "%lld", (long long)r->peak_device_bytes);
            else fmt_bytes_(pk, sizeof pk, (double)r->peak_device_bytes);
            if (isnan(r->h2d_gbps)) snprintf(h2d, sizeof h2d, "%s", none);
            else snprintf(h2d, sizeof h2d, g.csv ? "%.6g" : "%.3g", r->h2d_gbps);
            if (isnan(r->d2h_gbps)) snprintf(d2h, sizeof d2h, "%s", none);
            else snprintf(d2h, sizeof d2h, "%.6g", r->d2h_gbps);
            if (isnan(r->copy_hidden_fraction)) snprintf(hid, sizeof hid, "%s", none);
            else if (g.csv) snprintf(hid, sizeof hid, "%.6g", r->copy_hidden_fraction);
            else snprintf(hid, sizeof hid, "%.0f%%", 100.0 * r->copy_hidden_fraction);
            if (g.csv)
                printf("%lld%s%s%s%.9g%s%s%s%.9g%s%.1f%s%.9g%s%s%s%s%s%s%s%s%s%s%s%s\n",
                       (long long)r->step, sep, phase_str_(r->phase), sep, r->train_loss, sep,
                       vl, sep, r->lr, sep, r->tokens_per_s, sep, r->grad_norm, sep, res, sep,
                       off, sep, pk, sep, h2d, sep, d2h, sep, hid);
            else
                printf("%6lld %-6s %-12.9g %-12s %-12.6g %-10.0f %-10.6g %-7s %-10s %-8s %s\n",
                       (long long)r->step, phase_str_(r->phase), r->train_loss, vl, r->lr,
                       r->tokens_per_s, r->grad_norm, off, pk, h2d, hid);
        }
    }
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

/* The memory plan is computed here from the spec, like m6d would at submit:
 * no daemon needed. */
/* plan --daemon: m6d plans the spec and adds its own host checks. */
static int plan_on_daemon_(const char *path)
{
    char *buf = read_spec_(path);
    if (!buf) return EXIT_ERR;
    M6__PlanQuery q = M6__PLAN_QUERY__INIT;
    q.spec_json = buf;
    q.device_memory = g.device_memory;
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = M6__REQUEST__BODY_PLAN;
    rq.plan = &q;
    M6__Response *resp = request_(&rq);
    free(buf);
    if (!resp) return EXIT_ERR;
    if (resp->body_case != M6__RESPONSE__BODY_PLAN) {
        errf_("m6d sent no plan");
        m6__response__free_unpacked(resp, NULL);
        return EXIT_ERR;
    }
    if (resp->plan->warning && *resp->plan->warning)
        errf_("warning: %s", resp->plan->warning);
    fputs(g.json ? resp->plan->plan_json : resp->plan->plan_text, stdout);
    fflush(stdout);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_plan_(int argc, char **argv)
{
    if (g.plan_daemon) return plan_on_daemon_(argv[0]);
    run_spec spec;
    char err[1024];
    if (spec_load_file(&spec, argv[0], err, sizeof err) != 0) {
        errf_("%s", err);
        return EXIT_ERR;
    }
    offload_plan plan;
    int rc = offload_plan_for_spec(&spec, g.device_memory, &plan, err, sizeof err);
    if (rc != 0) {
        errf_("%s", err);
    } else {
        offload_plan_print(stdout, &plan, g.json);
        fflush(stdout);
    }
    offload_plan_free(&plan);
    return rc == 0 ? EXIT_OK : EXIT_ERR;
}

static void progress_(const char *file, size_t bytes, void *ud)
{
    size_t *count = ud;
    (*count)++;
    fprintf(stderr, "  [%zu] %s (%zu bytes)\n", *count, file, bytes);
}

static volatile sig_atomic_t prepare_signal_seen_;

static void prepare_signal_(int sig)
{
    prepare_signal_seen_ = sig;
    data_prepare_interrupt();
}

static int cmd_data_(int argc, char **argv)
{
    if (strcmp(argv[0], "prepare") != 0) {
        errf_("data: unknown action \"%s\" (want: prepare)", argv[0]);
        return EXIT_USAGE;
    }
    if (!g.out_dir[0]) {
        errf_("data prepare: --out DIR is required");
        return EXIT_USAGE;
    }
    if (argc < 2) {
        errf_("data prepare: no input FILES");
        return EXIT_USAGE;
    }
    prepare_stats st;
    size_t count = 0;
    char err[1024];
    fprintf(stderr, "preparing shards in %s (val fraction %.3g)\n", g.out_dir, g.val_fraction);
    /* Ctrl-C or SIGTERM: stop and remove this run's shards (no partial
     * corpus left for a train_*.bin glob to pick up). */
    struct sigaction sa = {.sa_handler = prepare_signal_};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);  /* a closed terminal or ssh session */
    if (data_prepare(g.out_dir, (const char *const *)argv + 1, argc - 1, g.val_fraction,
                     (size_t)g.shard_tokens, &st, progress_, &count, err, sizeof err) < 0) {
        errf_("%s", err);
        if (prepare_signal_seen_) {
            errf_("stopped by signal %d; the shards written so far were removed",
                  (int)prepare_signal_seen_);
            return 128 + (int)prepare_signal_seen_;
        }
        return EXIT_ERR;
    }
    if (g.json) {
        json_t *o = json_object();
        json_object_set_new(o, "files", json_integer((json_int_t)st.files));
        json_object_set_new(o, "skipped", json_integer((json_int_t)st.skipped));
        json_object_set_new(o, "binary", json_integer((json_int_t)st.binary));
        json_object_set_new(o, "special", json_integer((json_int_t)st.special));
        json_object_set_new(o, "duplicates", json_integer((json_int_t)st.duplicates));
        json_object_set_new(o, "train_tokens", json_integer((json_int_t)st.train_tokens));
        json_object_set_new(o, "val_tokens", json_integer((json_int_t)st.val_tokens));
        json_object_set_new(o, "train_shards", json_integer((json_int_t)st.train_shards));
        json_object_set_new(o, "val_shards", json_integer((json_int_t)st.val_shards));
        print_json_(o);
    } else {
        /* What was read and written, then what was not read and why: a
         * corpus such as fortunes holds as many binary indexes (.dat) and
         * symlinks (.u8) as text files. */
        printf("%zu text file%s read: %zu train tokens in %zu shard%s, %zu val tokens "
               "in %zu shard%s\n", st.files, st.files == 1 ? "" : "s", st.train_tokens,
               st.train_shards, st.train_shards == 1 ? "" : "s", st.val_tokens,
               st.val_shards, st.val_shards == 1 ? "" : "s");
        const char *sep = "not read: ";
        if (st.binary) {
            printf("%s%zu binary file%s (a NUL byte in the first 8 KiB, such as %s)", sep,
                   st.binary, st.binary == 1 ? "" : "s", st.binary_example);
            sep = ", ";
        }
        if (st.special) {
            printf("%s%zu special file%s (fifo, socket, device or dangling symlink)", sep,
                   st.special, st.special == 1 ? "" : "s");
            sep = ", ";
        }
        if (st.duplicates) {
            printf("%s%zu duplicate%s (a symlink, hard link or repeated path to a file "
                   "already read)", sep, st.duplicates, st.duplicates == 1 ? "" : "s");
            sep = ", ";
        }
        if (sep[0] == ',') printf("\n");  /* something was listed */
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------- table */

enum { F_JSON = 1, F_CSV = 2, F_PREPARE = 4, F_WATCH = 8, F_PLAN = 16,
       F_RUN = 32 /* the first argument is a RUN: checked before dispatch */ };

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    int min_args, max_args;  /* positional; -1 no limit */
    int flags;
    const char *usage, *help;
} command;

/* A run's events, oldest first, fetched in pages (m6d sends at most 10000
 * per reply) until one comes back empty. */
static int cmd_events_(int argc, char **argv)
{
    (void)argc;
    M6__RunRef ref;
    if (parse_run_(argv[0], &ref) < 0) return EXIT_ERR;  /* checked in main */
    json_t *all = g.json ? json_array() : NULL;
    int64_t after = 0;
    int header = !g.json; /* printed once m6d has answered */
    for (;;) {
        M6__EventsQuery q = M6__EVENTS_QUERY__INIT;
        q.run = &ref;
        q.after_id = after;
        M6__Request rq = M6__REQUEST__INIT;
        rq.body_case = M6__REQUEST__BODY_EVENTS;
        rq.events = &q;
        M6__Response *resp = request_(&rq);
        if (!resp) {
            json_decref(all);
            return EXIT_ERR;
        }
        const M6__EventRows *er = resp->events;
        size_t n = er ? er->n_events : 0;
        if (header) {
            printf("%-20s %-16s %s\n", "TIME (UTC)", "KIND", "DETAIL");
            header = 0;
        }
        for (size_t i = 0; i < n; i++) {
            const M6__Event *e = er->events[i];
            after = e->id;
            if (g.json) {
                json_t *o = json_object();
                json_object_set_new(o, "id", json_integer(e->id));
                json_object_set_new(o, "time", json_real(e->time));
                json_object_set_new(o, "kind", json_string(e->kind));
                json_object_set_new(o, "detail", json_string(e->detail));
                json_array_append_new(all, o);
                continue;
            }
            char when[32] = "?";
            time_t t = (time_t)e->time;
            struct tm tm;
            if (gmtime_r(&t, &tm))
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
            printf("%-20s %-16s %s\n", when, e->kind, e->detail);
        }
        m6__response__free_unpacked(resp, NULL);
        if (n == 0) break;
    }
    if (g.json) print_json_(all);
    return EXIT_OK;
}

static const command commands_[] = {
    {"submit", cmd_submit_, 1, 1, F_JSON, "SPEC",
     "Submit a run spec (JSON file, - for stdin); prints the run id.\n"
     "Relative data.train/data.val globs are relative to the spec file\n"
     "(to the current directory for -)."},
    {"list", cmd_list_, 0, 0, F_JSON, "", "List runs."},
    {"status", cmd_status_, 1, 1, F_JSON | F_RUN, "RUN", "Show one run."},
    {"watch", cmd_watch_, 1, 1, F_JSON | F_RUN | F_WATCH, "RUN",
     "Follow a run until it ends; rides out m6d restarts.\n"
     "Exit 0 completed, 1 failed, 3 stopped, 4 m6d unreachable for longer\n"
     "than --reconnect."},
    {"pause", cmd_pause_, 1, 1, F_JSON | F_RUN, "RUN", "Pause at the next step boundary (checkpoints)."},
    {"resume", cmd_resume_, 1, 1, F_JSON | F_RUN, "RUN", "Resume a paused run."},
    {"delink", cmd_delink_, 1, 1, F_JSON | F_RUN, "RUN",
     "Delink now (at the next step boundary), before the spec's pseudo.steps."},
    {"stop", cmd_stop_, 1, 1, F_JSON | F_RUN, "RUN", "Stop a run (checkpoints) or dequeue it."},
    {"metrics", cmd_metrics_, 1, 1, F_JSON | F_RUN | F_CSV, "RUN", "Loss curve, one row per step."},
    {"events", cmd_events_, 1, 1, F_JSON | F_RUN, "RUN",
     "What happened to a run, oldest first: submit, start, delink, pause,\n"
     "paused.error (and why), resume, checkpoint.bad, interrupted, stop, ..."},
    {"data", cmd_data_, 1, -1, F_JSON | F_PREPARE,
     "prepare --out DIR [--val-fraction F] [--shard-tokens N] FILES...",
     "Turn text files into byte-level token shards (no daemon needed)."},
    {"plan", cmd_plan_, 1, 1, F_JSON | F_PLAN, "SPEC [--device-memory SIZE] [--daemon]",
     "Memory plan of a spec: what is resident, what is offloaded.\n"
     "Computed here, no daemon needed; --daemon asks m6d, which also checks\n"
     "its own host memory and pinned-memory limit.\n"
     "Resident and offloaded slots, peak device bytes, host<->device bytes per\n"
     "step and the minimum budget with every slot offloaded."},
};
#define N_COMMANDS (sizeof commands_ / sizeof commands_[0])

static void usage_(FILE *f)
{
    fprintf(f, "usage: m6ctl [--socket PATH] [--json] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *h = commands_[i].help;  /* first line only */
        int n = (int)strcspn(h, "\n");
        fprintf(f, "  %-8s %-10s %.*s\n", commands_[i].name,
                strlen(commands_[i].usage) <= 10 ? commands_[i].usage : "...", n, h);
    }
    fprintf(f, "\nRUN is a run id (or a unique name). Socket: --socket, $M6_SOCKET, or the\n"
               "default of m6d. 'm6ctl COMMAND --help' for details.\n"
               "Options for every command: --socket PATH, --no-color (or NO_COLOR=1),\n"
               "--help. Exit status: 0 ok; 1 error (refused by m6d, an unknown RUN\n"
               "included, or a local failure; the message is on stderr) or the watched\n"
               "run failed; 2 usage (a malformed RUN such as 0 included); 3 the watched\n"
               "run was stopped; 4 m6d unreachable.\n");
}

static void command_usage_(FILE *f, const command *c)
{
    fprintf(f, "usage: m6ctl %s%s%s\n%s\n\noptions:\n", c->name,
            c->usage[0] ? " " : "", c->usage, c->help);
    if (c->flags & F_JSON) fprintf(f, "  --json            machine-readable output\n");
    if (c->flags & F_CSV) fprintf(f, "  --csv             comma-separated output\n");
    if (c->flags & F_WATCH)
        fprintf(f, "  --interval SEC    poll period (default 0.5)\n"
                   "  --reconnect SEC   keep retrying an unreachable m6d this long\n"
                   "                    (default 60; 0: give up at once)\n");
    if (c->flags & F_PLAN)
        fprintf(f, "  --device-memory SIZE\n"
                   "                    device memory budget, e.g. 8GiB (default: the\n"
                   "                    spec's device.memory_budget)\n"
                   "  --daemon          let m6d plan it (its MemAvailable and\n"
                   "                    RLIMIT_MEMLOCK, not this shell's)\n");
    if (c->flags & F_PREPARE)
        fprintf(f, "  --out DIR         where to write the shards (required)\n"
                   "  --val-fraction F  share of each file for validation, 0..0.5 (default 0.1)\n"
                   "  --shard-tokens N  tokens per shard, a whole number in 1024..2147483647\n"
                   "                    (default 100000000)\n");
    fprintf(f, "  --socket PATH     m6d's control socket\n"
               "  --no-color        no colour (also NO_COLOR=1; none off a tty)\n"
               "  --help            this text\n");
}

/* The one parser of numeric options: a plain decimal number (digits, an
 * optional fraction and exponent; no sign, hex, inf, nan or blanks, which
 * strtod alone would take), within [lo, hi], a whole number if whole.
 * Errors name the option and what it wants. */
static int parse_number_(const char *opt, const char *s, double lo, double hi, int whole,
                         double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    int plain = ((*s >= '0' && *s <= '9') || *s == '.') &&
                strspn(s, "0123456789.eE+-") == strlen(s);
    if (!plain || *end || errno == ERANGE || !(v >= lo && v <= hi) ||
        (whole && v != floor(v))) {
        if (whole)
            errf_("%s: want a whole number in [%.0f, %.0f], got \"%s\"", opt, lo, hi, s);
        else
            errf_("%s: want a number in [%g, %g], got \"%s\"", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* `m6ctl help --markdown [commands|spec-keys]` (hidden, for
 * docs/gen-tables.sh): README.md's table of the commands above, or the spec
 * key table of spec.c (spec_keys_markdown). Help text is joined into one
 * line; '|' and '<' are escaped for Markdown. Returns the exit status. */
static int markdown_tables_(const char *which)
{
    if (strcmp(which, "spec-keys") == 0)
        return spec_keys_markdown(stdout) == 0 ? EXIT_OK : EXIT_ERR;
    if (strcmp(which, "commands") != 0) {
        errf_("help --markdown: want commands or spec-keys, got \"%s\"", which);
        return EXIT_USAGE;
    }
    printf("| command | options | what it does |\n|---|---|---|\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const command *c = &commands_[i];
        printf("| `%s%s%s` | ", c->name, c->usage[0] ? " " : "", c->usage);
        /* F_PLAN's and F_PREPARE's options are in their usage already */
        const char *opt[] = {
            (c->flags & F_JSON) ? "`--json`" : NULL,
            (c->flags & F_CSV) ? "`--csv`" : NULL,
            (c->flags & F_WATCH) ? "`--interval SEC`, `--reconnect SEC`" : NULL,
        };
        int any = 0;
        for (size_t j = 0; j < sizeof opt / sizeof opt[0]; j++)
            if (opt[j]) printf("%s%s", any++ ? ", " : "", opt[j]);
        printf(" | ");
        for (const char *p = c->help; *p; p++) {
            if (*p == '\n') putchar(' ');
            else if (*p == '|') fputs("\\|", stdout);
            else if (*p == '<') fputs("&lt;", stdout);
            else putchar(*p);
        }
        printf(" |\n");
    }
    return ferror(stdout) ? EXIT_ERR : EXIT_OK;
}

int main(int argc, char **argv)
{
    enum { O_SOCKET = 256, O_JSON, O_CSV, O_OUT, O_VALF, O_SHARD, O_INTERVAL, O_HELP, O_VERSION, O_NOCOLOR, O_DEVMEM, O_RECONNECT, O_DAEMON };
    static const struct option opts[] = {
        {"socket", required_argument, 0, O_SOCKET}, {"json", no_argument, 0, O_JSON},
        {"csv", no_argument, 0, O_CSV}, {"out", required_argument, 0, O_OUT},
        {"val-fraction", required_argument, 0, O_VALF},
        {"shard-tokens", required_argument, 0, O_SHARD},
        {"interval", required_argument, 0, O_INTERVAL}, {"help", no_argument, 0, O_HELP},
        {"version", no_argument, 0, O_VERSION}, {"no-color", no_argument, 0, O_NOCOLOR},
        {"device-memory", required_argument, 0, O_DEVMEM},
        {"reconnect", required_argument, 0, O_RECONNECT},
        {"daemon", no_argument, 0, O_DAEMON},
        {0, 0, 0, 0},
    };
    argv[0] = (char *)"m6ctl";  /* getopt's own messages */
    if (argc >= 3 && argc <= 4 && strcmp(argv[1], "help") == 0 &&
        strcmp(argv[2], "--markdown") == 0)
        return markdown_tables_(argc == 4 ? argv[3] : "commands");
    /* A daemon that stops mid-watch must give an error, not kill us. */
    signal(SIGPIPE, SIG_IGN);
    int nocolor = getenv("NO_COLOR") != NULL;
    if (paths_client_socket(g.socket, sizeof g.socket) < 0) g.socket[0] = 0;

    /* Pass 1: global options up to the command name. */
    const command *cmd = NULL;
    int help = 0;
    int ch;
    opterr = 1;
    while ((ch = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (ch) {
        case O_SOCKET: snprintf(g.socket, sizeof g.socket, "%s", optarg); break;
        case O_JSON: g.json = 1; break;
        case O_NOCOLOR: nocolor = 1; break;
        case 'h': case O_HELP: help = 1; break;
        case O_VERSION: printf("m6ctl %s (protocol %u)\n", M6_VERSION, M6_PROTOCOL_VERSION); return 0;
        default: usage_(stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        if (!help) errf_("no command given");
        usage_(help ? stdout : stderr);
        return help ? EXIT_OK : EXIT_USAGE;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[optind], commands_[i].name) == 0) cmd = &commands_[i];
    if (!cmd) {
        errf_("unknown command \"%s\"", argv[optind]);
        usage_(stderr);
        return EXIT_USAGE;
    }
    /* Pass 2: the command's options, anywhere among its arguments. */
    int cargc = argc - optind;
    char **cargv = argv + optind;
    cargv[0] = (char *)"m6ctl";  /* getopt's messages name m6ctl */
    optind = 0;  /* glibc: 0 re-initialises getopt for the new argv */
    while ((ch = getopt_long(cargc, cargv, "h", opts, NULL)) != -1) {
        int ok = 1;
        switch (ch) {
        case O_SOCKET: snprintf(g.socket, sizeof g.socket, "%s", optarg); break;
        case O_JSON: ok = cmd->flags & F_JSON; g.json = 1; break;
        case O_CSV: ok = cmd->flags & F_CSV; g.csv = 1; break;
        case O_NOCOLOR: nocolor = 1; break;
        case O_OUT: ok = cmd->flags & F_PREPARE; snprintf(g.out_dir, sizeof g.out_dir, "%s", optarg); break;
        case O_VALF:
            ok = cmd->flags & F_PREPARE;
            if (ok && parse_number_("--val-fraction", optarg, 0, 0.5, 0, &g.val_fraction) < 0) return EXIT_USAGE;
            break;
        case O_SHARD: {
            /* a shard's header counts its tokens in an int32 */
            double v = 0;
            ok = cmd->flags & F_PREPARE;
            if (ok && parse_number_("--shard-tokens", optarg, 1024, INT32_MAX, 1, &v) < 0)
                return EXIT_USAGE;
            g.shard_tokens = (long)v;
            break;
        }
        case O_DAEMON: ok = cmd->flags & F_PLAN; g.plan_daemon = 1; break;
        case O_RECONNECT:
            ok = cmd->flags & F_WATCH;
            if (ok && parse_number_("--reconnect", optarg, 0, 86400, 0, &g.reconnect) < 0) return EXIT_USAGE;
            break;
        case O_INTERVAL:
            ok = cmd->flags & F_WATCH;
            if (ok && parse_number_("--interval", optarg, 0.05, 60, 0, &g.interval) < 0) return EXIT_USAGE;
            break;
        case O_DEVMEM:
            ok = cmd->flags & F_PLAN;
            if (ok) {
                int rc = spec_parse_size(optarg, &g.device_memory);
                if (rc == -2) {
                    errf_("--device-memory: \"%s\" is too large", optarg);
                    return EXIT_USAGE;
                }
                if (rc != 0 || g.device_memory == 0) {
                    errf_("--device-memory: want a size above 0 such as 8GiB "
                          "or 512MiB (units " SPEC_SIZE_UNITS "), got \"%s\"",
                          optarg);
                    return EXIT_USAGE;
                }
            }
            break;
        case 'h': case O_HELP: help = 1; break;
        default: command_usage_(stderr, cmd); return EXIT_USAGE;
        }
        if (!ok) {
            errf_("%s: option %s does not apply", cmd->name, cargv[optind - 1]);
            return EXIT_USAGE;
        }
    }
    if (help) {
        command_usage_(stdout, cmd);
        return EXIT_OK;
    }
    int npos = cargc - optind;
    if (npos < cmd->min_args || (cmd->max_args >= 0 && npos > cmd->max_args)) {
        errf_("%s: wrong number of arguments", cmd->name);
        command_usage_(stderr, cmd);
        return EXIT_USAGE;
    }
    if (g.json && g.csv) {
        errf_("%s: --json and --csv exclude each other", cmd->name);
        return EXIT_USAGE;
    }
    /* A malformed RUN (0, -1, an overflowing id) is a usage error for every
     * command alike; a RUN m6d does not know is its refusal (exit 1). */
    M6__RunRef ref;
    if ((cmd->flags & F_RUN) && parse_run_(cargv[optind], &ref) < 0) return EXIT_USAGE;
    g.color = !nocolor && !g.json && isatty(STDOUT_FILENO);
    int rc = cmd->fn(npos, cargv + optind);
    if (g.fd >= 0) close(g.fd);
    if (rc == EXIT_ERR && g.transport_err) rc = EXIT_UNREACHABLE;
    return rc;
}
