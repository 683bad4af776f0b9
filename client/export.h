/*
 * export.h — m6 weights in and out of m6ctl: a run's checkpoint read
 * directly from m6d's state directory (m6ctl export), written as a
 * Hugging Face GPT-2 directory, as m6's own safetensors, or as an llm.c
 * checkpoint; an llm.c checkpoint read into m6's layout (m6ctl import
 * llmc). Plain C over the checkpoint format (daemon/ckpt/checkpoint.h)
 * and the model layout (gpt.h): no engine, no BLAS.
 *
 * Errors: every function returns 0, or -1 with err naming the file and
 * what is wrong. A writer leaves nothing behind when it fails: files go
 * to a temporary name beside the target and are renamed at the end.
 */
#ifndef M6_CLIENT_EXPORT_H
#define M6_CLIENT_EXPORT_H

#include <stddef.h>

#include "model/gpt.h"

/* A model's weights in gpt.h's plain layout. */
typedef struct {
    model_config cfg;      /* V, L, NH, C, T (and the MoE shape, if any) */
    int S;                 /* slots */
    int *slot_of;          /* [L] slot of each layer */
    unsigned char *slot_moe;  /* [S] kind of each slot: 1 MoE, 0 dense
                              * (gpt_slot_kinds; a mixed model has both) */
    float *params;         /* n_global + S*slot_size floats, F32 */
    size_t n_global, slot_size;
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    long step;             /* the checkpoint's step; -1 unknown */
    char phase[16];        /* "pseudo", "real" */
} m6_weights;

/* Read the weights of directory dir: an m6d checkpoint (meta.json and
 * model.safetensors; cfg, the run's model from its spec, is then needed)
 * or a directory written by weights_write_m6 (m6-model.json holds the
 * model; cfg NULL, or checked against it). Every tensor is checked:
 * present, F32, the layout's shape. */
int weights_load(m6_weights *w, const char *dir, const model_config *cfg,
                 char *err, size_t errlen);
void weights_free(m6_weights *w);

/* Hugging Face GPT-2 (GPT2LMHeadModel): out/model.safetensors with
 * transformer.{wte,wpe,h.<l>.*,ln_f}.* (Conv1D weights (in, out): c_attn
 * (C,3C) = [Q|K|V] along the output dim, mlp.c_fc (C,4C), mlp.c_proj
 * (4C,C); no lm_head.weight, tied to wte) and out/config.json
 * (gelu_new, layer_norm_epsilon 1e-5, n_inner 4C). Layer l holds a copy
 * of slot slot_of[l], so a pseudo-phase model comes out with L layers.
 * An MoE model is refused. out must not exist unless force (then its
 * files of the same names are replaced). */
int weights_write_hf_gpt2(const m6_weights *w, const char *out, int force,
                          char *err, size_t errlen);

/* m6's own layout: out/model.safetensors with gpt.h's tensor names (the
 * slots as they are) and out/m6-model.json (format "m6-weights", the
 * model, n_slots, slot_of, step, phase): what weights_load reads back and
 * a spec's init.from takes. */
int weights_write_m6(const m6_weights *w, const char *out, int force,
                     char *err, size_t errlen);

/* llm.c's GPT-2 checkpoint (train_gpt2.c's layout): a header of 256
 * int32 (magic 20240326, version 3, maxT = T, V, L, NH, C, Vp = V
 * rounded up to 128), then the 16 parameter tensors, F32, wte padded
 * with zero rows to Vp, each per-layer tensor (L, ...) with layer l from
 * slot slot_of[l]. The file out must not exist unless force. MoE refused. */
int weights_write_llmc(const m6_weights *w, const char *out, int force,
                       char *err, size_t errlen);

/* Read an llm.c GPT-2 checkpoint (version 3: F32, version 5: BF16,
 * widened exactly to F32) into *w: S = L, slot_of[l] = l, phase "real",
 * wte's padded rows dropped. Refused, naming what is wrong: a file
 * shorter than its header or its parameters, another magic or version,
 * dimensions out of range, bytes after the parameters. */
int weights_read_llmc(m6_weights *w, const char *path, char *err,
                      size_t errlen);

#endif /* M6_CLIENT_EXPORT_H */
