/*
 * main.c — m6d: the per-node training daemon (docs/DESIGN.md, "Threads").
 *
 * Modules, started in dependency order and stopped in reverse:
 *   log -> open-file limit -> state (m6.db) -> runner (queue + runner
 *   thread) -> loop -> server (control socket) -> signals -> notify
 *   (systemd READY/watchdog).
 * SIGTERM/SIGINT only set a flag and stop the loop; the runner then finishes
 * its current step, checkpoints the running run and leaves it to resume at
 * the next start.
 */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <uv.h>
#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "common/node_share.h"
#include "common/rankboard.h"
#include "common/cpus.h"
#include "common/threads.h"
#include "common/log.h"
#include "common/paths.h"
#include "proto/frame.h"
#include "control/handlers.h"
#include "control/server.h"
#include "runner/runner.h"
#include "http/http.h"
#include "kernels.h"
#include "cluster/cluster.h"
#include "cluster/coordinator.h"
#include "cluster/dp.h"
#include "cluster/join.h"
#include "state/state.h"
#include "train/trainer.h"

typedef struct {
    char state_dir[2048];
    char socket_path[2048];
    int threads;
    /* access (issue 16): who may drive m6d, other writers on m6.db */
    double db_hold_limit_s;     /* --db-hold-limit; 0 the default */
    gid_t group;                /* --group's gid, else m6d's egid */
    char group_name[64];
    int group_read_only;        /* --group-read-only */
    /* metrics: --metrics-listen, --metrics-peak-flops */
    char metrics_listen[512];
    double peak_flops;
    char metrics_hosts[HTTP_HOSTS_MAX][256];  /* --metrics-host, "" unused */
    char metrics_token_file[2048];            /* --metrics-token-file */
    /* nodes (daemon/cluster, issue 14): role, coordinator's TCP listener,
     * a worker's join */
    int coordinator;            /* --role coordinator */
    int worker;                 /* --role worker, or --join */
    char listen[300];           /* --listen HOST:PORT */
    char join[300];             /* --join HOST:PORT */
    char token_file[2048];
    char node_name[256];
    int node_timeout_ms;
    int devices;                /* --devices: ranks this node runs; 0 unset */
    unsigned conn_idle_ms;      /* --conn-idle-timeout; 0 the default */
} options;

static struct {
    options opt;
    uv_loop_t loop;
    state *st;
    runner *runner;
    handlers_ctx handlers;
    server *srv;
    /* metrics (daemon/http): the figures, the listening socket until the
     * server takes it, the server, and the handlers it asks (uncounted) */
    http_stats *stats;
    int http_fd;
    http_server *http;
    handlers_ctx http_handlers;
    uv_signal_t sigterm, sigint, sighup;
    int lock_fd;                /* flock on STATE_DIR/m6d.lock, held to exit */
    uv_timer_t watchdog;
    int watchdog_on;
    volatile sig_atomic_t stopping;
    int drain_expired;          /* the shutdown drain's deadline passed */
    /* nodes */
    cluster_token token;
    cluster_token http_token;   /* --metrics-token-file */
    cluster_facts facts;
    char node_uuid[33];
    int self_registered;
    cluster_coord *cluster;     /* --listen */
    cluster_join *join;         /* --join */
    int join_failed;            /* the join gave up: exit 1 */
    /* wiring (issue 14): runs across nodes */
    cluster_dp_coord dpc;       /* rank 0's side (runner_dist's ud) */
    runner_dist dist;
    cluster_dp_worker *dpw;     /* --join: this node's ranks */
} g;

/* ----------------------------------------------------------------- options */

static void usage_(FILE *f)
{
    fprintf(f,
        "usage: m6d [options]\n"
        "Train GPT-style models with the Pseudo-to-Real schedule; controlled by m6ctl.\n\n"
        "  --state-dir DIR    m6.db, runs/ and the socket (default $M6_STATE_DIR,\n"
        "                     $STATE_DIRECTORY, $XDG_STATE_HOME/m6 or\n"
        "                     ~/.local/state/m6)\n"
        "  --socket PATH      control socket (default STATE_DIR/m6d.sock)\n"
        "  --threads N        CPU threads for runs whose spec leaves device.threads\n"
        "                     at 0, 1..1024 (default: OMP_NUM_THREADS, else the\n"
        "                     CPUs m6d may use: affinity, cgroup CPU quota)\n"
        "  --log-level L      debug|info|warn|error (default info)\n"
        "  --group NAME       the group whose members may drive m6d (the unit's\n"
        "                     Group=; default m6d's own group): the socket's group\n"
        "  --group-read-only  members of the group may only read (status, list,\n"
        "                     metrics, events, plan); root and m6d's user still all\n"
        "  --db-hold-limit S  seconds step records may wait in memory while another\n"
        "                     process holds m6.db's write lock; then the run pauses\n"
        "                     (default 600)\n"
        "  --conn-idle-timeout S\n"
        "                     close a control connection idle this long, 1..86400\n"
        "                     (default 300; m6ctl watch polls at most every 60 s)\n"
        "  --metrics-listen ADDR:PORT\n"
        "                     serve Prometheus /metrics and the dashboard over\n"
        "                     HTTP there (read-only; e.g. 127.0.0.1:9464)\n"
        "                     (PORT alone: loopback, 127.0.0.1:PORT)\n"
        "  --metrics-host NAME[,NAME...]\n"
        "                     names that clients may use in Host: besides IP\n"
        "                     addresses, localhost and the listen host (others\n"
        "                     are refused: DNS rebinding), at most 8\n"
        "  --metrics-token-file PATH\n"
        "                     every HTTP request needs Authorization: Bearer with\n"
        "                     this token (not readable by others); for a listen\n"
        "                     address beyond loopback\n"
        "  --metrics-peak-flops F\n"
        "                     the device's peak FLOP/s, for m6_mfu_ratio\n"
        "Many nodes (docs/OPERATIONS.md, \"Many nodes\"):\n"
        "  --role R           coordinator (needs --listen) or worker (needs --join);\n"
        "                     default: a single m6d, both roles for this node only\n"
        "  --listen HOST:PORT coordinator: accept worker nodes over TCP here\n"
        "  --join HOST:PORT   worker: register with the coordinator there\n"
        "  --token-file PATH  the cluster's shared token (not readable by others)\n"
        "  --node-name NAME   this node's name among the nodes (default: hostname)\n"
        "  --node-timeout S   a node silent this long is lost; a first join gives\n"
        "                     up after it (0.1..3600 s, default 30)\n"
        "  --devices N        run N data-parallel ranks of a run across nodes here\n"
        "                     (1..256; N > 1 needs --listen or --join): cpu, each\n"
        "                     with its share of the cores (default 1); cuda, one\n"
        "                     per GPU, the first N visible (CUDA_VISIBLE_DEVICES;\n"
        "                     default: all of them with --listen or --join, else 1)\n"
        "  --help, --version\n");
}

