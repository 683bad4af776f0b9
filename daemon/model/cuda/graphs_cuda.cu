/*
 * graphs_cuda.cu — the CUDA model's step queue: each microbatch staged in
 * its own pinned block and queued without waiting for the one before,
 * and, where they apply, the step through CUDA graphs (graph A: the
 * zeroing and the microbatches; graph B: the sum of squares and the
 * multi-tensor AdamW), captured, kept and dropped here. gpt_cuda.cu's
 * passes and AdamW are what they queue.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* M6_CUDA_GRAPH: unset, empty or 1, steps through CUDA graphs where they
 * apply; 0, the queued path. Another value is reported (once) and read
 * as 1. */
int gpt_cuda_graphs_env_(void)
{
    static int warned;
    return gpt_cuda_env_flag_("M6_CUDA_GRAPH", 1, "CUDA graphs on", &warned);
}

#define MB_MAX 4096 /* queued microbatches per step, at most */

/* Wait for event e when it has not completed (a host wait only then). A
 * query's cudaErrorNotReady is not an error: it is cleared so that no
 * later cudaGetLastError reports it. */
static void event_wait_(cudaEvent_t e)
{
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        CUDA_CHECK(cudaEventSynchronize(e));
    } else {
        CUDA_CHECK(q);
    }
}

/* The staging of the step's k-th microbatch, made when there is none yet
 * (pinned: tokens, targets, plan, loss in one block) and free to write:
 * its last use (a step before) waited for when not done, which after a
 * step's gpt_cuda_grad_norm it always is. */
static mb_stage_ *mb_stage_get_(gpt_cuda *g, int k)
{
    if (k >= MB_MAX) {
        fprintf(stderr, "gpt_cuda: more than %d microbatches since "
                "gpt_cuda_zero_grad\n", MB_MAX);
        exit(1);
    }
    if (k >= g->n_mb) {
        mb_stage_ *mb = (mb_stage_ *)realloc(
            g->mb, (size_t)(k + 1) * sizeof *mb);
        if (!mb) {
            fprintf(stderr, "gpt_cuda: out of memory (microbatch "
                    "staging)\n");
            exit(1);
        }
        g->mb = mb;
        size_t BT = (size_t)g->B * g->T;
        size_t ints = 2 * BT + encoder_plan_ints((int)BT);
        for (; g->n_mb <= k; g->n_mb++) {
            mb_stage_ *m = &g->mb[g->n_mb];
            CUDA_CHECK(cudaMallocHost((void **)&m->inp,
                                      ints * sizeof(int32_t) +
                                          sizeof(float)));
            m->tgt = m->inp + BT;
            m->plan = m->tgt + BT;
            m->loss = (float *)(m->plan + encoder_plan_ints((int)BT));
            CUDA_CHECK(cudaEventCreateWithFlags(&m->done,
                                                cudaEventDisableTiming));
        }
    }
    mb_stage_ *m = &g->mb[k];
    event_wait_(m->done);
    return m;
}

/* Microbatch m's tokens, targets (NULL: none) and encoder plan into its
 * pinned staging, with its B and loss scale: host work only. */
static void mb_stage_host_(gpt_cuda *g, mb_stage_ *m, const int32_t *inp,
                           const int32_t *targets, int B, float loss_scale)
{
    size_t BT = (size_t)B * g->T;
    memcpy(m->inp, inp, BT * sizeof(int32_t));
    if (targets)
        memcpy(m->tgt, targets, BT * sizeof(int32_t));
    m->nseg = encoder_backward_plan(m->plan, inp, (int)BT,
                                    g->cfg.vocab_size);
    if (m->nseg < 0) {
        fprintf(stderr, "gpt_cuda: token outside [0,%d)\n",
                g->cfg.vocab_size);
        exit(1);
    }
    m->B = B;
    m->loss_scale = loss_scale;
}

/* The device work of staged microbatch m queued: its copies in, forward,
 * backward and its loss out. graph: queued into a capture, so that the
 * encoder backward serves any plan (nseg read on the device). */
