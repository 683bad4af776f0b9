/*
 * m6ctl.c — the operator's CLI for m6d. Table-driven: every subcommand is one
 * {name, handler, flags, usage, help} row; what it prints is one field table
 * per view (proto/views.c), rendered as text, --json or --csv by
 * common/view.c; colour only on a tty; the exit code tells the truth (0 ok,
 * 1 error or run failed, 2 usage, 3 run stopped, 4 m6d unreachable). Here:
 * the table, the connection and the plain commands; watch, plan and
 * export/import/plot are m6ctl_watch.c, m6ctl_plan.c and m6ctl_export.c
 * (m6ctl_internal.h: what they share).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/durable.h"
#include "common/paths.h"
#include "proto/frame.h"
#include "m6.pb-c.h"
#include "offload/offload.h"
#include "offload/plan_p2r.h"
#include "client/export.h"
#include "client/plot.h"
#include "spec/spec.h"
#include "eta.h"
#include "proto/views.h"
#include "client/m6ctl_internal.h"

/* ----------------------------------------------------------------- globals */

m6ctl_opts g = {.steps_ratio = -1, .scratch_steps = -1, .pseudo_lr_scale = -1,
       .export_step = -1, .format = "hf-gpt2", .fd = -1, .interval = 0.5, .reconnect = 60, .val_fraction = 0.1};

/* End watch's progress line (a tty's \r-redrawn bar), if one is open. */
void m6ctl_end_bar_(void)
{
    if (!g.bar_open) return;
    fputc('\n', stdout);
    fflush(stdout);
    g.bar_open = 0;
}

static void verrf_(const char *fmt, va_list ap)
{
    m6ctl_end_bar_();
    fputs("m6ctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void m6ctl_errf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf_(fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ client */

/* Longest wait for an answer (not for submit): m6d answers in milliseconds
 * even mid-step, so silence this long means a hung or stopped m6d. Except
 * while another process locks m6.db: a command's durable write then waits
 * up to 30 s (daemon/state/state.c WAIT_MAX_S) before m6d answers it, so
 * this is longer, or m6ctl would report a failure for a command m6d goes
 * on to acknowledge and apply. */
enum { RECV_TIMEOUT_S = 45 };

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
        m6ctl_errf_("request too large");
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
            if (!resp) m6ctl_errf_("malformed response from m6d");
            break;
        }
        if (fr == FRAME_TOO_LARGE) {
            m6ctl_errf_("response of %zu bytes exceeds the frame limit", plen);
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
            m6ctl_errf_("out of memory");
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
        m6ctl_errf_("socket path too long: %s", g.socket);
        return -1;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.socket);
    g.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g.fd < 0 || connect(g.fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        struct stat st;
        if (stat(g.socket, &st) == 0 && !S_ISSOCK(st.st_mode))
            transport_fail_("cannot reach m6d at %s: not a socket (a %s; "
                            "--socket or M6_SOCKET choose m6d's socket)",
                            g.socket, S_ISDIR(st.st_mode) ? "directory"
                                      : S_ISREG(st.st_mode) ? "regular file"
                                                            : "file");
        else
            transport_fail_("cannot reach m6d at %s: %s (is m6d running? "
                            "--socket or M6_SOCKET choose another socket)",
                            g.socket, strerror(e));
        return -1;
    }
    struct timeval tv = {.tv_sec = RECV_TIMEOUT_S};
    setsockopt(g.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    M6__Hello hello = M6__HELLO__INIT;
    hello.protocol_version = M6_PROTOCOL_VERSION;
    hello.client = (char *)"m6ctl " M6_VERSION;
    M6__Request rq = frame_request(M6__REQUEST__BODY_HELLO, &hello.base);
    M6__Response *resp = call_(&rq);
    if (!resp) return -1;
    g.transport_err = 0;
    int ok = resp->status == M6__STATUS__STATUS_OK;
    if (!ok) m6ctl_errf_("%s", resp->message);
    m6__response__free_unpacked(resp, NULL);
    return ok ? 0 : -1;
}

/* Connect if needed, send, and check the status: NULL (message printed) if
 * the daemon refused. */
M6__Response *m6ctl_request_(M6__Request *rq)
{
    if (g.fd < 0 && connect_() < 0) return NULL;
    M6__Response *resp = call_(rq);
    if (resp && resp->status != M6__STATUS__STATUS_OK) {
        m6ctl_errf_("%s", resp->message && *resp->message ? resp->message
                                                    : "request refused");
        m6__response__free_unpacked(resp, NULL);
        return NULL;
    }
    return resp;
}

M6__Response *m6ctl_ask_(M6__Request__BodyCase which, ProtobufCMessage *body)
{
    M6__Request rq = frame_request(which, body);
    return m6ctl_request_(&rq);
}

/* RUN: a numeric id, or a name. */
int m6ctl_parse_run_(const char *arg, M6__RunRef *ref)
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
    m6ctl_errf_("RUN must be an id > 0 or a run name, got \"%s\"", arg);
    return -1;
}

/* --------------------------------------------------------------- rendering */

/* The forms of the views (views.h) that the options ask for. */

/* The output form of the run views: --json (one object, or one line each
 * for watch), else text (form). */