/* optarg as a number in [lo, hi] ((lo, hi] when lo_open) into *v: 0, or
 * -1 after "m6d: NAME: want WANT, got "optarg"" on stderr. */
static int real_arg_(const char *name, const char *want, double lo,
                     int lo_open, double hi, double *v)
{
    char *end;
    *v = strtod(optarg, &end);
    if (end == optarg || *end || !(*v >= lo && *v <= hi) ||
        (lo_open && *v == lo)) {
        fprintf(stderr, "m6d: %s: want %s, got \"%s\"\n", name, want, optarg);
        return -1;
    }
    return 0;
}

static int parse_args_(int argc, char **argv, options *o)
{
    static const struct option longopts[] = {
        {"state-dir", required_argument, 0, 'd'},
        {"socket", required_argument, 0, 's'},
        {"threads", required_argument, 0, 't'},
        {"log-level", required_argument, 0, 'l'},
        /* access */
        {"db-hold-limit", required_argument, 0, 'H'},
        {"group", required_argument, 0, 'G'},
        {"group-read-only", no_argument, 0, 'R'},
        {"conn-idle-timeout", required_argument, 0, 'I'},
        /* metrics */
        {"metrics-listen", required_argument, 0, 'M'},
        {"metrics-peak-flops", required_argument, 0, 'F'},
        {"metrics-host", required_argument, 0, 'W'},
        {"metrics-token-file", required_argument, 0, 'K'},
        {"role", required_argument, 0, 'r'},
        {"listen", required_argument, 0, 'L'},
        {"join", required_argument, 0, 'J'},
        {"token-file", required_argument, 0, 'T'},
        {"node-name", required_argument, 0, 'N'},
        {"node-timeout", required_argument, 0, 'O'},
        {"devices", required_argument, 0, 'D'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->group = getegid();
    o->node_timeout_ms = CLUSTER_TIMEOUT_MS_DEFAULT;
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'd':
        case 's': {
            /* "" (an unset variable) must not mean the default */
            const char *name = ch == 'd' ? "--state-dir" : "--socket";
            char *dst = ch == 'd' ? o->state_dir : o->socket_path;
            size_t cap = ch == 'd' ? sizeof o->state_dir : sizeof o->socket_path;
            if (!optarg[0] || strlen(optarg) >= cap) {
                fprintf(stderr, "m6d: %s: want a path of 1..%zu bytes, got "
                        "\"%.80s\"%s\n", name, cap - 1, optarg,
                        strlen(optarg) > 80 ? "..." : "");
                return -1;
            }
            snprintf(dst, cap, "%s", optarg);
            break;
        }
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 1024) {
                fprintf(stderr, "m6d: --threads: want 1..1024, got \"%s\"\n", optarg);
                return -1;
            }
            o->threads = (int)v;
            break;
        }
        case 'l': {
            int lv = log_parse_level(optarg);
            if (lv < 0) {
                fprintf(stderr, "m6d: --log-level: want debug|info|warn|error, got \"%s\"\n",
                        optarg);
                return -1;
            }
            log_set_level((log_level)lv);
            break;
        }
        /* access */
        case 'H':
            if (real_arg_("--db-hold-limit", "seconds, 1..86400", 1, 0, 86400,
                          &o->db_hold_limit_s) < 0)
                return -1;
            break;
        case 'G': {
            struct group gr, *res = NULL;
            char buf[8192], *end;
            unsigned long num = strtoul(optarg, &end, 10);
            if (*optarg && !*end)  /* a gid */
                getgrgid_r((gid_t)num, &gr, buf, sizeof buf, &res);
            else
                getgrnam_r(optarg, &gr, buf, sizeof buf, &res);
            if (!res) {
                fprintf(stderr, "m6d: --group: no group \"%.80s\" (see "
                        "getent group)\n", optarg);
                return -1;
            }
            o->group = res->gr_gid;
            snprintf(o->group_name, sizeof o->group_name, "%s", res->gr_name);
            break;
        }
        case 'R': o->group_read_only = 1; break;
        case 'I': {
            double v;
            if (real_arg_("--conn-idle-timeout", "seconds, 1..86400", 1, 0,
                          86400, &v) < 0)
                return -1;
            o->conn_idle_ms = (unsigned)(v * 1000);
            break;
        }
        /* metrics */
        case 'M':
            if (!optarg[0] || strlen(optarg) >= sizeof o->metrics_listen) {
                fprintf(stderr, "m6d: --metrics-listen: want ADDR:PORT, got "
                        "\"%.80s\"\n", optarg);
                return -1;
            }
            snprintf(o->metrics_listen, sizeof o->metrics_listen, "%s", optarg);
            break;
        case 'F':
            if (real_arg_("--metrics-peak-flops", "FLOP/s > 0 (312e12)", 0, 1,
                          1e21, &o->peak_flops) < 0)
                return -1;
            break;
        case 'W': {
            char buf[2048];
            snprintf(buf, sizeof buf, "%s", optarg);
            int n = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                while (n < HTTP_HOSTS_MAX && o->metrics_hosts[n][0]) n++;
                if (n == HTTP_HOSTS_MAX || strlen(t) >= sizeof o->metrics_hosts[0]) {
                    fprintf(stderr, "m6d: --metrics-host: at most %d names of "
                            "at most 255 bytes, got \"%.80s\"\n",
                            HTTP_HOSTS_MAX, optarg);
                    return -1;
                }
                snprintf(o->metrics_hosts[n], sizeof o->metrics_hosts[n], "%s", t);
            }
            break;
        }
        case 'K':
            if (!optarg[0] || strlen(optarg) >= sizeof o->metrics_token_file) {
                fprintf(stderr, "m6d: --metrics-token-file: want a path\n");
                return -1;
            }
            snprintf(o->metrics_token_file, sizeof o->metrics_token_file, "%s",
                     optarg);
            break;
        /* nodes (issue 14) */
        case 'r':
            if (strcmp(optarg, "coordinator") == 0) o->coordinator = 1;
            else if (strcmp(optarg, "worker") == 0) o->worker = 1;
            else {
                fprintf(stderr, "m6d: --role: want coordinator or worker, got "
                        "\"%.80s\"\n", optarg);
                return -1;
            }
            break;
        case 'L':
        case 'J':
        case 'T':
        case 'N': {
            const char *name = ch == 'L' ? "--listen" : ch == 'J' ? "--join"
                               : ch == 'T' ? "--token-file" : "--node-name";
            char *dst = ch == 'L' ? o->listen : ch == 'J' ? o->join
                        : ch == 'T' ? o->token_file : o->node_name;
            size_t cap = ch == 'L' ? sizeof o->listen : ch == 'J' ? sizeof o->join
                         : ch == 'T' ? sizeof o->token_file : sizeof o->node_name;
            if (!optarg[0] || strlen(optarg) >= cap) {
                fprintf(stderr, "m6d: %s: want 1..%zu bytes, got \"%.80s\"\n",
                        name, cap - 1, optarg);
                return -1;
            }
            snprintf(dst, cap, "%s", optarg);
            break;
        }
        case 'O': {
            double v;
            if (real_arg_("--node-timeout", "0.1..3600 seconds", 0.1, 0, 3600,
                          &v) < 0)
                return -1;
            o->node_timeout_ms = (int)(v * 1000 + 0.5);
            break;
        }
        case 'D': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > RANKBOARD_DEVICES_MAX) {
                fprintf(stderr, "m6d: --devices: want 1..%d, got \"%s\"\n",
                        RANKBOARD_DEVICES_MAX, optarg);
                return -1;
            }
            o->devices = (int)v;
            break;
        }
        case 'h': usage_(stdout); exit(0);
        case 'V': printf("m6d %s (protocol %u)\n", M6_VERSION, M6_PROTOCOL_VERSION); exit(0);
        default: usage_(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "m6d: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    if (o->join[0]) o->worker = 1;
    if (o->coordinator && o->worker) {
        fprintf(stderr, "m6d: --role coordinator and --join/--role worker "
                "exclude each other\n");
        return -1;
    }
    if (o->coordinator && !o->listen[0]) {
        fprintf(stderr, "m6d: --role coordinator needs --listen HOST:PORT\n");
        return -1;
    }
    if (o->listen[0] && !o->coordinator) {
        fprintf(stderr, "m6d: --listen is for --role coordinator\n");
        return -1;
    }
    if (o->devices > 1 && !o->listen[0] && !o->join[0]) {
        fprintf(stderr, "m6d: --devices %d runs the ranks of runs across "
                "nodes (nodes.world_size): it needs --role coordinator "
                "--listen HOST:PORT or --join HOST:PORT\n", o->devices);
        return -1;
    }
    if (o->listen[0]) {
        /* rank 0's collectives bind the --listen host and workers connect
         * to it: a wildcard names no address to give them (127.0.0.1 would
         * be unreachable from another node), and the collectives, which
         * carry gradients unencrypted, belong on the cluster network */
        char host[256], e[300];
        int port;
        if (cluster_parse_addr(o->listen, 1, host, sizeof host, &port, e,
                               sizeof e) < 0) {
            fprintf(stderr, "m6d: --listen: %s\n", e);
            return -1;
        }
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !host[0]) {
            fprintf(stderr, "m6d: --listen %s: give this node's address on "
                    "the cluster network (the one workers --join), not a "
                    "wildcard: rank 0's collectives bind it and workers "
                    "connect to it\n", o->listen);
            return -1;
        }
    }
    if (o->worker && !o->join[0]) {
        fprintf(stderr, "m6d: --role worker needs --join HOST:PORT\n");
        return -1;
    }
    if ((o->listen[0] || o->join[0]) && !o->token_file[0]) {
        fprintf(stderr, "m6d: %s needs --token-file PATH: node traffic is "
                "authenticated with a shared token\n",
                o->listen[0] ? "--listen" : "--join");
        return -1;
    }
    if (o->token_file[0] && !o->listen[0] && !o->join[0]) {
        fprintf(stderr, "m6d: --token-file is for --listen or --join\n");
        return -1;
    }
    if (!o->state_dir[0] && paths_state_dir(o->state_dir, sizeof o->state_dir) < 0) {
        fprintf(stderr, "m6d: no --state-dir and no HOME to derive one\n");
        return -1;
    }
    if (!o->socket_path[0])
        paths_socket_in(o->state_dir, o->socket_path, sizeof o->socket_path);
    if (!o->group_name[0]) {
        struct group gr, *res = NULL;
        char buf[8192];
        getgrgid_r(o->group, &gr, buf, sizeof buf, &res);
        if (res)
            snprintf(o->group_name, sizeof o->group_name, "%s", res->gr_name);
        else
            snprintf(o->group_name, sizeof o->group_name, "%u",
                     (unsigned)o->group);
    }
    return 0;
}

