#!/usr/bin/env bash
# offload.sh — issue #5's reporting on a real m6d: the same spec with and
# without a device memory budget trains to bitwise the same losses through a
# delink; status and metrics report the slot placement, peak device bytes
# (<= the budget), copy rates and the hidden share of copy time; a budget
# below the planner's minimum is refused at submit, with the numbers; the
# plan of a cuda spec counts bf16 copies and pinned vs ordinary host bytes;
# a paused run resumes under another budget (m6ctl resume --memory-budget)
# with the same losses.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"

# offload_spec FILE NAME [extra top-level JSON members]: six layers, so that there are slots
# to offload; one slot in the pseudo phase, delinked at step 20.
offload_spec() {
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 6),
  "pseudo": {"share_groups": 1, "steps": 20},
  "train": {"steps": 120, "batch_size": 4, "eval_every": 20, "seed": 11},
  "checkpoint": {"every": 0, "keep": 2}${3:+,
  $3}
JSON
}

offload_spec "$T/plain.json" off-plain
# The plan without a budget: its peak, its minimum, one slot's bytes. A
# budget of the minimum plus one slot keeps one slot resident.
read -r PEAK MIN SLOT < <("$M6CTL" plan "$T/plain.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["peak_device_bytes"], p["min_budget_bytes"], p["breakdown"]["slot_bytes"])') \
    || fail "plan --json"
BUDGET=$((MIN + SLOT))
[ "$BUDGET" -lt "$PEAK" ] || fail "budget $BUDGET not below the unlimited peak $PEAK"
offload_spec "$T/off.json" off-budget "\"device\": {\"memory_budget\": $BUDGET}"
OFFLOADED=$("$M6CTL" plan "$T/off.json" --json |
            python3 -c 'import json,sys; print(len(json.load(sys.stdin)["offloaded_slots"]))')
[ "$OFFLOADED" -ge 4 ] || fail "plan offloads only $OFFLOADED of 6 slots at $BUDGET bytes"
SMALL=$((MIN - 1))
offload_spec "$T/small.json" off-small "\"device\": {\"memory_budget\": $SMALL}"
# The cuda plan (planned here and by m6d alike, GPU or not): bf16 staging
# and transfers, 20 host bytes per offloaded parameter of which 4 pinned.
offload_spec "$T/cuda.json" off-cuda '"device": {"backend": "cuda"}'
read -r CMIN CSLOT < <("$M6CTL" plan "$T/cuda.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["min_budget_bytes"], p["breakdown"]["slot_bytes"])') || fail "cuda plan --json"
offload_spec "$T/cuda-off.json" off-cuda "\"device\": {\"backend\": \"cuda\", \"memory_budget\": $((CMIN + CSLOT))}"
"$M6CTL" plan "$T/cuda-off.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
b = p["breakdown"]
assert p["backend"] == "cuda" and len(p["offloaded_slots"]) == 5, p
assert p["host_bytes"] == 5 * b["host_slot_bytes"] and p["pinned_bytes"] == 5 * b["pinned_slot_bytes"], p
assert b["host_slot_bytes"] == 5 * b["pinned_slot_bytes"] == 5 * b["staging_buffer_bytes"], b
assert b["slot_bytes"] == 4 * b["staging_buffer_bytes"], b
' || fail "cuda plan: $("$M6CTL" plan "$T/cuda-off.json" --json)"
"$M6CTL" plan "$T/cuda-off.json" | has "pinned" || fail "cuda plan table"
# offload.speculative: auto shows off here (m6d decides at start); on adds
# each offloaded slot's second buffers, 14 bytes a parameter (2 pinned),
# to the host and pinned totals; off never
CPAR=$(( CSLOT / 16 ))  # the slot's parameters: 16 device bytes each
for mode in auto on off; do
    offload_spec "$T/cuda-spec-$mode.json" off-cuda "\"device\": {\"backend\": \"cuda\", \"memory_budget\": $((CMIN + CSLOT))}, \"offload\": {\"speculative\": \"$mode\"}"
    "$M6CTL" plan "$T/cuda-spec-$mode.json" --json | MODE=$mode CPAR=$CPAR python3 -c '
import json, os, sys
p = json.load(sys.stdin)
b, mode, n = p["breakdown"], os.environ["MODE"], int(os.environ["CPAR"])
assert p["speculative_mode"] == mode, p
assert p["speculative"] == (mode == "on"), p
assert b["speculative_slot_bytes"] == 14 * n and b["speculative_pinned_slot_bytes"] == 2 * n, b
k = 5 if mode == "on" else 0
assert p["host_bytes"] == 5 * b["host_slot_bytes"] + k * b["speculative_slot_bytes"], p
assert p["pinned_bytes"] == 5 * b["pinned_slot_bytes"] + k * b["speculative_pinned_slot_bytes"], p
' || fail "cuda plan, speculative $mode: $("$M6CTL" plan "$T/cuda-spec-$mode.json" --json)"
done
"$M6CTL" plan "$T/cuda-spec-on.json" | has "speculative clipped update (offload.speculative on): on" ||
    fail "plan table: no speculative line: $("$M6CTL" plan "$T/cuda-spec-on.json")"

# The boundary hold (lib.sh hold_boundary): the offloaded run's 20 Pseudo
# steps take 40 ms unhindered; the test holds the worker at its boundary
# before each pause, so the pause lands in the phase it wants whatever the
# speed of a step
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"

# expert parallelism: the plan adds a rank's own model (its experts only),
# the same from m6d: its slots and its minimum budget are smaller
jq '.model.moe = {"num_experts": 4, "prototypes": 2} | .nodes = {"world_size": 2, "expert_parallel": 2} | del(.device)' \
    "$T/plain.json" >"$T/ep-plain.json" || fail "ep spec"
EMIN=$("$M6CTL" plan "$T/ep-plain.json" --json | jq .min_budget_bytes) || fail "ep plan --json"
jq --argjson b "$EMIN" '.device.memory_budget = $b' "$T/ep-plain.json" >"$T/ep-off.json"
"$M6CTL" plan "$T/ep-off.json" --json >"$T/ep-plan.json" || fail "ep-off plan"
[ "$(jq '.expert_parallel_rank.breakdown.slot_bytes < .breakdown.slot_bytes and
         .expert_parallel_rank.min_budget_bytes < .min_budget_bytes' "$T/ep-plan.json")" = true ] ||
    fail "ep-off plan: no rank's model, or not smaller: $(cat "$T/ep-plan.json")"

# sharded with offloading: the state's share on the host, the same from m6d
jq --argjson b "$MIN" '.device.memory_budget = $b | .optimizer = {"shard": true} | .nodes = {"world_size": 2}' \
    "$T/plain.json" >"$T/zero-off.json" || fail "zero-off spec"
"$M6CTL" plan "$T/zero-off.json" | grep -q "optimizer state .* (this rank's share, optimizer.shard)" \
    || fail "zero-off plan: no line for the optimizer state on the host: $("$M6CTL" plan "$T/zero-off.json")"
# ... and its least budget is the same whether the spec has one or not
jq 'del(.device.memory_budget)' "$T/zero-off.json" >"$T/zero-nobudget.json"
[ "$("$M6CTL" plan "$T/zero-off.json" --json | jq .min_budget_bytes)" = \
  "$("$M6CTL" plan "$T/zero-nobudget.json" --json | jq .min_budget_bytes)" ] \
    || fail "zero-off: the least budget differs without a budget"
for f in cuda-off cuda-spec-on ep-off zero-off; do
for a in "" "--json"; do
    ctl plan "$T/$f.json" $a >"$T/plan.local" || fail "$f plan $a"
    ctl plan "$T/$f.json" $a --daemon >"$T/plan.daemon" 2>"$T/err" || fail "$f plan $a --daemon: $(cat "$T/err")"
    diff "$T/plan.local" "$T/plan.daemon" >"$T/diff" || fail "$f plan $a: m6d and m6ctl differ: $(head "$T/diff")"
done
done

# Below the minimum: refused at submit, naming the budget and the minimum.
ctl submit "$T/small.json" >/dev/null 2>"$T/err" && fail "budget $SMALL < min $MIN accepted"
grep -q "device.memory_budget" "$T/err" && grep -q "($SMALL bytes)" "$T/err" &&
    grep -q "($MIN bytes)" "$T/err" || fail "refusal message: $(cat "$T/err")"
[ "$(db "$T/s" "select count(*) from runs")" = 0 ] || fail "a refused spec was queued"

A=$(ctl submit "$T/plain.json")
rc=0; ctl watch "$A" >"$T/watch-a.out" || rc=$?
[ "$rc" = 0 ] || fail "plain run: watch exit $rc"

# The offloaded run: pause it after its first step (Pseudo phase, the
# coordinator's live sample), then again in the Real phase.
submit_paused_at "$T/off.json" 1
B=$RUN
ctl status "$B" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert r['phase'] == 'pseudo', r
assert (r['resident_slots'], r['offloaded_slots']) == (1, 0), r
assert r['device_budget_bytes'] == $BUDGET, r
assert 0 < r['device_bytes_in_use'] <= r['peak_device_bytes'] <= $BUDGET, r
" || fail "status of the paused pseudo run: $(ctl status "$B" --json)"
ctl resume "$B" >/dev/null
# Pause after a Real step or two (the sample after the delink itself has
# no rates yet).
pause_at_step "$B" 22
ctl status "$B" --json >"$T/live.json"
python3 -c "
import json, math
r = json.load(open('$T/live.json'))
assert r['phase'] == 'real', r
assert r['offloaded_slots'] == $OFFLOADED and r['resident_slots'] == 6 - $OFFLOADED, r
assert 0 < r['device_bytes_in_use'] <= r['peak_device_bytes'] <= $BUDGET, r
assert r['h2d_gbps'] > 0 and r['d2h_gbps'] > 0, r
assert 0 <= r['copy_hidden_fraction'] <= 1, r
" || fail "status of the paused real run: $(cat "$T/live.json")"
ctl status "$B" >"$T/live.txt"
grep -Eq "^offload: +$OFFLOADED/6 slots offloaded, peak .* budget, h2d .* GB/s.*% of copy time hidden" "$T/live.txt" \
    || fail "status line: $(cat "$T/live.txt")"
ctl resume "$B" >/dev/null
rc=0; ctl watch "$B" >"$T/watch-b.out" || rc=$?
[ "$rc" = 0 ] || fail "offloaded run: watch exit $rc"

# Same spec, same seed: bitwise the same losses, through the delink (and
# the two pauses with their checkpoints).
losses "$A" >"$T/loss-a.csv"
[ "$(wc -l <"$T/loss-a.csv")" = 121 ] || fail "plain run rows: $(wc -l <"$T/loss-a.csv")"
same_losses "$B" "$T/loss-a.csv" "losses of the offloaded run differ"
grep -q "^21,real," "$T/loss-a.csv" || fail "no real-phase step 21"

# After the end (no trainer held): status from the last metrics row.
ctl status "$B" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert r['state'] == 'completed', r
assert r['offloaded_slots'] == $OFFLOADED and r['resident_slots'] == 6 - $OFFLOADED, r
assert 0 < r['peak_device_bytes'] <= $BUDGET == r['device_budget_bytes'], r
assert r['device_bytes_in_use'] == 0, r
" || fail "status of the finished offloaded run: $(ctl status "$B" --json)"
ctl status "$A" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert (r['resident_slots'], r['offloaded_slots']) == (6, 0), r
assert r['peak_device_bytes'] == $PEAK and r['device_budget_bytes'] == 0, r
assert r['h2d_gbps'] is None and r['copy_hidden_fraction'] is None, r
" || fail "status of the plain run: $(ctl status "$A" --json)"
ctl status "$A" >"$T/status-a.txt"
grep -q "^offload: *off (no budget): 6/6 slots resident" "$T/status-a.txt" \
    || fail "plain status line: $(cat "$T/status-a.txt")"

# Per-step rows: in m6.db, and through metrics --csv / --json.
[ "$(db "$T/s" "select count(*) from metrics where run=$B and phase='real'
        and offloaded_slots=$OFFLOADED and peak_device_bytes<=$BUDGET
        and h2d_gbps>0 and copy_hidden_fraction between 0 and 1")" = 100 ] \
    || fail "real-phase rows of run $B: $(db "$T/s" "select * from metrics where run=$B limit 3 offset 19")"
[ "$(db "$T/s" "select count(*) from metrics where run=$B and phase='pseudo'
        and offloaded_slots=0 and resident_slots=1")" = 20 ] || fail "pseudo-phase rows of run $B"
[ "$(db "$T/s" "select count(*) from metrics where run=$A and offloaded_slots=0
        and peak_device_bytes>0 and h2d_gbps is null")" = 120 ] || fail "rows of run $A"
# (Into files: with pipefail, `| head -1` would kill m6ctl with SIGPIPE.)
ctl metrics "$B" --csv >"$T/metrics-b.csv"
ctl metrics "$B" >"$T/metrics-b.txt"
sed -n 1p "$T/metrics-b.csv" | has ",resident_slots,offloaded_slots,peak_device_bytes,h2d_gbps,d2h_gbps,copy_hidden_fraction$" \
    || fail "metrics --csv header: $(sed -n 1p "$T/metrics-b.csv")"
ctl metrics "$B" --json | python3 -c "
import json, sys
rows = json.load(sys.stdin)
r = rows[-1]
assert r['offloaded_slots'] == $OFFLOADED and r['peak_device_bytes'] <= $BUDGET, r
assert rows[0]['h2d_gbps'] is None, rows[0]
" || fail "metrics --json"
sed -n 1p "$T/metrics-b.txt" | has "OFFL .*PEAK .*H2D_GB/S .*HIDDEN" || fail "metrics table header"
grep -Eq "^ +120 real .* $OFFLOADED/6 .*MiB .*%$" "$T/metrics-b.txt" || fail "metrics table: $(tail -1 "$T/metrics-b.txt")"

# m6ctl resume --memory-budget: the plain spec paused in the Real phase
# continues under the budget (slots offloaded from the resume on), paused
# again continues with none (every slot resident): the plain run's losses
# bit for bit. Refused, changing nothing: a budget below the minimum; a
# budget whose resume is refused (the run's checkpoints gone over a
# restart: the new spec is put back, said in an event); an m6d stopped
# before it answered such a resume (its successor keeps the new spec if
# the resume was recorded, else puts the old one back). The same budget
# again is a plain resume.
submit_paused_at "$T/plain.json" 30
E=$RUN
out=$(ctl resume "$E" --memory-budget "$SMALL" 2>&1) && fail "resume under $SMALL < min $MIN accepted: $out"
has "run $E could not resume, it stays paused: device.memory_budget" <<<"$out" &&
    has "($SMALL bytes)" <<<"$out" && has "($MIN bytes)" <<<"$out" || fail "refused budget: $out"
[ "$(field "$E" state)" = paused ] && ! ctl events "$E" | has layout ||
    fail "a refused budget changed run $E: $(field "$E" state) $(ctl events "$E" | grep layout)"
hold_at_step 60 nowait
ctl resume "$E" --memory-budget "$BUDGET" >/dev/null || fail "resume of run $E under $BUDGET"
wait_held
pause_held_ "$E" 60
[ "$(ctl status "$E" --json | jq .device_budget_bytes)" = "$BUDGET" ] ||
    fail "run $E's budget after the resume: $(ctl status "$E" --json | jq .device_budget_bytes)"
stop_daemon
mv "$T/s/runs/$E/checkpoints" "$T/away"
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"
wait_paused_error "$E" "is gone" >/dev/null
# no placement while its checkpoints are gone (m6d holds a stand-in, not
# the run's real-phase model)
! ctl status "$E" | grep '^offload:' && [ "$(ctl status "$E" --json | jq '.resident_slots + .offloaded_slots')" = 0 ] ||
    fail "placement of run $E with its checkpoints gone: $(ctl status "$E" --json | jq -c '[.resident_slots, .offloaded_slots]')"
out=$(ctl resume "$E" --memory-budget none 2>&1) && fail "resume with its checkpoints gone accepted: $out"
has "could not resume, it stays paused" <<<"$out" || fail "refusal: $out"
[ "$(ctl status "$E" --json | jq .device_budget_bytes)" = "$BUDGET" ] ||
    fail "a refused resume changed run $E's budget: $(ctl status "$E" --json | jq .device_budget_bytes)"
ctl events "$E" | has -E "layout +undone, the resume was refused: device.memory_budget $BUDGET -> 0" ||
    fail "no event of the undone budget: $(ctl events "$E")"
mv "$T/away" "$T/s/runs/$E/checkpoints"
n=$(ctl events "$E" | grep -c layout)
hold_at_step 90 nowait
ctl resume "$E" --memory-budget "$BUDGET" >/dev/null || fail "resume of run $E under its own budget"
wait_held
[ "$(ctl events "$E" | grep -c layout)" = "$n" ] || fail "the same budget again made an event: $(ctl events "$E")"
pause_held_ "$E" 90
# m6d stopped between changing a run's spec and answering its resume:
# (1) before the resume was recorded (m6.db as such an m6d leaves it: the
# new spec, the old one kept in spec_before): the next m6d puts the old
# spec back and says so; (2) after (killed while the resume waits at the
# held boundary): the next m6d keeps the new spec and the command log
# resumes the run with it
stop_daemon
sqlite3 "$T/s/m6.db" "update runs set spec_before = spec,
    spec = replace(spec, '\"memory_budget\": $BUDGET', '\"memory_budget\": $((2 * BUDGET))'),
    device_budget = $((2 * BUDGET)) where id = $E" || fail "an unsettled spec"
grep -q "memory_budget\": $((2 * BUDGET))" <<<"$(db "$T/s" "select spec from runs where id = $E")" ||
    fail "the unsettled spec has no budget $((2 * BUDGET)): $(db "$T/s" "select spec from runs where id = $E")"
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"
[ "$(ctl status "$E" --json | jq .device_budget_bytes)" = "$BUDGET" ] ||
    fail "an unrecorded resume changed run $E's budget: $(ctl status "$E" --json | jq .device_budget_bytes)"
ctl events "$E" | has -E "layout +undone: m6d stopped before the resume at this layout or budget was recorded" ||
    fail "no event of the unrecorded resume undone: $(ctl events "$E")"
lg=$T/m6d-s.log
seen=$(grep -c 'test.hold' "$lg" || true)
hold_boundary nowait
ctl resume "$E" --memory-budget none >"$T/unanswered.out" 2>&1 &
rpid=$!
wait_for "the resume to wait at the held boundary" 20 log_has "$lg" 'test.hold' $((seen + 1))
log_has "$lg" "run.layout run=$E device.memory_budget $BUDGET -> 0" >/dev/null ||
    fail "the new spec was not written before the boundary: $(grep run.layout "$lg")"
kill9_daemon
wait "$rpid" && fail "the resume was answered: $(cat "$T/unanswered.out")"
release_boundary
start_daemon "$T/s"
ctl events "$E" | has -E "layout +kept: m6d stopped after recording the resume at this layout or budget" ||
    fail "no event of the recorded resume kept: $(ctl events "$E")"
[ "$(db "$T/s" "select spec_before is null from runs where id = $E")" = 1 ] ||
    fail "run $E's spec change left unsettled"
rc=0; ctl watch "$E" >/dev/null || rc=$?
[ "$rc" = 0 ] || fail "run $E resumed under budgets: watch exit $rc"
ctl events "$E" >"$T/events-e.txt"
has -E "layout +device.memory_budget 0 -> $BUDGET: from the newest checkpoint" <"$T/events-e.txt" &&
    has -E "layout +device.memory_budget $BUDGET -> 0: from the newest checkpoint" <"$T/events-e.txt" ||
    fail "no budget events: $(cat "$T/events-e.txt")"
[ "$(db "$T/s" "select count(*) from metrics where run=$E and step between 31 and 90 and offloaded_slots=$OFFLOADED")" = 60 ] &&
[ "$(db "$T/s" "select count(*) from metrics where run=$E and (step <= 30 or step > 90) and offloaded_slots=0")" = 60 ] ||
    fail "run $E's slots by step: $(db "$T/s" "select step, offloaded_slots from metrics where run=$E and step in (30, 31, 60, 61, 90, 91)")"
same_losses "$E" "$T/loss-a.csv" "losses of the run resumed under budgets differ"

# offload.stream_grads through m6d: without the global clip, the streamed
# offloaded run gives the losses of the same spec with every slot resident,
# bit for bit, through the delink; with the clip it is refused at submit,
# naming the key and the reason, and nothing is queued.
# stream_spec FILE NAME CLIP [extra members]: offload_spec's run with
# train.grad_clip CLIP.
stream_spec() {
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 6),
  "pseudo": {"share_groups": 1, "steps": 20},
  "train": {"steps": 120, "batch_size": 4, "eval_every": 20, "seed": 11,
            "grad_clip": $3},
  "checkpoint": {"every": 0, "keep": 2}${4:+,
  $4}
JSON
}
STREAM="\"device\": {\"memory_budget\": $BUDGET}, \"offload\": {\"stream_grads\": true}"
stream_spec "$T/nc.json" stream-plain 0
stream_spec "$T/st.json" stream-on 0 "$STREAM"
stream_spec "$T/stc.json" stream-clip 1 "$STREAM"
N0=$(db "$T/s" "select count(*) from runs")
ctl submit "$T/stc.json" >/dev/null 2>"$T/err" && fail "streamed with grad_clip accepted"
grep -q "offload.stream_grads needs train.grad_clip 0" "$T/err" ||
    fail "stream refusal: $(cat "$T/err")"
[ "$(db "$T/s" "select count(*) from runs")" = "$N0" ] || fail "a refused spec was queued"
C=$(ctl submit "$T/nc.json")
rc=0; ctl watch "$C" >/dev/null || rc=$?
[ "$rc" = 0 ] || fail "unclipped run: watch exit $rc"
D=$(ctl submit "$T/st.json")
rc=0; ctl watch "$D" >/dev/null || rc=$?
[ "$rc" = 0 ] || fail "streamed run: watch exit $rc"
losses "$C" >"$T/loss-c.csv"
[ "$(wc -l <"$T/loss-c.csv")" = 121 ] || fail "unclipped run rows"
same_losses "$D" "$T/loss-c.csv" "losses of the streamed run differ"

stop_daemon
echo "ok offload ($OFFLOADED/6 slots offloaded at a budget of $BUDGET bytes; min $MIN, unlimited peak $PEAK)"
