/*
 * phase.h — the phase of a run, the one type for it inside m6: Pseudo
 * (layers share slots, pseudo.steps of them) then Real (every layer its
 * own slot, after delink). The trainer, the runner and the state
 * module use it; its text form ("pseudo", "real") is what m6.db and the
 * checkpoints' meta.json hold. The protocol's Phase enum (proto/m6.proto)
 * is the edge's: handlers.c and m6ctl map to and from it.
 */
#ifndef M6_PHASE_H
#define M6_PHASE_H

#include <string.h>

typedef enum { PHASE_PSEUDO = 0, PHASE_REAL = 1 } run_phase;

/* "pseudo" or "real" (anything but PHASE_PSEUDO is real). */
static inline const char *phase_name(run_phase phase)
{
    return phase != PHASE_PSEUDO ? "real" : "pseudo";
}

/* PHASE_PSEUDO or PHASE_REAL for "pseudo" or "real", -1 for anything else
 * (NULL included). */
static inline int phase_parse(const char *s)
{
    if (s && strcmp(s, "pseudo") == 0) return PHASE_PSEUDO;
    if (s && strcmp(s, "real") == 0) return PHASE_REAL;
    return -1;
}

#endif /* M6_PHASE_H */
