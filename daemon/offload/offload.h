/*
 * offload.h — granular CPU offloading (docs/DESIGN.md, "Offloading"): memory pools, the
 * planner, the submit-time preflight check, and the step scheduler that
 * streams offloaded slots between host and device.
 *
 * Terms. A slot is RESIDENT when its weights, gradient and AdamW moments
 * live in device memory, OFFLOADED when its fp32 master weights, gradient
 * and moments live in host memory (what of it is pinned: the planner, per
 * backend) and its weights are copied to a device staging buffer just
 * before the layers that use it run. The globals
 * (embeddings, final LayerNorm) are always resident.
 *
 * Offloading is on when the spec sets device.memory_budget > 0 (bytes);
 * 0 means unlimited: no pools, every slot resident, exactly the plain path.
 *
 * On the CPU backend the "device" is a pool of ordinary memory with the
 * budget enforced byte for byte; copies are memcpy on a copy thread (the
 * pools and the runtime below). The CUDA backend uses only the planner
 * from this file: gpt_cuda (daemon/model/cuda/gpt_cuda.h) places, streams and
 * updates the slots itself, as the planner's cuda accounting describes,
 * and daemon/train/backend_cuda.c maps its statistics to offload_stats.
 *
 * Units: bytes everywhere (size_t / uint64_t), seconds as double.
 */
#ifndef M6_OFFLOAD_H
#define M6_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels.h"
#include "model/facts.h"
#include "model/gpt.h"
#include "spec/spec.h"

/* ================================================================ pools */

/* Both pools hand out 64-byte aligned, zeroed blocks from large chunks
 * (first fit, neighbours coalesced on free). Thread-safe. */
typedef struct offload_pool offload_pool;

typedef struct {
    size_t capacity;   /* bytes the pool may hand out (device: the budget;
                        * host: sum of its chunks) */
    size_t in_use;     /* bytes handed out now */
    size_t peak;       /* most bytes ever in use at once */
    size_t pinned;     /* host: bytes of chunks page-locked (0 for device) */
    int chunks;        /* host: chunks held */
    size_t requested;  /* bytes the callers asked for (before the 64-byte
                        * rounding) of the blocks handed out now */
    size_t largest_chunk; /* host: bytes of the largest chunk */
} offload_pool_stats;

/* Largest host chunk: single pinned allocations over 4 GiB have failed on
 * some drivers, so pools grow by chunks of at most this. */
#define OFFLOAD_MAX_CHUNK ((size_t)1 << 30)

/* Device pool with a hard budget of `budget` bytes: an allocation that
 * would take in_use past the budget fails (NULL, errno ENOMEM). The CPU
 * stand-in reserves `budget` bytes of address space once, at most this
 * machine's physical memory (a budget above it is no limit; pages are
 * committed as they are touched). NULL on failure. */
offload_pool *offload_device_pool_create(size_t budget);

/* Pinned host pool. It grows by chunks of max(chunk_bytes, request) bytes,
 * each page-locked with mlock. When locking fails (RLIMIT_MEMLOCK, no
 * CAP_IPC_LOCK) the chunk is kept unlocked and one warning line goes to
 * stderr: a run goes on, slower, rather than failing mid-way (submit-time
 * policy is offload_check's). NULL on failure. */
offload_pool *offload_host_pool_create(size_t chunk_bytes);
/* As offload_host_pool_create, with chunks of at most max_chunk bytes
 * (offload_host_pool_create: OFFLOAD_MAX_CHUNK): a new chunk is
 * min(max_chunk, max(chunk_bytes, request)) bytes, page-rounded, and a
 * block never straddles two chunks. A single request larger than
 * max_chunk gets a chunk of its own size, locked with one mlock per
 * max_chunk piece (largest_chunk in the stats shows it). */
offload_pool *offload_host_pool_create_max(size_t chunk_bytes,
                                           size_t max_chunk);
/* Bytes this process has page-locked now (VmLck of /proc/self/status),
 * all pools and anything else together; SIZE_MAX when unknown. For
 * measuring pinned against requested bytes. */
size_t offload_vm_locked(void);

/* A zeroed, 64-byte aligned block of `bytes` (> 0); NULL with errno ENOMEM
 * when the budget (device) or memory (host) runs out. */
void *offload_pool_alloc(offload_pool *p, size_t bytes);
void offload_pool_free(offload_pool *p, void *ptr);
void offload_pool_get_stats(offload_pool *p, offload_pool_stats *st);
/* Host pool: return chunks with nothing in use to the system. */
void offload_pool_trim(offload_pool *p);
void offload_pool_destroy(offload_pool *p);

