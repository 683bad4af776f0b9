/*
 * gpt_cuda.cu — the GPT model on one GPU (gpt_cuda.h): layout, memory plan,
 * device init, the kernel paths, forward and backward of a layer and of
 * the head, a pass, and AdamW with device-side clipping. It wires the ops
 * of kernels_cuda.h together exactly as daemon/model/gpt.c wires the CPU
 * ops, so the two can be compared step by step. Its neighbours: the MoE
 * block (moe_cuda.cu), the step's queue and CUDA graphs (graphs_cuda.cu),
 * the state in and out and reslot (state_cuda.cu); gpt_cuda_impl.cuh is
 * what they share. Offloaded slots enter only through the offload runtime's
 * interface (gpt_offload.h): a pass asks for the staging buffer of each
 * position whose slot is offloaded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* ------------------------------------------------------------- layout */

static void layout_(gpt_cuda *g)
{
    size_t C = g->cfg.n_embd, T = g->cfg.seq_len, off = 0;
    tensor_at_(&g->glob[GLOB_WTE], &off, g->Vp, C);
    tensor_at_(&g->glob[GLOB_WPE], &off, T, C);
    tensor_at_(&g->glob[GLOB_LNF_W], &off, C, 0);
    tensor_at_(&g->glob[GLOB_LNF_B], &off, C, 0);
    g->n_global = pad_(off);
    g->n_global_cpu = pad_(off - (size_t)(g->Vp - g->cfg.vocab_size) * C);
    slot_layout_(g);
}

/* ------------------------------------------------------------- memory
 * (the state's allocation: state_cuda.cu) */

/* One planned allocation for all activations and scratch, laid out by the
 * table the offload planner counts from too (model/cuda/act_layout.h):
 * each region rounded up to 256 bytes. */
static int alloc_acts_(gpt_cuda *g)
{
    size_t T = g->T, C = g->cfg.n_embd;
    size_t NH = g->cfg.n_head, B = g->B, BT = B * T;
    acts_ *a = &g->a;
    size_t scratch = matmul_backward_scratch_floats((int)BT, 4 * (int)C);
    size_t s2 = layernorm_backward_scratch_floats((int)BT, (int)C);
    size_t s3 = attention_backward_scratch_floats((int)B, (int)T, (int)NH);
    if (s2 > scratch) scratch = s2;
    if (s3 > scratch) scratch = s3;
    /* attention: the tensor-core flash kernels where the head size allows
     * them (no workspace), else cuBLASLt where the head size and T allow
     * it (attention_impl_cuda) */
    int att_gemm = !g->att_flash &&
                   attention_impl_cuda((int)C, (int)NH) == ATT_IMPL_GEMM;
    size_t att_ws = att_gemm ? attention_gemm_workspace_bytes(
                                   (int)B, (int)T, (int)C, (int)NH)
                             : 0;
    gpt_cuda_act_ops ops = {scratch, att_ws,
                            grad_sumsq_scratch_floats() + RED_NSCALARS,
                            encoder_plan_ints((int)BT)};
    size_t bytes[CUDA_ACT_N];
    size_t total = gpt_cuda_act_layout(&g->cfg, g->B, &ops, bytes);
    /* in the order of the table's regions */
    void **t[] = {
        (void **)&a->encoded,
        (void **)&a->ln1, (void **)&a->qkv, (void **)&a->atty,
        (void **)&a->res2, (void **)&a->ln2, (void **)&a->fch,
        (void **)&a->fchg, (void **)&a->res3,
        (void **)&a->lnf, (void **)&a->logits,
        (void **)&a->ln1_mean, (void **)&a->ln1_rstd,
        (void **)&a->ln2_mean, (void **)&a->ln2_rstd,
        (void **)&a->lnf_mean, (void **)&a->lnf_rstd,
        (void **)&a->lse,
        (void **)&a->losses, (void **)&a->dlosses,
        (void **)&a->dres, (void **)&a->dln, (void **)&a->datty,
        (void **)&a->dlnf, (void **)&a->dqkv, (void **)&a->dfch,
        (void **)&a->dfchg,
        (void **)&a->scratch, &a->att_ws, (void **)&a->red,
        (void **)&a->inp, (void **)&a->tgt, (void **)&a->plan,
        (void **)&a->moe_probs, (void **)&a->moe_lse,
        (void **)&a->moe_expert, (void **)&a->moe_slot,
        (void **)&a->moe_counts, (void **)&a->moe_routed,
        (void **)&a->moe_row_token, (void **)&a->moe_dropped,
        (void **)&a->moe_xe, (void **)&a->moe_hpre, (void **)&a->moe_hact,
        (void **)&a->moe_ye, &a->moe_scratch, (void **)&a->moe_aux,
    };
    static_assert(sizeof t / sizeof t[0] == CUDA_ACT_N,
                  "one pointer per region of model/cuda/act_layout.h");
    if (cudaMalloc(&g->act_mem, total) != cudaSuccess) {
        (void)cudaGetLastError();
        g->act_mem = NULL;
        fprintf(stderr, "gpt_cuda: out of device memory for activations "
                        "(%.2f GiB for B=%d)\n", total / 1073741824.0, g->B);
        return -1;
    }
    CUDA_CHECK(cudaMemset(g->act_mem, 0, total));
    char *p = (char *)g->act_mem;
    for (int i = 0; i < CUDA_ACT_N; i++) {
        *t[i] = p;
        p += ceil_div(bytes[i], GPT_CUDA_ACT_ALIGN) * GPT_CUDA_ACT_ALIGN;
    }
    a->att_ws_bytes = att_ws;
    if (!att_ws)
        a->att_ws = NULL;
    a->moe_rows = gpt_cuda_moe_rows(&g->cfg, g->B);
    if (g->cfg.moe_experts > 0) {
        /* the region table's scratch must hold what moe.cu asks for */
        moe_dims d = {(int)BT, (int)C, g->cfg.moe_experts,
                      g->cfg.moe_prototypes, model_moe_hidden(&g->cfg),
                      (int)(a->moe_rows / (size_t)g->cfg.moe_experts), 0};
        if (moe_backward_scratch_bytes(&d) > bytes[CUDA_ACT_MOE_SCRATCH]) {
            fprintf(stderr, "gpt_cuda: MoE scratch: the table has %zu bytes, "
                            "moe.cu needs %zu\n",
                    bytes[CUDA_ACT_MOE_SCRATCH],
                    moe_backward_scratch_bytes(&d));
            return -1;
        }
    }
    g->act_bytes = total;
    return 0;
}

/* ------------------------------------------------------------- create */

