/*
 * m6ctl_plan.c — `m6ctl plan SPEC`: the memory plan of a spec, here or by
 * m6d (--daemon), for one node or a cluster, and the P2R cost model
 * (--p2r, offload/plan_p2r.h).
 */
#include "client/m6ctl_internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/paths.h"
#include "client/eta.h"
#include "client/export.h"
#include "client/plot.h"
#include "offload/offload.h"
#include "offload/plan_p2r.h"
#include "proto/views.h"
#include "spec/spec.h"

/* A PlanReply's phase as the planner's struct (placement malloc'd), for
 * offload_plan_print: m6d's plan is printed as the local one is. */
static int plan_from_reply_(const M6__PhasePlan *pp, backend_kind be, offload_plan *p)
{
    memset(p, 0, sizeof *p);
    p->n_layer = pp->n_layer;
    p->n_slots = pp->n_slots;
    p->n_resident = (int)pp->n_resident_slots;
    p->n_offloaded = (int)pp->n_offloaded_slots;
    if (pp->n_slots < 1 || p->n_resident + p->n_offloaded != pp->n_slots) return -1;
    p->placement = calloc((size_t)pp->n_slots, 1);
    if (!p->placement) return -1;
    for (size_t i = 0; i < pp->n_offloaded_slots; i++) {
        if (pp->offloaded_slots[i] < 0 || pp->offloaded_slots[i] >= pp->n_slots) return -1;
        p->placement[pp->offloaded_slots[i]] = OFFLOAD_OFFLOADED;
    }
    p->n_staging = pp->staging_buffers;
    p->batch_size = pp->batch_size;
    p->grad_accum = pp->grad_accum;
    p->prefetch = pp->prefetch;
    p->backend = be;
    p->budget_bytes = pp->budget_bytes;
    p->global_bytes = pp->global_bytes;
    p->slot_bytes = pp->slot_bytes;
    p->staging_bytes = pp->staging_buffer_bytes;
    p->act_bytes = pp->activations_bytes;
    p->workspace_bytes = pp->workspace_bytes;
    p->peak_device_bytes = pp->peak_device_bytes;
    p->min_budget_bytes = pp->min_budget_bytes;
    p->host_slot_bytes = pp->host_slot_bytes;
    p->pinned_slot_bytes = pp->pinned_slot_bytes;
    p->host_bytes = pp->host_bytes;
    p->pinned_bytes = pp->pinned_bytes;
    p->h2d_bytes_per_step = pp->h2d_bytes_per_step;
    p->d2h_bytes_per_step = pp->d2h_bytes_per_step;
    p->speculative = pp->speculative;
    p->speculative_mode = offload_speculative_mode_of(pp->speculative_mode);
    if (p->speculative_mode < 0) return -1;
    p->spec_slot_bytes = pp->speculative_slot_bytes;
    p->stream_grads = pp->stream_grads;
    p->n_grad_bufs = pp->grad_buffers;
    p->grad_buf_bytes = pp->grad_buffer_bytes;
    p->spec_pinned_slot_bytes = pp->speculative_pinned_slot_bytes;
    p->host_state_bytes = pp->host_state_bytes;
    return 0;
}