/* Bytes this process may page-lock: SIZE_MAX with CAP_IPC_LOCK, else the
 * soft RLIMIT_MEMLOCK (or the test override below). */
size_t offload_pin_limit(void);

/* ================================================================ planner */

typedef enum { OFFLOAD_RESIDENT = 0, OFFLOAD_OFFLOADED = 1 } offload_placement;

/* What the planner needs: the model shape and share map, the microbatch,
 * the budget and the backend. */
typedef struct {
    model_config model;    /* V, L, NH, C, T */
    int n_slots;           /* S, 1..L */
    const int *slot_of;    /* [L] share map; NULL: the default l*S/L */
    int batch_size;        /* B, sequences per microbatch */
    int grad_accum;        /* microbatches per optimizer step (>= 1) */
    int prefetch;          /* staging buffers (offload.prefetch, >= 1) */
    backend_kind backend;  /* sets the workspace reserve */
    size_t budget;         /* device bytes; 0: unlimited */
    int speculative;       /* offload.speculative, SPEC_SPECULATIVE_*
                            * (0, a zeroed input: auto) */
    int clipped;           /* train.grad_clip > 0: speculation applies */
    size_t host_limit;     /* host bytes the run may use (MemAvailable,
                            * capped by the cgroup, at its start); 0: unknown, so auto is off */
    gpt_optim optim;       /* the optimizer state (zeroed: AdamW); the CPU
                            * model's Adafactor state by its own sizes
                            * (model_optim_floats), resident only */
    int stream_grads;      /* offload.stream_grads: offloaded slots'
                            * gradients streamed (cpu, one microbatch) */
    int host_threads;      /* host update threads (offload.host_threads,
                            * resolved); streamed gradients in flight
                            * depend on it */
    int shard_world;       /* optimizer.shard: the AdamW state spread over
                            * this many data-parallel ranks (the phase's
                            * world size), each rank counted with its share
                            * (model_optim_bytes_sharded); <= 1: whole */
} offload_plan_input;