view_out m6ctl_run_out_(view_form text_form, int lines)
{
    view_out o = {.f = stdout, .v = &views_run, .color = g.color, .form = text_form};
    if (g.json) o.form = lines ? VIEW_JSON_LINES : VIEW_JSON_OBJECT;
    return o;
}

static void print_run_(const M6__RunInfo *r, const char *message)
{
    views_run_row row = {.r = r, .message = message, .watch_eta = -1};
    view_out o = m6ctl_run_out_(VIEW_RECORDS, 0);
    view_begin(&o);
    view_row(&o, &row);
    view_end(&o);
}

void m6ctl_print_one_(const view *v, const void *row)
{
    view_out o = {.f = stdout, .v = v, .form = g.json ? VIEW_JSON_OBJECT : VIEW_LINE};
    view_row(&o, row);
    if (!g.json) fputc('\n', stdout);
}

/* The form of a stream of rows: --json, --csv or a text table. */
static view_out rows_out_(const view *v)
{
    view_out o = {.f = stdout, .v = v, .color = g.color, .form = VIEW_TABLE};
    if (g.json) o.form = VIEW_JSON_ARRAY;
    else if (g.csv) o.form = VIEW_CSV;
    return o;
}

/* ---------------------------------------------------------------- commands */

M6__Response *m6ctl_run_request_(M6__Request__BodyCase which, const char *arg)
{
    M6__RunRef ref;
    if (m6ctl_parse_run_(arg, &ref) < 0) return NULL;
    return m6ctl_ask_(which, &ref.base);
}

M6__Response *m6ctl_metrics_page_(M6__RunRef *ref, int64_t after_step,
                                  int limit)
{
    M6__MetricsQuery q = M6__METRICS_QUERY__INIT;
    q.run = ref;
    q.after_step = after_step;
    q.limit = limit;
    return m6ctl_ask_(M6__REQUEST__BODY_METRICS, &q.base);
}

/* Relative data globs (and init.from) in a spec are relative to the spec file's directory
 * (the current one for a spec on stdin; the daemon runs elsewhere): rewrite
 * them as absolute paths. A spec that does not parse (duplicate keys
 * included) is sent as it is, for the daemon to explain. Returns the
 * text to send (buf itself, or a new malloc'd string; buf then freed). */
