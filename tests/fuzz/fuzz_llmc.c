/*
 * fuzz_llmc.c — libFuzzer target: the llm.c checkpoint reader of
 * `m6ctl import llmc` (weights_read_llmc, client/export.c) on arbitrary
 * file contents.
 *
 * Beyond "no crash, no sanitizer report": a refusal has a message; an
 * accepted file has the size its header implies (256 int32, then the
 * parameters at 4 bytes (version 3) or 2 (version 5) each) and its wte
 * is the file's first V*C values after the header, exactly (bf16 widened:
 * the 16 bits shifted up). A violation aborts. Seeds (corpus/llmc): files
 * written by weights_write_llmc (the code's writer) for a tiny model, and
 * headers that go wrong. Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/export.h"
#include "fuzz_util.h"

static char path_[512];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path_[0])
        snprintf(path_, sizeof path_, "%s/m6fuzz-llmc-%d.bin", fuzz_tmpdir(),
                 (int)getpid());
    if (fuzz_write_file(path_, data, size) != 0) return 0;
    m6_weights w;
    char err[1024];
    err[0] = 0;
    if (weights_read_llmc(&w, path_, err, sizeof err) != 0) {
        fuzz_refusal_says_why("fuzz_llmc", err);
        return 0;
    }
    int32_t hdr[256];
    memcpy(hdr, data, sizeof hdr);
    size_t esz = hdr[1] == 3 ? 4 : 2;
    size_t V = (size_t)w.cfg.vocab_size, C = (size_t)w.cfg.n_embd;
    const uint8_t *wte = data + sizeof hdr;
    for (size_t i = 0; i < V * C; i++) {
        uint32_t u = 0;
        if (esz == 4) memcpy(&u, wte + 4 * i, 4);
        else u = (uint32_t)(wte[2 * i] | wte[2 * i + 1] << 8) << 16;
        uint32_t got;
        memcpy(&got, &w.params[w.glob[GLOB_WTE].offset + i], 4);
        if (got != u) {
            fprintf(stderr, "fuzz_llmc: wte[%zu] read %08x, file holds %08x\n",
                    i, got, u);
            abort();
        }
    }
    weights_free(&w);
    return 0;
}