/* A memory plan for one phase (one share map).
 *
 * Device memory = globals + resident slots + activations + staging buffers
 * + backend workspace. There are n_staging = min(prefetch, n_offloaded)
 * staging buffers. (n_global, slot_size: gpt_layout_sizes, padded to 16
 * elements; the slot layout is the same on both backends.) Per backend:
 *
 *   cpu (fp32 everywhere; the "device" is a pool of ordinary memory):
 *     global_bytes  = 4 buffers (params, grads, m, v) * n_global * 4
 *     slot_bytes    = 4 buffers * slot_size * 4        (one resident slot)
 *     staging_bytes = 2 buffers (weights, grads) * slot_size * 4
 *     act_bytes     = gpt_act_floats(model, B) * 4
 *     workspace     = 0
 *     host, per offloaded slot: params, grads, m, v, 16 bytes/parameter,
 *       all of it pinned (the host pool); with Adafactor params, grads,
 *       its first moment (if any) and its factored second moment
 *       (model_optim_floats), a block each, each rounded up to 64 bytes,
 *       and the speculative update off (its second buffers are AdamW's)
 *     streamed gradients (offload.stream_grads): per offloaded slot
 *       params, m, v, 12 bytes/parameter, and n_grad_bufs gradient buffers
 *       of the largest slot (4 bytes/parameter, pinned; a pool of its own):
 *       a slot's gradient takes one at its first drain and gives it back
 *       when its host AdamW is done (offload_stream_grad_bufs)
 *     sharded optimizer state (optimizer.shard; gpt.h state_on_host):
 *       the globals, a resident slot and an offloaded slot's host block
 *       hold weights and gradients only (8 bytes/parameter; streamed: 4 on
 *       the host), and the optimizer state of the whole model lives in
 *       ordinary host memory, this rank's share of it
 *       (model_optim_bytes_sharded over shard_world): host_state_bytes,
 *       in host_bytes; no speculative update (it copies a slot's state)
 *
 *   cuda (daemon/model/cuda/gpt_cuda.h; bf16 working copy, fp32 optimizer):
 *     global_bytes  = 16 bytes * n_global_cuda (bf16 params 2 + bf16 grads
 *                     2 + fp32 master, m, v 12), n_global_cuda = the
 *                     globals with wte padded to Vp = V rounded up to 128
 *                     rows
 *     slot_bytes    = 16 bytes * slot_size        (one resident slot)
 *     staging_bytes = 4 bytes * slot_size         (bf16 weights + grads)
 *     act_bytes     = offload_cuda_act_bytes(model, B): exactly gpt_cuda's
 *                     activation block
 *     workspace     = 32 MiB (cuBLASLt's workspace)
 *     host, per offloaded slot: 16 bytes/parameter of ordinary memory
 *       (fp32 master, m, v, gradient accumulator) + 4 bytes/parameter
 *       pinned (bf16 working copy, bf16 gradient landing buffer)
 * The CUDA context and the allocator's rounding are not counted.
 *
 * Speculative clipped update (offload.speculative; only with clipping and
 * offloaded slots): each offloaded slot's AdamW runs unclipped as soon as
 * its gradient is final, and is kept when the global norm is within the
 * clip (the bits of the clipped update: the scale is then exactly 1) or
 * redone from the old state otherwise. Second buffers, per offloaded slot:
 *     cpu:  12 bytes/parameter ordinary memory (the old fp32 master, m, v,
 *           kept while the update runs in place);
 *     cuda: 12 bytes/parameter ordinary (the new fp32 master, m, v) + 2
 *           bytes/parameter pinned (the new bf16 working copy), 14 in all.
 * They are in spec_slot_bytes (of which spec_pinned_slot_bytes pinned) and,
 * when speculation is on, in host_bytes and pinned_bytes. on: always (with
 * clipping and offloaded slots); auto: when host_limit > 0 and everything
 * the plan puts in host memory (cpu: the "device" peak too) fits in
 * host_limit with the second buffers; off: never.
 *
 * Which slots: resident slots fill the budget first; the rest are
 * offloaded, taken from the END of the stack. In backward the last layers'
 * gradients are final first, so their host AdamW has the longest time to
 * finish, and their weights are needed last in the next forward, so their
 * copies hide behind the resident layers' compute. The offloaded slots are
 * therefore always a suffix [n_resident, n_slots).
 *
 * Bytes moved per optimizer step (training microbatches only; evaluation
 * passes add forward fetches): the layers of one microbatch, forward then
 * backward, are cut into intervals, maximal runs of adjacent layers using
 * the same offloaded slot (so the last layer's forward and backward share
 * one fetch). W is one slot's weights as they travel: slot_size * 4 (fp32)
 * on cpu, slot_size * 2 (bf16) on cuda. Each interval fetches the slot's
 * weights once (h2d, W); each interval with backward layers drains the
 * gradient (d2h, W). On cpu such an interval, unless it is the slot's
 * first backward use in the step, first fetches the partial gradient (h2d,
 * W), so that accumulation happens in the same kernel, in the same order,
 * as for a resident slot; on cuda it starts from zero and the host adds
 * the drained gradient to the slot's fp32 accumulator. For the Real phase
 * with k offloaded slots and A microbatches:
 *   cpu:  h2d = A(2k-1)W + (A-1)kW, d2h = AkW
 *   cuda: h2d = A(2k-1)W,           d2h = AkW */
typedef struct offload_plan {
    int n_layer, n_slots;
    int n_resident, n_offloaded;
    unsigned char *placement;  /* [n_slots] offload_placement (malloc'd) */
    int n_staging;             /* staging buffers on the device */
    int batch_size, grad_accum, prefetch;
    backend_kind backend;
    size_t budget_bytes;       /* 0: unlimited */
    size_t global_bytes;       /* globals: params, grads, optimizer state */
    size_t slot_bytes;         /* one resident slot: the same */
    size_t staging_bytes;      /* one staging buffer: weights + grads */
    size_t act_bytes;          /* activations and backward scratch */
    size_t workspace_bytes;    /* backend workspace reserve */
    size_t peak_device_bytes;  /* predicted peak device memory */
    size_t min_budget_bytes;   /* device memory with every slot offloaded */
    size_t host_slot_bytes;    /* host memory of one offloaded slot */
    size_t pinned_slot_bytes;  /* of which page-locked */
    size_t host_bytes;         /* host memory of the offloaded slots (with
                                * the second buffers when speculative) */
    size_t host_state_bytes;   /* optimizer state kept on the host apart
                                * from the slots (state_on_host; in
                                * host_bytes), this rank's share; else 0 */
    size_t pinned_bytes;       /* of which page-locked */
    int speculative;           /* the speculative update is on */
    int speculative_mode;      /* the input's SPEC_SPECULATIVE_* */
    size_t spec_slot_bytes;    /* second buffers of one offloaded slot */
    size_t spec_pinned_slot_bytes; /* of which page-locked */
    uint64_t h2d_bytes_per_step, d2h_bytes_per_step;
    int stream_grads;          /* offloaded gradients streamed */
    int n_grad_bufs;           /* ... through this many host buffers */
    size_t grad_buf_bytes;     /* one of them (the largest slot's) */
    struct offload_plan *pseudo;  /* offload_plan_for_spec: the Pseudo
                                   * phase's plan when the run has one */
    struct offload_plan *ep_rank; /* offload_plan_for_spec of a spec with
                                   * nodes.expert_parallel P > 1: a rank's
                                   * own model once its group forms (the
                                   * most experts a rank holds; its Pseudo
                                   * phase in ep_rank->pseudo); else NULL */
    int ep_experts;               /* ... those experts a MoE slot */
} offload_plan;