/* ---------------------------------------------------------- open-file limit */

static void rlim_str_(rlim_t v, char *buf, size_t len)
{
    if (v == RLIM_INFINITY)
        snprintf(buf, len, "unlimited");
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* What multiplies in the CPU engine (library, version, ISA; bf16 native or
 * emulated) and its self-check's verdict in each precision, once at start:
 * info when both passed; an error with the reason when one failed (CPU
 * runs in that precision are then refused, backend_cpu_create; m6d keeps
 * serving). */
static void log_gemm_(void)
{
    gemm_info gi;
    char why[GEMM_N_PRECISIONS][512];
    int ok[GEMM_N_PRECISIONS];
    gemm_describe(&gi);
    for (int p = 0; p < GEMM_N_PRECISIONS; p++)
        ok[p] = gemm_ready((gemm_precision)p, why[p], sizeof why[p]) == 0;
    const char *bf16 = gi.bf16_native ? "native" : "emulated";
    if (ok[GEMM_FP32] && ok[GEMM_BF16])
        log_info("cpu.gemm", "library=%s version=%s isa=%s bf16=%s "
                 "selfcheck=passed selfcheck_bf16=passed", gi.library,
                 gi.version, gi.isa, bf16);
    else
        log_error("cpu.gemm", "library=%s version=%s isa=%s bf16=%s "
                  "selfcheck=%s selfcheck_bf16=%s err=\"%s\"", gi.library,
                  gi.version, gi.isa, bf16, ok[GEMM_FP32] ? "passed" : "failed",
                  ok[GEMM_BF16] ? "passed" : "failed",
                  !ok[GEMM_FP32] ? why[GEMM_FP32] : why[GEMM_BF16]);
}

/* A run holds one file descriptor per data shard for its whole life
 * (train/data.h), so a corpus of a few thousand shards, or a few runs'
 * worth, passes the soft RLIMIT_NOFILE of 1024 that shells and systemd
 * (whose default hard limit is 524288) usually give. Raise the soft limit
 * to the hard one, as Go's runtime does at start: m6d waits on descriptors
 * with epoll (libuv), never select(), so numbers past FD_SETSIZE are safe,
 * and it starts no child processes that could inherit the raised limit.
 * One info line with the old and new soft limits; if the raise fails, a
 * warning, and m6d goes on with the limit it has (a shard it then cannot
 * open is refused with "too many open files (limit N)"). */
static void raise_nofile_limit_(void)
{
    struct rlimit rl;
    char cur[32], max[32];
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        log_warn("daemon.nofile", "err=\"getrlimit(RLIMIT_NOFILE): %s\" "
                 "msg=\"open-file limit left as it is\"", strerror(errno));
        return;
    }
    rlim_str_(rl.rlim_cur, cur, sizeof cur);
    rlim_str_(rl.rlim_max, max, sizeof max);
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
            log_warn("daemon.nofile", "old=%s hard=%s err=\"setrlimit"
                     "(RLIMIT_NOFILE): %s\" msg=\"soft limit left at %s: a "
                     "run holds one descriptor per shard\"", cur, max,
                     strerror(errno), cur);
            return;
        }
    }
    log_info("daemon.nofile", "old=%s new=%s", cur, max);
}