int gpt_cuda_device_count(const char **why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* CUDA's words, then what they mean on a node */
        *why = e == cudaErrorInsufficientDriver
                   ? "CUDA driver version is insufficient for CUDA runtime "
                     "version: this machine has no NVIDIA driver, or one "
                     "older than this build's CUDA runtime needs"
               : e == cudaErrorNoDevice
                   ? "no CUDA-capable device is detected: no NVIDIA GPU is "
                     "visible to this process (CUDA_VISIBLE_DEVICES, the "
                     "container's devices)"
                   : cudaGetErrorString(e);
        return -1;
    }
    *why = n > 0 ? "" : "no devices";
    return n;
}

int gpt_cuda_use_device(int device, const char **why)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *why = cudaGetErrorString(e);
        return -1;
    }
    *why = "";
    return 0;
}

uint64_t gpt_cuda_free_bytes(int device)
{
    int cur = 0;
    size_t fr = 0, tot = 0;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cur = 0;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&fr, &tot) != cudaSuccess)
        fr = 0;
    (void)cudaSetDevice(cur);
    (void)cudaGetLastError();
    return fr;
}

int gpt_cuda_blas_ready(const char **why)
{
    cublasLtMatmulPreference_t p;
    cublasStatus_t st = cublasLtMatmulPreferenceCreate(&p);
    if (st != CUBLAS_STATUS_SUCCESS) {
        *why = cublasLtGetStatusString(st);
        return -1;
    }
    cublasLtMatmulPreferenceDestroy(p);
    *why = "";
    return 0;
}