static void mb_queue_(gpt_cuda *g, mb_stage_ *m, int graph, int last)
{
    size_t BT = (size_t)m->B * g->T;
    cudaStream_t st = g->stream;
    CUDA_CHECK(cudaMemcpyAsync(g->a.inp, m->inp, BT * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g->a.tgt, m->tgt, BT * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g->a.plan, m->plan,
                               encoder_plan_ints((int)BT) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st));
    g->h_loss = m->loss;
    encoder_forward_cuda(g->a.encoded, g->a.inp, GW_(g, GLOB_WTE),
                         GW_(g, GLOB_WPE), m->B, g->T, g->cfg.n_embd, st);
    gpt_cuda_run_pass_(g, 0, 2 * g->cfg.n_layer, m->B, m->loss_scale, last);
    encoder_backward_cuda(GDW_(g, GLOB_WTE), GDW_(g, GLOB_WPE), g->a.dres,
                          g->a.plan, graph ? -1 : m->nseg, m->B, g->T,
                          g->cfg.n_embd, st);
    g->h_loss = g->h_out;
}

/* ------------------------------------------------------------ CUDA graphs
 *
 * A step through graphs (docs/DESIGN.md, "A CUDA graph per step"): its
 * zero_grad and microbatches are staged on the host only; the last
 * microbatch launches graph A (the zeroing and every microbatch), captured
 * at the first step and again when the microbatches' count, sizes or loss
 * scales change; gpt_cuda_adamw launches graph B (the sum of squares and
 * the multi-tensor AdamW, whose per-step values it copies from pinned
 * h_args). A reslot drops both. Anything else that queues work or waits
 * first queues what is staged, without a graph (flush_). */

void gpt_cuda_graph_drop_(step_graph_ *sg)
{
    if (sg->exec)
        CUDA_CHECK(cudaGraphExecDestroy(sg->exec));
    sg->exec = NULL;
    sg->n = 0;
}

void gpt_cuda_graphs_drop_(gpt_cuda *g)
{
    gpt_cuda_graph_drop_(&g->ga);
    gpt_cuda_graph_drop_(&g->gb);
}

/* A capture that the runtime refused: said once, and the queued path
 * from then on (what the step staged is queued by the caller). */
static void graph_fail_(gpt_cuda *g, const char *what, cudaError_t e)
{
    (void)cudaGetLastError(); /* not sticky: clear it */
    fprintf(stderr, "gpt_cuda: CUDA graphs off: %s: %s\n", what,
            cudaGetErrorString(e));
    g->graph_failed = 1;
    g->step_graph = 0;
    gpt_cuda_graphs_drop_(g);
}

static int capture_begin_(gpt_cuda *g)
{
    cudaError_t e = cudaStreamBeginCapture(g->stream,
                                           cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        graph_fail_(g, "cudaStreamBeginCapture", e);
        return -1;
    }
    return 0;
}

/* Ends the capture begun by capture_begin_ into sg->exec. 0 or -1. */
static int capture_end_(gpt_cuda *g, step_graph_ *sg)
{
    cudaGraph_t gr = NULL;
    cudaError_t e = cudaStreamEndCapture(g->stream, &gr);
    if (e != cudaSuccess) {
        graph_fail_(g, "cudaStreamEndCapture", e);
        return -1;
    }
    e = cudaGraphInstantiate(&sg->exec, gr, 0);
    CUDA_CHECK(cudaGraphDestroy(gr));
    if (e != cudaSuccess) {
        sg->exec = NULL;
        graph_fail_(g, "cudaGraphInstantiate", e);
        return -1;
    }
    g->graph_captures++;
    return 0;
}

/* Graph A for the step's zeroing and microbatches [0, n), captured when
 * the one kept was captured for other microbatches. 0 launched, -1 not
 * (the caller queues the work). */
