/*
 * data.h — token shards in the llm.c layout and the byte-level tokenizer.
 *
 * Shard file: a header of 256 int32 (little-endian): [0] magic 20240520,
 * [1] version 1, [2] token count n; then n uint16 tokens. Nothing else.
 * Shards made by llm.c's tools load as they are. This file reads them (the
 * daemon's side); client/corpus/corpus.h writes them (`m6ctl data prepare`).
 */
#ifndef M6_DATA_H
#define M6_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

/* The shards matched by a glob, each kept open for reading. Batches are
 * read from the files with pread (token_set_read), not from a mapping: a
 * shard truncated or rewritten while a run uses it is then an error of that
 * read, naming the file, instead of SIGBUS (a mapping touched past the
 * file's new end kills the whole process) or an out-of-range token id
 * reaching the model. A shard replaced by rename is not seen: the open
 * file is the one that was checked. */
typedef struct {
    int n_shards;
    size_t *n_tokens;         /* per shard, as checked at open */
    size_t total;             /* sum of n_tokens */
    int vocab_size;           /* every token read is checked against it */
    /* private */
    int *fds; char **paths;
} token_set;

/* Returned by token_set_open when the process (EMFILE) or the system
 * (ENFILE) ran out of file descriptors: the shards may well be fine, and
 * the same call can succeed once descriptors are free or the limit is
 * raised. err (code M6_ENOFILE) then begins "too many open files (limit
 * N): " (N the soft RLIMIT_NOFILE at the time) or "too many open files in
 * the system (fs.file-max): " and names the file and how many shards the
 * set has; what to do is the edge's to say (control/advice.h). */
#define TOKEN_SET_ENOFILE (-2)

/* Open every shard matching glob (sorted by name), check header, size and
 * that every token < vocab_size. Errors name the file and the problem:
 * "no files match", "truncated: header says N tokens, file holds M",
 * "bad magic X (want 20240520)", "token 300 at index 17 >= vocab_size 256".
 * A set whose shards hold no tokens at all is an error too.
 * A shard this process has scanned before (same device, inode, size and
 * mtime) is not read again. Thread-safe. Holds one file descriptor per
 * shard until token_set_close.
 * Returns 0, or -1 with *err set (code M6_EDATA for the data,
 * M6_EINVALID for vocab_size, M6_EINTERNAL out of memory; the message
 * whole, the full path in it), or TOKEN_SET_ENOFILE (above); on either
 * error *ts is zeroed (token_set_close is safe) and no descriptor is left
 * open. The caller frees *err (m6_err_free). */
int token_set_open(token_set *ts, const char *glob, int vocab_size,
                   m6_err *err);

/* token_set_open with its message in a fixed-size buffer (err, errlen
 * bytes, for tests and tools): a path of 200 bytes or more loses its
 * middle ("..."), so the shard's name and the problem still fit. */
int token_set_open_buf(token_set *ts, const char *glob, int vocab_size,
                       char *err, size_t errlen);
void token_set_close(token_set *ts);

/* Copy n consecutive tokens starting at global index pos (shards
 * concatenated in order; indices at or past total wrap around) into buf,
 * read from the files and each checked < vocab_size as it is copied.
 * Returns 0, or -1 with *err (M6_EDATA; the caller frees it) naming the
 * shard by its full path and what is wrong, e.g.
 * "train_000001.bin: truncated while in use: now 123 tokens, was 456",
 * "train_000001.bin: token 999 at index 17 >= vocab_size 256 (the shard
 * changed while in use)" or "train_000001.bin: read: Input/output error";
 * buf is then partly written. A shard may be fixed (restored in place) and
 * the read retried. Safe to call from several threads at once. */
int token_set_read(const token_set *ts, size_t pos, uint16_t *buf, size_t n,
                   m6_err *err);

/* token_set_read with its message in a fixed-size buffer, a long path
 * shortened as in token_set_open_buf (for tests and tools). */
int token_set_read_buf(const token_set *ts, size_t pos, uint16_t *buf,
                       size_t n, char *err, size_t errlen);

/* Token at global index i (wrapping as in token_set_read), or -1 when it
 * cannot be read (token_set_read's errors, not reported). For tests and
 * tools; the trainer uses token_set_read. */
int token_set_at(const token_set *ts, size_t i);

#endif /* M6_DATA_H */