/* offload.speculative's mode (SPEC_SPECULATIVE_*) as the spec writes it:
 * "auto", "on", "off" ("?" for another value); and back, -1 for a name
 * that is none of them (a PlanReply from another version of m6d). */
const char *offload_speculative_mode_name(int mode);
int offload_speculative_mode_of(const char *name);

/* Device bytes of gpt_cuda's activations and scratch for microbatches of
 * up to B sequences (the bytes_acts of gpt_cuda_get_info). Plain C: the
 * CUDA model's own table (model/cuda/act_layout.h) with the scratch sizes
 * of kernels/cuda/{matmul,layernorm,attention,adamw,encoder}.cu, whose
 * constants plan.c copies (tests/gpu/test_trainer.c compares the two on a
 * GPU, and emu_gpu_trainer on the emulation). */
size_t offload_cuda_act_bytes(const model_config *model, int B);

/* offload.stream_grads: the host gradient buffers a step's offloaded
 * slots share, the slots in flight: the most slots whose gradient is
 * partial at once (offload_partial_max; 0 unless a slot's layers are not
 * adjacent), plus one being updated on each of host_threads (>= 1) host
 * threads, plus one landing; at most the offloaded slots. A drain that
 * finds none free waits for an update to finish (the partial ones are
 * fewer than the buffers, so one does). slot_of [L], offloaded [S]. -1
 * when out of memory. */
int offload_stream_grad_bufs(const int *slot_of, int L,
                             const unsigned char *offloaded, int S,
                             int host_threads);

/* The most offloaded slots whose gradient is partial at once in a
 * backward pass of share map slot_of (offload_partial_max): 0 when every
 * offloaded slot's layers are adjacent, so that each is drained once a
 * step, as the cuda backend's streamed gradients need (it keeps no fp32
 * accumulator). -1 when out of memory. */
int offload_stream_partials(const int *slot_of, int L,
                            const unsigned char *offloaded, int S);

/* Plan one phase. 0, or -1 with err when the input is invalid or the model
 * does not fit even with every slot offloaded; the message gives the budget,
 * the minimum and its parts. out is filled in both cases (placement NULL on
 * error); release with offload_plan_free. */
int offload_plan_make(const offload_plan_input *in, offload_plan *out,
                      char *err, size_t errlen);

/* Plan a spec: the Real phase (L slots: what must fit) in *out and, when
 * pseudo.steps > 0, the Pseudo phase in out->pseudo. budget_override > 0
 * replaces spec->device.memory_budget (m6ctl plan --device-memory).
 * 0 or -1 with err as offload_plan_make. */
int offload_plan_for_spec(const run_spec *spec, size_t budget_override,
                          offload_plan *out, char *err, size_t errlen);

/* offload_plan_for_spec with the run's host memory: the input's host_limit
 * is host_limit (bytes; 0 unknown), which decides offload.speculative auto;
 * auto is also off when the plan's pinned bytes with the second buffers
 * exceed offload_pin_limit. The trainer plans with MemAvailable at the
 * run's start, capped by its cgroup (offload_host_available; its later
 * plans follow that decision). */
int offload_plan_for_run(const run_spec *spec, size_t budget_override,
                         size_t host_limit, offload_plan *out, char *err,
                         size_t errlen);

/* Host memory m6d may still use, in bytes: MemAvailable of /proc/meminfo
 * capped by the room under its cgroup's memory limit (common/memlimit.h);
 * 0 when it cannot be read. */
size_t offload_host_available(void);
/* One rank's share of it for spec's run: offload_host_available split
 * among the run's ranks on this node (common/node_share.h; the whole on
 * a node of one rank). What the trainer plans with and offload_check
 * admits by. */