static int graph_a_(gpt_cuda *g, int n)
{
    step_graph_ *sg = &g->ga;
    int same = sg->exec && sg->n == n;
    for (int k = 0; same && k < n; k++)
        same = sg->B[k] == g->mb[k].B &&
               !memcmp(&sg->scale[k], &g->mb[k].loss_scale, sizeof(float));
    if (!same) {
        gpt_cuda_graph_drop_(sg);
        int *B = (int *)realloc(sg->B, (size_t)n * sizeof(int));
        if (B)
            sg->B = B;
        float *sc = B ? (float *)realloc(sg->scale, (size_t)n * sizeof(float))
                      : NULL;
        if (sc)
            sg->scale = sc;
        if (!B || !sc) {
            fprintf(stderr, "gpt_cuda: out of memory (graph key)\n");
            exit(1);
        }
        if (capture_begin_(g) != 0)
            return -1;
        CUDA_CHECK(cudaMemsetAsync(g->grads, 0, g->n_params * sizeof(bf16),
                                   g->stream));
        for (int k = 0; k < n; k++)
            mb_queue_(g, &g->mb[k], 1, 0);
        if (capture_end_(g, sg) != 0)
            return -1;
        sg->n = n;
        for (int k = 0; k < n; k++) {
            sg->B[k] = g->mb[k].B;
            sg->scale[k] = g->mb[k].loss_scale;
        }
    }
    CUDA_CHECK(cudaGraphLaunch(sg->exec, g->stream));
    return 0;
}

/* Queues what the step has staged and not queued: the zeroing of the
 * gradients and microbatches [mb_q, mb_k), through graph A when graph is
 * set and the step has staged all of them (else one by one). */
static void queue_staged_(gpt_cuda *g, int graph)
{
    int k0 = g->mb_q, k1 = g->mb_k;
    if (!g->zero_defer && k0 == k1)
        return;
    if (graph && g->zero_defer && k0 == 0 && g->step_graph &&
        graph_a_(g, k1) == 0) {
        g->zero_defer = 0;
    } else {
        if (g->zero_defer)
            CUDA_CHECK(cudaMemsetAsync(g->grads, 0,
                                       g->n_params * sizeof(bf16),
                                       g->stream));
        g->zero_defer = 0;
        for (int k = k0; k < k1; k++) {
            mb_queue_(g, &g->mb[k], 0, 0);
            CUDA_CHECK(cudaEventRecord(g->mb[k].done, g->stream));
        }
        g->mb_q = k1;
        return;
    }
    for (int k = k0; k < k1; k++) /* after the graph: one wait each */
        CUDA_CHECK(cudaEventRecord(g->mb[k].done, g->stream));
    g->mb_q = k1;
}

/* Before any other work is queued or waited for: the staged work first. */
void gpt_cuda_flush_(gpt_cuda *g)
{
    queue_staged_(g, 0);
}

/* Whether a step starting now runs through graphs: wanted, no capture
 * failed, and a step the graphs cover (all slots resident, no MoE block,
 * the multi-tensor AdamW). */
int gpt_cuda_graphs_apply_(const gpt_cuda *g)
{
    return g->graphs && !g->graph_failed && g->n_res == g->S &&
           g->n_moe_layers == 0 && !gpt_cuda_adamw_per_tensor_();
}

void gpt_cuda_set_graphs(gpt_cuda *g, int on)
{
    gpt_cuda_flush_(g);
    g->graphs = on != 0;
    if (!g->graphs)
        gpt_cuda_graphs_drop_(g);
}

/* One training microbatch staged in mb[mb_k] and, unless the step runs
 * through graphs and this is not its last, queued; returns it. */
static mb_stage_ *queue_microbatch_(gpt_cuda *g, const int32_t *inp,
                                           const int32_t *targets, int B,
                                           float loss_scale, int last)
{
    if (!g->step_graph)
        gpt_cuda_flush_(g); /* nothing staged then; kept for safety */
    mb_stage_ *m = mb_stage_get_(g, g->mb_k);
    mb_stage_host_(g, m, inp, targets, B, loss_scale);
    g->mb_k++;
    if (g->step_graph) {
        if (last)
            queue_staged_(g, 1);
        return m;
    }
    mb_queue_(g, m, 0, last);
    CUDA_CHECK(cudaEventRecord(m->done, g->stream));
    g->mb_q = g->mb_k;
    return m;
}

