/*
 * advice.h — what the operator can do next about a core error, keyed by
 * its code (common/err.h). The core's messages say only what happened
 * ("too many open files (limit 64): ...", "no checkpoint of run 3 loads:
 * ..."); the edge (the control handlers) adds these words after them.
 *
 * Header-only (static inline): the handlers and the tests share it.
 */
#ifndef M6_ADVICE_H
#define M6_ADVICE_H

#include "common/err.h"

/* How to raise the open-file limit, for both codes that meet it. */
#define M6_ADVICE_NOFILE                                                    \
    "a run keeps every shard open: raise m6d's open-file limit (ulimit "   \
    "-n, LimitNOFILE= under systemd) or use fewer, larger shards (m6ctl "  \
    "data prepare --shard-tokens)"

/* The advice for an error of code, and what joins it to the message
 * ("; ", or ": " where the advice reads as the message's consequence).
 * text NULL: there is none. */
typedef struct {
    const char *sep;
    const char *text;
} m6_advice;

static inline m6_advice m6_advice_for(m6_code code)
{
    switch (code) {
    case M6_EDATA:
        return (m6_advice){"; ", "once the shard is fixed, `m6ctl resume` "
                                 "reopens the data"};
    case M6_ENOFILE:
        return (m6_advice){"; ", M6_ADVICE_NOFILE "; once m6d can open "
                                 "them, `m6ctl resume` reopens the data"};
    case M6_ESUBMITFD:
        return (m6_advice){"; ", M6_ADVICE_NOFILE};
    case M6_ENOCKPT:
        return (m6_advice){": ", "`m6ctl resume` starts the run over from "
                                 "step 0"};
    case M6_ECKPTGONE:
        return (m6_advice){"; ", "put the checkpoints back where they were "
                                 "and `m6ctl resume RUN` takes the run up "
                                 "from them; or `m6ctl resume RUN "
                                 "--from-scratch` trains it again from step 0 "
                                 "(its metrics rows are then dropped, and "
                                 "events say so)"};
    default:
        return (m6_advice){"", NULL};
    }
}

#endif /* M6_ADVICE_H */
