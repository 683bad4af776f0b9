/*
 * fuzz_dispatch.c — libFuzzer target: the control socket's framing
 * (proto/frame.c) and the request dispatch behind it
 * (daemon/control/handlers.c), against a state DB with runs in it.
 *
 * The input is the byte stream one client sends on one connection. It is
 * fed to a frame_reader in chunks of varying size (1, 7, 64, 3, 4096
 * bytes, in turn), as reads on a socket split it; every complete frame goes
 * to handlers_dispatch with the connection's session, as server.c does. A
 * declared length over the limit, or a reply that asks to close, ends the
 * connection there (server.c closes it).
 *
 * The state: a temp dir (in /dev/shm where it exists) with m6.db holding five runs (completed with
 * metrics, events and a checkpoint row; paused; queued; failed, with a
 * name shared by the paused one; stopped) and a runner made with
 * runner_config.no_thread (runner.h: the testing seam): no runner thread,
 * no active run, nothing trains. A request that changes the state (a
 * successful stop, pause, resume, delink or submit) marks it dirty and
 * the next input gets a fresh one, so each input sees the same runs.
 *
 * Beyond "no crash, no sanitizer report", every reply must be one whole
 * frame (header = payload length) that decodes as m6.Response, with a
 * message, non-empty when the status is not OK. A violation aborts.
 * Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/frame.h"
#include "control/handlers.h"
#include "runner/runner.h"
#include "m6.pb-c.h"
#include "state/state.h"

static char dir_[512];
static state *st_;
static runner *runner_;
static int dirty_ = 1;
static unsigned long setups_;

static void at_exit_(void)
{
    if (getenv("M6_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_dispatch: %lu fresh states\n", setups_);
    /* the temp dir goes with the process */
    if (runner_) runner_fini(runner_);
    if (st_) state_close(st_);
    runner_ = NULL;
    st_ = NULL;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (dir_[0] && system(cmd) != 0) fprintf(stderr, "fuzz_dispatch: rm %s failed\n", dir_);
}

static const char spec_[] =
    "{\"name\": \"alpha\", \"data\": {\"train\": \"t/*.bin\", \"val\": \"v/*.bin\"}}";

static void fail_(const char *what)
{
    fprintf(stderr, "fuzz_dispatch: %s\n", what);
    abort();
}

static void teardown_(void)
{
    if (runner_) runner_fini(runner_);
    if (st_) state_close(st_);
    runner_ = NULL;
    st_ = NULL;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s/m6.db* %s/runs", dir_, dir_);
    if (system(cmd) != 0) fail_("could not clear the state dir");
}

static int64_t run_(const char *name, run_state s, int64_t step, const char *err)
{
    int64_t id = state_run_insert(st_, name, spec_, 100, 0, NULL);
    if (id <= 0) fail_("state_run_insert");
    if (s != RUN_QUEUED && state_run_set_state(st_, id, s, err) != 0)
        fail_("state_run_set_state");
    if (step > 0 && state_run_set_progress(st_, id, step, 0) != 0)
        fail_("state_run_set_progress");
    for (int64_t k = 1; k <= step; k++) {
        metric_row m = {.step = k, .train_loss = 5.0 / (double)k, .val_loss = NAN,
                        .lr = 1e-3, .tokens_per_s = 1000, .grad_norm = 1.5,
                        .resident_slots = -1, .offloaded_slots = -1,
                        .peak_device_bytes = -1, .h2d_gbps = NAN,
                        .d2h_gbps = NAN, .copy_hidden_fraction = NAN,
                        .moe_aux_loss = NAN, .moe_z_loss = NAN,
                        .moe_dropped_fraction = NAN, .moe_load_min = NAN,
                        .moe_load_max = NAN, .moe_load_cv = NAN,
                        .moe_experts_empty = NAN};
        if (state_record_step(st_, id, &m) != 0) fail_("state_record_step");
    }
    state_event(st_, id, "submit", "name=%s", name);
    return id;
}

