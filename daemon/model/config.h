/*
 * config.h — the shape of a GPT model: what daemon/model/gpt.h and the CUDA
 * model (daemon/model/cuda/gpt_cuda.h) are built from. The run spec
 * (train/spec.h) embeds one; the model does not know about the spec.
 */
#ifndef M6_MODEL_CONFIG_H
#define M6_MODEL_CONFIG_H

typedef struct {
    int vocab_size;   /* V */
    int n_layer;      /* L */
    int n_head;       /* NH */
    int n_embd;       /* C */
    int seq_len;      /* T (also the size of the position table) */
} model_config;

#endif /* M6_MODEL_CONFIG_H */
