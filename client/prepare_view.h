/*
 * prepare_view.h — what `m6ctl data prepare --json` prints: the counts of
 * client/corpus's prepare_stats as one field table (common/view.h).
 */
#ifndef M6CTL_PREPARE_VIEW_H
#define M6CTL_PREPARE_VIEW_H

#include "common/view.h"

/* Rows: prepare_stats (data prepare --json). */
extern const view views_prepare;

#endif /* M6CTL_PREPARE_VIEW_H */
