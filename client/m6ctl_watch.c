/*
 * m6ctl_watch.c — `m6ctl watch RUN`: a run's progress line, its events and
 * ETA polled until it ends, through m6d restarts (reconnecting).
 */
#include "client/m6ctl_internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/paths.h"
#include "client/eta.h"
#include "client/export.h"
#include "client/plot.h"
#include "offload/offload.h"
#include "offload/plan_p2r.h"
#include "proto/views.h"
#include "spec/spec.h"

/* Two losses the same (NaN equals NaN: no validation pass either). */
static int same_loss_(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

/* A watch event: one JSON line {"event", "step"[, "last_seen_step"]}
 * with --json (last_seen < 0: none), else the printf-formatted text. */
static void print_event_(const char *event, long long step, long last_seen,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void print_event_(const char *event, long long step, long last_seen,
                         const char *fmt, ...)
{
    m6ctl_end_bar_();
    if (g.json) {
        views_watch_event_row e = {event, step, last_seen};
        view_out o = {.f = stdout, .v = &views_watch_event, .form = VIEW_JSON_LINES};
        view_row(&o, &e);
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

/* watch's ETA (eta.h): the rate watch saw over its recent polls, not
 * m6d's estimate (an average that still carries the slow first steps);
 * m6d's until the polls span enough. Restarted when the run is not
 * running, and when watch reconnects to m6d. */
static double watch_eta_(eta_window *w, const M6__RunInfo *r, double now)
{
    if (r->state != M6__RUN_STATE__RUN_STATE_RUNNING) {
        eta_reset(w);
        return r->eta_s;
    }
    double eta = eta_update(w, r->step, r->total_steps, now);
    return eta < 0 ? r->eta_s : eta;
}

/* One status line of watch: a \r-redrawn bar on a tty, else a line. */
static void watch_line_(const M6__RunInfo *r, double eta, int tty)
{
    views_run_row row = {.r = r, .watch_eta = eta};
    view_out o = {.f = stdout, .v = &views_watch_line, .form = VIEW_LINE, .color = g.color};
    if (tty) {
        int width = 30;
        double frac = r->total_steps > 0 ? (double)r->step / (double)r->total_steps : 0;
        int fill = (int)(frac * width);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
        bar[width] = 0;
        printf("\r\033[K[%s] ", bar);
    }
    view_row(&o, &row);
    if (tty) g.bar_open = 1;
    else fputc('\n', stdout);
}

/* The watched run's identity: the same id may be another run after m6d
 * restarted on another state directory. */
static int same_run_(const M6__RunInfo *r, double *created, char *name, size_t len)
{
    if (*created < 0) {
        *created = r->created;
        snprintf(name, len, "%s", r->name ? r->name : "");
        return 1;
    }
    if (r->created == *created && strcmp(name, r->name ? r->name : "") == 0) return 1;
    char a[32], b[32];
    const view_field *at = view_field_named(&views_run, "created");
    views_run_row row = {.r = r};
    M6__RunInfo then = *r;
    then.created = *created;
    views_run_row row0 = {.r = &then};
    view_text(a, sizeof a, at, &row);
    view_text(b, sizeof b, at, &row0);
    m6ctl_end_bar_();
    m6ctl_errf_("run %lld on this m6d is another run (\"%s\", created %s) than the "
          "one watched (\"%s\", created %s): was m6d restarted on another "
          "state directory?", (long long)r->id, r->name, a, name, b);
    return 0;
}

/* m6d unreachable mid-watch (restarting: systemd, an upgrade): keep
 * trying for --reconnect seconds from *lost_at (set at the first failure).
 * 1: try again, a second later; 0: give up (said). */
static int watch_retry_(double *lost_at)
{
    if (*lost_at < 0) {
        *lost_at = clock_mono_s();
        m6ctl_end_bar_();
        if (g.reconnect > 0)
            m6ctl_errf_("m6d unreachable; retrying for up to %.0f s (--reconnect)", g.reconnect);
        g.quiet = 1;
    }
    if (clock_mono_s() - *lost_at < g.reconnect) {
        struct timespec one = {1, 0};
        nanosleep(&one, NULL);
        return 1;
    }
    if (g.reconnect > 0) m6ctl_errf_("m6d still unreachable after %.0f s", g.reconnect);
    return 0;
}

/* The watched run ended: say how; its exit status (0 completed, 1
 * failed, 3 stopped). */
static int watch_end_(const M6__RunInfo *r)
{
    m6ctl_end_bar_();
    if (!g.json) {
        printf("run %lld %s at step %lld", (long long)r->id, views_state_str(r->state),
               (long long)r->step);
        if (r->error && *r->error) printf(": %s", r->error);
        printf("\n");
    }
    return r->state == M6__RUN_STATE__RUN_STATE_COMPLETED ? EXIT_OK
           : r->state == M6__RUN_STATE__RUN_STATE_STOPPED ? EXIT_STOPPED
                                                           : EXIT_ERR;
}

int cmd_watch_(int argc, char **argv)
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
    static eta_window win;
    for (;;) {
        M6__Response *resp = m6ctl_run_request_(M6__REQUEST__BODY_STATUS, argv[0]);
        if (!resp && g.transport_err) {
            if (watch_retry_(&lost_at)) continue;
            return EXIT_UNREACHABLE;
        }
        if (!resp) {
            m6ctl_end_bar_();
            return EXIT_ERR;
        }
        const M6__RunInfo *r = resp->run;
        if (!same_run_(r, &created, name, sizeof name)) {
            m6__response__free_unpacked(resp, NULL);
            return EXIT_ERR;
        }
        if (lost_at >= 0) {
            m6ctl_errf_("reconnected to m6d after %.0f s", clock_mono_s() - lost_at);
            lost_at = -1;
            /* the outage is no part of the run's rate: measure it afresh
             * (with it in the window, the ETA came out about twice the
             * real time left after an m6d restart) */
            eta_reset(&win);
            g.quiet = 0;
        }
        /* Report the delink once: as it happens, or on attach if it already
         * happened (a fast run may pass it before watch starts). */
        if (last_phase != 1 && r->phase == M6__PHASE__PHASE_REAL && r->delink_step >= 0 &&
            r->pseudo_steps != 0) {
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
        double eta = watch_eta_(&win, r, clock_mono_s());
        if (g.json && changed) {
            view_out o = m6ctl_run_out_(VIEW_RECORDS, 1);
            views_run_row row = {.r = r, .watch_eta = eta};
            view_row(&o, &row);
        } else if (tty) {
            watch_line_(r, eta, 1);
        } else if (changed && (r->state != last_state || (int)r->phase != last_phase_seen ||
                               !same_loss_(r->val_loss, last_val) || views_terminal(r->state) ||
                               clock_mono_s() - last_print >= 10.0)) {
            /* Not a tty (a log): one line per eval, phase or state change,
             * and at least every 10 s, not one per step. */
            last_print = clock_mono_s();
            last_val = r->val_loss;
            last_phase_seen = (int)r->phase;
            watch_line_(r, eta, 0);
        }
        if (!g.json && r->state != last_state &&
            r->state == M6__RUN_STATE__RUN_STATE_PAUSED) {
            /* why: m6d's reason when it paused the run itself (a write
             * failed, a shard went bad, a node was lost); without one, a
             * command paused it */
            m6ctl_end_bar_();
            if (r->error && *r->error)
                printf("run %lld paused at step %lld: %s\n", (long long)r->id,
                       (long long)r->step, r->error);
            else
                printf("run %lld paused at step %lld by a command (m6ctl "
                       "pause); waiting for its resume\n", (long long)r->id,
                       (long long)r->step);
        }
        fflush(stdout);
        last_step = r->step;
        last_state = r->state;
        if (views_terminal(r->state)) {
            int rc = watch_end_(r);
            m6__response__free_unpacked(resp, NULL);
            return rc;
        }
        m6__response__free_unpacked(resp, NULL);
        struct timespec ts = {(time_t)g.interval,
                              (long)((g.interval - (double)(time_t)g.interval) * 1e9)};
        nanosleep(&ts, NULL);
    }
}
