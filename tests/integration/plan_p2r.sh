#!/usr/bin/env bash
# plan_p2r.sh — m6ctl plan SPEC --p2r (the Pseudo-to-Real cost model,
# daemon/offload/plan_p2r.c) on the examples and on a fixture of
# bench/p2r_sweep's CSV. Each JSON figure is checked against the same
# formulas worked out here in Python from the spec's shape, the rates given
# and the placement (the number of offloaded slots, from plain `m6ctl
# plan --json`, the planner's own tested output); then the errors of bad
# input. No daemon.
. "$(dirname "$0")/lib.sh"
EX="$(dirname "$0")/../../examples"
FIX="$(dirname "$0")/p2r_sweep_fixture.csv"
SOCK=$T/none.sock
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

# --- fortunes-p2r.json: nothing offloaded, the default rates
ctl --json plan "$EX/fortunes-p2r.json" --p2r >"$T/f0.json" \
    || fail "plan --p2r fortunes: $(cat "$T/f0.json")"
python3 - "$T/f0.json" "$EX/fortunes-p2r.json" <<'PY' || fail "fortunes, defaults"
import json, sys
r = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
m, t = s["model"], s["train"]
V, L, C, T = m["vocab_size"], m["n_layer"], m["n_embd"], m["seq_len"]
N = L * (12 * C * C + 13 * C) + V * C          # blocks + the tied LM head
fpt = 6 * N + 12 * L * C * T                   # PaLM appendix B
tok = t["batch_size"] * T * t["grad_accum"]
rate = 990e12 * 0.4
def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1, abs(b)), (what, a, b)
close(r["rates"]["gpu_flops"], rate, "default rate")
close(r["rates"]["h2d_bytes_per_s"], 63e9, "default h2d")
close(r["rates"]["host_adam_bytes_per_s"], 24e9, "default adam")
for ph in ("pseudo", "real"):
    p = r[ph]
    assert p["n_offloaded"] == 0, p
    close(p["active_params"], N, ph + " N")
    close(p["flops_per_step"], fpt * tok, ph + " flops")
    close(p["t_step_s"], fpt * tok / rate, ph + " t_step")
close(r["step_time_ratio"], 1, "ratio")
close(r["wall_ratio"], 1, "wall ratio")
close(r["break_even_steps_ratio"], 1, "break-even")
close(r["pseudo_steps"], s["pseudo"]["steps"], "P")
close(r["scratch_steps"], t["steps"], "N_s")
PY

# --- fortunes-p2r.json with a budget that offloads real slots; own rates
ctl --json plan "$EX/fortunes-p2r.json" --device-memory 160MiB >"$T/f1p.json" \
    || fail "plan 160MiB"
ctl --json plan "$EX/fortunes-p2r.json" --p2r --device-memory 160MiB \
    --gpu-tflops 1 --h2d-gbps 0.05 --d2h-gbps 0.04 --host-adam-gbps 0.03 \
    --steps-ratio 1.1 --scratch-steps 800 >"$T/f1.json" || fail "plan --p2r 160MiB"