/* ------------------------------------------------------------------ notify */

static void notify_(const char *msg)
{
#ifdef HAVE_SYSTEMD
    sd_notify(0, msg);
#else
    (void)msg;
#endif
}

static void watchdog_cb_(uv_timer_t *t)
{
    if (uv_is_closing((uv_handle_t *)t) || g.stopping) return;
    char st[256], msg[320];
    runner_describe(g.runner, st, sizeof st);
    snprintf(msg, sizeof msg, "WATCHDOG=1\nSTATUS=%s", st);
    notify_(msg);
}

static int notify_init_(void)
{
#ifdef HAVE_SYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t ms = usec / 2000;  /* ping at half the interval */
        if (ms < 100) ms = 100;
        uv_timer_init(&g.loop, &g.watchdog);
        uv_timer_start(&g.watchdog, watchdog_cb_, 0, ms);
        g.watchdog_on = 1;
    } else {
        /* No watchdog: still keep STATUS= current, every 5 s. */
        if (getenv("NOTIFY_SOCKET")) {
            uv_timer_init(&g.loop, &g.watchdog);
            uv_timer_start(&g.watchdog, watchdog_cb_, 0, 5000);
            g.watchdog_on = 1;
        }
    }
#endif
    notify_("READY=1\nSTATUS=serving");
    return 0;
}

static int listen_fd_(void)
{
#ifdef HAVE_SYSTEMD
    int n = sd_listen_fds(1);
    if (n >= 1) return SD_LISTEN_FDS_START;
#endif
    return -1;
}

/* ----------------------------------------------------------------- signals */

static void on_signal_(uv_signal_t *h, int signum)
{
    if (uv_is_closing((uv_handle_t *)h)) return;
    if (g.stopping) { /* a second Ctrl-C, a closed terminal: not fatal */
        log_info("daemon.signal", "signal=%s action=ignored msg=\"already "
                 "stopping: the step ends, then the checkpoint\"",
                 strsignal(signum));
        return;
    }
    g.stopping = 1;
    log_info("daemon.signal", "signal=%s", strsignal(signum));
    if (g.runner) /* NULL when the start failed before the runner */
        /* a flag: the runner stops after this step */
        runner_request_shutdown(g.runner);
    uv_stop(h->loop);
}

/* Nothing: the request that makes libuv start its thread pool. */
static void pool_start_(uv_work_t *w)
{
    (void)w;
}

enum { DRAIN_S = 15 };  /* above the runner's 10 s resume wait */
static void on_drain_timeout_(uv_timer_t *t)
{
    (void)t;
    g.drain_expired = 1;
}

/* SIGHUP (a closed terminal, `systemctl reload`): nothing to reload; keep
 * training rather than die without a checkpoint. */
static void on_sighup_(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    log_warn("daemon.signal", "signal=SIGHUP action=ignored msg=\"no configuration "
             "to reload; SIGTERM stops m6d with a checkpoint\"");
}

/* One m6d per state dir: an exclusive flock on STATE_DIR/m6d.lock, taken
 * before the DB is opened or any run is touched, held until exit. The file
 * holds the owner's pid for the error message. 0, or -1 with err. */
