/* eta.c — watch's time-left estimate (eta.h). */
#include "eta.h"

void eta_reset(eta_window *w)
{
    w->n = 0;
}

double eta_update(eta_window *w, long long step, long long total, double now)
{
    int last = (w->head + ETA_POLLS - 1) % ETA_POLLS;
    if (w->n && step < w->step[last]) w->n = 0;
    w->t[w->head] = now;
    w->step[w->head] = step;
    w->head = (w->head + 1) % ETA_POLLS;
    if (w->n < ETA_POLLS) w->n++;
    /* Drop the oldest poll while it is older than ETA_WINDOW_S and the
     * polls after it still span ETA_MIN_STEPS steps. */
    int oldest = (w->head + ETA_POLLS - w->n) % ETA_POLLS;
    while (w->n > 2 && now - w->t[oldest] > ETA_WINDOW_S) {
        int next = (oldest + 1) % ETA_POLLS;
        if (step - w->step[next] < ETA_MIN_STEPS) break;
        oldest = next;
        w->n--;
    }
    double dt = now - w->t[oldest];
    long long ds = step - w->step[oldest];
    if (dt < ETA_MIN_S || ds < 1) return -1;
    return (double)(total - step) * dt / (double)ds;
}
