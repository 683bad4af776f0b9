/*
 * plan_cluster.c — the paper-scale plan (offload.h "plan at scale"): a
 * spec's parameter state on N nodes of G devices, with the experts spread
 * over the N*G devices and everything else replicated, resident or
 * granularly offloaded, phase by phase, with the arithmetic behind each
 * figure. Plain arithmetic on the model's shape: no allocation that grows
 * with the model, so M6-10T plans in microseconds.
 */
#include "offload/offload.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/view.h"
#include "model/facts.h"
#include "model/gpt.h"

/* ------------------------------------------------------------- counting */

/* The parameter counts of one block part (model/facts.h). */
static void parts_(const model_config *c, cluster_phase *p)
{
    model_block_parts b = model_block_parts_of(c);
    p->global_params = model_global_params(c);
    p->attn_params = b.attn;
    p->mlp_params = b.mlp;
    p->gate_params = b.gate;
    p->expert_params = b.expert;
}

/* Adafactor's second-moment floats of the globals ([0]), of a device's
 * share of a dense ([1]) and an MoE ([2]) slot; zeros for AdamW. */
typedef struct {
    uint64_t f[3];
} af_share_;

/* Device bytes of the parameter state with slots [0, R) resident. */
static uint64_t device_bytes_(const cluster_phase *p, const af_share_ *af,
                              const unsigned char *kind, int R, int prefetch)
{
    uint64_t b = p->pb.resident * p->global_params + 4 * af->f[0];
    uint64_t biggest = 0;
    for (int s = 0; s < p->n_slots; s++) {
        uint64_t sh = p->slot_params[kind[s]];
        if (s < R)
            b += p->pb.resident * sh + 4 * af->f[1 + kind[s]];
        else if (sh > biggest)
            biggest = sh;
    }
    int k = p->n_slots - R, nst = k < prefetch ? k : prefetch;
    return b + (uint64_t)nst * p->pb.staging * biggest;
}

