/*
 * state_cuda.cu — the CUDA model's state from the host's side: the weight
 * init (the CPU model's, region by region), the state copied in and out
 * in gpt.h's plain layout (checkpoints, the trainer's state regions), host
 * slots, AdamW's step counts, the fp32 gradient for data parallelism, and
 * reslot (delink and placement changes), device and host slots alike; and
 * the allocation of that state (slots' places, device buffers).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* ------------------------------------------------------------- memory */

/* Each slot's kind under share map slot_of (S slots) into *moe and its
 * place, the elements before it, into *off ([S+1]; malloc'd both). 0, or
 * -1 with a message (a slot shared by blocks of both kinds, or out of
 * host memory). */
int gpt_cuda_slot_places_(const gpt_cuda *g, int S, const int *slot_of,
                        unsigned char **moe, size_t **off)
{
    char why[256];
    *moe = (unsigned char *)malloc((size_t)S);
    *off = (size_t *)malloc(((size_t)S + 1) * sizeof(size_t));
    if (!*moe || !*off) {
        fprintf(stderr, "gpt_cuda: out of host memory\n");
    } else if (gpt_slot_kinds(&g->cfg, S, slot_of, *moe, why,
                              sizeof why) != 0) {
        fprintf(stderr, "gpt_cuda: share map: %s\n", why);
    } else {
        (*off)[0] = 0;
        for (int s = 0; s < S; s++)
            (*off)[s + 1] = (*off)[s] + g->kind_size[(*moe)[s]];
        return 0;
    }
    free(*moe);
    free(*off);
    *moe = NULL;
    *off = NULL;
    return -1;
}

/* Device state for globals + n_res resident slots placed by off (their
 * elements: off[n_res]) of kinds moe, step counts for S. */