static int lock_state_dir_(const char *dir, char *err, size_t errlen)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/m6d.lock", dir);
    /* 0600, and made so if an older m6d left it 0640: a lock file that
     * others may open is one that others may flock (even a shared, read-only
     * flock) to stop m6d from starting */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (fchmod(fd, 0600) != 0) {
        snprintf(err, errlen, "%s: chmod 0600: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "?";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        if (n > 0) {
            pid[n] = 0;
            pid[strcspn(pid, "\n")] = 0;
        }
        snprintf(err, errlen, "state dir %s is in use by another m6d (pid %s); "
                 "one m6d per state dir", dir, pid);
        close(fd);
        return -1;
    }
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    g.lock_fd = fd;
    return 0;
}

/* access: a directory that others may write (o+w) lets anyone replace
 * m6.db, a checkpoint or the control socket (sshd's StrictModes refuses
 * the same). 0, or -1 with err naming the directory, its mode and the fix. */
static int refuse_world_writable_(const char *what, const char *dir,
                                  char *err, size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) return 0;  /* the step that needs it says */
    if (!(sb.st_mode & S_IWOTH)) return 0;
    int socket = strcmp(what, "socket dir") == 0;
    if (sb.st_mode & S_ISVTX) /* shared by design (/tmp): never chmod it */
        snprintf(err, errlen, "%s %s has mode %04o: a shared directory that "
                 "others may write (and so take the name of m6.db, a "
                 "checkpoint or the control socket); m6d will not use it. "
                 "Fix: give %s a directory of m6d's own, e.g. %s (m6d "
                 "creates it 0750)", what, dir,
                 (unsigned)(sb.st_mode & 07777),
                 socket ? "--socket a path in" : "--state-dir",
                 socket ? "$XDG_RUNTIME_DIR/m6/m6d.sock" : "/var/lib/m6");
    else
        snprintf(err, errlen, "%s %s has mode %04o: others may write it (and "
                 "so replace m6.db, a checkpoint or the control socket); m6d "
                 "will not use it. Fix: `chmod o-w %s` (m6d creates its "
                 "directories 0750)%s", what, dir,
                 (unsigned)(sb.st_mode & 07777), dir,
                 socket ? ", or give --socket a path in a directory of "
                          "m6d's own" : "");
    return -1;
}

