/*
 * m6ctl_data.c — `m6ctl data prepare --out DIR FILES...`: text files into
 * token shards (client/corpus), what was read and what was not, and a
 * clean stop on a signal (the shards written so far removed).
 */
#include "client/m6ctl_internal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "client/corpus/corpus.h"
#include "client/prepare_view.h"

/* Each file read; the first one says where the shards go (not before:
 * a refused --out, one that already holds shards, says so alone). */
static void progress_(const char *file, size_t bytes, void *ud)
{
    size_t *count = ud;
    if ((*count)++ == 0)
        fprintf(stderr, "preparing shards in %s (val fraction %.3g)\n",
                g.out_dir, g.val_fraction);
    fprintf(stderr, "  [%zu] %s (%zu bytes)\n", *count, file, bytes);
}

static volatile sig_atomic_t prepare_signal_seen_;

static void prepare_signal_(int sig)
{
    prepare_signal_seen_ = sig;
    data_prepare_interrupt();
}

int cmd_data_(int argc, char **argv)
{
    if (strcmp(argv[0], "prepare") != 0) {
        m6ctl_errf_("data: unknown action \"%s\" (want: prepare)", argv[0]);
        return EXIT_USAGE;
    }
    if (!g.out_dir[0]) {
        m6ctl_errf_("data prepare: --out DIR is required");
        return EXIT_USAGE;
    }
    if (argc < 2) {
        m6ctl_errf_("data prepare: no input FILES");
        return EXIT_USAGE;
    }
    prepare_stats st;
    size_t count = 0;
    char err[1024];
    /* Ctrl-C or SIGTERM: stop and remove this run's shards (no partial
     * corpus left for a train_*.bin glob to pick up). */
    struct sigaction sa = {.sa_handler = prepare_signal_};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);  /* a closed terminal or ssh session */
    if (data_prepare(g.out_dir, (const char *const *)argv + 1, argc - 1, g.val_fraction,
                     (size_t)g.shard_tokens, &st, progress_, &count, err, sizeof err) < 0) {
        m6ctl_errf_("%s", err);
        if (prepare_signal_seen_) {
            m6ctl_errf_("stopped by signal %d; the shards written so far were removed",
                  (int)prepare_signal_seen_);
            return 128 + (int)prepare_signal_seen_;
        }
        return EXIT_ERR;
    }
    if (g.json) {
        m6ctl_print_one_(&views_prepare, &st);
    } else {
        /* What was read and written, then what was not read and why: a
         * corpus such as fortunes holds as many binary indexes (.dat) and
         * symlinks (.u8) as text files. */
        printf("%zu text file%s read: %zu train tokens in %zu shard%s, %zu val tokens "
               "in %zu shard%s\n", st.files, st.files == 1 ? "" : "s", st.train_tokens,
               st.train_shards, st.train_shards == 1 ? "" : "s", st.val_tokens,
               st.val_shards, st.val_shards == 1 ? "" : "s");
        const char *sep = "not read: ";
        if (st.binary) {
            printf("%s%zu binary file%s (a NUL byte in the first 8 KiB, such as %s)", sep,
                   st.binary, st.binary == 1 ? "" : "s", st.binary_example);
            sep = ", ";
        }
        if (st.special) {
            printf("%s%zu special file%s (fifo, socket, device or dangling symlink)", sep,
                   st.special, st.special == 1 ? "" : "s");
            sep = ", ";
        }
        if (st.duplicates) {
            printf("%s%zu duplicate%s (a symlink, hard link or repeated path to a file "
                   "already read)", sep, st.duplicates, st.duplicates == 1 ? "" : "s");
            sep = ", ";
        }
        if (sep[0] == ',') printf("\n");  /* something was listed */
    }
    return EXIT_OK;
}