size_t offload_rank_host_available(const run_spec *spec);

/* Human table (json 0) or one JSON object (json 1) with at least
 * resident_slots, offloaded_slots (arrays of slot indices),
 * peak_device_bytes, h2d_bytes_per_step, d2h_bytes_per_step,
 * min_budget_bytes, host_bytes, pinned_bytes, budget_bytes, backend and a
 * breakdown; the Pseudo phase, if any, nested as "pseudo". Both forms are
 * one field table (plan.c, rendered by common/view.h); m6ctl prints its
 * own plan and m6d's (PlanReply) with it. */
void offload_plan_print(FILE *f, const offload_plan *p, int json);

/* ====================================================== plan at scale
 *
 * m6ctl plan --nodes N --gpus-per-node G ... (offload/plan_cluster.c): a
 * spec's parameter state on N*G = D devices, for the pseudo phase
 * (pseudo.share_groups slots, when the spec has one) and the real phase
 * (L slots). Placement, stated in the output: expert parallel, each MoE
 * slot's E experts split into D groups of at most ceil(E/D), one group per
 * device (the device holding the most is the one counted); the globals,
 * every slot's attention and LayerNorms, the gates and the dense MLPs
 * replicated on every device. Bytes per parameter are the cuda model's
 * for the spec's optimizer.name and optimizer.master (model/facts.h
 * model_param_bytes_for(1, ...); Adafactor's factored second moment by
 * the tensors' shapes, model_af_state_floats), whatever device.backend
 * says; with AdamW and fp32 masters:
 *   device, resident: weights 6 (bf16 2 + fp32 master 4), gradients 2
 *     (bf16), optimizer 8 (fp32 m, v) = 16;
 *   device, staging buffer: 4 per parameter of the slot share it holds;
 *   host, offloaded: weights 6 (fp32 master 4 + pinned bf16 2), gradients 6
 *     (fp32 accumulator 4 + pinned bf16 2), optimizer 8 = 20; with
 *     offload.stream_grads no gradients per offloaded parameter, but
 *     n_grad_bufs in flight of the largest offloaded share, 2 bytes
 *     (pinned bf16) a parameter each.
 * Resident slots are a prefix, the most the device memory holds with the
 * globals and min(prefetch, offloaded) staging buffers of the largest
 * offloaded share; host memory is per node, G devices' offloaded shares.
 * Activations, the CUDA context and the workspace are not counted. */

typedef struct {
    int nodes, gpus_per_node;   /* N, G */
    uint64_t device_memory;     /* bytes per device */
    uint64_t host_memory;       /* bytes per node; 0: not limited */
    int prefetch;               /* staging buffers (offload.prefetch) */
} cluster_input;

typedef enum {
    CLUSTER_FITS_RESIDENT,      /* every slot resident */
    CLUSTER_FITS_OFFLOADED,     /* only with granular offloading */
    CLUSTER_NO_FIT              /* not at all */
} cluster_fit;

/* One phase at scale. Parameter counts are elements; bytes per device
 * unless named per node. */
typedef struct {
    int n_slots, n_moe_slots;   /* S, and its MoE slots */
    int devices;                /* D */
    uint64_t experts_per_device;  /* ceil(E / D) of each MoE slot */
    double alltoall_bytes;      /* sent by the device with the most
                                 * experts in a step's all-to-alls: its
                                 * B x grad_accum x T tokens in bf16 rows,
                                 * every MoE layer, model_ep_alltoall_bytes */
    int n_moe_layers;
    uint64_t global_params;     /* VC + TC + 2C */
    uint64_t attn_params;       /* a block's ln_1, attn, ln_2: 4C^2 + 8C */
    uint64_t mlp_params;        /* a dense block's MLP: 8C^2 + 5C */
    uint64_t gate_params;       /* an MoE block's gate: EC + E */
    uint64_t expert_params;     /* one expert: 2HC + H + C */
    uint64_t total_params;      /* the whole model with S slots */
    uint64_t slot_params[2];    /* a dense [0] and an MoE [1] slot's share
                                 * of one device */
    uint64_t device_params;     /* globals + every slot's share */
    uint64_t offloaded_params;  /* of which in offloaded slots */
    cluster_fit fit;
    int n_resident, n_offloaded, n_staging;
    uint64_t all_resident_bytes;  /* device, every slot resident */
    uint64_t min_device_bytes;    /* device, every slot offloaded */
    uint64_t dev_weights, dev_grads, dev_optim, dev_total;
    uint64_t host_weights, host_grads, host_optim, host_total;
    uint64_t node_host_total;   /* host_total * G */
    uint64_t shortfall_bytes;   /* CLUSTER_NO_FIT: what is missing */
    int short_of_host;          /* ... of a node's host memory (else of a
                                 * device's memory) */
    model_param_bytes pb;       /* bytes per parameter of the setting */
    uint64_t af_dev_floats;     /* Adafactor's second moment on a device
                                 * (resident part) and on its host share */
    uint64_t af_host_floats;
    int stream_grads;           /* offload.stream_grads: host_grads are
                                 * n_grad_bufs gradients in flight
                                 * (offload_stream_grad_bufs with the
                                 * spec's host threads, spec_host_threads)
                                 * of the largest offloaded share, each
                                 * pb.stream_grad bytes a parameter */
    int n_grad_bufs;
} cluster_phase;