static int phase_(const run_spec *spec, const cluster_input *in, int S,
                  cluster_phase *p, char *err, size_t errlen)
{
    const model_config *c = &spec->model;
    int L = c->n_layer;
    memset(p, 0, sizeof *p);
    gpt_optim o = spec_gpt_optim(spec);
    p->pb = model_param_bytes_for(1, &o);
    p->n_slots = S;
    p->devices = in->nodes * in->gpus_per_node;
    parts_(c, p);
    int *map = malloc((size_t)L * sizeof(int));
    unsigned char *kind = malloc((size_t)S);
    if (!map || !kind) {
        free(map);
        free(kind);
        snprintf(err, errlen, "plan: out of memory");
        return -1;
    }
    int bad = gpt_default_share_map(c, S, map) != 0;
    if (bad)
        snprintf(err, errlen, "no share map of %d slots (a model of dense "
                 "and MoE blocks needs at least one slot of each kind)", S);
    else
        bad = gpt_slot_kinds(c, S, map, kind, err, errlen) != 0;
    if (bad) {
        free(map);
        free(kind);
        return -1;
    }
    /* the expert-parallel group's largest share, its last device's */
    int first_expert;
    p->experts_per_device = (uint64_t)model_expert_range(
        c->moe_experts, p->devices, p->devices - 1, &first_expert);
    p->n_moe_layers = model_moe_layers(c);
    p->alltoall_bytes =
        p->n_moe_layers *
        model_ep_alltoall_bytes((double)spec->train.batch_size *
                                    spec->train.grad_accum * c->seq_len,
                                c->moe_prototypes, c->n_embd, c->moe_experts,
                                p->devices, p->devices - 1, 2);
    af_share_ af = {{0, 0, 0}};
    model_af_floats aff;
    if (o.adafactor) {
        if (model_af_state_floats(c, &aff) != 0) {
            free(map);
            free(kind);
            snprintf(err, errlen, "plan: out of memory");
            return -1;
        }
        af.f[0] = aff.global;
        af.f[1] = aff.dense_slot;
        af.f[2] = aff.moe_shared + p->experts_per_device * aff.expert;
    }
    p->slot_params[0] = p->attn_params + p->mlp_params;
    p->slot_params[1] = p->attn_params + p->gate_params +
                        p->experts_per_device * p->expert_params;
    p->total_params = p->global_params;
    p->device_params = p->global_params;
    for (int s = 0; s < S; s++) {
        p->n_moe_slots += kind[s];
        p->total_params += kind[s] ? p->attn_params + p->gate_params +
                                         (uint64_t)c->moe_experts *
                                             p->expert_params
                                   : p->slot_params[0];
        p->device_params += p->slot_params[kind[s]];
    }
    /* resident slots a prefix, offloaded a suffix (offload.h); the most
     * resident slots the device holds, which needs the least host memory */
    int pf = in->prefetch;
    p->all_resident_bytes = device_bytes_(p, &af, kind, S, pf);
    p->min_device_bytes = device_bytes_(p, &af, kind, 0, pf);
    int R = S;
    while (R > 0 && device_bytes_(p, &af, kind, R, pf) > in->device_memory)
        R--;
    uint64_t off_params = 0;
    p->af_dev_floats = af.f[0];
    for (int s = 0; s < S; s++) {
        if (s >= R)
            off_params += p->slot_params[kind[s]];
        *(s < R ? &p->af_dev_floats : &p->af_host_floats) +=
            af.f[1 + kind[s]];
    }
    uint64_t res_params = p->device_params - off_params;
    p->n_resident = R;
    p->n_offloaded = S - R;
    p->n_staging = p->n_offloaded < pf ? p->n_offloaded : pf;
    uint64_t staging = device_bytes_(p, &af, kind, R, pf) -
                       p->pb.resident * res_params - 4 * p->af_dev_floats;
    p->dev_weights = p->pb.weights * res_params + staging / 2;
    p->dev_grads = p->pb.grads * res_params + staging / 2;
    p->dev_optim = p->pb.optim * res_params + 4 * p->af_dev_floats;
    p->dev_total = p->dev_weights + p->dev_grads + p->dev_optim;
    p->host_weights = p->pb.host_weights * off_params;
    p->host_grads = p->pb.host_grads * off_params;
    if (spec->offload.stream_grads && p->n_offloaded > 0) {
        /* streamed: the gradients in flight only, each of the largest
         * offloaded share (offload_stream_grad_bufs' rule, the spec's
         * host threads per device) */
        unsigned char *offl = calloc((size_t)S, 1);
        uint64_t big = 0;
        for (int s = R; offl && s < S; s++) {
            offl[s] = 1;
            if (p->slot_params[kind[s]] > big)
                big = p->slot_params[kind[s]];
        }
        int nb = offl ? offload_stream_grad_bufs(map, L, offl, S,
                                                 spec_host_threads(spec))
                      : -1;
        free(offl);
        if (nb < 0) {
            free(map);
            free(kind);
            snprintf(err, errlen, "plan: out of memory");
            return -1;
        }
        p->stream_grads = 1;
        p->n_grad_bufs = nb;
        p->host_grads = (uint64_t)nb * p->pb.stream_grad * big;
    }
    p->host_optim = p->pb.optim * off_params + 4 * p->af_host_floats;
    p->host_total = p->host_weights + p->host_grads + p->host_optim;
    p->node_host_total = p->host_total * (uint64_t)in->gpus_per_node;
    p->offloaded_params = off_params;
    if (p->min_device_bytes > in->device_memory) {
        p->fit = CLUSTER_NO_FIT;
        p->short_of_host = 0;
        p->shortfall_bytes = p->min_device_bytes - in->device_memory;
    } else if (R == S) {
        p->fit = CLUSTER_FITS_RESIDENT;
    } else if (in->host_memory == 0 || p->node_host_total <= in->host_memory) {
        p->fit = CLUSTER_FITS_OFFLOADED;
    } else {
        p->fit = CLUSTER_NO_FIT;
        p->short_of_host = 1;
        p->shortfall_bytes = p->node_host_total - in->host_memory;
    }
    free(map);
    free(kind);
    return 0;
}

