/*
 * fuzz_shard.c — libFuzzer target: the shard reader (daemon/train/data.c)
 * on arbitrary file contents.
 *
 * The input's first byte picks vocab_size (1 + byte * 256, up to 65,281);
 * the rest is written as one shard file and opened with token_set_open.
 * Beyond "no crash": when the open succeeds, each of the first tokens (up
 * to the header's count) that token_set_read returns must be the
 * little-endian uint16 at its place after the 1024-byte header (the llm.c
 * layout), and below vocab_size; when it fails, the message must be non-empty. A violation
 * aborts. Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/data.h"
#include "fuzz_util.h"

static char dir_[512];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (!dir_[0]) {
        snprintf(dir_, sizeof dir_, "%s/m6fuzz-shard-%d", fuzz_tmpdir(),
                 (int)getpid());
        (void)mkdir(dir_, 0700);
    }
    int vocab = 1 + data[0] * 256;
    const uint8_t *file = data + 1;
    size_t fsize = size - 1;
    char path[128];
    /* a new name each time: the reader caches scans by file identity */
    static unsigned long seq;
    snprintf(path, sizeof path, "%s/s%lu.bin", dir_, seq++);
    if (fuzz_write_file(path, file, fsize) != 0) return 0;

    token_set ts;
    char err[1024];
    int rc = token_set_open_buf(&ts, path, vocab, err, sizeof err);
    if (rc != 0) {
        fuzz_refusal_says_why("fuzz_shard", err);
        unlink(path);
        return 0;
    }
    /* header: int32 magic, version, token count, ... (256 int32) */
    uint32_t count = (uint32_t)file[8] | (uint32_t)file[9] << 8 |
                     (uint32_t)file[10] << 16 | (uint32_t)file[11] << 24;
    size_t want_n = count < 64 ? count : 64;
    uint16_t buf[64];
    if (token_set_read_buf(&ts, 0, buf, want_n, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_shard: opened, then first read failed: %s\n", err);
        abort();
    }
    for (size_t i = 0; i < want_n; i++) {
        uint16_t v = (uint16_t)(file[1024 + 2 * i] | file[1024 + 2 * i + 1] << 8);
        if (buf[i] != v || buf[i] >= vocab) {
            fprintf(stderr, "fuzz_shard: token %zu read %u, file holds %u "
                    "(vocab %d)\n", i, buf[i], v, vocab);
            abort();
        }
    }
    token_set_close(&ts);
    unlink(path);
    return 0;
}
