/*
 * m6_logits.c — test helper for hf_reference.py: m6's own forward pass
 * (model/gpt.c, the CPU kernels) over the weights of an m6 checkpoint
 * directory, read here straight from its model.safetensors by m6's tensor
 * names and its meta.json share map, not through m6ctl's export code.
 *
 * usage: m6_logits CKPT_DIR V L NH C T OUT.f32 TOKEN... (exactly T tokens)
 * writes the logits (T, V) as little-endian float32 to OUT.f32.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "model/gpt.h"

int main(int argc, char **argv)
{
    if (argc < 9) {
        fprintf(stderr, "usage: m6_logits DIR V L NH C T OUT TOKEN...\n");
        return 2;
    }
    model_config cfg = {.vocab_size = atoi(argv[2]), .n_layer = atoi(argv[3]),
                        .n_head = atoi(argv[4]), .n_embd = atoi(argv[5]),
                        .seq_len = atoi(argv[6]), .moe_prototypes = 1,
                        .moe_every = 1};
    int T = cfg.seq_len, L = cfg.n_layer;
    if (argc - 8 != T) {
        fprintf(stderr, "m6_logits: want %d tokens, got %d\n", T, argc - 8);
        return 2;
    }
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/meta.json", argv[1]);
    json_t *m = json_load_file(path, 0, &je);
    if (!m) {
        fprintf(stderr, "m6_logits: %s: %s\n", path, je.text);
        return 1;
    }
    int S = (int)json_integer_value(json_object_get(m, "n_slots"));
    int *slot_of = malloc((size_t)L * sizeof(int)), *src = malloc((size_t)S * sizeof(int));
    for (int l = 0; l < L; l++)
        slot_of[l] = (int)json_integer_value(json_array_get(json_object_get(m, "slot_of"), l));
    for (int s = 0; s < S; s++)
        src[s] = s;
    json_decref(m);
    gpt_model g;
    if (gpt_create(&g, &cfg, S, 1) != 0 || gpt_reslot(&g, S, slot_of, src, 1) != 0) {
        perror("m6_logits: gpt_create");
        return 1;
    }
    st_file sf;
    char e[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    if (safetensors_open(&sf, path, e, sizeof e) != 0) {
        fprintf(stderr, "m6_logits: %s\n", e);
        return 1;
    }
    char nm[160];
    for (int i = 0; i < GLOB_NTENSORS; i++) {
        gpt_tensor_name(nm, sizeof nm, "", -1, &g.glob[i]);
        if (safetensors_get(&sf, nm, g.params + g.glob[i].offset, g.glob[i].numel, e, sizeof e)) {
            fprintf(stderr, "m6_logits: %s\n", e);
            return 1;
        }
    }
    for (int s = 0; s < S; s++)
        for (int i = 0; i < SLOT_NTENSORS; i++) {
            gpt_tensor_name(nm, sizeof nm, "", s, &g.slot[i]);
            if (safetensors_get(&sf, nm, gpt_slot_ptr(&g, g.params, s) + g.slot[i].offset,
                                g.slot[i].numel, e, sizeof e)) {
                fprintf(stderr, "m6_logits: %s\n", e);
                return 1;
            }
        }
    safetensors_close(&sf);
    int32_t *inp = malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++)
        inp[t] = atoi(argv[8 + t]);
    gpt_forward(&g, inp, NULL, 1);
    FILE *f = fopen(argv[7], "wb");
    if (!f || fwrite(g.a.logits, sizeof(float), (size_t)T * cfg.vocab_size, f) !=
                  (size_t)T * cfg.vocab_size || fclose(f) != 0) {
        perror("m6_logits: write");
        return 1;
    }
    gpt_free(&g);
    free(inp);
    free(slot_of);
    free(src);
    return 0;
}
