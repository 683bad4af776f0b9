/*
 * init.c — the one weight init (gpt.h: gpt_init_region): the CPU model
 * (gpt_init_weights), a plain buffer (gpt_init_params: the CUDA backend of
 * the daemon) and the CUDA model (gpt_cuda_init_weights: its benchmarks and
 * tests) all draw their weights here, so every model starts from the same
 * values for the same seed.
 *
 * The stream is splitmix64 seeded with seed: its k-th draw (k >= 1) is
 * mix(seed + k * 0x9E3779B97F4A7C15), so any draw is computed directly.
 * The 2-D tensors take their draws in layout order, globals first, then
 * slot 0, 1, ...; each pair of elements (i, i+1) takes two draws (u1, u2)
 * and gets Box-Muller's cos and sin. A region's first draw is therefore a
 * function of (cfg, which region), and regions and elements can be filled
 * in any order, on any number of threads, with the same result.
 */
#include "model/gpt.h"
#include "model/facts.h"

#include <math.h>
#include <string.h>

#define GOLDEN_ 0x9E3779B97F4A7C15ull

/* the k-th draw of splitmix64 seeded with seed, as a double in (0,1) */
static double uniform_at_(uint64_t seed, uint64_t k)
{
    uint64_t z = seed + k * GOLDEN_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* draws a tensor of n elements takes: one per element, rounded up to even */
static uint64_t draws_(const gpt_tensor *t)
{
    return t->cols ? (uint64_t)(t->numel + 1) / 2 * 2 : 0;
}

/* p[0, n) ~ N(0, std), pair j from draws k0 + 2j + 1 and k0 + 2j + 2 */
static void fill_normal_(float *p, size_t n, float std, uint64_t seed,
                         uint64_t k0)
{
    long pairs = (long)((n + 1) / 2);
#pragma omp parallel for schedule(static) if (pairs > 65536)
    for (long j = 0; j < pairs; j++) {
        size_t i = 2 * (size_t)j;
        double u1 = uniform_at_(seed, k0 + i + 1);
        double u2 = uniform_at_(seed, k0 + i + 2);
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(std * r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            p[i + 1] = (float)(std * r * sin(2 * M_PI * u2));
    }
}

/* p[0, n) ~ N(0, std) as elements e0 .. e0+n-1 of a tensor whose pair j
 * takes draws k0 + 2j + 1 and k0 + 2j + 2 (fill_normal_ when e0 is 0):
 * a slice of a tensor, the same values as in the whole */
static void fill_normal_at_(float *p, size_t n, float std, uint64_t seed,
                            uint64_t k0, size_t e0)
{
    if (e0 == 0) {
        fill_normal_(p, n, std, seed, k0);
        return;
    }
#pragma omp parallel for schedule(static) if (n > 131072)
    for (size_t i = 0; i < n; i++) {
        size_t g = e0 + i, j = g / 2;
        double u1 = uniform_at_(seed, k0 + 2 * j + 1);
        double u2 = uniform_at_(seed, k0 + 2 * j + 2);
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(std * r * (g % 2 ? sin(2 * M_PI * u2)
                                         : cos(2 * M_PI * u2)));
    }
}

/* tensor t of a region at base; e0: t is elements e0.. of the whole
 * model's tensor (an expert-parallel rank's experts), else 0 */
static void init_tensor_(float *base, const gpt_tensor *t, float std,
                         int is_ln_weight, uint64_t seed, uint64_t k0,
                         size_t e0)
{
    float *p = base + t->offset;
    if (t->cols) {
        fill_normal_at_(p, t->numel, std, seed, k0, e0);
    } else {
        float v = is_ln_weight ? 1.0f : 0.0f;
        for (size_t i = 0; i < t->numel; i++)
            p[i] = v;
    }
}

void gpt_init_region(const model_config *cfg, int s, float *buf,
                     uint64_t seed)
{
    gpt_init_slot(cfg, cfg->moe_experts > 0, s, buf, seed);
}

/* Slot s of kind moe (the globals when s < 0). Slot s's draws start after
 * s slots of the largest kind, whatever the kinds, so a uniform model's
 * values are those it always had. Under expert parallelism the draws are
 * the whole model's (cfg without moe_ep_*) and a rank's experts get their
 * slice of them: the values of the same experts in the whole model. */
void gpt_init_slot(const model_config *cfg, int moe, int s, float *buf,
                   uint64_t seed)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    gpt_tensor whole[SLOT_NTENSORS_MAX];
    size_t n_global, slot_size;
    model_config all = *cfg;
    all.moe_ep_size = all.moe_ep_rank = 0;
    int first, E = cfg->moe_experts;
    model_local_experts(cfg, &first);
    gpt_layout(&all, glob, slot, &n_global, &slot_size);
    uint64_t global_draws = 0, slot_draws = 0;
    for (int i = 0; i < GLOB_NTENSORS; i++)
        global_draws += draws_(&glob[i]);
    int nt = gpt_slot_ntensors(cfg);
    for (int i = 0; i < nt; i++)
        slot_draws += draws_(&slot[i]);
    moe = moe && cfg->moe_experts > 0;
    gpt_slot_layout(&all, moe, whole, &slot_size);
    gpt_slot_layout(cfg, moe, slot, &slot_size);
    nt = moe ? SLOT_NTENSORS_MAX : SLOT_NTENSORS;
    if (s < 0) {
        /* wte N(0, 0.02), wpe N(0, 0.01) (gpt.h), ln_f 1 and 0 */
        const float std_of[GLOB_NTENSORS] = {0.02f, 0.01f, 0, 0};
        uint64_t k = 0;
        memset(buf, 0, n_global * sizeof(float));
        for (int i = 0; i < GLOB_NTENSORS; i++) {
            init_tensor_(buf, &glob[i], std_of[i], i == GLOB_LNF_W, seed, k,
                         0);
            k += draws_(&glob[i]);
        }
        return;
    }
    float std = 0.02f;
    float proj_std = 0.02f / sqrtf(2.0f * (float)cfg->n_layer);
    uint64_t k = global_draws + (uint64_t)s * slot_draws;
    memset(buf, 0, slot_size * sizeof(float));
    /* MoE: the experts like the dense MLP (c_proj as a residual
     * projection), the gate weight N(0, 0.02), biases 0 */
    for (int i = 0; i < nt; i++) {
        int is_proj = i == SLOT_ATTPROJ_W || i == SLOT_FCPROJ_W;
        int is_lnw = i == SLOT_LN1_W || i == SLOT_LN2_W;
        int expert = moe && i >= SLOT_FC_W && i <= SLOT_FCPROJ_B;
        size_t e0 = expert ? whole[i].numel / (size_t)E * (size_t)first : 0;
        init_tensor_(buf, &slot[i], is_proj ? proj_std : std, is_lnw, seed,
                     k, e0);
        k += draws_(&whole[i]);
    }
}

int gpt_init_params(const model_config *cfg, int S, float *params,
                    uint64_t seed)
{
    size_t n_global, slot_size;
    gpt_layout_sizes(cfg, &n_global, &slot_size);
    gpt_init_region(cfg, -1, params, seed);
    for (int s = 0; s < S; s++)
        gpt_init_region(cfg, s, params + n_global + (size_t)s * slot_size,
                        seed);
    return 0;
}
