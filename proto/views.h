/*
 * views.h — what m6ctl prints: each of its views is one field table
 * (common/view.h), rendered as text, --json or --csv by the one renderer.
 * The plan's view is the planner's own (offload_plan_print).
 */
#ifndef M6CTL_VIEWS_H
#define M6CTL_VIEWS_H

#include "common/view.h"
#include "m6.pb-c.h"

/* A row of views_run and views_watch_line: the daemon's RunInfo, the
 * reply's message (the commands' --json; NULL none) and watch's own ETA
 * (seconds; < 0 none). */
typedef struct {
    const M6__RunInfo *r;
    const char *message;
    double watch_eta;
} views_run_row;

/* A row of views_watch_event: a delink or resume watch saw. */
typedef struct {
    const char *event;
    long long step, last_seen; /* last_seen < 0: none */
} views_watch_event_row;

/* Rows: views_run_row. list: the columns; status: the "label: value"
 * lines; --json (list, status, the commands): the fields with a name. */
extern const view views_run;
/* watch's line, "step 5/100 running pseudo loss 2.3456 val - tok/s 1234
 * eta 3m05s" (the ETA watch measured). Rows: views_run_row. */
extern const view views_watch_line;
/* Rows: M6__MetricRow (metrics: table, --csv, --json). */
extern const view views_metrics;
/* views_metrics with the MoE router's columns after it (moe_aux_loss ...
 * moe_experts_empty per block and microbatch, then moe_step_tokens_min ...
 * moe_experts_idle of the whole step): `m6ctl metrics` of an MoE run. */
extern const view views_metrics_moe;
/* Rows: M6__Event (events: table with UTC times, --json). */
extern const view views_events;
/* Rows: M6__CheckpointEntry (checkpoints: table with sizes, --json). */
extern const view views_checkpoints;
/* Rows: M6__SubmitReply (text: the id alone). */
extern const view views_submit;
/* Rows: views_watch_event_row (watch --json's event lines). */
extern const view views_watch_event;
/* Rows: M6__RankState (status: the ranks of a run of several, a table
 * after the run's lines; --json has them as the run's "ranks"). */
extern const view views_ranks;
/* Rows: M6__NodeInfo (nodes: table, --json). */
extern const view views_nodes;

/* "queued", "running", ...: the state's name in common/run_state.h's
 * table; "unknown" for UNSPECIFIED or a number it does not know. */
const char *views_state_str(M6__RunState s);
/* completed, failed or stopped */
int views_terminal(M6__RunState s);

#endif /* M6CTL_VIEWS_H */