typedef struct {
    cluster_input in;
    int has_pseudo;
    cluster_phase pseudo, real;
} cluster_plan;

/* Plan spec at scale. 0, or -1 with err (bad input, or a share map the
 * model cannot have). */
int cluster_plan_for_spec(const run_spec *spec, const cluster_input *in,
                          cluster_plan *out, char *err, size_t errlen);
/* One optimizer setting at scale (cluster_settings_plan). */
typedef struct {
    const char *name;           /* "adamw fp32", "adafactor b1=0 bf16", ... */
    optimizer_kind optimizer;
    float beta1;                /* Adafactor's (0: no first moment) */
    master_kind master;
    int stream;                 /* offload.stream_grads */
    cluster_plan plan;
    double device_bytes_per_param;  /* real phase, every slot resident:
                                 * all_resident_bytes / params per device */
    double host_bytes_per_param;    /* an offloaded parameter's host bytes
                                 * (per-parameter part; Adafactor's second
                                 * moment and streamed gradients beside) */
    int possible;               /* 0: a device cannot hold even every slot
                                 * offloaded, in some phase */
    uint64_t least_host_bytes;  /* the least host memory per node it
                                 * needs over both phases (0: resident) */
} cluster_setting;
#define CLUSTER_N_SETTINGS 12
/* The plan of spec on in for each optimizer setting, in this order:
 * AdamW, Adafactor with a first moment (beta1 0.9, or the spec's when it
 * has one), Adafactor without one (beta1 0), each with fp32 then bf16
 * master weights; then the same six with offload.stream_grads. 0, or -1
 * with err. */
int cluster_settings_plan(const run_spec *spec, const cluster_input *in,
                          cluster_setting out[CLUSTER_N_SETTINGS], char *err,
                          size_t errlen);
/* Text (with explain: the arithmetic under each figure) or one JSON
 * object (nodes, devices, ..., "pseudo" and "real" with the figures of
 * cluster_phase, fits one of "resident", "offloaded", "none"), then the
 * optimizer settings (cluster_settings_plan): a table, or "settings" in
 * the JSON. */
void cluster_plan_print(FILE *f, const cluster_plan *p, const run_spec *spec,
                        int explain, int json);
void offload_plan_free(offload_plan *p);
/* A copy of src's own fields into dst (placement duplicated; dst->pseudo
 * NULL): 0, or -1 (out of memory; dst then holds nothing to free). */
int offload_plan_copy(offload_plan *dst, const offload_plan *src);
/* The planner input of a spec's run: its model, microbatch, accumulation,
 * prefetch, backend and budget; n_slots L, slot_of NULL (the default). */
offload_plan_input offload_plan_input_of(const run_spec *spec);

/* ================================================================ submit */

enum { OFFLOAD_REQUIRE_PINNED = 1 };

/* Preflight at submit. Plans the spec (both phases) and checks that the
 * host side can be had by one rank: on a node of several ranks each of
 * the run's ranks there must fit its share of the host memory and of the
 * lockable memory below (offload_rank_host_available; the refusal then
 * ends "; node NAME runs K ranks of this run, which share its host
 * memory: X each"):
 *  - the plan fits the budget (else offload_plan_for_spec's error);
 *  - host memory: on the CPU backend, everything (the plan's peak device
 *    bytes, which are host memory there, plus offloaded slots) must not
 *    exceed MemAvailable capped by m6d's cgroup memory limit
 *    (offload_host_available; "host memory: training needs X ..., only Y
 *    available (MemAvailable)" or "..., m6d's cgroup allows Y (memory.max
 *    ...)"); on CUDA, the Real phase's host bytes, ordinary and
 *    pinned ("host memory: offloading N slots needs X of host memory, P
 *    of it pinned; only Y available ..." or "..., m6d's cgroup allows
 *    Y ...");
 *  - pinning: when the pinned bytes (cpu: all host bytes; cuda: the bf16
 *    copies only) exceed what this process may lock (offload_pin_limit),
 *    it is an error under OFFLOAD_REQUIRE_PINNED (naming RLIMIT_MEMLOCK,
 *    the bytes, and LimitMEMLOCK=/ulimit -l), and otherwise a warning in
 *    warn (the run will use pageable memory).
 * out (may be NULL) receives the plan. 0 (warn may be non-empty) or -1. */
