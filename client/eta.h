/*
 * eta.h — `m6ctl watch`'s time-left estimate.
 *
 * The steps left at the rate watch saw over its recent polls: the polls of
 * the last ETA_WINDOW_S seconds, and older ones too while the window holds
 * fewer than ETA_MIN_STEPS steps. The step count bound keeps a pause that
 * fills the window (an evaluation, a checkpoint, a busy machine) from being
 * read as the rate of the whole run: with the 30-second window alone, one
 * 30-second evaluation made the ETA 30 s × the steps left. The 120-second
 * window spans several evaluations at the usual eval intervals, so their
 * cost is averaged in rather than swinging the figure.
 */
#ifndef M6_CLIENT_ETA_H
#define M6_CLIENT_ETA_H

#define ETA_POLLS 1024
#define ETA_WINDOW_S 120.0
#define ETA_MIN_S 2.0
#define ETA_MIN_STEPS 20

typedef struct {
    double t[ETA_POLLS];     /* poll times, seconds (any monotonic origin) */
    long long step[ETA_POLLS];
    int head, n;
} eta_window;

/* Records one poll of a running run (step `step` of `total` at time `now`,
 * seconds) and returns the estimated seconds left, or -1 while the polls
 * span less than ETA_MIN_S seconds or no step (the caller then shows m6d's
 * own estimate). A step lower than the last poll's (the run went back to a
 * checkpoint) restarts the window. */
double eta_update(eta_window *w, long long step, long long total, double now);

/* Forgets every poll (the run stopped running). */
void eta_reset(eta_window *w);

#endif