int gpt_cuda_check_config(const model_config *cfg, char *err, size_t errlen)
{
    int C = cfg->n_embd, NH = cfg->n_head;
    if (NH < 1 || C < 1 || C % NH) {
        snprintf(err, errlen, "model.n_head: %d does not divide n_embd %d",
                 NH, C);
        return -1;
    }
    if (C % 8) {
        snprintf(err, errlen, "model.n_embd: %d is not a multiple of 8 "
                 "(needed by the cuda backend)", C);
        return -1;
    }
    int hs = C / NH;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        snprintf(err, errlen, "model.n_head: head size n_embd/n_head = %d; "
                 "the cuda backend supports 16, 32, 64 or 128", hs);
        return -1;
    }
    if (cfg->moe_experts > 0) {
        int E = cfg->moe_experts, H = model_moe_hidden(cfg);
        if (cfg->moe_every < 1 || cfg->moe_every > cfg->n_layer) {
            snprintf(err, errlen, "model.moe.every: must be in [1, "
                     "model.n_layer = %d], got %d", cfg->n_layer,
                     cfg->moe_every);
            return -1;
        }
        if (E % 8 || H % 8 || cfg->moe_prototypes < 1 ||
            E % cfg->moe_prototypes) {
            snprintf(err, errlen, "model.moe: the cuda model needs "
                     "num_experts (%d) and expert_hidden (%d) multiples of 8 "
                     "and prototypes dividing num_experts", E, H);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- paths */

/* Ask cuBLASLt ahead, for every GEMM the passes will make (each layer's
 * tensors, every microbatch size up to B), whether it has an algorithm,
 * and choose the path where it has none: attention falls back to the
 * flash kernels (the activations are planned again, without the
 * workspace), a bias or GELU epilogue to a plain GEMM plus the own
 * kernels; a plain GEMM has no other path: -1 with the reason. One log
 * line per choice. The answers are kept (matmul.cu), so the passes take
 * the paths chosen here. After a reslot, the launchers still fall back
 * by themselves for the epilogues. */
static int choose_paths_(gpt_cuda *g)
{
    const int L = g->cfg.n_layer, T = g->T, C = g->cfg.n_embd;
    const int NH = g->cfg.n_head;
    const size_t Ba = (size_t)g->B * T;
    acts_ *a = &g->a;
    char why[256] = "";
    if (a->att_ws) {
        /* the layers differ only in where qkv and atty start: one probe
         * per pair of alignments (powers of two up to 256, as matmul.cu
         * states them) */
        int ok = 1, n_seen = 0;
        uintptr_t seen[81];
        for (int l = 0; l < L && ok; l++) {
            uintptr_t q = (uintptr_t)(a->qkv + l * Ba * 3 * C) | 256;
            uintptr_t o = (uintptr_t)(a->atty + l * Ba * C) | 256;
            uintptr_t key = (q & -q) << 9 | (o & -o);
            int known = 0;
            for (int i = 0; i < n_seen; i++)
                known |= seen[i] == key;
            if (known)
                continue;
            seen[n_seen++] = key;
            ok = attention_gemm_supported(a->att_ws, a->att_ws_bytes,
                                          a->qkv + l * Ba * 3 * C,
                                          a->atty + l * Ba * C, a->dqkv,
                                          a->datty, g->B, T, C, NH, why,
                                          sizeof why);
        }
        if (ok) {
            fprintf(stderr, "gpt_cuda: attention (B<=%d T=%d hs=%d): "
                            "cuBLASLt tensor-core GEMMs, %.1f MiB "
                            "workspace\n", g->B, T, C / NH,
                    a->att_ws_bytes / 1048576.0);
        } else {
            fprintf(stderr, "gpt_cuda: attention (B<=%d T=%d hs=%d): flash "
                            "kernels: %s\n", g->B, T, C / NH, why);
            g->att_flash = 1;
            CUDA_CHECK(cudaFree(g->act_mem));
            g->act_mem = NULL;
            if (alloc_acts_(g) != 0)
                return -1;
        }
    } else if (attention_impl_cuda(C, NH) == ATT_IMPL_TC) {
        fprintf(stderr, "gpt_cuda: attention (B<=%d T=%d hs=%d): flash "
                        "kernels on the tensor cores\n", g->B, T, C / NH);
    } else {
        fprintf(stderr, "gpt_cuda: attention (B<=%d T=%d hs=%d): flash "
                        "kernels on the CUDA cores (%s)\n", g->B, T, C / NH,
                attention_impl_cuda(C, NH) == ATT_IMPL_CORE
                    ? "M6_ATTENTION=core"
                    : "no tensor-core path for this shape");
    }
    /* one slot's weights as a layer sees them: its resident slot, or a
     * staging buffer (all alike: whole allocations) */
    static const char *name[4] = {"qkv bias", "attproj bias",
                                  "fc gelu+bias", "fcproj bias"};
    int fused[4] = {0, 0, 0, 0}, asked[4] = {0, 0, 0, 0};
    int dgelu_fused = 0, dgelu_asked = 0; /* the fcproj backward's DGELU */
    for (int l = 0; l < L; l++) {
        int s = g->slot_of[l];
        const tensor_ *ts = slot_ts_(g, s);
        /* a dense block's MLP regions: its entry among the dense blocks */
        size_t fl = model_layer_is_moe(&g->cfg, l)
                        ? 0 : (size_t)gpt_cuda_mlp_index(&g->cfg, l);
        bf16 *w, *dw;
        if (s < g->n_res) {
            w = g->params + g->n_global + g->slot_off[s];
            dw = g->grads + g->n_global + g->slot_off[s];
        } else {
            w = g->off.stg[0].w;
            dw = g->off.stg[0].dw;
        }
        /* out, pre (fc), inp, weight, bias, dinp, dweight, dout, C, OC */
        struct {
            bf16 *out, *pre;
            const bf16 *inp;
            int wt, bt;
            bf16 *dinp, *dout;
            int c, oc;
        } m[4] = {
            {a->qkv + l * Ba * 3 * C, NULL, a->ln1 + l * Ba * C, SLOT_QKV_W,
             SLOT_QKV_B, a->dln, a->dqkv, C, 3 * C},
            {a->res2 + l * Ba * C, NULL, a->atty + l * Ba * C,
             SLOT_ATTPROJ_W, SLOT_ATTPROJ_B, a->datty, a->dres, C, C},
            {a->fchg + fl * Ba * 4 * C, a->fch + fl * Ba * 4 * C,
             a->ln2 + l * Ba * C, SLOT_FC_W, SLOT_FC_B, a->dln, a->dfch, C,
             4 * C},
            {a->res3 + l * Ba * C, NULL, a->fchg + fl * Ba * 4 * C,
             SLOT_FCPROJ_W, SLOT_FCPROJ_B, a->dfch, a->dres, 4 * C, C}};
        /* an MoE block's experts are batched GEMMs (moe.cu), no MLP */
        int n_mm = model_layer_is_moe(&g->cfg, l) ? 2 : 4;
        for (int b = 1; b <= g->B; b++)
            for (int i = 0; i < n_mm; i++) {
                const bf16 *W = w + ts[m[i].wt].off;
                const bf16 *bias = w + ts[m[i].bt].off;
                asked[i]++;
                int N = b * T;
                if (!matmul_plain_supported(m[i].pre ? m[i].pre : m[i].out,
                                            m[i].inp, W, m[i].dinp,
                                            dw + ts[m[i].wt].off,
                                            m[i].dout, N, m[i].c, m[i].oc,
                                            why, sizeof why)) {
                    fprintf(stderr, "gpt_cuda: %s: no other path\n", why);
                    return -1;
                }
                fused[i] += matmul_forward_fused_supported(
                    m[i].out, m[i].pre, m[i].inp, W, bias, N, m[i].c,
                    m[i].oc, m[i].pre != NULL);
                if (m[i].pre) /* the GELU's fallback: bias into pre */
                    (void)matmul_forward_fused_supported(
                        m[i].pre, NULL, m[i].inp, W, bias, N, m[i].c,
                        m[i].oc, 0);
                if (i == 3) { /* d(fch) = (dres W) GELU'(fch) */
                    dgelu_asked++;
                    dgelu_fused += matmul_backward_dgelu_supported(
                        a->dfch, m[2].pre, m[i].dout, W, N, m[i].c, m[i].oc);
                }
            }
    }
    for (int b = 1; b <= g->B; b++) /* the LM head: no bias */
        if (!matmul_plain_supported(a->logits, a->lnf,
                                    g->params + g->glob[GLOB_WTE].off,
                                    a->dlnf, g->grads + g->glob[GLOB_WTE].off,
                                    a->logits, b * T, C, g->Vp, why,
                                    sizeof why)) {
            fprintf(stderr, "gpt_cuda: %s: no other path\n", why);
            return -1;
        }
    char line[512];
    int n = 0;
    g->epi_fallback = 0;
    /* the MLP's two only where some block is dense */
    for (int i = 0; i < 4; i++) {
        if (!asked[i])
            continue;
        const char *how = fused[i] == asked[i] ? "fused"
                          : fused[i] == 0      ? "own kernels"
                                   : "fused, some shapes own kernels";
        g->epi_fallback += fused[i] != asked[i];
        n += snprintf(line + n, sizeof line - n, "%s%s %s", i ? ", " : "",
                      name[i], how);
    }
    if (dgelu_asked)
        snprintf(line + n, sizeof line - n, ", fcproj backward dgelu %s",
                 dgelu_fused == dgelu_asked ? "fused"
                 : dgelu_fused == 0         ? "own kernels"
                                    : "fused, some shapes own kernels");
    fprintf(stderr, "gpt_cuda: matmul epilogues (cuBLASLt): %s\n", line);
    return 0;
}

gpt_cuda *gpt_cuda_create(const model_config *cfg, int S, int B)
{
    return gpt_cuda_create_optim(cfg, S, B, NULL, NULL);
}

gpt_cuda *gpt_cuda_create_offload(const model_config *cfg, int S, int B,
                                  const gpt_cuda_offload *off)
{
    return gpt_cuda_create_optim(cfg, S, B, off, NULL);
}

gpt_cuda *gpt_cuda_create_optim(const model_config *cfg, int S, int B,
                                const gpt_cuda_offload *off,
                                const gpt_optim *o)
{
    int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head;
    char why[256];
    if (gpt_cuda_check_config(cfg, why, sizeof why) != 0) {
        fprintf(stderr, "gpt_cuda_create: %s\n", why);
        return NULL;
    }
    if (L < 1 || S < 1 || S > L || B < 1 || cfg->seq_len < 1 ||
        cfg->vocab_size < 2) {
        fprintf(stderr, "gpt_cuda_create: bad shape (L=%d S=%d B=%d C=%d "
                        "NH=%d): need 1 <= S <= L\n", L, S, B, C, NH);
        return NULL;
    }
    gpt_cuda *g = (gpt_cuda *)calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->cfg = *cfg;
    g->B = B;
    g->T = cfg->seq_len;
    g->Vp = (int)ceil_div(cfg->vocab_size, VPAD) * VPAD;
    layout_(g);
    size_t BT = (size_t)B * g->T;
    g->slot_of = (int *)calloc((size_t)L, sizeof(int));
    if (!g->slot_of) {
        free(g);
        return NULL;
    }
    g->n_moe_layers = gpt_cuda_moe_layers(cfg);
    /* as gpt_create: a mixed model spreads each kind over its slots */
    if (gpt_default_share_map(cfg, S, g->slot_of) != 0) {
        fprintf(stderr, "gpt_cuda_create: no share map of %d slots (a "
                        "model of dense and MoE blocks needs at least one "
                        "slot of each kind)\n", S);
        free(g->slot_of);
        free(g);
        return NULL;
    }
    CUDA_CHECK(cudaStreamCreate(&g->stream));
    matmul_cuda_init();
    if (gpt_cuda_optim_init_(g, o, off) != 0 ||
        (off && gpt_offload_init(g, off) != 0)) {
        gpt_cuda_free(g);
        return NULL;
    }
    int n_res = off && off->n_resident < S ? off->n_resident : S;
    if (n_res < 0)
        n_res = 0;
    bf16 *params, *grads;
    float *opt;
    long *t_slot;
    hslot_ *hs;
    unsigned char *moe;
    size_t *soff;
    if (gpt_cuda_slot_places_(g, S, g->slot_of, &moe, &soff) != 0 ||
        gpt_cuda_alloc_placed_(g, S, n_res, moe, soff, &params, &grads, &opt,
                               &t_slot, &hs) != 0) {
        gpt_cuda_free(g);
        return NULL;
    }
    gpt_cuda_use_state_(g, S, n_res, params, grads, opt, t_slot, hs, moe, soff);
    if ((n_res < S && gpt_offload_set_staging(g, 1) != 0) || alloc_acts_(g) != 0 ||
        choose_paths_(g) != 0) {
        gpt_cuda_free(g);
        return NULL;
    }
    CUDA_CHECK(cudaMallocHost((void **)&g->h_inp, BT * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost((void **)&g->h_tgt, BT * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost((void **)&g->h_plan,
                              encoder_plan_ints((int)BT) * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost((void **)&g->h_out, 4 * sizeof(float)));
    g->h_loss = g->h_out;
    g->graphs = gpt_cuda_graphs_env_();
    return g;
}

void gpt_cuda_free(gpt_cuda *g)
{
    if (!g)
        return;
    if (g->stream)
        gpt_cuda_synchronize(g);
    gpt_offload_free_slots(g, g->off.hs, g->S - g->n_res);
    gpt_offload_fini(g);
    gpt_cuda_graphs_drop_(g);
    free(g->ga.B);
    free(g->ga.scale);
    if (g->d_args) CUDA_CHECK(cudaFree(g->d_args));
    if (g->h_args) CUDA_CHECK(cudaFreeHost(g->h_args));
    if (g->args_done) CUDA_CHECK(cudaEventDestroy(g->args_done));
    gpt_cuda_free_state_(g->params, g->grads, g->opt, g->adam_t_slot);
    if (g->gradf) CUDA_CHECK(cudaFree(g->gradf));
    adamw_multi_plan_destroy(g->mt);
    free(g->mt_t);
    gpt_cuda_optim_fini_(g);
    if (g->act_mem) CUDA_CHECK(cudaFree(g->act_mem));
    if (g->h_inp) CUDA_CHECK(cudaFreeHost(g->h_inp));
    if (g->h_tgt) CUDA_CHECK(cudaFreeHost(g->h_tgt));
    if (g->h_plan) CUDA_CHECK(cudaFreeHost(g->h_plan));
    if (g->h_out) CUDA_CHECK(cudaFreeHost(g->h_out));
    for (int k = 0; k < g->n_mb; k++) {
        CUDA_CHECK(cudaFreeHost(g->mb[k].inp));
        CUDA_CHECK(cudaEventDestroy(g->mb[k].done));
    }
    free(g->mb);
    if (g->stream) CUDA_CHECK(cudaStreamDestroy(g->stream));
    free(g->slot_of);
    free(g->slot_moe);
    free(g->slot_off);
    free(g);
}

void gpt_cuda_get_info(const gpt_cuda *g, gpt_cuda_info *info)
{
    memset(info, 0, sizeof *info);
    info->S = g->S;
    info->n_resident = g->n_res;
    info->Vp = g->Vp;
    info->n_params = g->n_params;
    info->n_params_cpu = g->n_global_cpu + g->slot_off[g->S];
    info->bytes_params = g->n_params * sizeof(bf16);
    info->bytes_grads = g->n_params * sizeof(bf16);
    info->bytes_opt = gpt_cuda_opt_layout_(g, NULL, g->n_params, g->n_res,
                                           g->slot_moe, NULL, NULL) *
                      sizeof(float);
    info->bytes_acts = g->act_bytes;
    info->att_gemm = g->a.att_ws != NULL;
    info->epi_fallback = g->epi_fallback;
    info->graphs = g->graphs && !g->graph_failed;
    info->graph_captures = g->graph_captures;
}

const int *gpt_cuda_slot_of(const gpt_cuda *g)
{
    return g->slot_of;
}

size_t gpt_cuda_slot_offset(const gpt_cuda *g, int s)
{
    return s < 0 ? 0 : g->slot_off[s > g->S ? g->S : s];
}

void gpt_cuda_synchronize(gpt_cuda *g)
{
    gpt_cuda_flush_(g);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (g->off.enabled) {
        CUDA_CHECK(cudaStreamSynchronize(g->off.copy));
        CUDA_CHECK(cudaStreamSynchronize(g->off.drain));
        gpt_offload_wait_idle(g);
    }
}
/* No activation gradient is zeroed: the first write of each is a *_first
 * op (kernels_cuda.h; the MoE block's moe_backward_first_cuda), which
 * stores, and only the residual stream's dres and the weight gradients
 * accumulate. */

/* ------------------------------------------------------------- passes */

/* Weights of slot s, resident or in its staging buffer: tensor i of a slot
 * whose region starts at w (dw: its gradient), ts its kind's table. */
#define W_(w, i) ((w) + ts[i].off)

static void stage_tokens_(gpt_cuda *g, int32_t *dev, int32_t *pinned,
                          const int32_t *host, size_t n)
{
    memcpy(pinned, host, n * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(dev, pinned, n * sizeof(int32_t),
                               cudaMemcpyHostToDevice, g->stream));
}

void gpt_cuda_check_B_(const gpt_cuda *g, int B, const char *who)
{
    if (B < 1 || B > g->B) {
        fprintf(stderr, "%s: B=%d outside 1..%d\n", who, B, g->B);
        exit(1);
    }
}

/* Tokens (and the encoder's backward plan) to the device through the
 * pinned buffers h_inp, h_tgt, h_plan, which must be free (no copy from
 * them queued and not done). */
static void stage_batch_to_(gpt_cuda *g, const int32_t *inp,
                            const int32_t *targets, int B, int plan,
                            int32_t *h_inp, int32_t *h_tgt, int32_t *h_plan)
{
    size_t BT = (size_t)B * g->T;
    stage_tokens_(g, g->a.inp, h_inp, inp, BT);
    if (targets)
        stage_tokens_(g, g->a.tgt, h_tgt, targets, BT);
    if (!plan)
        return;
    g->nseg = encoder_backward_plan(h_plan, inp, (int)BT,
                                    g->cfg.vocab_size);
    if (g->nseg < 0) {
        fprintf(stderr, "gpt_cuda: token outside [0,%d)\n",
                g->cfg.vocab_size);
        exit(1);
    }
    CUDA_CHECK(cudaMemcpyAsync(g->a.plan, h_plan,
                               encoder_plan_ints((int)BT) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, g->stream));
}

/* stage_batch_to_ through the model's own staging, once the compute
 * stream is idle. */
static void stage_batch_(gpt_cuda *g, const int32_t *inp,
                         const int32_t *targets, int B, int plan)
{
    CUDA_CHECK(cudaStreamSynchronize(g->stream)); /* pinned staging free */
    stage_batch_to_(g, inp, targets, B, plan, g->h_inp, g->h_tgt, g->h_plan);
}

/* Layer l's saved activations (per-layer stride: the allocated B; fch
 * and fchg by the layer's index among the dense blocks) and res, its input:
 * the encoder's output, or layer l - 1's res3. */
typedef struct {
    bf16 *res, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3;
    float *lse;
} layer_acts_;

static layer_acts_ layer_acts_of_(gpt_cuda *g, int l)
{
    const size_t T = (size_t)g->T, C = (size_t)g->cfg.n_embd;
    const size_t Ba = (size_t)g->B * T, L = (size_t)l;
    const size_t fl = model_layer_is_moe(&g->cfg, l)
                          ? 0 : (size_t)gpt_cuda_mlp_index(&g->cfg, l);
    acts_ *a = &g->a;
    layer_acts_ x;
    x.res = l == 0 ? a->encoded : a->res3 + (L - 1) * Ba * C;
    x.ln1 = a->ln1 + L * Ba * C;
    x.qkv = a->qkv + L * Ba * 3 * C;
    x.atty = a->atty + L * Ba * C;
    x.res2 = a->res2 + L * Ba * C;
    x.ln2 = a->ln2 + L * Ba * C;
    x.fch = a->fch + fl * Ba * 4 * C;
    x.fchg = a->fchg + fl * Ba * 4 * C;
    x.res3 = a->res3 + L * Ba * C;
    x.lse = a->lse + L * (size_t)g->B * g->cfg.n_head * T;
    return x;
}

/* Layer l forward with its slot's weights at w. */
/* Layer l's forward on its weights w. ln1_done: its LayerNorm 1 was
 * computed by the layer before (fused with that layer's residual add).
 * next_w: the weights of layer l + 1 when l < L - 1 and they are on the
 * device, whose LayerNorm 1 is then fused with this layer's last residual
 * add (NULL: not); the last layer's add is always fused with the final
 * LayerNorm (the globals'), which head_forward_ then skips. */
static void layer_forward_(gpt_cuda *g, int l, const bf16 *w, int B,
                           int ln1_done, const bf16 *next_w)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    const size_t Ba = (size_t)g->B * T; /* per-layer stride: allocated B */
    acts_ *a = &g->a;
    cudaStream_t st = g->stream;
    const tensor_ *ts = slot_ts_(g, g->slot_of[l]);
    const int moe = model_layer_is_moe(&g->cfg, l);
    layer_acts_ x = layer_acts_of_(g, l);

    if (!ln1_done)
        layernorm_forward_cuda(x.ln1, a->ln1_mean + l * Ba,
                               a->ln1_rstd + l * Ba, x.res, W_(w, SLOT_LN1_W),
                               W_(w, SLOT_LN1_B), (int)BT, C, st);
    matmul_forward_cuda(x.qkv, x.ln1, W_(w, SLOT_QKV_W), W_(w, SLOT_QKV_B),
                        (int)BT, C, 3 * C, st);
    if (a->att_ws)
        attention_gemm_forward_cuda(x.atty, x.lse, a->att_ws,
                                    a->att_ws_bytes, x.qkv, B, T, C, NH, st);
    else
        attention_forward_cuda(x.atty, x.lse, x.qkv, B, T, C, NH, st);
    matmul_forward_cuda(x.res2, x.atty, W_(w, SLOT_ATTPROJ_W),
                        W_(w, SLOT_ATTPROJ_B), (int)BT, C, C, st);
    /* res2 = res + attention branch, and its LayerNorm, in one pass */
    residual_layernorm_forward_cuda(x.res2, x.ln2, a->ln2_mean + l * Ba,
                                    a->ln2_rstd + l * Ba, x.res, x.res2,
                                    W_(w, SLOT_LN2_W), W_(w, SLOT_LN2_B),
                                    (int)BT, C, st);
    if (moe) {
        gpt_cuda_moe_layer_forward_(g, l, w, x.ln2, x.res3, B);
    } else {
        matmul_forward_gelu_cuda(x.fchg, x.fch, x.ln2, W_(w, SLOT_FC_W),
                                 W_(w, SLOT_FC_B), (int)BT, C, 4 * C, st);
        matmul_forward_cuda(x.res3, x.fchg, W_(w, SLOT_FCPROJ_W),
                            W_(w, SLOT_FCPROJ_B), (int)BT, 4 * C, C, st);
    }
    /* res3 = res2 + MLP branch, and the next LayerNorm in the same pass:
     * layer l + 1's first (its weights resident) or the final one */
    const int L = g->cfg.n_layer;
    if (l == L - 1) {
        residual_layernorm_forward_cuda(x.res3, a->lnf, a->lnf_mean,
                                        a->lnf_rstd, x.res2, x.res3,
                                        GW_(g, GLOB_LNF_W),
                                        GW_(g, GLOB_LNF_B), (int)BT, C, st);
    } else if (next_w) {
        const tensor_ *nts = slot_ts_(g, g->slot_of[l + 1]);
        residual_layernorm_forward_cuda(
            x.res3, a->ln1 + (l + 1) * Ba * C, a->ln1_mean + (l + 1) * Ba,
            a->ln1_rstd + (l + 1) * Ba, x.res2, x.res3,
            next_w + nts[SLOT_LN1_W].off, next_w + nts[SLOT_LN1_B].off,
            (int)BT, C, st);
    } else {
        residual_forward_cuda(x.res3, x.res2, x.res3, BTC, st);
    }
}

/* Layer l backward: a->dres holds d(res3 of l) and receives d(res of l);
 * the slot's gradient at dw accumulates. */
static void layer_backward_(gpt_cuda *g, int l, const bf16 *w, bf16 *dw,
                            int B)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const size_t BT = (size_t)B * T;
    const size_t Ba = (size_t)g->B * T;
    acts_ *a = &g->a;
    cudaStream_t st = g->stream;
    const tensor_ *ts = slot_ts_(g, g->slot_of[l]);
    const int moe = model_layer_is_moe(&g->cfg, l);
    const layer_acts_ x = layer_acts_of_(g, l);

    /* dres holds d(res3): the MLP (or MoE) branch adds to it. The
     * branch's activation gradients are written (the *_first ops), its
     * weight gradients accumulate. */
    if (moe) {
        gpt_cuda_moe_layer_backward_(g, l, w, dw, x.ln2, B);
    } else {
        /* through the GELU: d(fch) in one GEMM (DGELU epilogue) */
        matmul_backward_dgelu_first_cuda(a->dfch, W_(dw, SLOT_FCPROJ_W),
                                         W_(dw, SLOT_FCPROJ_B), a->scratch,
                                         a->dres, x.fchg, x.fch,
                                         W_(w, SLOT_FCPROJ_W), (int)BT, 4 * C,
                                         C, st);
        matmul_backward_first_cuda(a->dln, W_(dw, SLOT_FC_W),
                                   W_(dw, SLOT_FC_B), a->scratch, a->dfch,
                                   x.ln2, W_(w, SLOT_FC_W), (int)BT, C, 4 * C,
                                   st);
    }
    layernorm_backward_cuda(a->dres, W_(dw, SLOT_LN2_W), W_(dw, SLOT_LN2_B),
                            a->scratch, a->dln, x.res2, W_(w, SLOT_LN2_W),
                            a->ln2_mean + l * Ba, a->ln2_rstd + l * Ba,
                            (int)BT, C, st);
    /* dres holds d(res2): the attention branch adds to it */
    matmul_backward_first_cuda(a->datty, W_(dw, SLOT_ATTPROJ_W),
                               W_(dw, SLOT_ATTPROJ_B), a->scratch, a->dres,
                               x.atty, W_(w, SLOT_ATTPROJ_W), (int)BT, C, C,
                               st);
    if (a->att_ws)
        attention_gemm_backward_first_cuda(a->dqkv, a->scratch, a->att_ws,
                                           a->att_ws_bytes, a->datty, x.qkv,
                                           x.atty, x.lse, B, T, C, NH, st);
    else
        attention_backward_first_cuda(a->dqkv, a->scratch, a->datty, x.qkv,
                                      x.atty, x.lse, B, T, C, NH, st);
    matmul_backward_first_cuda(a->dln, W_(dw, SLOT_QKV_W), W_(dw, SLOT_QKV_B),
                               a->scratch, a->dqkv, x.ln1, W_(w, SLOT_QKV_W),
                               (int)BT, C, 3 * C, st);
    layernorm_backward_cuda(a->dres, W_(dw, SLOT_LN1_W), W_(dw, SLOT_LN1_B),
                            a->scratch, a->dln, x.res, W_(w, SLOT_LN1_W),
                            a->ln1_mean + l * Ba, a->ln1_rstd + l * Ba,
                            (int)BT, C, st);
    /* dres holds d(res): the previous layer's res3 */
}

/* Final LayerNorm (computed already by the last layer's forward, fused
 * with its residual add), logits and (with targets) the mean loss, queued into
 * red[RED_LOSS] and *g->h_loss. fused (training, with targets): the
 * classifier's backward too, dlogits = d(loss) with loss_scale per row
 * written over the logits in the same kernel (head_backward_ with fused
 * then skips it). */
static void head_forward_(gpt_cuda *g, int B, int targets, int fused,
                          float loss_scale)
{
    const int C = g->cfg.n_embd;
    const size_t BT = (size_t)B * g->T;
    acts_ *a = &g->a;
    cudaStream_t st = g->stream;
    matmul_forward_cuda(a->logits, a->lnf, GW_(g, GLOB_WTE), NULL, (int)BT, C,
                        g->Vp, st);
    if (!targets)
        return;
    if (fused)
        softmax_crossentropy_fused_cuda(a->losses, a->logits, a->tgt,
                                        loss_scale, (int)BT,
                                        g->cfg.vocab_size, g->Vp, st);
    else
        softmax_crossentropy_forward_cuda(a->losses, NULL, a->logits, a->tgt,
                                          (int)BT, g->cfg.vocab_size, g->Vp,
                                          st);
    float *red = a->red + grad_sumsq_scratch_floats();
    mean_cuda(red + RED_LOSS, a->losses, (int)BT, st);
    CUDA_CHECK(cudaMemcpyAsync(g->h_loss, red + RED_LOSS, sizeof(float),
                               cudaMemcpyDeviceToHost, st));
}

/* Loss -> logits (in place) -> final LayerNorm: a->dres = d(res3 of L-1).
 * fused: the logits hold dlogits already (head_forward_ fused). */
static void head_backward_(gpt_cuda *g, int B, float loss_scale, int fused)
{
    const int C = g->cfg.n_embd, L = g->cfg.n_layer;
    const size_t BT = (size_t)B * g->T, Ba = (size_t)g->B * g->T;
    acts_ *a = &g->a;
    cudaStream_t st = g->stream;
    if (!fused) {
        fill_cuda(a->dlosses, loss_scale, BT, st);
        softmax_crossentropy_backward_cuda(a->logits, a->logits, a->tgt,
                                           a->dlosses, (int)BT,
                                           g->cfg.vocab_size, g->Vp, st);
    }
    /* the first writes of dlnf and of the residual stream's dres */
    matmul_backward_first_cuda(a->dlnf, GDW_(g, GLOB_WTE), NULL, NULL,
                               a->logits, a->lnf, GW_(g, GLOB_WTE), (int)BT,
                               C, g->Vp, st);
    const bf16 *last = a->res3 + (size_t)(L - 1) * Ba * C;
    layernorm_backward_first_cuda(a->dres, GDW_(g, GLOB_LNF_W),
                                  GDW_(g, GLOB_LNF_B), a->scratch, a->dlnf,
                                  last, GW_(g, GLOB_LNF_W), a->lnf_mean,
                                  a->lnf_rstd, (int)BT, C, st);
}

/* Positions [p0, p1) of a microbatch: forward layer p for p < L, backward
 * layer 2L-1-p after. When the range crosses L, the head runs in between
 * (forward with targets, then backward with loss_scale). */
void gpt_cuda_run_pass_(gpt_cuda *g, int p0, int p1, int B, float loss_scale,
                      int last)
{
    const int L = g->cfg.n_layer;
    int off = g->n_res < g->S;
    if (g->n_moe_layers > 0) {
        /* d(training loss)/d(aux, z) of each MoE layer: the coefficient
         * over the MoE layers, times the microbatch's weight, as gpt.c */
        double wt = (double)loss_scale * (double)B * g->T / g->n_moe_layers;
        g->moe_daux = (float)(g->cfg.moe_aux_coef * wt);
        g->moe_dz = (float)(g->cfg.moe_z_coef * wt);
    }
    if (off)
        gpt_offload_pass_begin(g, p0, p1, last);
    int ln1_done = 0; /* layer p's LayerNorm 1 done by layer p - 1 */
    for (int p = p0; p < p1; p++) {
        if (p == L && p0 < L) {
            head_forward_(g, B, 1, 1, loss_scale);
            head_backward_(g, B, loss_scale, 1);
        }
        int l = p < L ? p : 2 * L - 1 - p, s = g->slot_of[l];
        bf16 *w, *dw;
        if (s < g->n_res) {
            if (off)
                gpt_offload_poll(g);
            w = g->params + g->n_global + g->slot_off[s];
            dw = g->grads + g->n_global + g->slot_off[s];
        } else {
            gpt_offload_enter(g, p, &w, &dw);
        }
        if (p < L) {
            /* the next layer's LayerNorm 1 fused with this layer's add
             * when the next layer's slot is resident */
            const bf16 *nw = NULL;
            if (p + 1 < L && g->slot_of[p + 1] < g->n_res)
                nw = g->params + g->n_global + g->slot_off[g->slot_of[p + 1]];
            layer_forward_(g, l, w, B, ln1_done, nw);
            ln1_done = nw != NULL;
        } else
            layer_backward_(g, l, w, dw, B);
        if (s >= g->n_res)
            gpt_offload_leave(g, p);
    }
}

float gpt_cuda_forward(gpt_cuda *g, const int32_t *inp,
                       const int32_t *targets, int B)
{
    gpt_cuda_check_B_(g, B, "gpt_cuda_forward");
    gpt_cuda_flush_(g);
    stage_batch_(g, inp, targets, B, 0);
    encoder_forward_cuda(g->a.encoded, g->a.inp, GW_(g, GLOB_WTE),
                         GW_(g, GLOB_WPE), B, g->T, g->cfg.n_embd, g->stream);
    gpt_cuda_run_pass_(g, 0, g->cfg.n_layer, B, 0.0f, 0);
    head_forward_(g, B, targets != NULL, 0, 0.0f);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return targets ? g->h_out[0] : 0.0f;
}

void gpt_cuda_zero_grad(gpt_cuda *g)
{
    gpt_cuda_flush_(g);
    g->mb_k = g->mb_q = 0; /* a new step's microbatches */
    g->step_graph = gpt_cuda_graphs_apply_(g);
    if (g->step_graph)
        g->zero_defer = 1; /* in graph A */
    else
        CUDA_CHECK(cudaMemsetAsync(g->grads, 0, g->n_params * sizeof(bf16),
                                   g->stream));
    g->off.early = 0; /* only gpt_cuda_step_begin(max_norm <= 0) sets it */
    g->off.speculate = 0; /* ... and this one with max_norm > 0 */
    if (g->n_res < g->S)
        gpt_offload_step_begin(g);
}

void gpt_cuda_backward(gpt_cuda *g, const int32_t *inp,
                       const int32_t *targets, int B, float loss_scale)
{
    const int L = g->cfg.n_layer;
    (void)targets; /* staged on the device by the forward */
    gpt_cuda_check_B_(g, B, "gpt_cuda_backward");
    gpt_cuda_flush_(g);
    CUDA_CHECK(cudaStreamSynchronize(g->stream)); /* plan staging free */
    g->nseg = encoder_backward_plan(g->h_plan, inp, B * g->T,
                                    g->cfg.vocab_size);
    if (g->nseg < 0) {
        fprintf(stderr, "gpt_cuda_backward: token outside [0,%d)\n",
                g->cfg.vocab_size);
        exit(1);
    }
    CUDA_CHECK(cudaMemcpyAsync(g->a.plan, g->h_plan,
                               encoder_plan_ints(B * g->T) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, g->stream));
    head_backward_(g, B, loss_scale, 0);
    gpt_cuda_run_pass_(g, L, 2 * L, B, loss_scale, 0);
    encoder_backward_cuda(GDW_(g, GLOB_WTE), GDW_(g, GLOB_WPE), g->a.dres,
                          g->a.plan, g->nseg, B, g->T, g->cfg.n_embd,
                          g->stream);
}

void gpt_cuda_step_begin(gpt_cuda *g, float lr, float beta1, float beta2,
                         float eps, float weight_decay, float max_norm)
{
    gpt_cuda_zero_grad(g);
    offload_rt_ *o = &g->off;
    /* Adafactor: early only with gpt_cuda_step_adafactor's
     * hyperparameters (one whole-slot job per slot), else after the
     * step's norm (gpt_cuda_adafactor) */
    o->early = max_norm <= 0.0f;
    o->af_early = 0;
    o->speculate = max_norm > 0.0f && o->speculative && g->n_res < g->S;
    o->lr = lr;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->wd = weight_decay;
}

void gpt_cuda_step_adafactor(gpt_cuda *g, const struct adafactor_hparams *h,
                             float weight_decay)
{
    if (g->af && g->off.enabled)
        gpt_offload_set_adafactor(g, h, weight_decay);
}

/* ------------------------------------------------------------- optimizer */

/* Device sum of squares of the resident gradients into red[RED_SUMSQ] and
 * h_out[1]; with offloaded slots, waits and adds the host's. Returns the
 * total. */
static float grad_sumsq_(gpt_cuda *g)
{
    gpt_cuda_flush_(g);
    float *red = g->a.red, *sc = red + grad_sumsq_scratch_floats();
    grad_sumsq_cuda(sc + RED_SUMSQ, red, g->grads, g->n_params, g->stream);
    CUDA_CHECK(cudaMemcpyAsync(g->h_out + 1, sc + RED_SUMSQ, sizeof(float),
                               cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (g->n_res < g->S)
        g->h_out[1] = (float)((double)g->h_out[1] + gpt_offload_grad_sumsq(g));
    return g->h_out[1];
}

float gpt_cuda_norm_sumsq_(gpt_cuda *g, float max_norm)
{
    float *red = g->a.red, *sc = red + grad_sumsq_scratch_floats();
    if (g->n_res == g->S) {
        grad_sumsq_cuda(sc + RED_SUMSQ, red, g->grads, g->n_params,
                        g->stream);
        CUDA_CHECK(cudaMemcpyAsync(g->h_out + 1, sc + RED_SUMSQ,
                                   sizeof(float), cudaMemcpyDeviceToHost,
                                   g->stream));
        return 1.0f;
    }
    /* the norm needs the host's part: one round trip, then the clip scale
     * on the device from the total, as without offloading */
    float total = grad_sumsq_(g), norm = sqrtf(total);
    g->h_out[2] = total;
    CUDA_CHECK(cudaMemcpyAsync(sc + RED_SUMSQ, g->h_out + 2, sizeof(float),
                               cudaMemcpyHostToDevice, g->stream));
    return max_norm > 0.0f && norm > max_norm ? max_norm / norm : 1.0f;
}

int gpt_cuda_div_slot_grads(gpt_cuda *g, const int *div)
{
    gpt_cuda_flush_(g);
    for (int s = g->n_res; s < g->S; s++)
        if (div[s] > 1)
            return -1;
    for (int s = 0; s < g->n_res; s++)
        if (div[s] > 1)
            grad_div_cuda(g->grads + g->n_global + g->slot_off[s],
                          slot_n_(g, s), (float)div[s], g->stream);
    return 0;
}

float gpt_cuda_grad_norm(gpt_cuda *g)
{
    return sqrtf(grad_sumsq_(g));
}

float gpt_cuda_last_grad_norm(gpt_cuda *g)
{
    gpt_cuda_flush_(g);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return sqrtf(g->h_out[1]);
}

static void adamw_region_(gpt_cuda *g, size_t base, const tensor_ *ts, int nt,
                          long t, float lr, float b1, float b2, float eps,
                          float wd, const float *scale)
{
    for (int i = 0; i < nt; i++) {
        size_t o = base + ts[i].off;
        adamw_update_cuda(g->master + o, g->params + o, g->grads + o,
                          g->m + o, g->v + o, ts[i].numel, lr, b1, b2, eps,
                          ts[i].two_d ? wd : 0.0f, scale, t, g->stream);
    }
}

/* The multi-tensor plan of the device block (globals, region 0; resident
 * slot s, region 1 + s), made again when n_res has changed (reslot,
 * offloading): the tensors of a slot depend on the config only. Exits, as
 * the model's other allocation failures, when it cannot be made. */
static void mt_plan_(gpt_cuda *g)
{
    if (g->mt && g->mt_nres == g->n_res)
        return;
    gpt_cuda_graph_drop_(&g->gb); /* it names the old plan */
    adamw_multi_plan_destroy(g->mt);
    g->mt = NULL;
    free(g->mt_t);
    int nt = GLOB_NTENSORS, k = 0;
    for (int s = 0; s < g->n_res; s++)
        nt += g->kind_nt[g->slot_moe[s]];
    adamw_tensor_cuda *ts = (adamw_tensor_cuda *)calloc((size_t)nt,
                                                        sizeof *ts);
    g->mt_t = (long *)calloc((size_t)g->n_res + 1, sizeof(long));
    if (!ts || !g->mt_t) {
        fprintf(stderr, "gpt_cuda_adamw: out of memory\n");
        exit(1);
    }
    /* bf16 masters: each tensor's key from its place in gpt.h's plain
     * layout (the globals' offsets there differ: wte has V rows, not Vp) */
    gpt_tensor cpu_glob[GLOB_NTENSORS], cpu_slot[SLOT_NTENSORS_MAX];
    size_t cpu_ng, cpu_ss;
    gpt_layout(&g->cfg, cpu_glob, cpu_slot, &cpu_ng, &cpu_ss);
    for (int r = 0; r <= g->n_res; r++) {
        /* the globals (region 0), then resident slot r - 1 */
        const tensor_ *src = r ? slot_ts_(g, r - 1) : g->glob;
        int n = r ? g->kind_nt[g->slot_moe[r - 1]] : GLOB_NTENSORS;
        size_t base = r ? g->n_global + g->slot_off[r - 1] : 0;
        for (int i = 0; i < n; i++, k++) {
            ts[k].off = base + src[i].off;
            ts[k].numel = src[i].numel;
            ts[k].decay = src[i].two_d;
            ts[k].region = r;
            ts[k].sr_key = gpt_cuda_sr_key_(g, r - 1, r ? src[i].off
                                                          : cpu_glob[i].offset);
        }
    }
    g->mt = adamw_multi_plan_create(ts, nt, 1 + g->n_res);
    free(ts);
    if (!g->mt)
        exit(1);
    g->mt_nres = g->n_res;
}

/* M6_ADAMW_PER_TENSOR=1: the reference path, one launch per tensor and
 * the clip scale from its own kernel; unset, empty or 0: one launch.
 * Another value is reported on stderr (once) and read as 0. Read at every
 * step (one getenv), so a test can switch paths between models. */
int gpt_cuda_adamw_per_tensor_(void)
{
    static int warned;
    return gpt_cuda_env_flag_("M6_ADAMW_PER_TENSOR", 0,
                              "the multi-tensor AdamW", &warned);
}

int gpt_cuda_env_flag_(const char *name, int dflt, const char *dflt_means,
                       int *warned)
{
    const char *e = getenv(name);
    if (!e || !e[0])
        return dflt;
    if (!strcmp(e, "0") || !strcmp(e, "1"))
        return e[0] == '1';
    if (!*warned) {
        fprintf(stderr, "gpt_cuda: %s=%s is not 0 or 1: %s\n", name, e,
                dflt_means);
        *warned = 1;
    }
    return dflt;
}

void gpt_cuda_adamw(gpt_cuda *g, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float max_norm)
{
    if (g->af) {
        fprintf(stderr, "gpt_cuda_adamw: the model keeps Adafactor's state "
                        "(gpt_cuda_adafactor); nothing updated\n");
        return;
    }
    gpt_cuda_flush_(g);
    if (g->step_graph && g->n_res == g->S &&
        (!gpt_cuda_adamw_per_tensor_() || g->mbf)) {
        mt_plan_(g);
        g->mt_t[0] = g->adam_t_global + 1;
        for (int s = 0; s < g->n_res; s++)
            g->mt_t[1 + s] = g->adam_t_slot[s] + 1;
        if (gpt_cuda_graph_b_(g, lr, beta1, beta2, eps, weight_decay, max_norm) ==
            0) {
            g->adam_t_global++;
            for (int s = 0; s < g->n_res; s++)
                g->adam_t_slot[s]++;
            return;
        }
    }
    float *red = g->a.red, *sc = red + grad_sumsq_scratch_floats();
    float host_scale = gpt_cuda_norm_sumsq_(g, max_norm);
    if (!gpt_cuda_adamw_per_tensor_() || g->mbf) {
        /* one launch over the device block, the clip scale in it (bf16
         * masters: the only path that rounds them) */
        mt_plan_(g);
        g->mt_t[0] = ++g->adam_t_global;
        for (int s = 0; s < g->n_res; s++)
            g->mt_t[1 + s] = ++g->adam_t_slot[s];
        adamw_multi_cuda(g->mt, g->master, g->params, g->grads, g->m, g->v,
                         g->mt_t, lr, beta1, beta2, eps, weight_decay,
                         sc + RED_SUMSQ, max_norm, g->stream);
        if (g->n_res < g->S)
            gpt_offload_adamw(g, lr, beta1, beta2, eps, weight_decay, host_scale);
        return;
    }
    grad_clip_scale_cuda(sc + RED_SCALE, sc + RED_SUMSQ, max_norm, g->stream);
    long t = ++g->adam_t_global;
    adamw_region_(g, 0, g->glob, GLOB_NTENSORS, t, lr, beta1, beta2, eps,
                  weight_decay, sc + RED_SCALE);
    for (int s = 0; s < g->n_res; s++) {
        t = ++g->adam_t_slot[s];
        adamw_region_(g, g->n_global + g->slot_off[s], slot_ts_(g, s),
                      g->kind_nt[g->slot_moe[s]], t, lr, beta1, beta2, eps,
                      weight_decay,
                      sc + RED_SCALE);
    }
    if (g->n_res < g->S)
        gpt_offload_adamw(g, lr, beta1, beta2, eps, weight_decay, host_scale);
}
