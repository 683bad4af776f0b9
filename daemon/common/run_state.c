/*
 * run_state.c — the table of a run's states (see run_state.h): each
 * state's name and its m6.proto RunState number (0: not recorded).
 */
#include "common/run_state.h"

#include <string.h>

static const struct {
    const char *name;
    int wire;  /* m6.proto RunState; 0: transient, never recorded */
} states_[RUN_STATE_COUNT] = {
    [RUN_QUEUED]    = {"queued", 1},
    [RUN_STARTING]  = {"starting", 0},
    [RUN_RUNNING]   = {"running", 2},
    [RUN_PAUSING]   = {"pausing", 0},
    [RUN_PAUSED]    = {"paused", 3},
    [RUN_RESUMING]  = {"resuming", 0},
    [RUN_STOPPING]  = {"stopping", 0},
    [RUN_COMPLETED] = {"completed", 4},
    [RUN_FAILED]    = {"failed", 5},
    [RUN_STOPPED]   = {"stopped", 6},
};

const char *run_state_name(run_state s)
{
    return (unsigned)s < RUN_STATE_COUNT ? states_[s].name : "unknown";
}

int run_state_parse(const char *name)
{
    for (int i = 0; name && i < RUN_STATE_COUNT; i++)
        if (strcmp(name, states_[i].name) == 0) return i;
    return -1;
}

int run_state_wire(run_state s)
{
    return (unsigned)s < RUN_STATE_COUNT ? states_[s].wire : 0;
}

int run_state_recorded(run_state s)
{
    return run_state_wire(s) != 0;
}

int run_state_from_wire(int n)
{
    for (int i = 0; n > 0 && i < RUN_STATE_COUNT; i++)
        if (states_[i].wire == n) return i;
    return -1;
}