/* plan --daemon: m6d plans the spec and adds its own host checks. */
static int plan_on_daemon_(const char *path)
{
    char *buf = m6ctl_read_spec_(path);
    if (!buf) return EXIT_ERR;
    M6__PlanQuery q = M6__PLAN_QUERY__INIT;
    q.spec_json = buf;
    q.device_memory = g.device_memory;
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_PLAN, &q.base);
    free(buf);
    if (!resp) return EXIT_ERR;
    const M6__PlanReply *pr = resp->body_case == M6__RESPONSE__BODY_PLAN ? resp->plan : NULL;
    backend_kind be = pr && strcmp(pr->backend, "cuda") == 0 ? BACKEND_CUDA : BACKEND_CPU;
    offload_plan plan;
    int ok = pr && pr->real && plan_from_reply_(pr->real, be, &plan) == 0;
    if (ok && pr->pseudo) {
        plan.pseudo = calloc(1, sizeof *plan.pseudo);
        ok = plan.pseudo && plan_from_reply_(pr->pseudo, be, plan.pseudo) == 0;
    }
    if (ok && pr->rank_real) {  /* expert parallelism: a rank's model */
        offload_plan *er = plan.ep_rank = calloc(1, sizeof *er);
        ok = er && plan_from_reply_(pr->rank_real, be, er) == 0;
        if (ok && pr->rank_pseudo) {
            er->pseudo = calloc(1, sizeof *er->pseudo);
            ok = er->pseudo &&
                 plan_from_reply_(pr->rank_pseudo, be, er->pseudo) == 0;
        }
        plan.ep_experts = pr->rank_experts;
    }
    if (!ok) {
        m6ctl_errf_("m6d sent no plan, or a plan whose slots do not add up");
    } else {
        if (pr->warning && *pr->warning) m6ctl_errf_("warning: %s", pr->warning);
        offload_plan_print(stdout, &plan, g.json);
        fflush(stdout);
    }
    if (pr && pr->real) offload_plan_free(&plan);
    m6__response__free_unpacked(resp, NULL);
    return ok ? EXIT_OK : EXIT_ERR;
}

/* The cluster planner's input from plan's options (--nodes,
 * --gpus-per-node, --device-memory, --host-memory) and the spec. */
static cluster_input cluster_input_(const run_spec *spec)
{
    return (cluster_input){
        .nodes = g.nodes ? g.nodes : 1,
        .gpus_per_node = g.gpus_per_node ? g.gpus_per_node : 1,
        .device_memory = g.device_memory ? g.device_memory
                                         : spec->device.memory_budget,
        .host_memory = g.host_memory,
        .prefetch = spec->offload.prefetch,
    };
}

/* plan --nodes ...: the spec's parameter state at scale (offload.h "plan
 * at scale"), computed here. */
static int plan_cluster_(const run_spec *spec)
{
    cluster_input in = cluster_input_(spec);
    if (!in.device_memory) {
        m6ctl_errf_("plan: --nodes/--gpus-per-node/--host-memory/--explain plan "
              "per device: give --device-memory SIZE (or set the spec's "
              "device.memory_budget)");
        return EXIT_USAGE;
    }
    cluster_plan cp;
    char err[1024];
    if (cluster_plan_for_spec(spec, &in, &cp, err, sizeof err) != 0) {
        m6ctl_errf_("%s", err);
        return EXIT_ERR;
    }
    cluster_plan_print(stdout, &cp, spec, g.explain, g.json);
    fflush(stdout);
    return EXIT_OK;
}

/* plan --p2r: the Pseudo-to-Real cost model (offload/plan_p2r.h) on the
 * single-node plan, or on the plan at scale with --nodes and friends. */
