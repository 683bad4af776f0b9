/*
 * load_client.c — the clients of bench/load.sh (issue 16 item 4): while a
 * run trains, N clients, each on its own connection, loop status,
 * metrics, events, pause and resume of that run for D seconds; meanwhile
 * M bad connections, spread over the same D seconds, either send half a
 * frame and vanish, or connect and never send Hello (sit for a moment,
 * then vanish).
 *
 *   load_client --socket PATH --run ID [--clients N] [--seconds D] [--bad M]
 *
 * Counting errors: every reply is sorted into ok, caused or unexpected.
 * caused: a pause or resume refused with STATUS_BAD_STATE because of the
 * run's state at that moment, which the other clients' commands set: the
 * run "is already paused", "is already pausing", "is not paused", or a
 * resume answered "a pause was sent after it" (another client's pause
 * cancelled it). Any other refusal, a reply that does not decode, a
 * connection that fails or closes, or 15 s without a reply is unexpected.
 * Prints the counts per request type, the acknowledged pauses and resumes
 * (bench/load.sh checks m6.db's events against them), and status latency
 * (p50, p99, max; each from send to whole reply, CLOCK_MONOTONIC), then a
 * key=value line. Exit 0 when nothing unexpected happened, 1 otherwise.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "proto/frame.h"
#include "m6.pb-c.h"
#include "../tests/common/hello_request.h"

enum { Q_STATUS, Q_METRICS, Q_EVENTS, Q_PAUSE, Q_RESUME, NQ };
static const char *const qname_[NQ] = {"status", "metrics", "events", "pause",
                                       "resume"};
enum { READ_TIMEOUT_MS = 15000 };

static const char *sock_path_;
static int64_t run_;
static double deadline_;  /* CLOCK_MONOTONIC seconds */

typedef struct {
    long ok[NQ], caused[NQ], unexpected[NQ];
    double *lat;  /* status latencies, seconds */
    long n_lat, cap_lat;
    char first_error[512];
} client_stats;

