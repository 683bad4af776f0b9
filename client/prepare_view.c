/*
 * prepare_view.c — `m6ctl data prepare`'s field table (prepare_view.h),
 * read by the one renderer of common/view.h. Beside the corpus tool it
 * shows, not with the protocol's views (proto/views.c).
 */
#include "client/prepare_view.h"

#include "client/corpus/corpus.h"

/* ---- data prepare's counts (--json; the text is a summary in words) */

#define P_(f) \
    static void p_##f##_(const void *row, view_val *v) \
    { v->i = (long long)((const prepare_stats *)row)->f; }
P_(files) P_(skipped) P_(binary) P_(special) P_(duplicates) P_(train_tokens)
P_(val_tokens) P_(train_shards) P_(val_shards)
#undef P_

static const view_field prepare_fields_[] = {
    {"files", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_files_},
    {"skipped", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_skipped_},
    {"binary", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_binary_},
    {"special", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_special_},
    {"duplicates", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_duplicates_},
    {"train_tokens", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_train_tokens_},
    {"val_tokens", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_val_tokens_},
    {"train_shards", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_train_shards_},
    {"val_shards", 0, 0, 0, VIEW_INT, VF_PLAIN, 0, p_val_shards_},
};
const view views_prepare = VIEW_OF(prepare_fields_);
