/*
 * intervals.h — internal to daemon/offload: how one pass over the layers is
 * cut into residency intervals of offloaded slots. The planner counts bytes
 * with it and the scheduler runs it, so the two cannot disagree.
 *
 * Positions of a pass: forward layer l is position l; backward layer l is
 * position L + (L-1-l). A training microbatch has 2L positions, an
 * evaluation pass L. An interval is a maximal run of adjacent positions
 * whose layers use the same offloaded slot: one staging buffer, one fetch.
 */
#ifndef M6_OFFLOAD_INTERVALS_H
#define M6_OFFLOAD_INTERVALS_H

typedef struct {
    int slot;
    int first, last;       /* positions, inclusive */
    int has_bwd;           /* covers backward positions: its gradient is
                            * prepared before and drained after */
    int grad_from_host;    /* has_bwd: start from the host's partial
                            * gradient (else from zero) */
    int final;             /* has_bwd: after this drain the slot's gradient
                            * for the step is complete */
} offload_interval;

/* Layer at position pos of a pass over L layers. */
static inline int offload_pos_layer(int pos, int L)
{
    return pos < L ? pos : 2 * L - 1 - pos;
}

/* Cut one pass. with_bwd: a training microbatch (else forward only).
 * touched[S], in/out: the slot had a backward interval earlier in this step
 * (its partial gradient is on the host). last_mb: this is the step's last
 * microbatch, so each slot's last backward interval is final.
 * iv holds up to 2L entries; at_pos[2L] receives the interval of each
 * position or -1 (resident slot). Returns the number of intervals. */
static inline int offload_cut_pass(const int *slot_of, int L,
                                   const unsigned char *offloaded,
                                   int with_bwd, int last_mb,
                                   unsigned char *touched,
                                   offload_interval *iv, int *at_pos)
{
    int npos = with_bwd ? 2 * L : L, n = 0;
    for (int p = 0; p < npos; p++) {
        int s = slot_of[offload_pos_layer(p, L)];
        at_pos[p] = -1;
        if (!offloaded[s])
            continue;
        if (n > 0 && iv[n - 1].slot == s && iv[n - 1].last == p - 1) {
            iv[n - 1].last = p;
        } else {
            iv[n] = (offload_interval){.slot = s, .first = p, .last = p};
            n++;
        }
        at_pos[p] = n - 1;
        if (p >= L && !iv[n - 1].has_bwd) {
            iv[n - 1].has_bwd = 1;
            iv[n - 1].grad_from_host = touched[s];
            touched[s] = 1;
        }
    }
    if (with_bwd && last_mb)
        for (int j = n - 1; j >= 0; j--) {
            int later = 0;
            for (int i = j + 1; i < n; i++)
                later |= iv[i].slot == iv[j].slot && iv[i].has_bwd;
            iv[j].final = iv[j].has_bwd && !later;
        }
    return n;
}

/* Of the n intervals of a step's only (so last) training microbatch: the
 * most offloaded slots whose gradient is partial at once, on the host
 * between a slot's first backward interval and its final one (a slot used
 * by non-adjacent layers). 0 when every slot's backward is one interval. */
static inline int offload_partial_max(const offload_interval *iv, int n)
{
    int most = 0;
    for (int j = 0; j < n; j++) {
        int open = 0;
        for (int i = 0; i < j; i++) {
            if (!iv[i].has_bwd || iv[i].final || iv[i].grad_from_host)
                continue;   /* not where a slot's partial gradient opens */
            for (int f = i + 1; f < n; f++)
                if (iv[f].slot == iv[i].slot && iv[f].final) {
                    open += f >= j;
                    break;
                }
        }
        if (open > most)
            most = open;
    }
    return most;
}

#endif /* M6_OFFLOAD_INTERVALS_H */