static char *resolve_data_paths_(char *buf, const char *path)
{
    json_t *root = json_loads(buf, JSON_REJECT_DUPLICATES, NULL);
    json_t *data = root ? json_object_get(root, "data") : NULL;
    json_t *init = root ? json_object_get(root, "init") : NULL;  /* init.from */
    if (!json_is_object(data) && !json_is_object(init)) {
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
    const char *keys[] = {"train", "val", "from"};
    for (int i = 0; i < 3; i++) {
        json_t *sec = i < 2 ? data : init;
        json_t *v = json_is_object(sec) ? json_object_get(sec, keys[i]) : NULL;
        const char *g0 = json_string_value(v);
        if (!g0 || !g0[0] || g0[0] == '/')
            continue;
        size_t len = strlen(dir) + strlen(g0) + 2;
        char *abs = malloc(len);
        snprintf(abs, len, "%s/%s", dir, g0);
        json_object_set_new(sec, keys[i], json_string(abs));
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
char *m6ctl_read_spec_(const char *path)
{
    FILE *f = stdin;
    if (strcmp(path, "-") != 0) {
        /* a FIFO (or a device) is refused, as m6d refuses one: reading it
         * would wait for a writer forever */
        char err[PATH_MAX + 128];
        int fd = open_regular(path, 0, NULL, err, sizeof err);
        if (fd < 0 || !(f = fdopen(fd, "rb"))) {
            if (fd >= 0) close(fd);
            m6ctl_errf_("%s", fd < 0 ? err : strerror(errno));
            return NULL;
        }
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            if (cap >= (8u << 20)) {
                m6ctl_errf_("%s: spec larger than 8 MiB", path);
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
        m6ctl_errf_("%s: %s", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    if (f != stdin) fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (buf[strspn(buf, " \t\r\n")] == 0) {
        m6ctl_errf_("%s: %s, want a JSON run spec", path, n ? "only blanks" : "empty");
        free(buf);
        return NULL;
    }
    return resolve_data_paths_(buf, path);
}

static int cmd_submit_(int argc, char **argv)
{
    const char *path = argv[0];
    char *buf = m6ctl_read_spec_(path);
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
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_SUBMIT, &sub.base);
    free(buf);
    if (!resp) return EXIT_ERR;
    m6ctl_print_one_(&views_submit, resp->submit);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_list_(int argc, char **argv)
{
    M6__ListRuns lr = M6__LIST_RUNS__INIT;
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_LIST, &lr.base);
    if (!resp) return EXIT_ERR;
    M6__RunList *l = resp->list;
    view_out o = m6ctl_run_out_(VIEW_TABLE, 0);
    if (g.json) o.form = VIEW_JSON_ARRAY;
    view_begin(&o);
    for (size_t i = 0; l && i < l->n_runs; i++) {
        views_run_row row = {.r = l->runs[i], .watch_eta = -1};
        view_row(&o, &row);
    }
    view_end(&o);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int cmd_status_(int argc, char **argv)
{
    M6__Response *resp = m6ctl_run_request_(M6__REQUEST__BODY_STATUS, argv[0]);
    if (!resp) return EXIT_ERR;
    print_run_(resp->run, NULL);
    if (!g.json && resp->run && resp->run->n_ranks > 0) {
        /* a run of several ranks: where each stands */
        printf("ranks:\n");
        view_out o = {.f = stdout, .v = &views_ranks, .color = g.color,
                      .form = VIEW_TABLE};
        view_begin(&o);
        for (size_t i = 0; i < resp->run->n_ranks; i++)
            view_row(&o, resp->run->ranks[i]);
        view_end(&o);
    }
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

/* A command on one run (msg: its RunRef, or a request holding one), its
 * answer printed. */
static int command_ref_(M6__Request__BodyCase which, ProtobufCMessage *msg)
{
    M6__Response *resp = m6ctl_ask_(which, msg);
    if (!resp) return EXIT_ERR;
    if (g.json) print_run_(resp->run, resp->message);
    else printf("%s\n", resp->message);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static int command_(M6__Request__BodyCase which, const char *arg)
{
    M6__RunRef ref;
    if (m6ctl_parse_run_(arg, &ref) < 0) return EXIT_ERR;
    return command_ref_(which, &ref.base);
}

static int cmd_pause_(int argc, char **argv) { return command_(M6__REQUEST__BODY_PAUSE, argv[0]); }
/* resume RUN: --from-scratch for a run whose checkpoints are gone; or
 * with --world-size N [--expert-parallel P] and/or --memory-budget a
 * resume at that layout or budget (ResumeAt) */
static int cmd_resume_(int argc, char **argv)
{
    (void)argc;
    if (!g.world_size && g.expert_parallel) {
        m6ctl_errf_("--expert-parallel: needs --world-size");
        return EXIT_USAGE;
    }
    if ((g.world_size || g.memory_budget) && g.from_scratch) {
        m6ctl_errf_("--from-scratch starts the run over at its own layout "
                    "and budget: leave out --world-size and --memory-budget");
        return EXIT_USAGE;
    }
    M6__RunRef ref;
    if (m6ctl_parse_run_(argv[0], &ref) < 0) return EXIT_ERR;
    ref.from_scratch = g.from_scratch;
    if (!g.world_size && !g.memory_budget)
        return command_ref_(M6__REQUEST__BODY_RESUME, &ref.base);
    M6__ResumeAt q = M6__RESUME_AT__INIT;
    q.run = &ref;
    q.world_size = g.world_size;
    q.expert_parallel = g.expert_parallel;
    q.memory_budget = g.memory_budget;
    return command_ref_(M6__REQUEST__BODY_RESUME_AT, &q.base);
}
static int cmd_delink_(int argc, char **argv) { return command_(M6__REQUEST__BODY_DELINK, argv[0]); }
static int cmd_stop_(int argc, char **argv) { return command_(M6__REQUEST__BODY_STOP, argv[0]); }

/* Rows per metrics page m6ctl asks for: small pages keep each of m6d's
 * reads (on its thread pool, under the state database's lock) short. */
enum { METRICS_PAGE_ = 2000 };

/* A run's metrics, every row, streamed page by page (after_step = the last
 * step received, while m6d says more follow). */
static int cmd_metrics_(int argc, char **argv)
{
    M6__RunRef ref;
    if (m6ctl_parse_run_(argv[0], &ref) < 0) return EXIT_ERR;  /* checked in main */
    view_out o = rows_out_(&views_metrics);
    int64_t after = 0;
    for (int started = 0;;) {
        M6__Response *resp = m6ctl_metrics_page_(&ref, after, METRICS_PAGE_);
        if (!resp) return EXIT_ERR;
        const M6__MetricRows *m = resp->metrics;
        if (!started) {  /* once m6d has answered */
            /* an MoE run's rows carry router figures (NaN for a dense
             * run, 0 from an m6d without them): their own columns */
            if (m && m->n_rows && m->rows[0]->moe_aux_loss > 0)
                o = rows_out_(&views_metrics_moe);
            view_begin(&o);
        }
        started = 1;
        size_t n = m ? m->n_rows : 0;
        for (size_t i = 0; i < n; i++) view_row(&o, m->rows[i]);
        if (n) after = m->rows[n - 1]->step;
        int more = n && m->more;
        m6__response__free_unpacked(resp, NULL);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            /* a reader that went away (| head) had what it wanted: stop
             * asking, quietly; a full disk is an error */
            if (errno == EPIPE) return EXIT_OK;
            m6ctl_errf_("writing the rows: %s", strerror(errno));
            return EXIT_ERR;
        }
        if (!more) break;
    }
    view_end(&o);
    return EXIT_OK;
}

/* ------------------------------------------------------------------- table */

enum { F_JSON = 1, F_CSV = 2, F_PREPARE = 4, F_WATCH = 8, F_PLAN = 16,
       F_RUN = 32 /* the first argument is a RUN: checked before dispatch */,
       F_EXPORT = 64, F_IMPORT = 128, F_PLOT = 256 /* export's options */,
       F_RESUME = 512 /* resume's layout, --from-scratch */ };

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
    if (m6ctl_parse_run_(argv[0], &ref) < 0) return EXIT_ERR;  /* checked in main */
    view_out o = rows_out_(&views_events);
    int64_t after = 0;
    for (int started = 0;;) {
        M6__EventsQuery q = M6__EVENTS_QUERY__INIT;
        q.run = &ref;
        q.after_id = after;
        M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_EVENTS, &q.base);
        if (!resp) return EXIT_ERR;
        const M6__EventRows *er = resp->events;
        size_t n = er ? er->n_events : 0;
        if (!started) view_begin(&o);  /* once m6d has answered */
        started = 1;
        for (size_t i = 0; i < n; i++) view_row(&o, er->events[i]);
        if (n) after = er->events[n - 1]->id;
        m6__response__free_unpacked(resp, NULL);
        if (n == 0) break;
    }
    view_end(&o);
    return EXIT_OK;
}

/* A run's checkpoints as m6.db records them (one whose directory is gone
 * says so), oldest first: one CheckpointsQuery (the query export asks),
 * its list as a view. */
static int cmd_checkpoints_(int argc, char **argv)
{
    (void)argc;
    M6__RunRef ref;
    if (m6ctl_parse_run_(argv[0], &ref) < 0) return EXIT_ERR;  /* checked in main */
    M6__CheckpointsQuery q = M6__CHECKPOINTS_QUERY__INIT;
    q.run = &ref;
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_CHECKPOINTS, &q.base);
    if (!resp) return EXIT_ERR;
    view_out o = rows_out_(&views_checkpoints);
    view_begin(&o);
    const M6__CheckpointList *cl = resp->checkpoints;
    for (size_t i = 0; cl && i < cl->n_checkpoints; i++)
        view_row(&o, cl->checkpoints[i]);
    view_end(&o);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

/* The coordinator's nodes (issue 14): one NodesQuery. */
static int cmd_nodes_(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    M6__NodesQuery q = M6__NODES_QUERY__INIT;
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_NODES, &q.base);
    if (!resp) return EXIT_ERR;
    view_out o = rows_out_(&views_nodes);
    view_begin(&o);
    for (size_t i = 0; resp->nodes && i < resp->nodes->n_nodes; i++)
        view_row(&o, resp->nodes->nodes[i]);
    view_end(&o);
    m6__response__free_unpacked(resp, NULL);
    return EXIT_OK;
}

static const command commands_[] = {
    {"submit", cmd_submit_, 1, 1, F_JSON, "SPEC",
     "Submit a run spec (JSON file, - for stdin); prints the run id.\n"
     "Relative data.train/data.val globs and init.from are relative to the\n"
     "spec file (to the current directory for -)."},
    {"list", cmd_list_, 0, 0, F_JSON, "", "List runs."},
    {"status", cmd_status_, 1, 1, F_JSON | F_RUN, "RUN", "Show one run."},
    {"watch", cmd_watch_, 1, 1, F_JSON | F_RUN | F_WATCH, "RUN",
     "Follow a run until it ends; rides out m6d restarts.\n"
     "A pause is not an end: it says why and waits for the resume.\n"
     "Exit 0 completed, 1 failed, 3 stopped, 4 m6d unreachable for longer\n"
     "than --reconnect."},
    {"pause", cmd_pause_, 1, 1, F_JSON | F_RUN, "RUN", "Pause at the next step boundary (checkpoints)."},
    {"resume", cmd_resume_, 1, 1, F_JSON | F_RUN | F_RESUME,
     "RUN [--world-size N [--expert-parallel P]] [--memory-budget SIZE|none] "
     "| RUN --from-scratch",
     "Resume a paused run, at another layout or memory budget if asked.\n"
     "(That takes it up from its newest checkpoint.)\n"
     "A run paused because its checkpoint directories are gone resumes from\n"
     "them once they are back; --from-scratch trains it again from step 0\n"
     "instead, dropping its metrics rows (events say so)."},
    {"delink", cmd_delink_, 1, 1, F_JSON | F_RUN, "RUN",
     "Delink now (at the next step boundary), before the spec's pseudo.steps."},
    {"stop", cmd_stop_, 1, 1, F_JSON | F_RUN, "RUN", "Stop a run for good (a checkpoint first; `pause` to resume later), or dequeue it."},
    {"metrics", cmd_metrics_, 1, 1, F_JSON | F_RUN | F_CSV, "RUN", "Loss curve, one row per step."},
    {"checkpoints", cmd_checkpoints_, 1, 1, F_JSON | F_RUN, "RUN",
     "A run's checkpoints, oldest first (step, size, on disk, directory).\n"
     "What export --step and init.from take; one whose directory is gone\n"
     "says so (its row is kept for when it is back)."},
    {"events", cmd_events_, 1, 1, F_JSON | F_RUN, "RUN",
     "What happened to a run, oldest first (its events table).\n"
     "Kinds: submit, start, delink, pause, paused.error (and why), resume,\n"
     "checkpoint.bad, interrupted, stop, ..."},
    {"nodes", cmd_nodes_, 0, 0, F_JSON, "",
     "List the coordinator's nodes (state, backend, devices, GEMM, memory, run).\n"
     "RANKS: the ranks a node holds in its run (\"2-3\": a node of 2 devices).\n"
     "GEMM: the node's CPU GEMM library and the instruction set it runs on.\n"
     "States: joining, live, lost (silent past --node-timeout, or its\n"
     "connection closed), left (stopped). Also: last heartbeat, address, why."},
    {"data", cmd_data_, 1, -1, F_JSON | F_PREPARE,
     "prepare --out DIR [--val-fraction F] [--shard-tokens N] FILES...",
     "Turn text files into byte-level token shards (no daemon needed)."},
    {"plan", cmd_plan_, 1, 1, F_JSON | F_PLAN,
     "SPEC [--device-memory SIZE] [--daemon] [--nodes N --gpus-per-node G "
     "--host-memory SIZE --explain]",
     "Memory plan of a spec: what is resident, what is offloaded.\n"
     "With --nodes, --gpus-per-node, --host-memory or --explain: the plan at\n"
     "scale, the experts spread over N x G devices and the rest replicated:\n"
     "parameters and bytes per device and per node, and whether each phase\n"
     "fits resident, only with offloading, or not at all.\n"
     "Computed here, no daemon needed; --daemon asks m6d, which also checks\n"
     "its own host memory and pinned-memory limit.\n"
     "Resident and offloaded slots, peak device bytes, host<->device bytes per\n"
     "step and the minimum budget with every slot offloaded; with\n"
     "nodes.expert_parallel, also a rank's own model (its experts only)."},
    {"export", cmd_export_, 1, 1, F_EXPORT,
     "RUN --out PATH [--step N] [--format F] [--force]",
     "Write a run's checkpoint (newest, or --step N) for other tools.\n"
     "hf-gpt2 (default): model.safetensors and config.json in the tensor\n"
     "names, shapes and config keys of transformers' GPT2LMHeadModel (the\n"
     "tests check the logits of an independent GPT-2 written to that layout,\n"
     "not transformers itself); a pseudo-phase model comes out with every\n"
     "layer a copy of its slot; MoE refused. safetensors: m6's\n"
     "own names and m6-model.json (what init.from takes). llmc: an llm.c\n"
     "GPT-2 .bin (version 3, fp32). Reads the files m6d names: needs read\n"
     "access to its state directory. RUN may instead be a directory (a path\n"
     "with a /) written by import or --format safetensors. --out must not\n"
     "exist unless --force."},
    {"import", cmd_import_, 2, 2, F_IMPORT, "llmc FILE.bin --out DIR [--force]",
     "Read an llm.c GPT-2 checkpoint into an m6 weights directory.\n"
     "Versions 3 (fp32) and 5 (bf16); the directory is what a spec's\n"
     "init.from takes. No daemon needed."},
    {"plot", cmd_plot_, 1, -1, F_PLOT, "RUN [RUN...] --out FILE.svg",
     "Plot train and val loss against step for runs, as SVG.\n"
     "One or more runs, each run's delink step marked."},
};
#define N_COMMANDS (sizeof commands_ / sizeof commands_[0])

static void usage_(FILE *f)
{
    fprintf(f, "usage: m6ctl [--socket PATH] [--json] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *h = commands_[i].help;  /* first line only */
        int n = (int)strcspn(h, "\n");
        fprintf(f, "  %-11s %-10s %.*s\n", commands_[i].name,
                strlen(commands_[i].usage) <= 10 ? commands_[i].usage : "...", n, h);
    }
    fprintf(f, "\nRUN is a run id (or a unique name). Socket: --socket, $M6_SOCKET, or\n"
               "m6d's default ($M6_STATE_DIR/m6d.sock when set). 'm6ctl COMMAND --help'\n"
               "for details.\n"
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
    if (c->flags & F_RESUME)
        fprintf(f, "  --world-size N    continue at N ranks (nodes.world_size)\n"
                   "  --expert-parallel P\n"
                   "                    and P ranks to each MoE slot's experts\n"
                   "  --memory-budget SIZE|none\n"
                   "                    continue under this device.memory_budget\n"
                   "                    (none or 0: every slot resident)\n"
                   "  --from-scratch    a run whose checkpoints are gone: train it\n"
                   "                    again from step 0 (its metrics rows dropped)\n");
    if (c->flags & F_WATCH)
        fprintf(f, "  --interval SEC    poll period (default 0.5)\n"
                   "  --reconnect SEC   keep retrying an unreachable m6d this long\n"
                   "                    (default 60; 0: give up at once)\n");
    if (c->flags & F_PLAN)
        fprintf(f, "  --device-memory SIZE\n"
                   "                    device memory budget, e.g. 8GiB (default: the\n"
                   "                    spec's device.memory_budget)\n"
                   "  --daemon          let m6d plan it (its MemAvailable and\n"
                   "                    RLIMIT_MEMLOCK, not this shell's)\n"
                   "  --nodes N         plan at scale on N nodes (default 1)\n"
                   "  --gpus-per-node G devices per node (default 1)\n"
                   "  --host-memory SIZE\n"
                   "                    host memory per node, e.g. 512GiB (default:\n"
                   "                    not limited)\n"
                   "  --explain         the arithmetic behind each figure\n"
                   "  --p2r             the Pseudo-to-Real cost model on this placement:\n"
                   "                    step times of the pseudo and the real model\n"
                   "                    (compute, copies, host AdamW), the wall-clock\n"
                   "                    ratio to a target loss against scratch and the\n"
                   "                    break-even steps ratio (options below)\n"
                   "  --gpu-tflops X    achieved TFLOP/s per device (default: the\n"
                   "                    H200's dense BF16 peak 990 x --mfu)\n"
                   "  --mfu F           model FLOPs utilisation without --gpu-tflops\n"
                   "                    (default 0.4)\n"
                   "  --h2d-gbps X      host->device GB/s (default 63: PCIe 5.0 x16)\n"
                   "  --d2h-gbps X      device->host GB/s (default: as --h2d-gbps)\n"
                   "  --host-adam-gbps X\n"
                   "                    host AdamW GB/s (default 24: bench/offload_host)\n"
                   "  --nvlink-gbps X, --net-gbps X, --alltoall-latency-us X\n"
                   "                    the experts' all-to-all inside a node, across\n"
                   "                    nodes and per call (default 450, 50, 20)\n"
                   "  --steps-ratio R   Pseudo-to-Real's steps to the target over\n"
                   "                    scratch's (default 1)\n"
                   "  --scratch-steps N scratch's steps to the target (default: the\n"
                   "                    spec's train.steps)\n"
                   "  --sweep CSV       take R from bench/p2r_sweep's CSV: the mean\n"
                   "                    step_ratio of the spec's setting\n"
                   "  --corpus NAME     the sweep's corpus (with --sweep)\n"
                   "  --grad-scale sum|mean, --pseudo-lr-scale X\n"
                   "                    pick the sweep's rows of that setting\n");
    if (c->flags & (F_EXPORT | F_IMPORT | F_PLOT))
        fprintf(f, "  --out PATH        where to write (required)\n");
    if (c->flags & F_EXPORT)
        fprintf(f, "  --step N          the checkpoint of step N (default: the newest)\n"
                   "  --format F        hf-gpt2 (default), safetensors or llmc\n");
    if (c->flags & (F_EXPORT | F_IMPORT))
        fprintf(f, "  --force           write over an existing --out\n");
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
            m6ctl_errf_("%s: want a whole number in [%.0f, %.0f], got \"%s\"", opt, lo, hi, s);
        else
            m6ctl_errf_("%s: want a number in [%g, %g], got \"%s\"", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

enum { O_SOCKET = 256, O_JSON, O_CSV, O_OUT, O_VALF, O_SHARD, O_INTERVAL, O_HELP,
       O_VERSION, O_NOCOLOR, O_DEVMEM, O_RECONNECT, O_DAEMON,
       O_STEP, O_FORMAT, O_FORCE, O_NODES, O_GPN, O_HOSTMEM, O_EXPLAIN,
       O_P2R, O_GPUTF, O_MFU, O_H2D, O_D2H, O_ADAMGB, O_SRATIO, O_SSTEPS,
       O_SWEEP, O_CORPUS, O_GSCALE, O_LRSCALE, O_WORLD, O_EP, O_SCRATCH,
       O_NVLINK, O_NET, O_A2ALAT, O_BUDGET };
static const struct option opts_[] = {
    {"socket", required_argument, 0, O_SOCKET}, {"json", no_argument, 0, O_JSON},
    {"csv", no_argument, 0, O_CSV}, {"out", required_argument, 0, O_OUT},
    {"val-fraction", required_argument, 0, O_VALF},
    {"shard-tokens", required_argument, 0, O_SHARD},
    {"interval", required_argument, 0, O_INTERVAL}, {"help", no_argument, 0, O_HELP},
    {"version", no_argument, 0, O_VERSION}, {"no-color", no_argument, 0, O_NOCOLOR},
    {"device-memory", required_argument, 0, O_DEVMEM},
    {"reconnect", required_argument, 0, O_RECONNECT},
    {"daemon", no_argument, 0, O_DAEMON},
    {"step", required_argument, 0, O_STEP}, {"format", required_argument, 0, O_FORMAT},
    {"force", no_argument, 0, O_FORCE},
    {"from-scratch", no_argument, 0, O_SCRATCH},
    {"memory-budget", required_argument, 0, O_BUDGET},
    {"nodes", required_argument, 0, O_NODES},
    {"gpus-per-node", required_argument, 0, O_GPN},
    {"host-memory", required_argument, 0, O_HOSTMEM},
    {"explain", no_argument, 0, O_EXPLAIN},
    {"p2r", no_argument, 0, O_P2R},
    {"gpu-tflops", required_argument, 0, O_GPUTF},
    {"mfu", required_argument, 0, O_MFU},
    {"h2d-gbps", required_argument, 0, O_H2D},
    {"d2h-gbps", required_argument, 0, O_D2H},
    {"host-adam-gbps", required_argument, 0, O_ADAMGB},
    {"nvlink-gbps", required_argument, 0, O_NVLINK},
    {"net-gbps", required_argument, 0, O_NET},
    {"alltoall-latency-us", required_argument, 0, O_A2ALAT},
    {"steps-ratio", required_argument, 0, O_SRATIO},
    {"scratch-steps", required_argument, 0, O_SSTEPS},
    {"sweep", required_argument, 0, O_SWEEP},
    {"corpus", required_argument, 0, O_CORPUS},
    {"grad-scale", required_argument, 0, O_GSCALE},
    {"pseudo-lr-scale", required_argument, 0, O_LRSCALE},
    {"world-size", required_argument, 0, O_WORLD},
    {"expert-parallel", required_argument, 0, O_EP},
    {0, 0, 0, 0},
};

/* One option ch of cmd (getopt's pass 2; opt: the argument that named it):
 * 0, or EXIT_USAGE with the error said (a bad value, or an option the
 * command does not take). */
static int command_option_(const command *cmd, int ch, const char *opt, int *nocolor,
                           int *help)
{
    int ok = 1;
    /* plan --p2r's options by their own names (opt may be the argument) */
    if (ch >= O_P2R && ch <= O_LRSCALE)
        for (const struct option *o = opts_; o->name; o++)
            if (o->val == ch) {
                static char nm[40];
                snprintf(nm, sizeof nm, "--%s", o->name);
                opt = nm;
            }
    switch (ch) {
    case O_SOCKET: snprintf(g.socket, sizeof g.socket, "%s", optarg); break;
    case O_JSON: ok = cmd->flags & F_JSON; g.json = 1; break;
    case O_CSV: ok = cmd->flags & F_CSV; g.csv = 1; break;
    case O_NOCOLOR: *nocolor = 1; break;
    case O_OUT: ok = cmd->flags & (F_PREPARE | F_EXPORT | F_IMPORT | F_PLOT); snprintf(g.out_dir, sizeof g.out_dir, "%s", optarg); break;
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
    case O_STEP: {
        double v = 0;
        ok = cmd->flags & F_EXPORT;
        if (ok && parse_number_("--step", optarg, 0, 9.2e18, 1, &v) < 0) return EXIT_USAGE;
        g.export_step = (long)v;
        break;
    }
    case O_FORMAT: ok = cmd->flags & F_EXPORT; snprintf(g.format, sizeof g.format, "%s", optarg); break;
    case O_FORCE: ok = cmd->flags & (F_EXPORT | F_IMPORT); g.force = 1; break;
    case O_SCRATCH: ok = cmd->flags & F_RESUME; g.from_scratch = 1; break;
    case O_BUDGET:
        ok = cmd->flags & F_RESUME;
        if (ok && strcmp(optarg, "none") == 0) {
            g.memory_budget = -1;
        } else if (ok) {
            /* 0, as in device.memory_budget: none */
            size_t b = 0;
            int rc = spec_parse_size(optarg, &b);
            if (rc != 0 || b > (size_t)INT64_MAX) {
                m6ctl_errf_("--memory-budget: want a size such as 8GiB "
                      "(units " SPEC_SIZE_UNITS "), or none (or 0), got \"%s\"",
                      optarg);
                return EXIT_USAGE;
            }
            g.memory_budget = b ? (long long)b : -1;
        }
        break;
    case O_WORLD: case O_EP: case O_NODES: case O_GPN: {
        /* counts of 1..65536: resume's layout, plan's cluster */
        int plan = ch == O_NODES || ch == O_GPN;
        const char *nm = ch == O_WORLD ? "--world-size"
                         : ch == O_EP ? "--expert-parallel"
                         : ch == O_NODES ? "--nodes" : "--gpus-per-node";
        int *to = ch == O_WORLD ? &g.world_size
                  : ch == O_EP ? &g.expert_parallel
                  : ch == O_NODES ? &g.nodes : &g.gpus_per_node;
        double v = 0;
        ok = cmd->flags & (plan ? F_PLAN : F_RESUME);
        if (ok && parse_number_(nm, optarg, 1, 65536, 1, &v) < 0)
            return EXIT_USAGE;
        *to = (int)v;
        g.cluster |= plan;
        break;
    }
    case O_EXPLAIN: ok = cmd->flags & F_PLAN; g.explain = g.cluster = 1; break;
    case O_P2R: ok = cmd->flags & F_PLAN; g.p2r = 1; break;
    case O_GPUTF: case O_MFU: case O_H2D: case O_D2H: case O_ADAMGB:
    case O_SRATIO: case O_SSTEPS: case O_LRSCALE: case O_NVLINK: case O_NET:
    case O_A2ALAT: {
        /* rates above 0; --mfu a fraction; a steps ratio may be 0 */
        static const struct { int ch; double lo, hi; int whole; double *to; } t[] = {
            {O_GPUTF, 1e-6, 1e6, 0, &g.gpu_tflops}, {O_MFU, 1e-6, 1, 0, &g.mfu},
            {O_H2D, 1e-6, 1e6, 0, &g.h2d_gbps}, {O_D2H, 1e-6, 1e6, 0, &g.d2h_gbps},
            {O_ADAMGB, 1e-6, 1e6, 0, &g.adam_gbps},
            {O_NVLINK, 1e-6, 1e6, 0, &g.nvlink_gbps}, {O_NET, 1e-6, 1e6, 0, &g.net_gbps},
            {O_A2ALAT, 0, 1e9, 0, &g.a2a_latency_us},
            {O_SRATIO, 0, 1e6, 0, &g.steps_ratio},
            {O_SSTEPS, 1, 9.2e18, 1, &g.scratch_steps},
            {O_LRSCALE, 1e-9, 1e6, 0, &g.pseudo_lr_scale},
        };
        ok = cmd->flags & F_PLAN;
        for (size_t i = 0; ok && i < sizeof t / sizeof t[0]; i++)
            if (t[i].ch == ch &&
                parse_number_(opt, optarg, t[i].lo, t[i].hi, t[i].whole, t[i].to) < 0)
                return EXIT_USAGE;
        g.a2a_latency_given |= ch == O_A2ALAT;  /* 0 is a value */
        g.p2r_only = opt;
        break;
    }
    case O_SWEEP: case O_CORPUS: case O_GSCALE: {
        char *to = ch == O_SWEEP ? g.sweep : ch == O_CORPUS ? g.corpus : g.grad_scale;
        size_t len = ch == O_SWEEP ? sizeof g.sweep
                     : ch == O_CORPUS ? sizeof g.corpus : sizeof g.grad_scale;
        ok = cmd->flags & F_PLAN;
        if (ok && (!optarg[0] || strlen(optarg) >= len ||
                   (ch == O_GSCALE && strcmp(optarg, "sum") && strcmp(optarg, "mean")))) {
            m6ctl_errf_("%s: want %s, got \"%s\"", opt,
                  ch == O_GSCALE ? "sum or mean"
                  : ch == O_SWEEP ? "a path (bench/p2r_sweep's CSV)" : "a corpus name",
                  optarg);
            return EXIT_USAGE;
        }
        if (ok) snprintf(to, len, "%s", optarg);
        g.p2r_only = opt;
        break;
    }
    case O_HOSTMEM:
        ok = cmd->flags & F_PLAN;
        if (ok) {
            int rc = spec_parse_size(optarg, &g.host_memory);
            if (rc != 0 || g.host_memory == 0) {
                m6ctl_errf_("--host-memory: want a size above 0 such as 512GiB "
                      "(units " SPEC_SIZE_UNITS "), got \"%s\"", optarg);
                return EXIT_USAGE;
            }
            g.cluster = 1;
        }
        break;
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
                m6ctl_errf_("--device-memory: \"%s\" is too large", optarg);
                return EXIT_USAGE;
            }
            if (rc != 0 || g.device_memory == 0) {
                m6ctl_errf_("--device-memory: want a size above 0 such as 8GiB "
                      "or 512MiB (units " SPEC_SIZE_UNITS "), got \"%s\"",
                      optarg);
                return EXIT_USAGE;
            }
        }
        break;
    case 'h': case O_HELP: *help = 1; break;
    default: command_usage_(stderr, cmd); return EXIT_USAGE;
    }
    if (!ok) {
        m6ctl_errf_("%s: option %s does not apply", cmd->name, opt);
        return EXIT_USAGE;
    }
    return 0;
}

/* `m6ctl help --markdown [commands|spec-keys]` (hidden, for
 * docs/gen-tables.sh): docs/OPERATIONS.md's table of the commands above, or the spec
 * key table of spec.c (spec_keys_markdown). Help text is joined into one
 * line; '|' and '<' are escaped for Markdown. Returns the exit status. */
static int markdown_tables_(const char *which)
{
    if (strcmp(which, "spec-keys") == 0)
        return spec_keys_markdown(stdout) == 0 ? EXIT_OK : EXIT_ERR;
    if (strcmp(which, "commands") != 0) {
        m6ctl_errf_("help --markdown: want commands or spec-keys, got \"%s\"", which);
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
    while ((ch = getopt_long(argc, argv, "+h", opts_, NULL)) != -1) {
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
        if (!help) m6ctl_errf_("no command given");
        usage_(help ? stdout : stderr);
        return help ? EXIT_OK : EXIT_USAGE;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[optind], commands_[i].name) == 0) cmd = &commands_[i];
    if (!cmd) {
        m6ctl_errf_("unknown command \"%s\"", argv[optind]);
        usage_(stderr);
        return EXIT_USAGE;
    }
    /* Pass 2: the command's options, anywhere among its arguments. */
    int cargc = argc - optind;
    char **cargv = argv + optind;
    /* "status -1": getopt would call -1 an invalid option; it is a
     * malformed RUN, which parse_run_ names */
    if ((cmd->flags & F_RUN) && cargc > 1 && cargv[1][0] == '-' && cargv[1][1] &&
        strspn(cargv[1] + 1, "0123456789") == strlen(cargv[1] + 1)) {
        M6__RunRef ref;
        m6ctl_parse_run_(cargv[1], &ref);
        return EXIT_USAGE;
    }
    cargv[0] = (char *)"m6ctl";  /* getopt's messages name m6ctl */
    optind = 0;  /* glibc: 0 re-initialises getopt for the new argv */
    while ((ch = getopt_long(cargc, cargv, "h", opts_, NULL)) != -1) {
        int rc = command_option_(cmd, ch, cargv[optind - 1], &nocolor, &help);
        if (rc) return rc;
    }
    if (help) {
        command_usage_(stdout, cmd);
        return EXIT_OK;
    }
    int npos = cargc - optind;
    if (npos < cmd->min_args || (cmd->max_args >= 0 && npos > cmd->max_args)) {
        m6ctl_errf_("%s: wrong number of arguments", cmd->name);
        command_usage_(stderr, cmd);
        return EXIT_USAGE;
    }
    if (g.json && g.csv) {
        m6ctl_errf_("%s: --json and --csv exclude each other", cmd->name);
        return EXIT_USAGE;
    }
    /* A malformed RUN (0, -1, an overflowing id) is a usage error for every
     * command alike; a RUN m6d does not know is its refusal (exit 1). */
    M6__RunRef ref;
    if ((cmd->flags & F_RUN) && m6ctl_parse_run_(cargv[optind], &ref) < 0) return EXIT_USAGE;
    g.color = !nocolor && !g.json && isatty(STDOUT_FILENO);
    int rc = cmd->fn(npos, cargv + optind);
    if (g.fd >= 0) close(g.fd);
    if (rc == EXIT_ERR && g.transport_err) rc = EXIT_UNREACHABLE;
    return rc;
}
