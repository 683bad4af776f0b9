/*
 * init_from.h — the weights a run starts from (spec key init.from): a
 * directory holding model.safetensors (m6's tensor names, gpt.h) and its
 * share map, in meta.json (an m6 checkpoint) or m6-model.json (written by
 * m6ctl import llmc and m6ctl export --format safetensors). Only the
 * weights are taken; the optimizer starts fresh.
 */
#ifndef M6_CKPT_INIT_FROM_H
#define M6_CKPT_INIT_FROM_H

#include "ckpt/checkpoint.h"
#include "common/err.h"
#include "spec/spec.h"

typedef struct {
    st_file sf;    /* model.safetensors, open and checked */
    int n_slots;   /* the share map's slot count (= the run's at start) */
} init_src;

/* Open spec->init.from and check it against the model the run starts
 * with: S = pseudo.share_groups slots when pseudo.steps > 0, else
 * n_layer, slot_of the default share map (gpt_default_share_map: l*S/L for
 * a dense model); every tensor of the model as checkpoints name it (an MoE
 * slot's per expert and gate prototype, gpt_slot_ckpt_tensors) present,
 * F32, with the model's shape. Errors (code M6_EINVALID) name the key,
 * the directory and what is wrong: "init.from: DIR: tensor wte has shape
 * (100, 32), the model wants (256, 32)", "... the checkpoint has 2 slots,
 * the run starts with 4", a missing file or tensor. 0, or -1 with err. */
int init_from_open(const run_spec *spec, init_src *src, m6_err *err);
void init_from_close(init_src *src);

#endif /* M6_CKPT_INIT_FROM_H */
