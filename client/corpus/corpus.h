/*
 * corpus.h — `m6ctl data prepare`: a text corpus into token shards (the
 * format of daemon/train/data.h), and the shard writer. A library of its
 * own (m6corpus) so that m6ctl, the tests and the benchmarks link it
 * without the engine; the daemon only reads shards.
 */
#ifndef M6_CORPUS_H
#define M6_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "train/data.h"   /* the shard format: SHARD_MAGIC, header size */

/* Write one shard: header + tokens. Written to path.tmp, fsynced, renamed. */
int shard_write(const char *path, const uint16_t *tokens, size_t n,
                char *err, size_t errlen);

/* Byte-level tokenizer (vocab 256): token = byte value. */
static inline uint16_t byte_token(unsigned char c) { return (uint16_t)c; }

/* `m6ctl data prepare`: read text files (directories walked recursively in
 * name order, .gz files decompressed, binary files — a NUL in the first 8 KiB —
 * skipped and counted), tokenize bytewise, and write train_000000.bin,
 * train_000001.bin, ... and val_000000.bin, ... into out_dir (created).
 * The last val_fraction of each file's bytes goes to val (at least one window
 * worth overall). shard_tokens caps tokens per shard. progress, if not NULL,
 * is called per file. Returns 0 or -1 with err. */
/* As built: val gets floor(size * val_fraction) bytes of each file; with
 * val_fraction > 0, an empty val overall is an error (seq_len is not known
 * here, so "one window" is checked by whoever opens the val set); with 0, no
 * val shard is written. val_fraction must be in [0, 1); shard_tokens 0 means
 * 100M. Symlinks are followed, each inode read once; fifos, sockets and
 * devices are skipped and counted in skipped. An out_dir already holding
 * train_*.bin / val_*.bin is refused; on error the shards of this run are
 * removed, and so are the directories it made on the way to out_dir (never
 * one that was there before). progress gets each text file after it is read, with its
 * (uncompressed) size. */
typedef struct {
    size_t files, skipped, train_tokens, val_tokens, train_shards, val_shards;
    /* what skipped counts: binary files (a NUL in the first 8 KiB) and
     * special ones (fifos, sockets, devices, dangling symlinks) */
    size_t binary, special;
    /* not in skipped: second names (symlinks, hard links, a path given
     * twice) of a file taken under another name */
    size_t duplicates;
    char binary_example[256];  /* the first binary file's name, or "" */
} prepare_stats;
int data_prepare(const char *out_dir, const char *const *inputs, int n_inputs,
                 double val_fraction, size_t shard_tokens, prepare_stats *st,
                 void (*progress)(const char *file, size_t bytes, void *ud),
                 void *ud, char *err, size_t errlen);

/* Make a data_prepare running in this process stop at its next 1 MiB read:
 * it fails with "interrupted" and removes its shards, as on any error.
 * Async-signal-safe: meant for SIGINT/SIGTERM handlers (m6ctl). Sticky
 * until data_prepare's next call. */
void data_prepare_interrupt(void);

#endif /* M6_CORPUS_H */