int cluster_plan_for_spec(const run_spec *spec, const cluster_input *in,
                          cluster_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (in->nodes < 1 || in->gpus_per_node < 1 || in->device_memory == 0 ||
        in->prefetch < 1) {
        snprintf(err, errlen, "plan: want nodes >= 1, gpus per node >= 1, "
                 "a device memory above 0 and prefetch >= 1 (got %d, %d, "
                 "%llu bytes, %d)", in->nodes, in->gpus_per_node,
                 (unsigned long long)in->device_memory, in->prefetch);
        return -1;
    }
    if ((long long)in->nodes * in->gpus_per_node > 1 << 24) {
        snprintf(err, errlen, "plan: %d nodes x %d devices is more than %d "
                 "devices", in->nodes, in->gpus_per_node, 1 << 24);
        return -1;
    }
    out->in = *in;
    char e2[512];
    if (phase_(spec, in, spec_slots_of_phase(spec, 0), &out->real, e2,
               sizeof e2) != 0) {
        snprintf(err, errlen, "real phase: %s", e2);
        return -1;
    }
    if (spec_starts_pseudo(spec)) {
        out->has_pseudo = 1;
        if (phase_(spec, in, spec_slots_of_phase(spec, 1), &out->pseudo,
                   e2, sizeof e2) != 0) {
            snprintf(err, errlen, "pseudo phase: %s", e2);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- printing */

/* "1.50 GiB" (common/view.h view_bytes) */
static const char *gib_(char *buf, size_t len, uint64_t n)
{
    return view_bytes(buf, len, (double)n, VIEW_BYTES_2DP);
}

/* "1,234,567" */
static const char *num_(char *buf, size_t len, uint64_t n)
{
    char d[32];
    int nd = snprintf(d, sizeof d, "%llu", (unsigned long long)n), o = 0;
    for (int i = 0; i < nd && o + 2 < (int)len; i++) {
        if (i && (nd - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = d[i];
    }
    buf[o] = 0;
    return buf;
}

static const char *fit_name_(cluster_fit f)
{
    return f == CLUSTER_FITS_RESIDENT ? "resident"
           : f == CLUSTER_FITS_OFFLOADED ? "offloaded" : "none";
}

static void print_phase_(FILE *f, const char *name, const cluster_plan *cp,
                         const cluster_phase *p, const model_config *c,
                         int explain)
{
    const cluster_input *in = &cp->in;
    char a[64], b[64], d[64], e[64], g[64], h[64];
    int Sd = p->n_slots - p->n_moe_slots;
    int af_ = p->af_dev_floats + p->af_host_floats > 0; /* Adafactor */
    fprintf(f, "\n%s phase: S = %d slot%s (%d MoE, %d dense)\n", name,
            p->n_slots, p->n_slots == 1 ? "" : "s", p->n_moe_slots, Sd);
    fprintf(f, "  model parameters       %s (%.3e)\n",
            num_(a, sizeof a, p->total_params), (double)p->total_params);
    if (explain)
        fprintf(f, "    = globals VC + TC + 2C %s + %d MoE slots x (attention "
                "4C^2 + 8C %s + gate EC + E %s + E x expert (2HC + H + C) "
                "%d x %s) + %d dense slots x (attention %s + MLP 8C^2 + 5C "
                "%s)\n", num_(b, sizeof b, p->global_params), p->n_moe_slots,
                num_(d, sizeof d, p->attn_params),
                num_(e, sizeof e, p->gate_params), c->moe_experts,
                num_(g, sizeof g, p->expert_params), Sd,
                num_(h, sizeof h, p->attn_params),
                num_(a, sizeof a, p->mlp_params));
    fprintf(f, "  parameters per device  %s (%.3e)\n",
            num_(a, sizeof a, p->device_params), (double)p->device_params);
    if (explain)
        fprintf(f, "    = globals %s + %d x MoE slot share (%s + %s + %llu "
                "experts x %s = %s) + %d x dense slot %s; experts per device "
                "ceil(E / D) = ceil(%d / %d) = %llu\n",
                num_(b, sizeof b, p->global_params), p->n_moe_slots,
                num_(d, sizeof d, p->attn_params),
                num_(e, sizeof e, p->gate_params),
                (unsigned long long)p->experts_per_device,
                num_(g, sizeof g, p->expert_params),
                num_(h, sizeof h, p->slot_params[1]), Sd,
                num_(a, sizeof a, p->slot_params[0]), c->moe_experts,
                p->devices, (unsigned long long)p->experts_per_device);
    if (p->alltoall_bytes > 0) {
        fprintf(f, "  all-to-all per device  %s a step (token rows in bf16, "
                "uniform routing, nothing dropped)\n",
                gib_(a, sizeof a, (uint64_t)p->alltoall_bytes));
        if (explain)
            fprintf(f, "    = %d MoE layers x 4 exchanges (2 forward, 2 "
                    "backward) x B x grad_accum x T tokens x k %d rows x "
                    "(E - %llu) / E held elsewhere x C %d x 2 bytes, plus "
                    "the row counts\n", p->n_moe_layers, c->moe_prototypes,
                    (unsigned long long)p->experts_per_device, c->n_embd);
    }
    fprintf(f, "  all slots resident     %s per device, of %s\n",
            gib_(a, sizeof a, p->all_resident_bytes),
            gib_(b, sizeof b, in->device_memory));
    if (explain)
        fprintf(f, "    = %d bytes x %s parameters%s%s%s = %s bytes\n",
                p->pb.resident,
                num_(d, sizeof d, p->device_params), af_ ? " + 4 bytes x " : "",
                af_ ? num_(g, sizeof g, p->af_dev_floats + p->af_host_floats)
                    : "",
                af_ ? " second-moment floats" : "",
                num_(e, sizeof e, p->all_resident_bytes));
    fprintf(f, "  resident / offloaded   %d / %d slots, %d staging buffer%s\n",
            p->n_resident, p->n_offloaded, p->n_staging,
            p->n_staging == 1 ? "" : "s");
    if (explain && p->n_offloaded)
        fprintf(f, "    = the most slots (a prefix) whose state, with the "
                "globals and min(prefetch %d, offloaded) staging buffers of "
                "%d bytes x the largest offloaded slot share, fits %s\n",
                in->prefetch, p->pb.staging,
                gib_(a, sizeof a, in->device_memory));
    uint64_t res = p->device_params - p->offloaded_params;
    fprintf(f, "  device: weights %s, gradients %s, optimizer %s = %s\n",
            gib_(a, sizeof a, p->dev_weights), gib_(b, sizeof b, p->dev_grads),
            gib_(d, sizeof d, p->dev_optim), gib_(e, sizeof e, p->dev_total));
    if (explain)
        fprintf(f, "    = %s resident parameters x (%d + %d + %d bytes)%s%s"
                "%s%s%s\n",
                num_(g, sizeof g, res), p->pb.weights,
                p->pb.grads, p->pb.optim,
                af_ ? " + 4 bytes x " : "",
                af_ ? num_(a, sizeof a, p->af_dev_floats) : "",
                af_ ? " second-moment floats" : "",
                p->n_staging ? " + staging (bf16 weights and gradients) " : "",
                p->n_staging ? gib_(h, sizeof h, p->dev_total -
                                    p->pb.resident * res -
                                    4 * p->af_dev_floats)
                             : "");
    fprintf(f, "  host:   weights %s, gradients %s, optimizer %s = %s per "
            "device, %s per node of %s\n",
            gib_(a, sizeof a, p->host_weights), gib_(b, sizeof b, p->host_grads),
            gib_(d, sizeof d, p->host_optim), gib_(e, sizeof e, p->host_total),
            gib_(g, sizeof g, p->node_host_total),
            in->host_memory ? gib_(h, sizeof h, in->host_memory) : "unlimited");
    if (explain)
        fprintf(f, "    = %s offloaded parameters x (%d + %d + %d bytes)%s%s%s; "
                "x %d devices per node\n",
                num_(g, sizeof g, p->offloaded_params),
                p->pb.host_weights, p->pb.host_grads, p->pb.optim,
                af_ ? " + 4 bytes x " : "",
                af_ ? num_(a, sizeof a, p->af_host_floats) : "",
                af_ ? " second-moment floats" : "", in->gpus_per_node);
    switch (p->fit) {
    case CLUSTER_FITS_RESIDENT:
        fprintf(f, "  fits: with all slots resident, %s of each device left "
                "for activations\n",
                gib_(a, sizeof a, in->device_memory - p->all_resident_bytes));
        break;
    case CLUSTER_FITS_OFFLOADED:
        fprintf(f, "  fits: only with granular offloading (all resident would "
                "need %s per device, %s more than it has); host %s per node "
                "of %s\n", gib_(a, sizeof a, p->all_resident_bytes),
                gib_(b, sizeof b, p->all_resident_bytes - in->device_memory),
                gib_(d, sizeof d, p->node_host_total),
                in->host_memory ? gib_(e, sizeof e, in->host_memory)
                                : "unlimited");
        break;
    case CLUSTER_NO_FIT:
        if (p->short_of_host)
            fprintf(f, "  fits: not at all: all resident needs %s per device "
                    "(of %s), and with %d slots offloaded each node needs %s "
                    "of host memory, %s more than its %s\n",
                    gib_(a, sizeof a, p->all_resident_bytes),
                    gib_(b, sizeof b, in->device_memory), p->n_offloaded,
                    gib_(d, sizeof d, p->node_host_total),
                    gib_(e, sizeof e, p->shortfall_bytes),
                    gib_(g, sizeof g, in->host_memory));
        else
            fprintf(f, "  fits: not at all: even with every slot offloaded a "
                    "device needs %s, %s more than its %s\n",
                    gib_(a, sizeof a, p->min_device_bytes),
                    gib_(b, sizeof b, p->shortfall_bytes),
                    gib_(d, sizeof d, in->device_memory));
        break;
    }
}

/* ------------------------------------------------------------- settings */

int cluster_settings_plan(const run_spec *spec, const cluster_input *in,
                          cluster_setting out[CLUSTER_N_SETTINGS], char *err,
                          size_t errlen)
{
    static const char *const names[CLUSTER_N_SETTINGS] = {
        "adamw fp32", "adamw bf16", "adafactor fp32", "adafactor bf16",
        "adafactor b1=0 fp32", "adafactor b1=0 bf16",
        "adamw fp32 stream", "adamw bf16 stream", "adafactor fp32 stream",
        "adafactor bf16 stream", "adafactor b1=0 fp32 stream",
        "adafactor b1=0 bf16 stream"};
    float b1 = spec->optimizer.name == OPTIMIZER_ADAFACTOR &&
                       spec->optimizer.beta1 > 0
                   ? spec->optimizer.beta1 : 0.9f;
    for (int k = 0; k < CLUSTER_N_SETTINGS; k++) {
        cluster_setting *st = &out[k];
        memset(st, 0, sizeof *st);
        int j = k % 6; /* the optimizer and master */
        st->name = names[k];
        st->optimizer = j < 2 ? OPTIMIZER_ADAMW : OPTIMIZER_ADAFACTOR;
        st->beta1 = j < 2 ? 0.0f : j < 4 ? b1 : 0.0f;
        st->master = j % 2 ? MASTER_BF16 : MASTER_FP32;
        st->stream = k >= 6;
        run_spec s = *spec;
        s.optimizer.name = st->optimizer;
        s.optimizer.beta1 = st->beta1;
        s.optimizer.master = st->master;
        s.offload.stream_grads = st->stream;
        if (cluster_plan_for_spec(&s, in, &st->plan, err, errlen) != 0)
            return -1;
        const cluster_phase *r = &st->plan.real;
        st->device_bytes_per_param = (double)r->all_resident_bytes /
                                     (double)r->device_params;
        st->host_bytes_per_param =
            r->pb.host - (st->stream ? r->pb.host_grads : 0);
        st->possible = 1;
        const cluster_phase *ph[2] = {&st->plan.real, &st->plan.pseudo};
        for (int i = 0; i < 1 + st->plan.has_pseudo; i++) {
            if (ph[i]->min_device_bytes > in->device_memory)
                st->possible = 0;
            else if (ph[i]->node_host_total > st->least_host_bytes)
                st->least_host_bytes = ph[i]->node_host_total;
        }
    }
    return 0;
}

/* The settings' table: bytes per parameter, each phase's fit, the least
 * host memory per node, and by how much the node's host memory covers
 * it or falls short. */
static void print_settings_(FILE *f, const cluster_setting *st,
                            const cluster_input *in)
{
    char a[64], b[64];
    fprintf(f, "\noptimizer settings (each phase planned again with it; "
            "bytes per parameter on a device with every slot resident, and "
            "on the host per offloaded parameter before Adafactor's second "
            "moment; stream: offload.stream_grads, which needs "
            "train.grad_clip 0 and train.grad_accum 1, the host gradients "
            "then only the slots in flight, %d bytes a parameter of the "
            "largest offloaded share each):\n",
            st[CLUSTER_N_SETTINGS - 1].plan.real.pb.stream_grad);
    fprintf(f, "  %-26s %9s %9s  %-9s %-9s %12s  %s\n", "setting",
            "device/p", "host/p", "pseudo", "real", "least host",
            "against the node's host memory");
    for (int k = 0; k < CLUSTER_N_SETTINGS; k++) {
        const cluster_setting *s = &st[k];
        const cluster_plan *p = &s->plan;
        char margin[160];
        if (!s->possible)
            snprintf(margin, sizeof margin, "none: a device is too small "
                     "even with every slot offloaded");
        else if (!in->host_memory)
            snprintf(margin, sizeof margin, "host memory not limited");
        else if (s->least_host_bytes <= in->host_memory)
            snprintf(margin, sizeof margin, "fits, %s to spare",
                     gib_(a, sizeof a, in->host_memory - s->least_host_bytes));
        else
            snprintf(margin, sizeof margin, "does not fit, %s short",
                     gib_(a, sizeof a, s->least_host_bytes - in->host_memory));
        fprintf(f, "  %-26s %9.3f %9.3f  %-9s %-9s %12s  %s\n", s->name,
                s->device_bytes_per_param, s->host_bytes_per_param,
                p->has_pseudo ? fit_name_(p->pseudo.fit) : "-",
                fit_name_(p->real.fit),
                s->possible ? gib_(b, sizeof b, s->least_host_bytes) : "-",
                margin);
    }
}

static json_t *settings_json_(const cluster_setting *st)
{
    json_t *a = json_array();
    for (int k = 0; k < CLUSTER_N_SETTINGS; k++) {
        const cluster_setting *s = &st[k];
        json_t *o = json_pack(
            "{s:s, s:s, s:f, s:s, s:b, s:f, s:f, s:b, s:I, s:s}",
            "name", s->name, "optimizer", spec_optimizer_name(s->optimizer),
            "beta1", (double)s->beta1, "master", spec_master_name(s->master),
            "stream_grads", s->stream,
            "device_bytes_per_param", s->device_bytes_per_param,
            "host_bytes_per_param", s->host_bytes_per_param,
            "possible", s->possible,
            "least_host_bytes_per_node", (json_int_t)s->least_host_bytes,
            "real_fits", fit_name_(s->plan.real.fit));
        if (s->plan.has_pseudo)
            json_object_set_new(o, "pseudo_fits",
                                json_string(fit_name_(s->plan.pseudo.fit)));
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *phase_json_(const cluster_phase *p)
{
    return json_pack(
        "{s:i, s:i, s:I, s:I, s:I, s:I, s:s, s:i, s:i, s:i, s:i, s:I, s:I,"
        " s:{s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I, s:I}, s:I}",
        "n_slots", p->n_slots, "moe_slots", p->n_moe_slots,
        "total_params", (json_int_t)p->total_params,
        "params_per_device", (json_int_t)p->device_params,
        "experts_per_device", (json_int_t)p->experts_per_device,
        "alltoall_bytes_per_step", (json_int_t)p->alltoall_bytes,
        "fits", fit_name_(p->fit), "resident_slots", p->n_resident,
        "offloaded_slots", p->n_offloaded, "staging_buffers", p->n_staging,
        "grad_buffers", p->n_grad_bufs,
        "all_resident_bytes", (json_int_t)p->all_resident_bytes,
        "min_device_bytes", (json_int_t)p->min_device_bytes,
        "device", "weights_bytes", (json_int_t)p->dev_weights,
        "gradients_bytes", (json_int_t)p->dev_grads,
        "optimizer_bytes", (json_int_t)p->dev_optim,
        "total_bytes", (json_int_t)p->dev_total,
        "host", "weights_bytes", (json_int_t)p->host_weights,
        "gradients_bytes", (json_int_t)p->host_grads,
        "optimizer_bytes", (json_int_t)p->host_optim,
        "total_bytes", (json_int_t)p->host_total,
        "per_node_bytes", (json_int_t)p->node_host_total,
        "shortfall_bytes", (json_int_t)p->shortfall_bytes);
}

void cluster_plan_print(FILE *f, const cluster_plan *p, const run_spec *spec,
                        int explain, int json)
{
    const cluster_input *in = &p->in;
    const model_config *c = &spec->model;
    if (json) {
        json_t *o = json_pack("{s:i, s:i, s:i, s:I, s:I, s:i, s:o}",
                              "nodes", in->nodes, "gpus_per_node",
                              in->gpus_per_node, "devices",
                              in->nodes * in->gpus_per_node,
                              "device_memory_bytes",
                              (json_int_t)in->device_memory,
                              "host_memory_bytes", (json_int_t)in->host_memory,
                              "prefetch", in->prefetch,
                              "real", phase_json_(&p->real));
        if (p->has_pseudo)
            json_object_set_new(o, "pseudo", phase_json_(&p->pseudo));
        cluster_setting st[CLUSTER_N_SETTINGS];
        char err[512];
        if (cluster_settings_plan(spec, in, st, err, sizeof err) == 0)
            json_object_set_new(o, "settings", settings_json_(st));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fprintf(f, "%s\n", s ? s : "{}");
        free(s);
        json_decref(o);
        return;
    }
    char a[64], b[64];
    int D = in->nodes * in->gpus_per_node;
    fprintf(f, "plan at scale: %d nodes x %d devices = %d devices, %s each; "
            "host %s per node\n", in->nodes, in->gpus_per_node, D,
            gib_(a, sizeof a, in->device_memory),
            in->host_memory ? gib_(b, sizeof b, in->host_memory)
                            : "unlimited");
    fprintf(f, "model: L %d, C %d, V %d, T %d", c->n_layer, c->n_embd,
            c->vocab_size, c->seq_len);
    if (c->moe_experts)
        fprintf(f, ", MoE every %d block%s: E %d experts in k %d prototypes, "
                "H %d", c->moe_every, c->moe_every == 1 ? "" : "s",
                c->moe_experts, c->moe_prototypes, model_moe_hidden(c));
    fprintf(f, "\n");
    fprintf(f, "placement: expert parallel: each MoE slot's E experts are "
            "split into %d groups of at most ceil(E / D) = %llu, one per "
            "device; the globals, attention, LayerNorms, gates and dense "
            "MLPs are replicated on every device (data parallel)\n", D,
            (unsigned long long)p->real.experts_per_device);
    const model_param_bytes *pb = &p->real.pb;
    int bf16 = spec->optimizer.master == MASTER_BF16;
    int af = spec->optimizer.name == OPTIMIZER_ADAFACTOR;
    fprintf(f, "bytes per parameter (optimizer.name %s, optimizer.master %s, "
            "as the cuda model): on the device %d = weights %d (%s) "
            "+ gradients %d (bf16) + optimizer %d (%s); a staging "
            "buffer %d (bf16 weights + gradients); on the host %d = weights "
            "%d (%s) + gradients %d (fp32 "
            "accumulator 4 + pinned bf16 2) + optimizer %d%s\n",
            spec_optimizer_name(spec->optimizer.name),
            spec_master_name(spec->optimizer.master), pb->resident,
            pb->weights, bf16 ? "the bf16 master 2" : "bf16 2 + fp32 master 4",
            pb->grads, pb->optim,
            !af ? "fp32 m, v" : pb->optim ? "fp32 m" : "no first moment",
            pb->staging, pb->host, pb->host_weights,
            bf16 ? "the pinned bf16 master 2" : "fp32 master 4 + pinned bf16 2",
            pb->host_grads, pb->optim,
            af ? "; and Adafactor's factored second moment, rows + cols fp32 "
                 "a matrix, n a vector, where its tensor lives" : "");
    if (spec->offload.stream_grads)
        fprintf(f, "offload.stream_grads: no host gradient per offloaded "
                "parameter; %d gradients in flight per device of the "
                "largest offloaded share, %d bytes (pinned bf16) a parameter "
                "each\n", p->real.n_grad_bufs, pb->stream_grad);
    fprintf(f, "not counted: activations, the CUDA context and the cuBLASLt "
            "workspace (what is left of a device is shown as headroom)\n");
    if (p->has_pseudo)
        print_phase_(f, "pseudo", p, &p->pseudo, c, explain);
    print_phase_(f, "real", p, &p->real, c, explain);
    cluster_setting st[CLUSTER_N_SETTINGS];
    char err[512];
    if (cluster_settings_plan(spec, in, st, err, sizeof err) != 0) {
        fprintf(f, "\noptimizer settings: %s\n", err);
        return;
    }
    print_settings_(f, st, in);
}
