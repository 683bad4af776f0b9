#!/usr/bin/env bash
# m6d_cuda.sh — a `device.backend: cuda` spec through the real m6d and
# m6ctl, on the emulated GPU (tests/cuda_emu: M6D is m6d_emu, the daemon
# linked with the engine on the emulated CUDA kernels): the plain run and the
# same spec with a budget that offloads 3 of 4 slots after the delink both
# finish with the same losses (to the tolerance of host vs device AdamW);
# status and metrics report the placement; the offloaded run paused in its
# Real phase survives an m6d restart and finishes with the losses of the
# uninterrupted run, bit for bit. The 10T plan's optimizer setting
# (Adafactor without a first moment, bf16 masters, streamed gradients)
# runs offloaded with the losses of its unstreamed twin. With cuBLASLt
# unloadable the spec is refused at submit, naming it.
. "$(dirname "$0")/../integration/lib.sh"

prepare_data "$T/data"

cuda_spec() { # FILE NAME [device members]
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 4),
  "pseudo": {"steps": 10},
  "train": {"steps": 30, "batch_size": 2, "eval_every": 10, "seed": 5},
  "checkpoint": {"every": 10, "keep": 2},
  "device": {"backend": "cuda"${3:+, $3}}
JSON
}

cuda_spec "$T/plain.json" cuda-plain
read -r MIN SLOT < <("$M6CTL" plan "$T/plain.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["min_budget_bytes"], p["breakdown"]["slot_bytes"])') || fail "plan --json"
BUDGET=$((MIN + SLOT))
cuda_spec "$T/off.json" cuda-off "\"memory_budget\": $BUDGET"

start_daemon "$T/s"
A=$(ctl submit "$T/plain.json") || fail "submit of the plain cuda spec"
rc=0; ctl watch "$A" >"$T/watch-a.out" || rc=$?
[ "$rc" = 0 ] || fail "plain cuda run: watch exit $rc: $(tail -3 "$T/watch-a.out")"
grep -q "delinked at step 10" "$T/watch-a.out" || fail "no delink in watch: $(cat "$T/watch-a.out")"

B=$(ctl submit "$T/off.json") || fail "submit of the offloaded cuda spec"
rc=0; ctl watch "$B" >"$T/watch-b.out" || rc=$?
[ "$rc" = 0 ] || fail "offloaded cuda run: watch exit $rc: $(tail -3 "$T/watch-b.out")"
ctl status "$B" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert r['state'] == 'completed' and r['phase'] == 'real', r
assert (r['resident_slots'], r['offloaded_slots']) == (1, 3), r
assert 0 < r['peak_device_bytes'] <= $BUDGET == r['device_budget_bytes'], r
" || fail "status of the offloaded run: $(ctl status "$B" --json)"
losses "$A" >"$T/loss-a.csv"
losses "$B" >"$T/loss-b.csv"
# Pseudo phase: the same placement, so the same bits; Real phase: host
# AdamW for the offloaded slots rounds like the device's to ~1 ulp
losses_close "$T/loss-a.csv" "$T/loss-b.csv" 30 1e-3 --same-first 10 --falls \
    || fail "losses: plain vs offloaded"

# Restart: the offloaded run paused in its Real phase, m6d stopped and
# started again, resumed: the rest of its losses are the uninterrupted
# run's bit for bit (checkpoint of offloaded slots from host memory).
C=$(ctl submit "$T/off.json")
wait_step "$C" 15
ctl pause "$C" >/dev/null || fail "pause of run $C"
wait_state "$C" paused
stop_daemon
start_daemon "$T/s"
ctl resume "$C" >/dev/null || fail "resume of run $C"
rc=0; ctl watch "$C" >"$T/watch-c.out" || rc=$?
[ "$rc" = 0 ] || fail "resumed run: watch exit $rc: $(tail -3 "$T/watch-c.out")"
losses "$C" >"$T/loss-c.csv"
diff "$T/loss-b.csv" "$T/loss-c.csv" >"$T/diff" || fail "resumed losses differ: $(head "$T/diff")"

# The optimizer setting the plan at scale fits ten trillion parameters
# with (Adafactor without a first moment, bf16 masters, streamed
# gradients, offloading), through m6d: streamed, the losses of the same
# spec unstreamed bit for bit (the same host updates, made as each slot's
# gradient lands), 3 slots of 4 offloaded (the host bytes:
# emu_gpu_trainer).
lean_spec() { # FILE NAME BUDGET [offload members]
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 4),
  "pseudo": {"steps": 5},
  "train": {"steps": 10, "batch_size": 2, "eval_every": 5, "seed": 5,
            "grad_clip": 0},
  "optimizer": {"name": "adafactor", "master": "bf16"},
  "checkpoint": {"every": 0, "keep": 2},
  "device": {"backend": "cuda", "memory_budget": $3}${4:+,
  $4}
JSON
}
# its own budget: one slot resident (its slots are smaller than AdamW's)
lean_spec "$T/lean0.json" cuda-lean0 0
read -r LMIN LSLOT < <("$M6CTL" plan "$T/lean0.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["min_budget_bytes"], p["breakdown"]["slot_bytes"])') || fail "plan --json (lean)"
lean_spec "$T/lean.json" cuda-lean $((LMIN + LSLOT))
lean_spec "$T/lean-st.json" cuda-lean-stream $((LMIN + LSLOT)) \
    '"offload": {"stream_grads": true}'
E=$(ctl submit "$T/lean.json") || fail "submit of the lean spec"
F=$(ctl submit "$T/lean-st.json") || fail "submit of the streamed lean spec"
for r in "$E" "$F"; do
    rc=0; ctl watch "$r" >"$T/watch-$r.out" || rc=$?
    [ "$rc" = 0 ] || fail "lean run $r: watch exit $rc: $(tail -3 "$T/watch-$r.out")"
done
losses "$E" >"$T/loss-e.csv"
same_losses "$F" "$T/loss-e.csv" "streamed lean run's losses differ"
ctl status "$F" --json | python3 -c "
import json, sys
f = json.load(sys.stdin)
assert f['state'] == 'completed' and f['phase'] == 'real', f
assert f['offloaded_slots'] == 3 and f['backend'] == 'cuda', f
" || fail "status of the streamed lean run: $(ctl status "$F" --json)"
stop_daemon

# cuBLASLt that cannot be opened (kernels/cuda/cublaslt_load.c's answer,
# emulated): the cuda spec is refused at submit naming it; m6d serves on
M6_EMU_CUBLASLT_UNLOADABLE=1 start_daemon "$T/s"
out=$(ctl submit "$T/plain.json" 2>&1) && fail "submit with cuBLASLt unloadable was accepted: $out"
grep -q "device.backend: 'cuda': cuBLASLt could not be loaded" <<<"$out" \
    || fail "refusal does not name cuBLASLt: $out"
ctl list >/dev/null || fail "m6d stopped answering after the refusal"
log "refused: $out"
stop_daemon
echo "ok m6d cuda (emulated GPU; budget $BUDGET bytes: 3 of 4 slots offloaded)"