/* The directory of a socket path ("." for a bare name). */
static void dir_of_(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

/* ----------------------------------------------------------------- metrics */

/* The HTTP side's requests, answered by the control handlers as if from a
 * client past Hello (http.h). */
static int http_dispatch_(void *ctx, const uint8_t *payload, size_t len,
                          uint8_t **frame, size_t *framelen)
{
    /* HTTP has no peer credentials: it may only read */
    session s = {.hello_done = 1, .read_only = 1};
    int close_after = 0;
    return handlers_dispatch(ctx, &s, payload, len, frame, framelen,
                             &close_after);
}

/* Before the state: the figures, and the port, so a port in use stops
 * the start (naming it) before m6.db is touched. 0, or -1 logged. */
static int metrics_bind_(void)
{
    char err[1024], host[256] = "";
    g.http_fd = -1;
    if (!g.opt.metrics_listen[0]) return 0;
    if (gethostname(host, sizeof host) != 0) host[0] = 0;
    host[sizeof host - 1] = 0;
    g.stats = stats_new((double)time(NULL), host, g.opt.peak_flops);
    if (!g.stats) {
        log_error("http.error", "err=\"out of memory\"");
        return -1;
    }
    gemm_info gi;
    gemm_describe(&gi);
    stats_set_gemm(g.stats, gi.library, gi.version, gi.isa, gi.bf16_native,
                   gemm_ready(GEMM_FP32, NULL, 0) == 0,
                   gemm_ready(GEMM_BF16, NULL, 0) == 0);
    g.http_fd = http_listen(g.opt.metrics_listen, err, sizeof err);
    if (g.http_fd < 0) {
        log_error("http.error", "err=\"%s\"", err);
        fprintf(stderr, "m6d: %s\n", err);
        return -1;
    }
    return 0;
}

/* http_auth_fn: the --metrics-token-file token (cluster_token_matches:
 * constant time) */
static int http_auth_(void *ctx, const void *p, size_t n)
{
    return cluster_token_matches(ctx, p, n);
}

/* Whether a listen host is loopback only: 127.x.y.z, ::1, localhost. */
static int loopback_host_(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcasecmp(host, "localhost") == 0;
}

/* After the runner: serve. 0, or -1 logged. */
static int metrics_start_(void)
{
    char err[512];
    if (g.http_fd < 0) return 0;
    g.http_handlers = (handlers_ctx){.st = g.st, .runner = g.runner};
    http_config hc = {.fd = g.http_fd, .stats = g.stats,
                      .dispatch = http_dispatch_,
                      .dispatch_ctx = &g.http_handlers};
    if (http_listen_host(g.opt.metrics_listen, hc.listen_host,
                         sizeof hc.listen_host) != 0) {
        log_error("http.error", "err=\"--metrics-listen: host too long\"");
        return -1;
    }
    memcpy(hc.hosts, g.opt.metrics_hosts, sizeof hc.hosts);
    if (g.opt.metrics_token_file[0]) {
        if (cluster_token_load(g.opt.metrics_token_file, &g.http_token, err,
                               sizeof err) < 0) {
            log_error("http.error", "err=\"--metrics-token-file: %s\"", err);
            fprintf(stderr, "m6d: --metrics-token-file: %s\n", err);
            return -1;
        }
        hc.auth = http_auth_;
        hc.auth_ctx = &g.http_token;
    } else if (!loopback_host_(hc.listen_host)) {
        log_warn("http.open", "addr=%s msg=\"the HTTP API (run names, errors, "
                 "paths) is served beyond loopback without a token: set "
                 "--metrics-token-file, or bind 127.0.0.1\"",
                 g.opt.metrics_listen);
    }
    g.http_fd = -1; /* the server's now, closed by it */
    g.http = http_start(&hc, err, sizeof err);
    if (!g.http) {
        log_error("http.error", "err=\"%s\"", err);
        return -1;
    }
    log_info("http.listen", "addr=%s paths=\"/metrics / /api/runs\"",
             g.opt.metrics_listen);
    return 0;
}

static void metrics_stop_(void)
{
    http_stop(g.http);
    g.http = NULL;
    if (g.http_fd >= 0) close(g.http_fd);
    g.http_fd = -1;
}

static void close_walk_(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* close_walk_ but for the signal handles, which are only unref'd: until
 * the worker is joined a signal must stay caught (logged), not fatal. */
static void close_but_signals_(uv_handle_t *h, void *arg)
{
    if (h == (uv_handle_t *)&g.sigterm || h == (uv_handle_t *)&g.sigint ||
        h == (uv_handle_t *)&g.sighup) {
        uv_unref(h);
        return;
    }
    close_walk_(h, arg);
}

/* ------------------------------------------------------------------- nodes */

/* The first join gave up, or the coordinator refused this node: m6d stops
 * (exit 1) with the reason, as for any failed start. */
static void on_join_fatal_(void *ud, const char *msg)
{
    (void)ud;
    log_error("cluster.join_failed", "err=\"%s\"", msg);
    fprintf(stderr, "m6d: %s\n", msg);
    g.join_failed = 1;
    if (!g.stopping) {
        g.stopping = 1;
        if (g.runner) runner_request_shutdown(g.runner);
        uv_stop(&g.loop);
    }
}

/* After the runner is up: this node's facts and id; a worker starts
 * joining, the others list themselves in the nodes table, and a
 * coordinator listens. 0, or -1 with err. */
/* wiring: the coordinator sent this node a rank (join's loop) */
static void on_join_assign_(void *ud, const cluster_assign *a)
{
    (void)ud;
    cluster_dp_assign(g.dpw, a);
}

/* The ranks this node runs, one per device: --devices; unset, every GPU
 * of a cuda node in a cluster (--listen or --join), else 1. Decided in
 * cluster_start_, from the node's facts. */
static int local_ranks_(void)
{
    return g.facts.devices > 1 ? g.facts.devices : 1;
}

/* device.threads for each local rank: --threads as today with one rank
 * (0 keeps the spec's); with several, each rank's share of the node's
 * (--threads, else the CPUs m6d may use), logged. */
static int rank_threads_(void)
{
    static int t;  /* once: the main thread, before the runner starts */
    int n = local_ranks_();
    if (n == 1) return g.opt.threads;
    if (t) return t;
    int total = g.opt.threads > 0 ? g.opt.threads : cpus_available();
    t = cluster_rank_threads(total, n);
    log_info("cluster.devices", "local_ranks=%d threads=%d per_rank=%d", n,
             total, t);
    return t;
}

static int cluster_start_(char *err, size_t errlen)
{
    static const cluster_gpus gpus = {trainer_cuda_devices,
                                      trainer_cuda_free_bytes};
    cluster_set_gpus(&gpus);  /* the cluster library links no CUDA */
    cluster_facts_get(&g.facts, g.opt.node_name,
                      g.opt.join[0] || g.opt.listen[0]);
    /* facts.devices: the GPUs this process sees (CUDA_VISIBLE_DEVICES),
     * or 1 on cpu; it becomes the ranks this node runs */
    int cuda = strcmp(g.facts.backend, "cpu") != 0;
    if (cuda && g.opt.devices > g.facts.devices) {
        snprintf(err, errlen, "--devices %d: this node has %d visible CUDA "
                 "device%s (CUDA_VISIBLE_DEVICES=%s)", g.opt.devices,
                 g.facts.devices, g.facts.devices == 1 ? "" : "s",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                : "unset");
        return -1;
    }
    if (g.opt.devices > 0)
        g.facts.devices = g.opt.devices;
    else if (cuda && !g.opt.join[0] && !g.opt.listen[0])
        g.facts.devices = 1;  /* a single m6d: one rank, on GPU 0 */
    /* the node's host memory, lockable pages and host AdamW threads are
     * divided among the ranks of a run on it (common/node_share.h) */
    node_share_set(g.facts.hostname, local_ranks_());
    gemm_info gi;  /* the cluster library does not link the kernels */
    gemm_describe(&gi);
    snprintf(g.facts.gemm, sizeof g.facts.gemm, "%s %s", gi.library, gi.isa);
    if (cluster_node_uuid(g.opt.state_dir, g.node_uuid, err, errlen) < 0)
        return -1;
    if (g.opt.join[0]) {
        cluster_join_config jc = {
            .loop = &g.loop, .addr = g.opt.join, .token = &g.token,
            .facts = &g.facts, .node_uuid = g.node_uuid,
            .state_dir = g.opt.state_dir,
            .timeout_ms = g.opt.node_timeout_ms, .on_fatal = on_join_fatal_,
            .on_assign = on_join_assign_};
        g.dpw = cluster_dp_worker_start(g.opt.join, &g.token, g.opt.state_dir,
                                        rank_threads_(), local_ranks_(), 0);
        if (!g.dpw) {
            snprintf(err, errlen, "cannot start the ranks' thread");
            return -1;
        }
        g.join = cluster_join_start(&jc, err, errlen);
        return g.join ? 0 : -1;
    }
    /* its own node secret: rank 0's store client presents it */
    char secret_hex[65] = "";
    if (cluster_node_secret_ensure(g.opt.state_dir, secret_hex, err, errlen) < 0) {
        if (g.opt.listen[0]) return -1;  /* a coordinator's ranks need it */
        log_warn("cluster.self", "msg=\"%s\"", err);
        secret_hex[0] = 0;
    }
    if (cluster_self_register(g.st, &g.facts, g.node_uuid, secret_hex, err,
                              errlen) < 0)
        log_warn("cluster.self", "msg=\"%s\"", err);  /* not fatal */
    else
        g.self_registered = 1;
    if (!g.opt.listen[0]) return 0;
    /* wiring: rank 0 dials its own store; its Gloo (NCCL) endpoint binds
     * the --listen host, which workers reach (a wildcard is refused at
     * parse_args_) */
    char host[256];
    int port;
    if (cluster_parse_addr(g.opt.listen, 1, host, sizeof host, &port, err,
                           errlen) < 0)
        return -1;
    cluster_coord_config cc = {.loop = &g.loop, .st = g.st,
                               .listen = g.opt.listen, .token = &g.token,
                               .timeout_ms = g.opt.node_timeout_ms};
    g.cluster = cluster_coord_init(&cc, err, errlen);
    if (!g.cluster) return -1;
    snprintf(g.dpc.host, sizeof g.dpc.host, "%s", host);
    snprintf(g.dpc.store_addr, sizeof g.dpc.store_addr,
             strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             cluster_coord_port(g.cluster));
    g.dpc.devices = local_ranks_();
    if (g.dpc.devices > 1) {
        /* ranks 1..devices-1 of its runs: rank threads like a worker's,
         * dialing its own store */
        g.dpc.local = cluster_dp_worker_start(g.dpc.store_addr, &g.token,
                                              g.opt.state_dir,
                                              rank_threads_(),
                                              g.dpc.devices - 1, 1);
        if (!g.dpc.local) {
            snprintf(err, errlen, "cannot start the local ranks' threads");
            return -1;
        }
    }
    cluster_dp_coord_attach(&g.dpc, g.cluster);
    return 0;
}

/* -------------------------------------------------------------------- main */

/* OpenMP's threads must not spin at barriers against other work on the
 * machine: on 2 cores beside one busy process the CPU engine kept 0.36 of
 * its quiet tokens/s with libgomp's default (spinning) wait and 0.52 with
 * OMP_WAIT_POLICY=passive, for 0.91 of the quiet figure when nothing else
 * runs (bench/cpu_shared.sh, bench/RESULTS.md). libgomp reads the policy
 * from the environment when it is loaded, before main, so m6d sets it and
 * executes itself again, once (same pid), unless the operator chose a
 * policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT set). A failed exec goes on
 * with the default policy. */
static void omp_passive_(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return;
    /* the binary's own path, not /proc/self/exe: the process keeps its
     * name (comm "m6d", what ps, pgrep and systemd show) */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1)
        return;
    self[n] = 0;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0)
        return;
    execv(self, argv);
    unsetenv("OMP_WAIT_POLICY"); /* not applied: say so truly */
}