static void setup_(void)
{
    if (!dir_[0]) {
        /* tmpfs where there is one: m6.db is made afresh often */
        struct stat sb;
        const char *base = getenv("TMPDIR");  /* run.sh: its own */
        if (!base)
            base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)
                       ? "/dev/shm" : "/tmp";
        snprintf(dir_, sizeof dir_, "%s/m6fuzz-dispatch-XXXXXX", base);
        if (!mkdtemp(dir_)) fail_("mkdtemp");
        log_set_level(LOG_ERROR);  /* every refusal logs at info */
        atexit(at_exit_);
    }
    teardown_();
    char db[600], runs[600], err[512];
    snprintf(db, sizeof db, "%s/m6.db", dir_);
    snprintf(runs, sizeof runs, "%s/runs", dir_);
    st_ = state_open(db, err, sizeof err);
    if (!st_) fail_(err);
    int64_t a = run_("alpha", RUN_COMPLETED, 12, NULL);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/runs/%lld/step-12", dir_, (long long)a);
    state_checkpoint_add(st_, a, 12, ck, 4096);
    state_event(st_, a, "completed", "step=12");
    run_("beta", RUN_PAUSED, 3, NULL);
    run_("gamma", RUN_QUEUED, 0, NULL);
    run_("beta", RUN_FAILED, 1, "shard t/0.bin: token 70000 >= vocab_size");
    run_("delta", RUN_STOPPED, 2, NULL);
    runner_config cc = {.st = st_, .runs_dir = runs, .no_thread = 1};
    runner_ = runner_init(&cc, err, sizeof err);
    if (!runner_) fail_(err);
    dirty_ = 0;
    setups_++;
}

/* Check one reply frame; returns its status. */
static int check_reply_(const uint8_t *out, size_t outlen)
{
    if (!out || outlen < M6_FRAME_HDR) fail_("no reply frame");
    if (frame_get_len(out) != outlen - M6_FRAME_HDR)
        fail_("reply header does not match its length");
    M6__Response *r = m6__response__unpack(NULL, outlen - M6_FRAME_HDR,
                                           out + M6_FRAME_HDR);
    if (!r) fail_("reply does not decode as m6.Response");
    int status = r->status;
    if (status != M6__STATUS__STATUS_OK && (!r->message || !r->message[0]))
        fail_("refusal without a message");
    m6__response__free_unpacked(r, NULL);
    return status;
}

static int changes_state_(const uint8_t *payload, size_t len)
{
    M6__Request *rq = m6__request__unpack(NULL, len, payload);
    if (!rq) return 0;
    int w = !handlers_is_read(rq->body_case) &&
            rq->body_case != M6__REQUEST__BODY_CHECKPOINTS;
    m6__request__free_unpacked(rq, NULL);
    return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dirty_ || !st_) setup_();
    handlers_ctx h = {.st = st_, .runner = runner_};
    session s;
    memset(&s, 0, sizeof s);
    frame_reader fr;
    frame_reader_init(&fr);
    static const size_t chunks[] = {1, 7, 64, 3, 4096};
    size_t off = 0, k = 0;
    int open = 1;
    while (open && off < size) {
        size_t n = chunks[k++ % 5];
        if (n > size - off) n = size - off;
        if (frame_reader_feed(&fr, data + off, n) != 0) break;
        off += n;
        for (;;) {
            const uint8_t *p;
            size_t len;
            frame_result fres = frame_reader_next(&fr, &p, &len);
            if (fres == FRAME_NEED_MORE) break;
            if (fres == FRAME_TOO_LARGE) {
                if (len <= M6_FRAME_MAX) fail_("too large, yet within the limit");
                size_t el;
                uint8_t *e = handlers_error_frame(M6__STATUS__STATUS_TOO_LARGE,
                                                  "frame too large", &el);
                check_reply_(e, el);
                free(e);
                open = 0;
                break;
            }
            uint8_t *out = NULL;
            size_t outlen = 0;
            int close_after = 0;
            (void)handlers_is_slow(p, len);
            if (handlers_dispatch(&h, &s, p, len, &out, &outlen, &close_after) != 0)
                fail_("handlers_dispatch built no reply");
            int status = check_reply_(out, outlen);
            free(out);
            if (status == M6__STATUS__STATUS_OK && changes_state_(p, len))
                dirty_ = 1;
            if (close_after) {
                open = 0;
                break;
            }
        }
    }
    if (open && frame_reader_pending(&fr) > size) fail_("pending beyond input");
    frame_reader_free(&fr);
    return 0;
}