int offload_check(const run_spec *spec, size_t budget_override, int flags,
                  offload_plan *out, char *warn, size_t warnlen, char *err,
                  size_t errlen);

/* ================================================================ runtime */

/* One run's offload runtime: the pools, the model's placement (a
 * gpt_storage), a copy thread and offload.host_threads AdamW threads.
 *
 * A step, as trainer_step drives it:
 *   offload_step_begin(o, &adam or NULL)  // adam given: clip is off, so an
 *                                         // offloaded slot's AdamW starts
 *                                         // as soon as its gradient is final
 *                                         // (offload.stream_grads: the
 *                                         // backend gives it; the norm is
 *                                         // then offload_stream_sumsq's)
 *   [offload_step_speculate(o, &adam)]    // clip on: the same, speculative
 *   gpt_zero_grad; for k in microbatches:
 *       offload_microbatch(o, k); gpt_forward; gpt_backward
 *   offload_wait_grads(o)                 // every gradient on the host
 *   gpt_grad_norm; offload_adamw(o, &adam with the clip scale);
 *   gpt_adamw (resident; runs while the host threads update offloaded slots)
 * The next forward waits per slot for its host update (a slot's fetch
 * starts when its AdamW is done), so updates overlap the resident layers.
 * Anything that reads state (checkpoints, delink) calls offload_sync first.
 *
 * Per slot, a small state machine: IDLE (master copy current) -> UPDATING
 * (AdamW queued or running) -> IDLE; staging buffers go FREE -> LOADING ->
 * READY -> IN_USE -> (DRAINING) -> FREE. The compute thread never spins:
 * it waits on condition variables. */
typedef struct offload_ctx offload_ctx;

/* A host update's hyperparameters: AdamW's, or with adafactor 1
 * Adafactor's af (its grad_scale replaced by grad_scale, weight_decay
 * decoupled as AdamW's). */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int adafactor;
    adafactor_hparams af;
} offload_adam;

typedef struct {
    int enabled;               /* 0: memory_budget 0, nothing below is set
                                * except the slot counts */
    int n_slots, n_resident, n_offloaded, n_staging;
    size_t budget_bytes, predicted_peak_bytes;
    offload_pool_stats device, host;
    uint64_t h2d_bytes, d2h_bytes;   /* since creation */
    double h2d_s, d2h_s;       /* copy thread busy time */
    double h2d_gbps, d2h_gbps; /* bytes / busy time, 1e9 bytes per second */
    double stall_s;            /* compute thread waiting on transfers */
    double hidden_fraction;    /* 1 - stall_s / (h2d_s + d2h_s), in [0,1];
                                * 1 when nothing was copied */
    double adam_s;             /* host AdamW busy time, all threads */
    int speculative;           /* the current plan speculates */
    size_t spec_bytes;         /* its second buffers, bytes */
    uint64_t spec_steps;       /* steps that speculated, since creation */
    uint64_t redo_steps;       /* of which the clip applied: redone */
    uint64_t spec_restores;    /* slot updates redone from the second
                                * buffers (the others were still queued
                                * and ran once, clipped) */
    int stream_grads;          /* the current plan streams gradients */
    int n_grad_bufs;           /* ... through this many buffers */
    offload_pool_stats grads;  /* the streamed gradients' own pool: its
                                * peak is the most bytes in flight */
    uint64_t stream_skips;     /* streamed slot updates skipped, their
                                * gradient not finite, since creation */
} offload_stats;

/* Create the runtime for the planner input in (in->budget > 0 device
 * bytes; in->n_slots and in->slot_of are ignored: each allocation is
 * planned for the model's own), with host_threads host AdamW threads.
 * first, if not NULL, is the plan already made for the model's first
 * allocation (copied); it is used when it is that allocation's (same
 * slots, default share map, same batch), so a run plans its start once.
 * NULL with err. */