int main(int argc, char **argv)
{
    char err[4600];
    omp_passive_(argv);
    /* access: what m6d creates (m6.db, runs/, checkpoints, its dirs) has
     * the same modes whatever umask the caller had: no write for the
     * group, nothing for others */
    umask(0027);
    if (parse_args_(argc, argv, &g.opt) < 0) return 2;
    signal(SIGPIPE, SIG_IGN);
    /* SIGTERM, SIGINT, SIGHUP... are taken by the loop thread alone
     * (common/threads.h): blocked here, so that every thread started from
     * now on inherits the block; unblocked on this thread once the loop
     * runs (a signal sent meanwhile waits for it). */
    sigset_t loop_mask;
    threads_block(&loop_mask);

    char runs[2200], db[2200];
    if (paths_mkdir_p(g.opt.state_dir, 0750) < 0) {
        int e = errno;
        log_error("daemon.error", "state_dir=%s err=\"%s\"%s", g.opt.state_dir,
                  strerror(e), e == EACCES ? " hint=\"m6d's uid may not reach "
                  "or create it: check it and each directory above it\"" : "");
        fprintf(stderr, "m6d: state dir %s: %s (uid %d)\n", g.opt.state_dir,
                strerror(e), (int)geteuid());
        return 1;
    }
    /* access: no directory others may write; the socket systemd passed
     * (m6d.socket) is checked by systemd's SocketMode= instead */
    int listen_fd = listen_fd_();
    char sock_dir[2048];
    dir_of_(g.opt.socket_path, sock_dir, sizeof sock_dir);
    if (refuse_world_writable_("state dir", g.opt.state_dir, err,
                               sizeof err) < 0 ||
        (listen_fd < 0 &&
         refuse_world_writable_("socket dir", sock_dir, err, sizeof err) < 0)) {
        log_error("daemon.error", "err=\"%s\"", err);
        fprintf(stderr, "m6d: %s\n", err);
        return 1;
    }
    /* the token before anything else: a token file others may read is a
     * refusal at start, naming its mode */
    if (g.opt.token_file[0] &&
        cluster_token_load(g.opt.token_file, &g.token, err, sizeof err) < 0) {
        log_error("daemon.error", "err=\"%s\"", err);
        fprintf(stderr, "m6d: %s\n", err);
        return 1;
    }
    if (lock_state_dir_(g.opt.state_dir, err, sizeof err) != 0) {
        log_error("daemon.error", "err=\"%s\"", err);
        fprintf(stderr, "m6d: %s\n", err);
        return 1;
    }
    snprintf(db, sizeof db, "%s/m6.db", g.opt.state_dir);
    snprintf(runs, sizeof runs, "%s/runs", g.opt.state_dir);
    log_info("daemon.start", "version=%s pid=%d state_dir=%s omp_wait_policy=%s",
             M6_VERSION, (int)getpid(), g.opt.state_dir,
             getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY")
             : getenv("GOMP_SPINCOUNT") ? "GOMP_SPINCOUNT" : "default");
    raise_nofile_limit_();
    log_gemm_();

    int rc = 1;
    if (uv_loop_init(&g.loop) < 0) {
        log_error("daemon.error", "err=\"uv_loop_init failed\"");
        return 1;
    }
    /* Signals caught from here on: a SIGTERM during a long start (the DB
     * check of a large m6.db) is acted on once the loop runs, not fatal. */
    uv_signal_init(&g.loop, &g.sigterm);
    uv_signal_init(&g.loop, &g.sigint);
    uv_signal_start(&g.sigterm, on_signal_, SIGTERM);
    uv_signal_start(&g.sigint, on_signal_, SIGINT);
    uv_signal_init(&g.loop, &g.sighup);
    uv_signal_start(&g.sighup, on_sighup_, SIGHUP);
    /* The socket before the state: an m6d that cannot serve (its socket
     * busy) must not create m6.db or take up a run. Connections wait in the
     * backlog until the loop runs, by then with the runner up. */
    server_config sc = {.loop = &g.loop, .socket_path = g.opt.socket_path,
                        .listen_fd = listen_fd, .handlers = &g.handlers,
                        .group = g.opt.group, .group_name = g.opt.group_name,
                        .group_read_only = g.opt.group_read_only,
                        .idle_timeout_ms = g.opt.conn_idle_ms,
                        .state_dir = g.opt.state_dir};
    g.srv = server_init(&sc, err, sizeof err);
    if (!g.srv) {
        log_error("server.error", "err=\"%s\"", err);
        goto out_loop;
    }
    if (metrics_bind_() < 0) goto out_server;
    g.st = state_open(db, err, sizeof err);
    if (!g.st) {
        log_error("state.error", "db=%s err=\"%s\"", db, err);
        goto out_server;
    }
    state_set_hold_limit(g.st, g.opt.db_hold_limit_s);
    /* the loop answers every client: it never waits long for another
     * process's lock on m6.db (the runner and the pool threads do) */
    state_thread_wait_limit(5);
    cluster_dp_coord_init(&g.dpc);
    g.dpc.token = &g.token;
    g.dpc.state_dir = g.opt.state_dir;
    g.dpc.st = g.st;
    g.dist = (runner_dist){.group = cluster_dp_coord_group,
                          .ungroup = cluster_dp_coord_ungroup,
                          .lost = cluster_dp_coord_lost, .ud = &g.dpc};
    /* the cluster before the runner: a run across nodes taken up at start
     * finds its coordinator attached (else its first nodes.wait event
     * said this m6d was no coordinator) */
    if (cluster_start_(err, sizeof err) < 0) {
        log_error("cluster.error", "err=\"%s\"", err);
        fprintf(stderr, "m6d: %s\n", err);
        goto out_server;
    }
    /* rank 0 of a run across nodes takes its share of the cores too
     * (folded into the run's spec like --threads); a run of one rank has
     * them all */
    runner_config cc = {.st = g.st, .runs_dir = runs,
                       .threads = g.opt.threads,
                       .rank_threads = local_ranks_() > 1 ? rank_threads_()
                                                          : 0,
                       .coordinator = g.opt.coordinator,
                       .worker_of = g.opt.join[0] ? g.opt.join : NULL,
                       .stats = g.stats, .dist = &g.dist};
    g.runner = runner_init(&cc, err, sizeof err);
    if (!g.runner) {
        log_error("runner.error", "err=\"%s\"", err);
        goto out_server;
    }
    g.handlers = (handlers_ctx){.st = g.st, .runner = g.runner, .stats = g.stats,
                                .cluster_join = g.opt.join[0] ? g.opt.join : NULL};
    if (metrics_start_() < 0) goto out_server;
    notify_init_();

    /* libuv starts its pool's threads at the first request: start them
     * now, with the signals still blocked */
    static uv_work_t pool_start;
    uv_queue_work(&g.loop, &pool_start, pool_start_, NULL);
    threads_restore(&loop_mask);
    uv_run(&g.loop, UV_RUN_DEFAULT);

    notify_("STOPPING=1\nSTATUS=finishing the current step");
    log_info("daemon.stopping", "waiting_for=\"the running step (if any) and requests in flight\"");
    /* the replies of requests in flight (a resume waits for the runner's
     * answer, which comes at the end of its step), for DRAIN_S at most: a
     * client that does not read its reply does not hold up the exit */
    server_drain(g.srv);
    cluster_join_leave(g.join);  /* this node: left, not lost */
    uv_timer_t drain_timer;
    uv_timer_init(&g.loop, &drain_timer);
    g.drain_expired = 0;
    uv_timer_start(&drain_timer, on_drain_timeout_, DRAIN_S * 1000, 0);
    while ((server_draining(g.srv) > 0 || cluster_join_busy(g.join)) &&
           !g.drain_expired)
        uv_run(&g.loop, UV_RUN_ONCE);
    if (g.drain_expired)
        log_warn("daemon.drain", "msg=\"%d replies not sent after %d s; "
                 "closing their connections\"", server_draining(g.srv),
                 DRAIN_S);
    uv_timer_stop(&drain_timer);
    rc = g.join_failed ? 1 : 0;
out_server:
    metrics_stop_(); /* its requests ask the runner and the state */
    cluster_dp_coord_attach(&g.dpc, NULL);  /* rank 0 gathers no more nodes */
    cluster_coord_fini(g.cluster);
    g.cluster = NULL;
    cluster_join_fini(g.join);
    g.join = NULL;
    server_fini(g.srv);
    g.srv = NULL;
out_loop:
    uv_walk(&g.loop, close_but_signals_, NULL);
    uv_run(&g.loop, UV_RUN_DEFAULT);  /* close callbacks; pool work ends */
    /* joins the runner thread: step ends, checkpoint written */
    runner_fini(g.runner);
    cluster_dp_worker_stop(g.dpw);  /* its group fails or times out */
    cluster_dp_worker_stop(g.dpc.local);
    g.dpc.local = NULL;
    g.dpw = NULL;
    /* log the signals caught meanwhile (a loop of unref'd handles only
     * would return at once) */
    uv_ref((uv_handle_t *)&g.sigterm);
    uv_run(&g.loop, UV_RUN_NOWAIT);
    uv_walk(&g.loop, close_walk_, NULL);
    /* closing the last handle of a signal puts back its default action: a
     * late second Ctrl-C would kill m6d after its checkpoint (exit 130
     * where 0 is due). From here to the exit they are ignored; the window
     * between the two calls is a few instructions long. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    uv_run(&g.loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&g.loop) != 0) {
        log_error("daemon.leak", "msg=\"handles still open at exit\"");
        rc = 1;
    }
    if (g.self_registered) cluster_self_leave(g.st, g.node_uuid);
    state_close(g.st);
    stats_free(g.stats);
    log_info("daemon.exit", "rc=%d", rc);
    return rc;
}