int gpt_cuda_alloc_state_(gpt_cuda *g, int S, int n_res, const size_t *off,
                          const unsigned char *moe, bf16 **params,
                          bf16 **grads, float **opt, long **t_slot)
{
    size_t n = g->n_global + off[n_res];
    size_t no = gpt_cuda_opt_layout_(g, NULL, n, n_res, moe, NULL, NULL);
    *params = NULL;
    *grads = NULL;
    *opt = NULL;
    *t_slot = (long *)calloc((size_t)S, sizeof(long));
    /* allocation failures are not fatal: the caller may keep its old state */
    if (!*t_slot || cudaMalloc((void **)params, n * sizeof(bf16)) != cudaSuccess ||
        cudaMalloc((void **)grads, n * sizeof(bf16)) != cudaSuccess ||
        cudaMalloc((void **)opt, no * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the (non-sticky) OOM error */
        if (*params) CUDA_CHECK(cudaFree(*params));
        if (*grads) CUDA_CHECK(cudaFree(*grads));
        free(*t_slot);
        *params = *grads = NULL;
        *t_slot = NULL;
        fprintf(stderr, "gpt_cuda: out of device memory for %d resident "
                        "slots (%zu parameters)\n", n_res, n);
        return -1;
    }
    CUDA_CHECK(cudaMemset(*params, 0, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(*grads, 0, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(*opt, 0, no * sizeof(float)));
    return 0;
}

int gpt_cuda_alloc_placed_(gpt_cuda *g, int S, int n_res, unsigned char *moe,
                           size_t *off, bf16 **params, bf16 **grads,
                           float **opt, long **t_slot, hslot_ **hs)
{
    int failed = 0;
    *hs = gpt_offload_alloc_slots(g, S, n_res, moe, &failed);
    if (failed || gpt_cuda_alloc_state_(g, S, n_res, off, moe, params, grads,
                                        opt, t_slot) != 0) {
        gpt_offload_free_slots(g, *hs, S - n_res);
        *hs = NULL;
        free(moe);
        free(off);
        return -1;
    }
    return 0;
}

void gpt_cuda_use_state_(gpt_cuda *g, int S, int n_res, bf16 *params,
                       bf16 *grads, float *opt, long *t_slot, hslot_ *hs,
                       unsigned char *moe, size_t *off)
{
    g->S = S;
    g->n_res = n_res;
    g->off.hs = hs;
    free(g->slot_moe);
    free(g->slot_off);
    g->slot_moe = moe;
    g->slot_off = off;
    /* the multi-tensor AdamW plan follows the slots' kinds: made anew */
    adamw_multi_plan_destroy(g->mt);
    g->mt = NULL;
    gpt_cuda_optim_drop_plan_(g);
    g->n_params = g->n_global + off[n_res];
    g->params = params;
    g->grads = grads;
    g->opt = opt;
    g->master = gpt_cuda_opt_master_(g, opt);
    gpt_cuda_opt_layout_(g, opt, g->n_params, n_res, moe, &g->m, &g->v);
    g->adam_t_slot = t_slot;
}

void gpt_cuda_free_state_(bf16 *params, bf16 *grads, float *opt, long *t_slot)
{
    if (params) CUDA_CHECK(cudaFree(params));
    if (grads) CUDA_CHECK(cudaFree(grads));
    if (opt) CUDA_CHECK(cudaFree(opt));
    free(t_slot);
}

/* ------------------------------------------------------------- weights */

/* bf16 masters (g->mbf): n host floats into the bf16 params at device
 * element `at` (rounded to nearest, as the CPU model's gemm_bf16_round
 * makes its masters), or out of them widened; through one bounce buffer.
 * Synchronous. */
static void params_put_(gpt_cuda *g, size_t at, const float *h, size_t n)
{
    bf16 *b = (bf16 *)malloc((n ? n : 1) * sizeof(bf16));
    if (!b) {
        fprintf(stderr, "gpt_cuda: out of host memory (%zu bf16)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        b[i] = __float2bfloat16_rn(h[i]);
    CUDA_CHECK(cudaMemcpy(g->params + at, b, n * sizeof(bf16),
                          cudaMemcpyHostToDevice));
    free(b);
}

static void params_get_(gpt_cuda *g, size_t at, float *h, size_t n)
{
    bf16 *b = (bf16 *)malloc((n ? n : 1) * sizeof(bf16));
    if (!b) {
        fprintf(stderr, "gpt_cuda: out of host memory (%zu bf16)\n", n);
        exit(1);
    }
    CUDA_CHECK(cudaMemcpy(b, g->params + at, n * sizeof(bf16),
                          cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        h[i] = __bfloat162float(b[i]);
    free(b);
}

/* The CPU model's init (model/init.c: gpt_init_region), region by region
 * through one host buffer, so that the host holds one region at a time
 * and every model, CPU or GPU, starts from the same weights for a seed. */
int gpt_cuda_init_weights(gpt_cuda *g, uint64_t seed)
{
    gpt_cuda_flush_(g);
    size_t C = g->cfg.n_embd, V = g->cfg.vocab_size, T = g->cfg.seq_len;
    size_t n = g->n_global_cpu > g->slot_size ? g->n_global_cpu
                                              : g->slot_size;
    float *h = (float *)malloc(n * sizeof(float));
    if (!h) {
        fprintf(stderr, "gpt_cuda_init_weights: out of host memory (%zu "
                        "floats)\n", n);
        return -1;
    }
    gpt_cuda_synchronize(g); /* host AdamW may still write host masters */
    if (g->mbf)
        CUDA_CHECK(cudaMemset(g->params, 0, g->n_params * sizeof(bf16)));
    else
        CUDA_CHECK(cudaMemset(g->master, 0, g->n_params * sizeof(float)));
    /* globals: the gpt.h layout has V rows of wte, this one Vp (the padded
     * rows stay zero) */
    gpt_init_region(&g->cfg, -1, h, seed);
    const size_t cpu_off[GLOB_NTENSORS] = {0, V * C, V * C + T * C,
                                           V * C + T * C + C};
    const size_t numel[GLOB_NTENSORS] = {V * C, T * C, C, C};
    for (int i = 0; i < GLOB_NTENSORS; i++)
        if (g->mbf)
            params_put_(g, g->glob[i].off, h + cpu_off[i], numel[i]);
        else
            CUDA_CHECK(cudaMemcpy(g->master + g->glob[i].off, h + cpu_off[i],
                                  numel[i] * sizeof(float),
                                  cudaMemcpyHostToDevice));
    /* slots: the same layout on both sides; an offloaded one to its host
     * master */
    for (int s = 0; s < g->S; s++) {
        gpt_init_slot(&g->cfg, g->slot_moe[s], s, h, seed);
        if (s < g->n_res && g->mbf) {
            params_put_(g, g->n_global + g->slot_off[s], h, slot_n_(g, s));
        } else if (s < g->n_res) {
            CUDA_CHECK(cudaMemcpy(g->master + g->n_global + g->slot_off[s],
                                  h, slot_n_(g, s) * sizeof(float),
                                  cudaMemcpyHostToDevice));
        } else {
            memcpy(g->off.hs[s - g->n_res].master, h,
                   slot_n_(g, s) * sizeof(float));
            gpt_offload_refresh_bf16(g, s);
        }
    }
    if (!g->mbf)
        copy_to_bf16_cuda(g->params, g->master, g->n_params, g->stream);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    free(h);
    return 0;
}

/* (cpu offset, gpu offset, floats) of each piece of the two layouts that
 * lives on the device (the offloaded slots follow at the end, on the host) */
static int pieces_(const gpt_cuda *g, size_t n, size_t off[][3],
                   int with_host_slots)
{
    size_t C = g->cfg.n_embd, V = g->cfg.vocab_size, T = g->cfg.seq_len;
    size_t cpu_wpe = V * C, cpu_lnw = cpu_wpe + T * C, cpu_lnb = cpu_lnw + C;
    size_t slots = g->slot_off[g->n_res];
    size_t need = g->n_global_cpu +
                  g->slot_off[with_host_slots ? g->S : g->n_res];
    if (n != need) {
        fprintf(stderr, "gpt_cuda: host buffer has %zu floats, the model "
                        "needs %zu\n", n, need);
        return -1;
    }
    size_t t[5][3] = {
        {0, g->glob[GLOB_WTE].off, V * C},
        {cpu_wpe, g->glob[GLOB_WPE].off, T * C},
        {cpu_lnw, g->glob[GLOB_LNF_W].off, C},
        {cpu_lnb, g->glob[GLOB_LNF_B].off, C},
        {g->n_global_cpu, g->n_global, slots},
    };
    memcpy(off, t, sizeof t);
    return 5;
}

static float *state_buf_(gpt_cuda *g, int which)
{
    return which == 0 ? g->master : which == 1 ? g->m : which == 2 ? g->v
                                                                   : NULL;
}

static float *host_buf_(hslot_ *h, int which)
{
    return which == 0 ? h->master : which == 1 ? h->m : h->v;
}

/* host + (offset of offloaded slot s in the gpt.h layout) */
static size_t host_slot_off_(const gpt_cuda *g, int s)
{
    return g->n_global_cpu + g->slot_off[s];
}

/* Adafactor's v: the device's af layout is the host's (the globals',
 * then the resident slots'), one copy of the device's floats either way
 * (set: from host; else into it); with_host_slots, each offloaded slot's
 * af floats follow at their places, copied from or to its host block. 0,
 * or -1 for a wrong n. */
static int af_v_copy_(gpt_cuda *g, float *host, size_t n, int set,
                      int with_host_slots)
{
    size_t dev = gpt_cuda_state_offset(g, 2, g->n_res);
    size_t need = gpt_cuda_state_offset(g, 2, with_host_slots ? g->S
                                                              : g->n_res);
    if (n != need) {
        fprintf(stderr, "gpt_cuda: host buffer has %zu floats, Adafactor's "
                        "second moment %zu\n", n, need);
        return -1;
    }
    gpt_cuda_synchronize(g);
    CUDA_CHECK(cudaMemcpy(set ? (void *)g->v : (void *)host,
                          set ? (const void *)host : (const void *)g->v,
                          dev * sizeof(float),
                          set ? cudaMemcpyHostToDevice
                              : cudaMemcpyDeviceToHost));
    for (int s = g->n_res; s < g->S && with_host_slots; s++) {
        float *h = g->off.hs[s - g->n_res].v;
        float *at = host + gpt_cuda_state_offset(g, 2, s);
        size_t k = g->af_kind[g->slot_moe[s]];
        memcpy(set ? h : at, set ? at : h, k * sizeof(float));
    }
    return 0;
}

/* set_state / get_state, of the offloaded slots too or not */
static int set_state_(gpt_cuda *g, int which, const float *host, size_t n,
                      int with_host_slots)
{
    gpt_cuda_flush_(g);
    if (which == 2 && g->af)
        return af_v_copy_(g, (float *)host, n, 1, with_host_slots);
    size_t off[5][3];
    float *buf = state_buf_(g, which);
    int k = pieces_(g, n, off, with_host_slots);
    if (k < 0 || (!buf && !(which == 0 && g->mbf)))
        return -1;
    gpt_cuda_synchronize(g);
    if (which == 0 && g->mbf) { /* the bf16 params are the masters */
        CUDA_CHECK(cudaMemset(g->params, 0, g->n_params * sizeof(bf16)));
        for (int i = 0; i < k; i++)
            params_put_(g, off[i][1], host + off[i][0], off[i][2]);
        /* an offloaded slot's master is its bf16 copy, rounded to nearest
         * as params_put_ rounds (the jobs that read it are done: synced) */
        for (int s = g->n_res; s < g->S && with_host_slots; s++)
            host_to_bf16(g->off.hs[s - g->n_res].wbf,
                         host + host_slot_off_(g, s), slot_n_(g, s));
        return 0;
    }
    CUDA_CHECK(cudaMemset(buf, 0, g->n_params * sizeof(float)));
    for (int i = 0; i < k; i++)
        CUDA_CHECK(cudaMemcpy(buf + off[i][1], host + off[i][0],
                              off[i][2] * sizeof(float),
                              cudaMemcpyHostToDevice));
    if (which == 0)
        copy_to_bf16_cuda(g->params, g->master, g->n_params, g->stream);
    for (int s = g->n_res; s < g->S && with_host_slots; s++) {
        memcpy(host_buf_(&g->off.hs[s - g->n_res], which),
               host + host_slot_off_(g, s), slot_n_(g, s) * sizeof(float));
        if (which == 0)
            gpt_offload_refresh_bf16(g, s);
    }
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return 0;
}

static int get_state_(gpt_cuda *g, int which, float *host, size_t n,
                      int with_host_slots)
{
    gpt_cuda_flush_(g);
    if (which == 2 && g->af)
        return af_v_copy_(g, host, n, 0, with_host_slots);
    size_t off[5][3];
    const float *buf = state_buf_(g, which);
    int k = pieces_(g, n, off, with_host_slots);
    if (k < 0 || (!buf && !(which == 0 && g->mbf)))
        return -1;
    gpt_cuda_synchronize(g);
    memset(host, 0, n * sizeof(float));
    if (which == 0 && g->mbf) { /* the bf16 params are the masters */
        for (int i = 0; i < k; i++)
            params_get_(g, off[i][1], host + off[i][0], off[i][2]);
        for (int s = g->n_res; s < g->S && with_host_slots; s++) {
            const uint16_t *w = g->off.hs[s - g->n_res].wbf;
            float *at = host + host_slot_off_(g, s);
            for (size_t i = 0; i < slot_n_(g, s); i++)
                at[i] = bf16_to_f32(w[i]);
        }
        return 0;
    }
    for (int i = 0; i < k; i++)
        CUDA_CHECK(cudaMemcpy(host + off[i][0], buf + off[i][1],
                              off[i][2] * sizeof(float),
                              cudaMemcpyDeviceToHost));
    for (int s = g->n_res; s < g->S && with_host_slots; s++)
        memcpy(host + host_slot_off_(g, s),
               host_buf_(&g->off.hs[s - g->n_res], which),
               slot_n_(g, s) * sizeof(float));
    return 0;
}

int gpt_cuda_set_state(gpt_cuda *g, int which, const float *host, size_t n)
{
    return set_state_(g, which, host, n, 1);
}

int gpt_cuda_get_state(gpt_cuda *g, int which, float *host, size_t n)
{
    return get_state_(g, which, host, n, 1);
}

int gpt_cuda_set_state_resident(gpt_cuda *g, int which, const float *host,
                                size_t n)
{
    return set_state_(g, which, host, n, 0);
}

int gpt_cuda_get_state_resident(gpt_cuda *g, int which, float *host,
                                size_t n)
{
    return get_state_(g, which, host, n, 0);
}

float *gpt_cuda_host_slot(gpt_cuda *g, int which, int s)
{
    if (s < g->n_res || s >= g->S || which < 0 || which > 2)
        return NULL;
    return host_buf_(&g->off.hs[s - g->n_res], which);
}

void gpt_cuda_host_slot_written(gpt_cuda *g, int s)
{
    if (s >= g->n_res && s < g->S)
        gpt_offload_refresh_bf16(g, s);
}

int gpt_cuda_set_params(gpt_cuda *g, const float *host, size_t n)
{
    return gpt_cuda_set_state(g, 0, host, n);
}

int gpt_cuda_get_params(gpt_cuda *g, float *host, size_t n)
{
    return gpt_cuda_get_state(g, 0, host, n);
}

/* Step counts are kept on the host for every slot; a queued host AdamW
 * already counted its step when it was queued. */
void gpt_cuda_get_adam_steps(const gpt_cuda *g, long *dst)
{
    dst[0] = g->adam_t_global;
    memcpy(dst + 1, g->adam_t_slot, (size_t)g->S * sizeof(long));
}

void gpt_cuda_set_adam_steps(gpt_cuda *g, const long *src)
{
    gpt_cuda_synchronize(g);
    g->adam_t_global = src[0];
    memcpy(g->adam_t_slot, src + 1, (size_t)g->S * sizeof(long));
}

/* ------------------------------------------------------- data parallelism */

float *gpt_cuda_grads_f32(gpt_cuda *g, size_t *n)
{
    gpt_cuda_flush_(g);
    if (g->gradf && g->gradf_n != g->n_params) { /* reslotted since */
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        CUDA_CHECK(cudaFree(g->gradf));
        g->gradf = NULL;
    }
    if (!g->gradf) {
        void *p = NULL;
        if (cudaMalloc(&p, g->n_params * sizeof(float)) != cudaSuccess) {
            (void)cudaGetLastError(); /* clear it: not a sticky error */
            fprintf(stderr, "gpt_cuda_grads_f32: out of device memory (%zu "
                    "floats)\n", g->n_params);
            return NULL;
        }
        g->gradf = (float *)p;
        g->gradf_n = g->n_params;
    }
    copy_to_f32_cuda(g->gradf, g->grads, g->n_params, g->stream);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (n)
        *n = g->n_params;
    return g->gradf;
}

void gpt_cuda_grads_f32_back(gpt_cuda *g)
{
    if (!g->gradf || g->gradf_n != g->n_params)
        return;
    copy_to_bf16_cuda(g->grads, g->gradf, g->n_params, g->stream);
}

int gpt_cuda_get_grads_resident(gpt_cuda *g, float *host, size_t n)
{
    size_t off[5][3];
    int k = pieces_(g, n, off, 0);
    if (k < 0)
        return -1;
    const float *f = gpt_cuda_grads_f32(g, NULL);
    if (!f)
        return -1;
    for (int i = 0; i < k; i++)
        CUDA_CHECK(cudaMemcpy(host + off[i][0], f + off[i][1],
                              off[i][2] * sizeof(float),
                              cudaMemcpyDeviceToHost));
    return 0;
}

int gpt_cuda_set_grads_resident(gpt_cuda *g, const float *host, size_t n)
{
    gpt_cuda_flush_(g);
    size_t off[5][3];
    int k = pieces_(g, n, off, 0);
    if (k < 0 || !g->gradf || g->gradf_n != g->n_params)
        return -1;
    /* wte's rows [V, Vp) and the padding: zero, as backward leaves them */
    CUDA_CHECK(cudaMemsetAsync(g->gradf, 0, g->n_params * sizeof(float),
                               g->stream));
    for (int i = 0; i < k; i++)
        CUDA_CHECK(cudaMemcpyAsync(g->gradf + off[i][1], host + off[i][0],
                                   off[i][2] * sizeof(float),
                                   cudaMemcpyHostToDevice, g->stream));
    gpt_cuda_grads_f32_back(g);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return 0;
}

/* ------------------------------------------------------------- delink */

/* fp32 state (master, m, v) of slot s of a state whose device buffers
 * are opt (gpt_cuda_opt_layout_: n_res resident slots placed by off, of
 * kinds moe) and host slots hs, and each buffer's floats: device pointers
 * for a resident slot, host pointers for an offloaded one; m NULL
 * (Adafactor without a first moment), v Adafactor's af layout. */
static void slot_state_(const gpt_cuda *g, float *opt, int n_res,
                        const size_t *off, const unsigned char *moe,
                        hslot_ *hs, int s, float *p[3], size_t sz[3])
{
    size_t at = g->n_global + off[s];
    float *m, *v;
    gpt_cuda_opt_layout_(g, opt, g->n_global + off[n_res], n_res, moe, &m,
                         &v);
    for (int i = 0; i < 3; i++) {
        sz[i] = off[s + 1] - off[s];
        p[i] = s >= n_res ? host_buf_(&hs[s - n_res], i) : NULL;
    }
    if (g->af)
        sz[2] = g->af_kind[moe[s]];
    if (s >= n_res)
        return; /* an offloaded slot's m is NULL without a first moment */
    p[0] = g->mbf ? NULL : opt + at; /* bf16 masters: reslot copies params */
    p[1] = m ? m + at : NULL;
    p[2] = g->af ? v + gpt_cuda_af_off_(g, moe, s) : v + at;
}

int gpt_cuda_reslot(gpt_cuda *g, int new_S, const int *new_slot_of,
                    const int *src_of, int reset_moments)
{
    return gpt_cuda_reslot_placed(g, new_S, new_slot_of, src_of,
                                  reset_moments, new_S);
}

int gpt_cuda_reslot_placed(gpt_cuda *g, int new_S, const int *new_slot_of,
                           const int *src_of, int reset_moments,
                           int n_resident)
{
    int L = g->cfg.n_layer;
    if (new_S < 1 || new_S > L)
        return -1;
    for (int s = 0; s < new_S; s++)
        if (src_of[s] < 0 || src_of[s] >= g->S)
            return -1;
    for (int l = 0; l < L; l++)
        if (new_slot_of[l] < 0 || new_slot_of[l] >= new_S)
            return -1;
    int n_res = n_resident < 0 ? 0 : n_resident > new_S ? new_S : n_resident;
    if (n_res < new_S && !g->off.enabled) {
        fprintf(stderr, "gpt_cuda_reslot_placed: offloading needs a model "
                        "made by gpt_cuda_create_offload\n");
        return -1;
    }
    /* each new slot's kind from its layers; it copies an old slot of the
     * same kind (as gpt_reslot) */
    unsigned char *moe;
    size_t *soff;
    if (gpt_cuda_slot_places_(g, new_S, new_slot_of, &moe, &soff) != 0)
        return -1;
    for (int s = 0; s < new_S; s++)
        if (moe[s] != g->slot_moe[src_of[s]]) {
            fprintf(stderr, "gpt_cuda_reslot_placed: new slot %d (%s) "
                            "copies old slot %d (%s): a slot keeps its "
                            "kind\n", s, moe[s] ? "MoE" : "dense",
                    src_of[s], g->slot_moe[src_of[s]] ? "MoE" : "dense");
            free(moe);
            free(soff);
            return -1;
        }
    gpt_cuda_synchronize(g);
    bf16 *params, *grads;
    float *opt;
    long *t_slot;
    hslot_ *hs;
    if (n_res < new_S && gpt_offload_set_staging(g, 1) != 0) {
        free(moe);
        free(soff);
        return -1; /* old state untouched */
    }
    if (gpt_cuda_alloc_placed_(g, new_S, n_res, moe, soff, &params, &grads,
                               &opt, &t_slot, &hs) != 0)
        return -1;
    size_t ng = g->n_global;
    float *nbuf[3] = {gpt_cuda_opt_master_(g, opt), NULL, NULL};
    gpt_cuda_opt_layout_(g, opt, ng + soff[n_res], n_res, moe, &nbuf[1],
                         &nbuf[2]);
    cudaMemcpyKind dd = cudaMemcpyDeviceToDevice;
    CUDA_CHECK(cudaMemcpy(params, g->params, ng * sizeof(bf16), dd));
    if (nbuf[0])
        CUDA_CHECK(cudaMemcpy(nbuf[0], g->master, ng * sizeof(float), dd));
    if (nbuf[1])
        CUDA_CHECK(cudaMemcpy(nbuf[1], g->m, ng * sizeof(float), dd));
    CUDA_CHECK(cudaMemcpy(nbuf[2], g->v,
                          (g->af ? g->af_glob : ng) * sizeof(float), dd));
    int nbufs = reset_moments ? 1 : 3; /* else m, v stay zero */
    for (int s = 0; s < new_S; s++) {
        float *from[3], *to[3];
        size_t sz[3]; /* the source's too: the same kind */
        slot_state_(g, g->opt, g->n_res, g->slot_off, g->slot_moe, g->off.hs,
                    src_of[s], from, sz);
        slot_state_(g, opt, n_res, soff, moe, hs, s, to, sz);
        /* host or device on either side: unified addressing tells which */
        for (int i = 0; i < nbufs; i++)
            if (to[i])
                CUDA_CHECK(cudaMemcpy(to[i], from[i], sz[i] * sizeof(float),
                                      cudaMemcpyDefault));
        if (!reset_moments)
            t_slot[s] = g->adam_t_slot[src_of[s]];
        if (g->mbf) { /* the bf16 params are the masters: device or host */
            int o = src_of[s];
            const void *from16 =
                o < g->n_res ? (const void *)(g->params + ng + g->slot_off[o])
                             : (const void *)g->off.hs[o - g->n_res].wbf;
            void *to16 = s < n_res ? (void *)(params + ng + soff[s])
                                   : (void *)hs[s - n_res].wbf;
            CUDA_CHECK(cudaMemcpy(to16, from16, sz[0] * sizeof(bf16),
                                  cudaMemcpyDefault));
        }
    }
    /* bf16 working copies: resident ones from the new masters on the
     * device; host ones below, once the new state is in place */
    if (nbuf[0])
        copy_to_bf16_cuda(params + ng, nbuf[0] + ng, soff[n_res], g->stream);
    CUDA_CHECK(cudaDeviceSynchronize());
    gpt_offload_free_slots(g, g->off.hs, g->S - g->n_res);
    gpt_cuda_free_state_(g->params, g->grads, g->opt, g->adam_t_slot);
    gpt_cuda_graphs_drop_(g); /* they name the old state */
    gpt_cuda_use_state_(g, new_S, n_res, params, grads, opt, t_slot, hs, moe, soff);
    memcpy(g->slot_of, new_slot_of, (size_t)L * sizeof(int));
    for (int s = n_res; s < new_S; s++)
        gpt_offload_refresh_bf16(g, s);
    if (n_res == new_S)
        gpt_offload_set_staging(g, 0);
    return 0;
}