offload_ctx *offload_create(const offload_plan_input *in, int host_threads,
                            const offload_plan *first, char *err,
                            size_t errlen);
/* The storage to pass to gpt_create_with; it plans every (re)allocation of
 * the model's state for the model's current share map. */
const gpt_storage *offload_storage(offload_ctx *o);
/* Why the last storage allocation failed (plan or pool), or "". */
const char *offload_last_error(const offload_ctx *o);

void offload_step_begin(offload_ctx *o, const offload_adam *early);
/* With clipping, after offload_step_begin(o, NULL): when the plan is
 * speculative, each offloaded slot's AdamW runs with a (its grad_scale
 * taken as 1) as soon as its gradient is final, the old params, m, v kept
 * in second buffers. offload_adamw then keeps those updates when its
 * grad_scale is exactly 1 (the same bits) and redoes them from the old
 * state otherwise, counting the step in redo_steps. A step that never
 * reaches offload_adamw has its speculative updates undone by the next
 * offload_step_begin or offload_sync. Without a speculative plan: no-op. */
void offload_step_speculate(offload_ctx *o, const offload_adam *a);
/* Data parallelism: offload_step_speculate, except that a slot's
 * speculative update is queued by offload_grad_summed (once the
 * all-reduce has summed its gradient over the ranks), never at its drain.
 * Without a speculative plan: no-op. */
void offload_step_speculate_summed(offload_ctx *o, const offload_adam *a);
/* After offload_step_speculate_summed: offloaded slot s's gradient of the
 * step is final (summed, and divided for the mean) in g->slots[s].grads;
 * queue its speculative update. No-op otherwise, or when s is resident,
 * already queued, or still being updated from the last step (offload_adamw
 * then updates it). Any thread. */
void offload_grad_summed(offload_ctx *o, int s);
/* pseudo.grad_scale mean: for this step (until the next
 * offload_step_begin, which clears it), divide each offloaded slot s's
 * gradient by div[s] (> 1; [S] ints, the caller's, valid for the step)
 * when its last drain lands, before a speculative update reads it.
 * Resident slots' gradients are the caller's to divide. NULL: none. Call
 * after offload_step_begin, before the microbatches. */
void offload_set_grad_divisors(offload_ctx *o, const int *div);
void offload_microbatch(offload_ctx *o, int k);
/* Data parallelism (the trainer all-reduces the gradient of the step's
 * last microbatch as backward produces it): ready non-NULL says the next
 * training microbatch is the step's last, whatever grad_accum says (a
 * data-parallel rank runs its share of the microbatches), and during it
 * ready(ready_ctx, s) is called on the copy thread, without the lock,
 * once offloaded slot s's final drain has landed: its host gradient
 * (g->slots[s].grads) is complete and nothing of the runtime writes it
 * until the next step. NULL: no reports, the microbatch count by
 * grad_accum again. Call before offload_microbatch. A data-parallel step
 * uses neither offload_set_grad_divisors nor offload_step_speculate (the
 * gradient is not final before the all-reduce): offload_step_speculate_
 * summed and offload_grad_summed instead. */
void offload_set_grad_ready(offload_ctx *o, void (*ready)(void *ctx, int s),
                            void *ready_ctx);
void offload_wait_grads(offload_ctx *o);
/* Streamed gradients (the plan's stream_grads), after offload_wait_grads:
 * out[s] (S doubles, the model's slots) = grad_sumsq of offloaded slot s's
 * final gradient of the step, taken as it landed (its buffer may be back
 * in the pool since), 0 for a resident slot. 0, or -1 when the plan does
 * not stream (out untouched). */
int offload_stream_sumsq(offload_ctx *o, double *out);
void offload_adamw(offload_ctx *o, const offload_adam *a);
void offload_sync(offload_ctx *o);

/* The current plan (valid until the model is re-slotted). */
const offload_plan *offload_current_plan(const offload_ctx *o);
void offload_get_stats(offload_ctx *o, offload_stats *st);
/* A runtime that took over from an earlier one (a model re-laid, the
 * earlier runtime freed): st's since-creation counts (bytes and seconds
 * of copies, stalls, host updates; speculated, redone and restored
 * steps; streamed skips) += earlier's, and the rates and the hidden
 * fraction taken again from the sums. The plan's figures and the pools'
 * stay st's own. */
void offload_stats_carry(offload_stats *st, const offload_stats *earlier);
void offload_free(offload_ctx *o);

#endif /* M6_OFFLOAD_H */
