/*
 * m6ctl_internal.h — what m6ctl's files share, private to client/: the exit
 * statuses, the options of the command line (g), and the helpers the
 * command files call in m6ctl.c: the error line, the request to m6d, a RUN
 * argument, a run's view. m6ctl.c owns the table of commands, the
 * connection and the plain commands; m6ctl_watch.c `watch`, m6ctl_plan.c
 * `plan`, m6ctl_export.c `export`, `import` and `plot`.
 */
#ifndef M6CTL_INTERNAL_H
#define M6CTL_INTERNAL_H

#include <stddef.h>

#include "common/view.h"
#include "m6.pb-c.h"

/* Exit status: 0 ok; 1 the daemon refused (its message on stderr; a RUN it
 * does not know included) or the watched run failed; 2 usage (a malformed
 * RUN included, for every command); 3 the watched run was stopped; 4 m6d
 * could not be reached, or the connection broke. */
enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_STOPPED = 3,
       EXIT_UNREACHABLE = 4 };

/* The command line's options, set by main and read by the commands. */
typedef struct {
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
    /* plan at scale (--nodes, --gpus-per-node, --host-memory, --explain):
     * cluster set when any of them is given */
    int cluster, nodes, gpus_per_node, explain;
    int world_size, expert_parallel;  /* resume --world-size, --expert-parallel
                                       * (0: not given) */
    size_t host_memory;     /* per node, bytes (0: not limited) */
    /* plan --p2r (offload/plan_p2r.h): rates 0 and the rest < 0 when not
     * given; p2r_only names the last option given that needs --p2r */
    int p2r;
    const char *p2r_only;
    double gpu_tflops, mfu, h2d_gbps, d2h_gbps, adam_gbps;
    double nvlink_gbps, net_gbps, a2a_latency_us;  /* the experts' all-to-all */
    int a2a_latency_given;
    double steps_ratio, scratch_steps, pseudo_lr_scale;
    char sweep[4096], corpus[256], grad_scale[8];
    char out_dir[4096];     /* data prepare */
    double val_fraction;
    long shard_tokens;
    long export_step;       /* export --step; -1: the newest checkpoint */
    char format[32];        /* export --format */
    int force;              /* export, import: replace --out */
    int from_scratch;       /* resume --from-scratch */
    long long memory_budget; /* resume --memory-budget: bytes, -1 none,
                              * 0 not given */
} m6ctl_opts;
extern m6ctl_opts g;

/* End watch's progress line (a tty's \r-redrawn bar), if one is open. */
void m6ctl_end_bar_(void);
/* "m6ctl: <message>" on stderr, after ending watch's progress line. */
void m6ctl_errf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One request to m6d and its answer (NULL: the connection failed, said on
 * stderr; g.transport_err set). */
M6__Response *m6ctl_request_(M6__Request *rq);
/* m6ctl_request_ of frame_request(which, body). */
M6__Response *m6ctl_ask_(M6__Request__BodyCase which, ProtobufCMessage *body);
/* A RUN argument (an id or a name) into *ref: 0, or -1 (said). */
int m6ctl_parse_run_(const char *arg, M6__RunRef *ref);
/* The output of a run's view: text_form with lines, or g's --json/--csv. */
view_out m6ctl_run_out_(view_form text_form, int lines);
/* One row of a view: --json an indented object, else its line. */
void m6ctl_print_one_(const view *v, const void *row);
/* A request of kind which about the run arg names: its answer, or NULL
 * (said; a malformed RUN too). */
M6__Response *m6ctl_run_request_(M6__Request__BodyCase which, const char *arg);
/* One page of a run's metrics: the rows after step after_step, at most
 * limit of them (0: m6d's page size). The answer (resp->metrics may be
 * NULL: no rows), or NULL (said). */
M6__Response *m6ctl_metrics_page_(M6__RunRef *ref, int64_t after_step,
                                  int limit);
/* The spec file at path, read whole (malloc'd), or NULL (said). */
char *m6ctl_read_spec_(const char *path);

/* The commands in their own files. */
int cmd_watch_(int argc, char **argv);
int cmd_plan_(int argc, char **argv);
int cmd_export_(int argc, char **argv);
int cmd_import_(int argc, char **argv);
int cmd_plot_(int argc, char **argv);
int cmd_data_(int argc, char **argv);

#endif /* M6CTL_INTERNAL_H */
