/*
 * crashpoint.h — places where a test may have m6d die as kill -9 would
 * (bench/crash_soak): never armed in normal operation. Header-only, like
 * clock.h, so the engine library can use it without linking common/.
 *
 * M6_TEST_CRASH="NAME:N" makes the N-th pass of this process through
 * crashpoint("NAME") send SIGKILL to the process itself: no handler, no
 * cleanup, no flush, exactly a kill -9 at that line. The names:
 *   step    in trainer_step, the gradients done, before the update
 *   eval    in a validation pass, after its first batch
 *   ckpt    in trainer_save, the tensors written, meta.json not yet
 *   delink  in the runner, the model delinked, not yet recorded
 *   commit  in a state DB transaction, its rows written, before COMMIT
 * Each name is passed in one translation unit only, so the count (a
 * static of that unit) is the process's.
 */
#ifndef M6_CRASHPOINT_H
#define M6_CRASHPOINT_H

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* Die (SIGKILL) if M6_TEST_CRASH names `name` and this is its N-th pass. */
static inline void crashpoint(const char *name)
{
    static int armed = -1;      /* -1 not read yet, 0 off, 1 on */
    static char want[32];
    static long at, seen;
    if (armed < 0) {
        const char *e = getenv("M6_TEST_CRASH");
        const char *colon = e ? strchr(e, ':') : NULL;
        armed = 0;
        if (colon && (size_t)(colon - e) < sizeof want) {
            memcpy(want, e, (size_t)(colon - e));
            want[colon - e] = 0;
            at = strtol(colon + 1, NULL, 10);
            armed = at > 0;
        }
    }
    if (armed && strcmp(name, want) == 0 && ++seen == at)
        raise(SIGKILL);
}

#endif /* M6_CRASHPOINT_H */
