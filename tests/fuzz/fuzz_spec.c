/*
 * fuzz_spec.c — libFuzzer target: the run-spec parser (daemon/spec/spec.c)
 * on arbitrary bytes.
 *
 * Beyond "no crash, no sanitizer report", it checks the parser's promise
 * (spec.h): a text that parses serialises to canonical JSON that parses
 * again to the same canonical JSON (spec_parse(spec_to_json(s)) gives back
 * s). A violation aborts, which libFuzzer reports as a crash with the input.
 * Built by tests/fuzz/run.sh (clang, -Dfuzz=true).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_spec a, b;
    char err[1024];
    if (spec_parse(&a, (const char *)data, size, err, sizeof err) != 0) {
        if (!memchr(err, 0, sizeof err) || err[0] == 0) {
            fprintf(stderr, "fuzz_spec: refused without a message\n");
            abort();
        }
        return 0;
    }
    char *ja = spec_to_json(&a);
    if (!ja) return 0; /* out of memory */
    if (spec_parse(&b, ja, strlen(ja), err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_spec: canonical JSON refused: %s\n%s\n", err, ja);
        abort();
    }
    char *jb = spec_to_json(&b);
    if (jb && strcmp(ja, jb) != 0) {
        fprintf(stderr, "fuzz_spec: canonical JSON not stable:\n%s\n%s\n", ja, jb);
        abort();
    }
    free(ja);
    free(jb);
    return 0;
}