float gpt_cuda_train_microbatch(gpt_cuda *g, const int32_t *inp,
                                const int32_t *targets, int B,
                                float loss_scale, int last)
{
    gpt_cuda_check_B_(g, B, "gpt_cuda_train_microbatch");
    mb_stage_ *m = queue_microbatch_(g, inp, targets, B, loss_scale,
                                            last);
    gpt_cuda_flush_(g);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return *m->loss;
}

void gpt_cuda_queue_microbatch(gpt_cuda *g, const int32_t *inp,
                               const int32_t *targets, int B,
                               float loss_scale, int last)
{
    gpt_cuda_check_B_(g, B, "gpt_cuda_queue_microbatch");
    (void)queue_microbatch_(g, inp, targets, B, loss_scale, last);
}

double gpt_cuda_step_loss(gpt_cuda *g)
{
    if (g->mb_k == 0)
        return 0.0;
    gpt_cuda_flush_(g);
    mb_stage_ *m = &g->mb[g->mb_k - 1];
    event_wait_(m->done);
    double sum = 0.0;
    for (int k = 0; k < g->mb_k; k++)
        sum += g->mb[k].loss[0];
    return sum;
}

/* Graph B's values (h_args, d_args) sized for the plan, and h_args free
 * to write (the last launch's copy from it done). 0, or -1 out of
 * memory (the caller takes the queued path). */
static int graph_args_(gpt_cuda *g)
{
    size_t n = adamw_multi_args_floats(g->mt);
    if (g->n_args != n) {
        gpt_cuda_graph_drop_(&g->gb);
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        if (g->d_args) CUDA_CHECK(cudaFree(g->d_args));
        if (g->h_args) CUDA_CHECK(cudaFreeHost(g->h_args));
        g->d_args = g->h_args = NULL;
        g->n_args = 0;
        if (cudaMalloc((void **)&g->d_args, n * sizeof(float)) !=
                cudaSuccess ||
            cudaMallocHost((void **)&g->h_args, n * sizeof(float)) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            if (g->d_args) CUDA_CHECK(cudaFree(g->d_args));
            g->d_args = NULL;
            g->h_args = NULL;
            return -1;
        }
        g->n_args = n;
        if (!g->args_done)
            CUDA_CHECK(cudaEventCreateWithFlags(&g->args_done,
                                                cudaEventDisableTiming));
    }
    event_wait_(g->args_done);
    return 0;
}

/* Graph B launched with this step's values (the step counts already
 * advanced in mt_t): captured at the first step and after a reslot. 0, or
 * -1 not launched (the caller queues the update). */
int gpt_cuda_graph_b_(gpt_cuda *g, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float max_norm)
{
    if (graph_args_(g) != 0)
        return -1;
    adamw_multi_args_fill(g->mt, g->h_args, g->mt_t, lr, beta1, beta2, eps,
                          weight_decay, max_norm);
    if (!g->gb.exec) {
        float *red = g->a.red, *sc = red + grad_sumsq_scratch_floats();
        if (capture_begin_(g) != 0)
            return -1;
        CUDA_CHECK(cudaMemcpyAsync(g->d_args, g->h_args,
                                   g->n_args * sizeof(float),
                                   cudaMemcpyHostToDevice, g->stream));
        grad_sumsq_cuda(sc + RED_SUMSQ, red, g->grads, g->n_params,
                        g->stream);
        CUDA_CHECK(cudaMemcpyAsync(g->h_out + 1, sc + RED_SUMSQ,
                                   sizeof(float), cudaMemcpyDeviceToHost,
                                   g->stream));
        adamw_multi_dev_cuda(g->mt, g->master, g->params, g->grads, g->m,
                             g->v, g->d_args, sc + RED_SUMSQ, g->stream);
        if (capture_end_(g, &g->gb) != 0)
            return -1;
    }
    CUDA_CHECK(cudaGraphLaunch(g->gb.exec, g->stream));
    CUDA_CHECK(cudaEventRecord(g->args_done, g->stream));
    return 0;
}
