#!/usr/bin/env bash
# m6d_cuda.sh — a `device.backend: cuda` spec through the real m6d and
# m6ctl, on the emulated GPU (tests/cuda_emu: M6D is m6d_emu, the daemon
# linked with the engine on the emulated CUDA kernels): the plain run and the
# same spec with a budget that offloads 3 of 4 slots after the delink both
# finish with the same losses (to the tolerance of host vs device AdamW);
# status and metrics report the placement; the offloaded run paused in its
# Real phase survives an m6d restart and finishes with the losses of the
# uninterrupted run, bit for bit. With cuBLASLt unloadable the spec is
# refused at submit, naming it.
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