static int plan_p2r_(const run_spec *spec)
{
    static char gpu_src[160];
    p2r_options o = {
        .budget_override = g.device_memory,
        .steps_ratio = g.steps_ratio,
        .scratch_steps = g.scratch_steps > 0 ? (long)g.scratch_steps : 0,
        .sweep = g.sweep[0] ? g.sweep : NULL,
        .corpus = g.corpus[0] ? g.corpus : NULL,
        .grad_scale = g.grad_scale[0] ? g.grad_scale : NULL,
        .pseudo_lr_scale = g.pseudo_lr_scale,
    };
    p2r_rates_default(&o.rates);
    if (g.gpu_tflops > 0) {
        o.rates.gpu_flops = g.gpu_tflops * 1e12;
        o.rates.gpu_src = "--gpu-tflops";
    } else if (g.mfu > 0) {
        o.rates.gpu_flops = P2R_H200_BF16_TFLOPS * 1e12 * g.mfu;
        snprintf(gpu_src, sizeof gpu_src, "H200 SXM dense BF16 peak %g "
                 "TFLOP/s (NVIDIA H200 datasheet) x --mfu %g",
                 P2R_H200_BF16_TFLOPS, g.mfu);
        o.rates.gpu_src = gpu_src;
    }
    if (g.h2d_gbps > 0) {
        o.rates.h2d_bytes_per_s = g.h2d_gbps * 1e9;
        o.rates.h2d_src = "--h2d-gbps";
        if (!(g.d2h_gbps > 0)) {
            o.rates.d2h_bytes_per_s = g.h2d_gbps * 1e9;
            o.rates.d2h_src = "as --h2d-gbps";
        }
    }
    if (g.d2h_gbps > 0) {
        o.rates.d2h_bytes_per_s = g.d2h_gbps * 1e9;
        o.rates.d2h_src = "--d2h-gbps";
    }
    const struct { double gbps; double *to; const char **src, *opt; } gb[] = {
        {g.adam_gbps, &o.rates.host_adam_bytes_per_s, &o.rates.adam_src,
         "--host-adam-gbps"},
        {g.nvlink_gbps, &o.rates.nvlink_bytes_per_s, &o.rates.nvlink_src,
         "--nvlink-gbps"},
        {g.net_gbps, &o.rates.net_bytes_per_s, &o.rates.net_src,
         "--net-gbps"}};
    for (size_t i = 0; i < sizeof gb / sizeof gb[0]; i++)
        if (gb[i].gbps > 0) {  /* given: GB/s to bytes/s */
            *gb[i].to = gb[i].gbps * 1e9;
            *gb[i].src = gb[i].opt;
        }
    if (g.a2a_latency_given) {
        o.rates.alltoall_latency_s = g.a2a_latency_us * 1e-6;
        o.rates.latency_src = "--alltoall-latency-us";
    }
    cluster_input in = cluster_input_(spec);
    if (g.cluster) {
        if (!in.device_memory) {
            m6ctl_errf_("plan --p2r: --nodes/--gpus-per-node/--host-memory plan "
                  "per device: give --device-memory SIZE (or set the spec's "
                  "device.memory_budget)");
            return EXIT_USAGE;
        }
        o.cluster = &in;
    }
    p2r_report r;
    char err[2048];
    if (p2r_plan_for_spec(spec, &o, &r, err, sizeof err) != 0) {
        m6ctl_errf_("%s", err);
        return EXIT_ERR;
    }
    p2r_print(stdout, &r, g.json);
    fflush(stdout);
    return EXIT_OK;
}

int cmd_plan_(int argc, char **argv)
{
    if (g.p2r_only && !g.p2r) {
        m6ctl_errf_("plan: %s applies with --p2r only", g.p2r_only);
        return EXIT_USAGE;
    }
    if (g.p2r && (g.plan_daemon || g.explain)) {
        m6ctl_errf_("plan --p2r: computed here; leave out %s",
              g.plan_daemon ? "--daemon" : "--explain");
        return EXIT_USAGE;
    }
    if (g.plan_daemon && g.cluster) {
        m6ctl_errf_("plan: --nodes, --gpus-per-node, --host-memory and --explain "
              "are planned here; leave out --daemon");
        return EXIT_USAGE;
    }
    if (g.plan_daemon) return plan_on_daemon_(argv[0]);
    run_spec spec;
    char err[1024];
    if (spec_load_file(&spec, argv[0], err, sizeof err) != 0) {
        m6ctl_errf_("%s", err);
        return EXIT_ERR;
    }
    if (g.p2r)
        return plan_p2r_(&spec);
    if (g.cluster)
        return plan_cluster_(&spec);
    offload_plan plan;
    int rc = offload_plan_for_spec(&spec, g.device_memory, &plan, err, sizeof err);
    if (rc != 0) {
        m6ctl_errf_("%s", err);
    } else {
        offload_plan_print(stdout, &plan, g.json);
        fflush(stdout);
    }
    offload_plan_free(&plan);
    return rc == 0 ? EXIT_OK : EXIT_ERR;
}