python3 - "$T/f1.json" "$T/f1p.json" "$EX/fortunes-p2r.json" <<'PY' || fail "fortunes, offloaded"
import json, sys
r = json.load(open(sys.argv[1])); plan = json.load(open(sys.argv[2]))
s = json.load(open(sys.argv[3]))
m, t = s["model"], s["train"]
V, L, C, T = m["vocab_size"], m["n_layer"], m["n_embd"], m["seq_len"]
A, B = t["grad_accum"], t["batch_size"]
def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1, abs(b)), (what, a, b)
k = len(plan["offloaded_slots"])               # the planner's placement
assert k >= 1 and not plan["pseudo"]["offloaded_slots"], plan
ss = -(-(12 * C * C + 13 * C) // 16) * 16      # a slot, padded to 16
W = 4 * ss                                     # cpu: fp32 on the wire
h2d = A * (2 * k - 1) * W + (A - 1) * k * W    # offload.h, cpu
d2h = A * k * W
adam = 28 * k * ss                             # fp32 p, g, m, v in; p, m, v out
fpt = 6 * (L * (12 * C * C + 13 * C) + V * C) + 12 * L * C * T
tc = fpt * B * T * A / 1e12
p = r["real"]
assert p["n_offloaded"] == k and p["resident_layers"] == L - k, p
close(p["h2d_bytes_per_step"], h2d, "h2d")
close(p["d2h_bytes_per_step"], d2h, "d2h")
close(p["host_adam_bytes_per_step"], adam, "adam bytes")
close(p["t_compute_s"], tc, "compute")
close(p["t_copy_s"], max(h2d / 0.05e9, d2h / 0.04e9), "copy")
close(p["t_host_adam_s"], adam / 0.03e9, "adam")
# grad_clip 1.0, offload.speculative auto: the update overlaps the step
assert p["host_adam_overlaps"] is True
t_real = max(tc, h2d / 0.05e9, d2h / 0.04e9, adam / 0.03e9)
assert t_real > 2 * tc, (t_real, tc)            # the host AdamW dominates
close(p["t_step_s"], t_real, "t_real")
t_ps = r["pseudo"]["t_step_s"]
close(t_ps, tc, "t_pseudo")
P, Ns, R = s["pseudo"]["steps"], 800, 1.1
close(r["scratch_steps"], Ns, "--scratch-steps")
close(r["step_time_ratio"], t_ps / t_real, "step ratio")
close(r["wall_p2r_s"], P * t_ps + (R * Ns - P) * t_real, "wall p2r")
close(r["wall_ratio"], (P * t_ps + (R * Ns - P) * t_real) / (Ns * t_real), "wall ratio")
close(r["break_even_steps_ratio"], 1 + P / Ns * (1 - t_ps / t_real), "break-even")
assert r["rates"]["gpu_flops_source"] == "--gpu-tflops", r["rates"]
PY
# the text form says the same
ctl plan "$EX/fortunes-p2r.json" --p2r --device-memory 160MiB >"$T/f1.txt" || fail "text"
grep -q "^  predicted wall ratio P2R / scratch = " "$T/f1.txt" || fail "text: $(cat "$T/f1.txt")"
grep -q "^  break-even steps ratio R\* = " "$T/f1.txt" || fail "text: break-even"
grep -q "^step time ratio t_pseudo / t_real = " "$T/f1.txt" || fail "text: step ratio"
! grep -q "^note: no device.memory_budget" "$T/f1.txt" || fail "text: a budget, yet the no-budget note"
# without a budget both phases are resident: each plan says so
ctl plan "$EX/m6-10t.json" --p2r >"$T/nb1.txt" || fail "no budget, --p2r"
ctl plan "$EX/m6-10t.json" >"$T/nb2.txt" || fail "no budget"
for f in nb1 nb2; do
    grep -q "^note: no device.memory_budget and no --device-memory" "$T/$f.txt" ||
        fail "no budget: no note in $(cat "$T/$f.txt")"
done

# --- the sweep's CSV: fortunes, S 1, 25% pseudo, copy, no re-warm; the
# spec with 5% re-warm (50 of 1000 steps) picks the other rows
# (the fixture's settings, which the example had before the sweep's)
python3 - "$EX/fortunes-p2r.json" "$T/rewarm.json" "$T/nopseudo.json" "$T/old.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["pseudo"]["share_groups"] = 1
s["pseudo"]["steps"] = 250
s["delink"]["rewarm_steps"] = 0
json.dump(s, open(sys.argv[4], "w"))
s["delink"]["rewarm_steps"] = 50
json.dump(s, open(sys.argv[2], "w"))
s["delink"]["rewarm_steps"] = 0
s["pseudo"]["steps"] = 0
json.dump(s, open(sys.argv[3], "w"))
PY
ctl --json plan "$T/rewarm.json" --p2r --device-memory 160MiB --sweep "$FIX" \
    --corpus fortunes >"$T/s1.json" || fail "sweep: $(cat "$T/s1.json")"
python3 - "$T/s1.json" "$FIX" <<'PY' || fail "sweep figures"
import csv, json, sys
r = json.load(open(sys.argv[1]))
rows = [w for w in csv.DictReader(open(sys.argv[2]))
        if w["corpus"] == "fortunes" and w["share_groups"] == "1"
        and float(w["pseudo_frac"]) == 0.25 and w["delink_optimizer"] == "copy"
        and float(w["rewarm_frac"]) == 0.05]
R = sum(float(w["step_ratio"]) for w in rows) / len(rows)
assert len(rows) == 2 and r["sweep"]["rows"] == 2, r["sweep"]
assert abs(r["steps_ratio"] - R) < 1e-12, (r["steps_ratio"], R)
tp, tr, P, Ns = (r["pseudo"]["t_step_s"], r["real"]["t_step_s"],
                 r["pseudo_steps"], r["scratch_steps"])
want = (P * tp + (R * Ns - P) * tr) / (Ns * tr)
assert abs(r["wall_ratio"] - want) <= 1e-12, (r["wall_ratio"], want)
assert r["reaches_target"] is True
PY
# one seed of the no-re-warm setting never got there: said plainly
ctl plan "$T/old.json" --p2r --sweep "$FIX" --corpus fortunes >"$T/s2.txt" \
    || fail "sweep never"
grep -q "never reached scratch's final loss in 1 of 2 seeds" "$T/s2.txt" \
    || fail "sweep never: $(cat "$T/s2.txt")"
! grep -q "predicted wall ratio" "$T/s2.txt" || fail "a ratio for never"
ctl --json plan "$T/old.json" --p2r --sweep "$FIX" --corpus foldoc \
    | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert r['reaches_target'] is False and r['wall_ratio'] is None, r
assert r['sweep']['never'] == 2, r['sweep']
" || fail "sweep never --json"

# --- an expert-parallel spec on the single-node planner: its all-to-all
# is not priced there, and the plan says so
python3 - "$EX/fortunes-moe.json" "$T/ep.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["nodes"] = {"world_size": 2, "expert_parallel": 2}
s.setdefault("pseudo", {}).setdefault("steps", 100)
json.dump(s, open(sys.argv[2], "w"))
PY
ctl plan "$T/ep.json" --p2r >"$T/ep.txt" || fail "EP spec --p2r: $(cat "$T/ep.txt")"
grep -q "^note: nodes.expert_parallel 2: the experts' all-to-all is priced at scale only" "$T/ep.txt" \
    || fail "EP spec --p2r: no note: $(head -5 "$T/ep.txt")"

# --- M6-10T at paper scale: 64 x 8 devices of 32 GiB
ctl --json plan "$EX/m6-10t.json" --nodes 64 --gpus-per-node 8 \
    --device-memory 32GiB >"$T/c.json" || fail "cluster plan"
ctl --json plan "$EX/m6-10t.json" --p2r --nodes 64 --gpus-per-node 8 \
    --device-memory 32GiB >"$T/c1.json" || fail "plan --p2r at scale: $(cat "$T/c1.json")"
python3 - "$T/c1.json" "$T/c.json" "$EX/m6-10t.json" <<'PY' || fail "10T figures"
import json, sys
r = json.load(open(sys.argv[1])); plan = json.load(open(sys.argv[2]))
s = json.load(open(sys.argv[3]))
m, t, moe = s["model"], s["train"], s["model"]["moe"]
V, L, C, T = m["vocab_size"], m["n_layer"], m["n_embd"], m["seq_len"]
E, k, H = moe["num_experts"], moe["prototypes"], moe["expert_hidden"]
D = 64 * 8
def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1, abs(b)), (what, a, b)
attn, gate, expert = 4 * C * C + 8 * C, E * C + E, 2 * H * C + H + C
share = attn + gate + -(-E // D) * expert       # one slot on one device
n_off = plan["real"]["offloaded_slots"]
assert plan["pseudo"]["offloaded_slots"] == 0
p = r["real"]
assert p["n_offloaded"] == n_off and p["devices"] == D, p
close(p["h2d_bytes_per_step"], (2 * n_off - 1) * 2 * share, "h2d")   # cuda, A 1
close(p["d2h_bytes_per_step"], n_off * 2 * share, "d2h")
close(p["host_adam_bytes_per_step"], 30 * n_off * share, "adam")    # one drain
N = L * (attn + gate + k * expert) + V * C
tok = t["batch_size"] * T * t["grad_accum"]
tc = (6 * N + 12 * L * C * T) * tok / (990e12 * 0.4)
close(p["t_compute_s"], tc, "compute")
# the experts' all-to-alls (GShard's four passes of the dispatch rows, bf16,
# the share bound for the other devices, plus int32 counts), every layer MoE
# (every 1) and 5 calls a layer: 20 us each, then the network's share of the
# bytes (504 of the 511 peers are on other nodes) at 50 GB/s against the
# rest over NVLink at 450 GB/s; after the compute on the device, beside the
# copies and the host AdamW
assert moe.get("every", 1) == 1
El = E * D // D - E * (D - 1) // D               # the last device's experts
a2a_b = L * (4 * tok * k * (E - El) / E * C * 2 + (E - El) * 4)
calls = L * t["grad_accum"] * 5
inter = a2a_b * (D - 8) / (D - 1)
t_a2a = calls * 20e-6 + max(inter / 50e9, (a2a_b - inter) / 450e9)
close(p["alltoall_bytes_per_step"], a2a_b, "all-to-all bytes")
close(p["alltoall_calls_per_step"], calls, "all-to-all calls")
close(p["t_alltoall_s"], t_a2a, "t_alltoall")
tr = max(tc + t_a2a, (2 * n_off - 1) * 2 * share / 63e9, 30 * n_off * share / 24e9)
close(p["t_step_s"], tr, "t_real")
close(r["pseudo"]["t_step_s"], tc + t_a2a, "t_pseudo")
P, Ns = s["pseudo"]["steps"], t["steps"]
close(r["wall_ratio"], (P * (tc + t_a2a) + (Ns - P) * tr) / (Ns * tr), "wall ratio")
PY

# --- M6-10T: each optimizer setting's bytes per parameter and least host
# memory per node (m6ctl plan's settings table) against a hand count of
# the shapes: per device the globals and 48 slot shares (attention,
# LayerNorms, the whole gate, ceil(E/D) experts); Adafactor's second
# moment rows + cols floats a matrix, n a vector; bytes per parameter
# weights (bf16 2 + fp32 master 4, or the bf16 master 2) + gradients 2 +
# optimizer (AdamW 8, Adafactor's m 4 or none); on the host weights (6, or
# 2) + gradients 6 + the optimizer's; streamed (offload.stream_grads) no
# gradients per offloaded parameter but min(offloaded, 2 host threads + 1)
# of a slot share in flight, 2 bytes a parameter
ctl --json plan "$EX/m6-10t.json" --nodes 64 --gpus-per-node 8 \
    --device-memory 32GiB --host-memory 512GiB >"$T/cs.json" || fail "settings json"
ctl plan "$EX/m6-10t.json" --nodes 64 --gpus-per-node 8 \
    --device-memory 32GiB --host-memory 512GiB >"$T/cs.txt" || fail "settings text"
python3 - "$T/cs.json" "$T/cs.txt" "$EX/m6-10t.json" <<'PY' || fail "settings figures"
import json, sys
plan = json.load(open(sys.argv[1])); text = open(sys.argv[2]).read()
s = json.load(open(sys.argv[3]))
m, moe = s["model"], s["model"]["moe"]
V, L, C, T = m["vocab_size"], m["n_layer"], m["n_embd"], m["seq_len"]
E, k, H = moe["num_experts"], moe["prototypes"], moe["expert_hidden"]
D, G, dev, host = 64 * 8, 8, 32 << 30, 512 << 30
epd = -(-E // D)
glob = V * C + T * C + 2 * C
share = (4 * C * C + 8 * C) + (E * C + E) + epd * (2 * H * C + H + C)
P = glob + L * share
assert P == 20397688832, P
v_glob = (V + C) + (T + C) + 2 * C
v_share = (2 * C + (3 * C + C) + 3 * C + (C + C) + C + 2 * C
           + k * ((E // k + C) + E // k) + epd * ((H + C) + H + (C + H) + C))
rows = {}
for line in text.splitlines():
    f = line.split()
    if len(f) > 3 and f[0] in ("adamw", "adafactor"):
        n = 2 + (f[1] == "b1=0") + (f[2 + (f[1] == "b1=0")] == "stream")
        rows[" ".join(f[:n])] = line
want = {"adamw fp32": (6, 8, 0), "adamw bf16": (2, 8, 0),
        "adafactor fp32": (6, 4, 1), "adafactor bf16": (2, 4, 1),
        "adafactor b1=0 fp32": (6, 0, 1), "adafactor b1=0 bf16": (2, 0, 1)}
want.update({n + " stream": w for n, w in want.items()})
got = {x["name"]: x for x in plan["settings"]}
assert sorted(got) == sorted(want), got.keys()
for name, (w, o, af) in want.items():
    stream = name.endswith(" stream")
    res = w + 2 + o
    dev_pp = (res * P + 4 * af * (v_glob + L * v_share)) / P
    host_pp = (2 if w == 2 else 6) + (0 if stream else 6) + o
    x = got[name]
    assert abs(x["device_bytes_per_param"] - dev_pp) <= 1e-9 * dev_pp, (name, x, dev_pp)
    assert x["host_bytes_per_param"] == host_pp, (name, x, host_pp)
    f = rows[name].split()
    i = len(name.split())
    assert f[i] == "%.3f" % dev_pp and f[i + 1] == "%.3f" % host_pp, (name, f, dev_pp)
    # the least host memory per node: the most slots the device holds
    # resident (with min(2, offloaded) staging buffers of 4 bytes a
    # parameter of a share), the rest on the host, 8 devices a node
    slot = res * share + 4 * af * v_share
    R = L
    while R > 0 and (res * glob + 4 * af * v_glob + R * slot +
                     min(2, L - R) * 4 * share) > dev:
        R -= 1
    need = G * (L - R) * ((host_pp) * share + 4 * af * v_share)
    if stream:
        need += G * min(L - R, 2 + 1) * 2 * share
    assert x["least_host_bytes_per_node"] == need, (name, x, need, R)
    assert x["real_fits"] == ("offloaded" if need <= host else "none"), x
    assert x["pseudo_fits"] == "resident", x
# the paper's cluster: Adafactor without a first moment, bf16 masters and
# streamed gradients fit, the pseudo phase resident
assert got["adafactor b1=0 bf16 stream"]["real_fits"] == "offloaded"
print("settings: " + ", ".join("%s %.3f B/p, %.1f GiB host" % (n, got[n]["device_bytes_per_param"], got[n]["least_host_bytes_per_node"] / 2**30) for n in want))
PY

# --- bad input: the error names what is wrong
expect() {  # expect RC PATTERN ARGS...: exit status and stderr
    local want=$1 pat=$2 rc=0; shift 2
    ctl "$@" >"$T/e.out" 2>"$T/e.err" || rc=$?
    [ "$rc" = "$want" ] && grep -q -- "$pat" "$T/e.err" \
        || fail "$* : rc $rc (want $want), stderr: $(cat "$T/e.err")"
}
F="$EX/fortunes-p2r.json"
expect 2 '--h2d-gbps: want a number' plan "$F" --p2r --h2d-gbps -5
expect 2 '--gpu-tflops: want a number' plan "$F" --p2r --gpu-tflops 0
expect 2 '--host-adam-gbps: want a number' plan "$F" --p2r --host-adam-gbps abc
expect 2 '--mfu: want a number in' plan "$F" --p2r --mfu 1.5
expect 2 '--grad-scale: want sum or mean' plan "$F" --p2r --grad-scale max
expect 2 '--corpus applies with --p2r only' plan "$F" --corpus fortunes
expect 2 'leave out --daemon' plan "$F" --p2r --daemon
expect 1 'No such file' plan "$F" --p2r --sweep "$T/none.csv" --corpus fortunes
expect 1 'needs --corpus' plan "$F" --p2r --sweep "$FIX"
expect 1 '--steps-ratio and --sweep' plan "$F" --p2r --sweep "$FIX" --corpus fortunes --steps-ratio 1
printf 'corpus,seed\nfortunes,1\n' >"$T/bad.csv"
expect 1 "bad.csv:1: not bench/p2r_sweep's CSV" plan "$F" --p2r --sweep "$T/bad.csv" --corpus fortunes
{ head -1 "$FIX"; echo "fortunes,1,1,0.25,copy,0,sum,1,1000,2,2,1,900,1000,soon,1,1,1"; } >"$T/bad2.csv"
expect 1 'bad2.csv:2: field step_ratio: bad value "soon"' plan "$F" --p2r --sweep "$T/bad2.csv" --corpus fortunes
expect 1 'no rows of corpus "wiki"' plan "$F" --p2r --sweep "$FIX" --corpus wiki
expect 1 'no row of corpus "foldoc" with the spec' plan "$T/rewarm.json" --p2r --sweep "$FIX" --corpus foldoc
expect 1 'no pseudo phase (pseudo.steps is 0)' plan "$T/nopseudo.json" --p2r
expect 1 'real phase: the 48-slot phase does not fit' plan "$EX/m6-10t.json" --p2r \
    --nodes 64 --gpus-per-node 8 --device-memory 32GiB --host-memory 512GiB
echo "PASS"