static int connect_(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path_);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all_(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all_(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, READ_TIMEOUT_MS);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return -2;  /* timed out */
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Send rq, read one Response. NULL with why[] on failure. */
static M6__Response *call_(int fd, const M6__Request *rq, char *why, size_t len)
{
    size_t n;
    uint8_t *f = frame_pack(&rq->base, &n);
    if (!f) {
        snprintf(why, len, "out of memory");
        return NULL;
    }
    int rc = write_all_(fd, f, n);
    free(f);
    if (rc != 0) {
        snprintf(why, len, "send: %s", strerror(errno));
        return NULL;
    }
    uint8_t hdr[4];
    if ((rc = read_all_(fd, hdr, 4)) != 0) {
        snprintf(why, len, rc == -2 ? "no reply in 15 s" : "connection closed");
        return NULL;
    }
    uint32_t plen = frame_get_len(hdr);
    if (plen > M6_FRAME_MAX) {
        snprintf(why, len, "reply of %u bytes", plen);
        return NULL;
    }
    uint8_t *buf = malloc(plen ? plen : 1);
    if (!buf || (rc = read_all_(fd, buf, plen)) != 0) {
        free(buf);
        snprintf(why, len, "reply cut short");
        return NULL;
    }
    M6__Response *r = m6__response__unpack(NULL, plen, buf);
    free(buf);
    if (!r) snprintf(why, len, "reply does not decode");
    return r;
}

/* A refusal the client caused (see the top). */
static int caused_(int q, const M6__Response *r)
{
    if ((q != Q_PAUSE && q != Q_RESUME) ||
        r->status != M6__STATUS__STATUS_BAD_STATE || !r->message)
        return 0;
    static const char *const why[] = {"is already paused", "is already pausing",
                                      "is not paused", "a pause was sent after it"};
    for (size_t i = 0; i < sizeof why / sizeof why[0]; i++)
        if (strstr(r->message, why[i])) return 1;
    return 0;
}

static void unexpected_(client_stats *s, int q, const char *what)
{
    s->unexpected[q]++;
    if (!s->first_error[0])
        snprintf(s->first_error, sizeof s->first_error, "%s: %.400s", qname_[q], what);
}

static void *client_main_(void *arg)
{
    client_stats *s = arg;
    char why[512];
    int fd = connect_();
    if (fd < 0) {
        unexpected_(s, Q_STATUS, "cannot connect");
        return NULL;
    }
    M6__Hello hello;
    M6__Request rq;
    hello_request(&rq, &hello, "bench/load");
    M6__Response *r = call_(fd, &rq, why, sizeof why);
    if (!r || r->status != M6__STATUS__STATUS_OK) {
        unexpected_(s, Q_STATUS, r ? r->message : why);
        if (r) m6__response__free_unpacked(r, NULL);
        close(fd);
        return NULL;
    }
    m6__response__free_unpacked(r, NULL);
    M6__RunRef ref = M6__RUN_REF__INIT;
    ref.run_id = run_;
    M6__MetricsQuery mq = M6__METRICS_QUERY__INIT;
    mq.run = &ref;
    M6__EventsQuery eq = M6__EVENTS_QUERY__INIT;
    eq.run = &ref;
    long round = 0;
    while (clock_mono_s() < deadline_) {
        int q = (int)(round++ % NQ);
        M6__Request x = M6__REQUEST__INIT;
        switch (q) {
        case Q_STATUS: x.body_case = M6__REQUEST__BODY_STATUS; x.status = &ref; break;
        case Q_METRICS:
            /* the newest rows: the page after the step the status saw */
            x.body_case = M6__REQUEST__BODY_METRICS; x.metrics = &mq; break;
        case Q_EVENTS: x.body_case = M6__REQUEST__BODY_EVENTS; x.events = &eq; break;
        case Q_PAUSE: x.body_case = M6__REQUEST__BODY_PAUSE; x.pause = &ref; break;
        case Q_RESUME: x.body_case = M6__REQUEST__BODY_RESUME; x.resume = &ref; break;
        }
        double t0 = clock_mono_s();
        r = call_(fd, &x, why, sizeof why);
        double dt = clock_mono_s() - t0;
        if (!r) {
            unexpected_(s, q, why);
            break;  /* the connection is gone */
        }
        if (r->status == M6__STATUS__STATUS_OK) {
            s->ok[q]++;
            if (q == Q_STATUS && r->run) {
                int64_t st = r->run->step;
                mq.after_step = st > 20 ? st - 20 : 0;
                mq.limit = 20;
            }
        } else if (caused_(q, r)) {
            s->caused[q]++;
        } else {
            char m[400];
            snprintf(m, sizeof m, "status %d: %s", r->status,
                     r->message ? r->message : "");
            unexpected_(s, q, m);
        }
        m6__response__free_unpacked(r, NULL);
        if (q == Q_STATUS) {
            if (s->n_lat == s->cap_lat) {
                long cap = s->cap_lat ? s->cap_lat * 2 : 4096;
                double *nl = realloc(s->lat, (size_t)cap * sizeof *nl);
                if (!nl) break;
                s->lat = nl;
                s->cap_lat = cap;
            }
            s->lat[s->n_lat++] = dt;
        }
    }
    close(fd);
    return NULL;
}

typedef struct {
    long n, half_frame, no_hello, failed;
} bad_stats;

/* M bad connections, evenly over the run: even ones send half a frame
 * (a length of 64 and 10 bytes of it), odd ones connect and send nothing
 * for 50 ms; then each vanishes (close, no shutdown). */
static void *bad_main_(void *arg)
{
    bad_stats *b = arg;
    double start = clock_mono_s(), span = deadline_ - start;
    uint8_t half[4 + 10] = {0, 0, 0, 64, 0x0a, 0x08, 0x08, 0x01, 0x12, 0x04,
                            'h', 'a', 'l', 'f'};
    for (long i = 0; i < b->n; i++) {
        double at = start + span * (double)i / (double)b->n;
        double wait = at - clock_mono_s();
        if (wait > 0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (long)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        int fd = connect_();
        if (fd < 0) {
            b->failed++;
            continue;
        }
        if (i % 2 == 0) {
            if (write_all_(fd, half, sizeof half) != 0) b->failed++;
            b->half_frame++;
        } else {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            b->no_hello++;
        }
        close(fd);
    }
    return NULL;
}

static int cmp_(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int clients = 20;
    double seconds = 60;
    long bad = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--socket")) sock_path_ = argv[i + 1];
        else if (!strcmp(argv[i], "--run")) run_ = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients")) clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--bad")) bad = atol(argv[i + 1]);
        else {
            fprintf(stderr, "load_client: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!sock_path_ || run_ <= 0 || clients < 1 || seconds <= 0 || bad < 0) {
        fprintf(stderr, "usage: load_client --socket PATH --run ID [--clients N] "
                        "[--seconds D] [--bad M]\n");
        return 2;
    }
    deadline_ = clock_mono_s() + seconds;
    client_stats *cs = calloc((size_t)clients, sizeof *cs);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    bad_stats bs = {.n = bad};
    pthread_t bt;
    if (!cs || !th) return 1;
    for (int i = 0; i < clients; i++)
        if (pthread_create(&th[i], NULL, client_main_, &cs[i]) != 0) return 1;
    if (pthread_create(&bt, NULL, bad_main_, &bs) != 0) return 1;
    for (int i = 0; i < clients; i++) pthread_join(th[i], NULL);
    pthread_join(bt, NULL);

    long ok[NQ] = {0}, caused[NQ] = {0}, unexp[NQ] = {0}, n_lat = 0;
    long total_unexpected = 0;
    for (int i = 0; i < clients; i++) {
        for (int q = 0; q < NQ; q++) {
            ok[q] += cs[i].ok[q];
            caused[q] += cs[i].caused[q];
            unexp[q] += cs[i].unexpected[q];
            total_unexpected += cs[i].unexpected[q];
        }
        n_lat += cs[i].n_lat;
        if (cs[i].first_error[0])
            printf("load: client %d: unexpected: %s\n", i, cs[i].first_error);
    }
    double *lat = malloc((size_t)(n_lat ? n_lat : 1) * sizeof *lat);
    long k = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(lat + k, cs[i].lat, (size_t)cs[i].n_lat * sizeof *lat);
        k += cs[i].n_lat;
        free(cs[i].lat);
    }
    qsort(lat, (size_t)n_lat, sizeof *lat, cmp_);
    double p50 = n_lat ? lat[n_lat / 2] * 1e3 : -1;
    double p99 = n_lat ? lat[(long)((double)(n_lat - 1) * 0.99)] * 1e3 : -1;
    double mx = n_lat ? lat[n_lat - 1] * 1e3 : -1;
    for (int q = 0; q < NQ; q++)
        printf("load: %-8s ok %7ld  caused %6ld  unexpected %ld\n", qname_[q],
               ok[q], caused[q], unexp[q]);
    printf("load: bad connections: %ld (%ld half a frame, %ld no Hello), "
           "%ld failed to connect or send\n", bs.n, bs.half_frame, bs.no_hello,
           bs.failed);
    printf("load: status latency over %ld calls: p50 %.2f ms, p99 %.2f ms, "
           "max %.2f ms\n", n_lat, p50, p99, mx);
    printf("clients=%d seconds=%g requests=%ld unexpected=%ld pause_ok=%ld "
           "resume_ok=%ld bad_connections=%ld bad_failed=%ld "
           "status_p50_ms=%.2f status_p99_ms=%.2f\n", clients, seconds,
           ok[0] + ok[1] + ok[2] + ok[3] + ok[4] + caused[3] + caused[4] +
               total_unexpected,
           total_unexpected, ok[Q_PAUSE], ok[Q_RESUME], bs.n, bs.failed, p50, p99);
    free(lat);
    free(cs);
    free(th);
    return total_unexpected || bs.failed ? 1 : 0;
}
