#!/usr/bin/env bash
# moe.sh — a short Pseudo-to-Real MoE run (every block MoE, E = 4 experts in
# k = 2 prototypes) through the real m6d and m6ctl on the fortunes text: it
# delinks and completes with a finite validation loss, every step's router
# figures are in m6.db, and status and metrics (text, --json, --csv) show
# them; a spec whose prototypes do not divide the experts is refused at
# submit naming the key; a mixed model (MoE every 2nd block) runs too; and
# the M6-10T plan at paper scale says what fits where.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
spec_file "$T/moe.json" moe-short <<JSON
  "model": $(tiny_model 2 '"moe": {"num_experts": 4, "prototypes": 2, "expert_hidden": 48}'),
  "pseudo": {"share_groups": 1, "steps": 6},
  "train": {"steps": 12, "batch_size": 4, "eval_every": 6, "eval_batches": 2, "seed": 7},
  "checkpoint": {"every": 6, "keep": 2}
JSON
start_daemon "$T/s"

# refused at submit, naming the key; m6d keeps running
sed 's/"prototypes": 2/"prototypes": 3/' "$T/moe.json" >"$T/bad.json"
rc=0; ctl submit "$T/bad.json" >"$T/bad.out" 2>"$T/bad.err" || rc=$?
[ "$rc" != 0 ] || fail "a spec with prototypes 3 of 4 experts was accepted"
grep -q "model.moe.prototypes: must divide model.moe.num_experts" "$T/bad.err" \
    || fail "bad spec message: $(cat "$T/bad.err")"

R=$(ctl submit "$T/moe.json") || fail "submit"
ctl watch "$R" >/dev/null || fail "the MoE run did not complete"
[ "$(field "$R" state)" = completed ] || fail "state $(field "$R" state)"
[ "$(field "$R" phase)" = real ] || fail "no delink: phase $(field "$R" phase)"
[ "$(field "$R" delink_step)" = 6 ] || fail "delink_step $(field "$R" delink_step)"

# m6.db: every step has its router figures; the val loss is finite
[ "$(db "$T/s" "select count(*) from metrics where run=$R and moe_aux_loss > 0
        and moe_z_loss > 0 and moe_dropped_fraction between 0 and 1
        and moe_load_min <= moe_load_max and moe_load_cv >= 0
        and moe_experts_empty >= 0")" = 12 ] || fail "MoE figures in m6.db"
python3 - "$(db "$T/s" "select val_loss from metrics where run=$R and step=12")" <<'PY' \
    || fail "final val loss"
import math, sys
v = float(sys.argv[1])
assert math.isfinite(v) and 0 < v < 6, v
print(f"# final val loss {v:.4f}", file=sys.stderr)
PY

# status: the text line and the JSON fields
ctl status "$R" >"$T/status.txt"
grep -q "^moe: *aux [0-9.]*, z [0-9.]*, dropped [0-9.]*%, load [0-9]*-[0-9]* per expert" \
    "$T/status.txt" || fail "status moe line: $(cat "$T/status.txt")"
ctl status "$R" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)
assert r['moe_aux_loss'] > 0 and r['moe_z_loss'] > 0, r
assert 0 <= r['moe_dropped_fraction'] <= 1, r
assert r['moe_load_min'] <= r['moe_load_max'], r
" || fail "status --json moe fields"

# metrics: the columns after the offload ones, in all three forms
ctl metrics "$R" --csv >"$T/m.csv" || fail "metrics --csv"
sed -n 1p "$T/m.csv" | has ",copy_hidden_fraction,moe_aux_loss,moe_z_loss,moe_dropped_fraction,moe_load_min,moe_load_max,moe_load_cv,moe_experts_empty$" \
    || fail "metrics csv header: $(sed -n 1p "$T/m.csv")"
[ "$(wc -l <"$T/m.csv")" = 13 ] || fail "metrics csv rows"
ctl metrics "$R" --json | python3 -c "
import json, sys
rows = json.load(sys.stdin)
assert len(rows) == 12, len(rows)
for r in rows:
    assert r['moe_aux_loss'] > 0 and r['moe_load_cv'] >= 0, r
" || fail "metrics --json moe fields"
ctl metrics "$R" >"$T/m.txt" || fail "metrics"
sed -n 1p "$T/m.txt" | has "HIDDEN .*AUX .*ZLOSS .*DROP .*LOAD_MIN .*LOAD_MAX .*LOAD_CV .*EMPTY" \
    || fail "metrics table header: $(sed -n 1p "$T/m.txt")"

# a dense run has none of it
write_spec "$T/dense.json" dense 2 0
D=$(ctl submit "$T/dense.json") || fail "submit dense"
ctl watch "$D" >/dev/null || fail "the dense run did not complete"
[ "$(db "$T/s" "select count(*) from metrics where run=$D and moe_aux_loss is null")" = 2 ] \
    || fail "dense run has MoE figures"
ctl status "$D" >"$T/dstatus.txt"
! grep -q "^moe:" "$T/dstatus.txt" || fail "dense status has a moe line"
ctl metrics "$D" --csv | sed -n 1p | has "copy_hidden_fraction$" || fail "dense csv header"
# a mixed model: MoE in every 2nd of 4 blocks, a pseudo phase of one slot
# of each kind; a pseudo phase of 1 slot is refused naming the key
sed -e 's/"n_layer": 2/"n_layer": 4/' -e 's/"expert_hidden": 48/"expert_hidden": 48, "every": 2/' \
    -e 's/"share_groups": 1/"share_groups": 2/' -e 's/moe-short/moe-mixed/' \
    "$T/moe.json" >"$T/mixed.json"
X=$(ctl submit "$T/mixed.json") || fail "submit mixed"
ctl watch "$X" >/dev/null || fail "the mixed run did not complete"
[ "$(db "$T/s" "select count(*) from metrics where run=$X and moe_aux_loss > 0")" = 12 ] \
    || fail "mixed run: router figures"
sed 's/"share_groups": 2/"share_groups": 1/' "$T/mixed.json" >"$T/mixed1.json"
rc=0; ctl submit "$T/mixed1.json" >/dev/null 2>"$T/mixed1.err" || rc=$?
[ "$rc" != 0 ] && grep -q "pseudo.share_groups: model.moe.every = 2" "$T/mixed1.err" \
    || fail "mixed spec with one pseudo slot: rc $rc, $(cat "$T/mixed1.err")"
stop_daemon

# the plan at paper scale (no daemon): M6-10T on 64 x 8 devices of 32 GiB
EX="$(dirname "$0")/../../examples/m6-10t.json"
ctl plan "$EX" --nodes 64 --gpus-per-node 8 --device-memory 32GiB \
    --host-memory 512GiB --explain >"$T/p10t.txt" || fail "plan at scale"
grep -q "^pseudo phase: S = 1 slot" "$T/p10t.txt" || fail "plan: no pseudo phase"
grep -q "^  parameters per device  476,113,920 " "$T/p10t.txt" || fail "plan: pseudo per device"
grep -q "^  fits: with all slots resident" "$T/p10t.txt" || fail "plan: pseudo fit"
grep -q "^  model parameters       10,056,391,903,232 " "$T/p10t.txt" || fail "plan: 10T count"
grep -q "^    = 16 bytes x 20,397,688,832 parameters" "$T/p10t.txt" || fail "plan: --explain"
grep -q "^  fits: not at all: .* 2.21 TiB more than its 512.00 GiB" "$T/p10t.txt" \
    || fail "plan: real fit: $(grep fits "$T/p10t.txt")"
ctl --json plan "$EX" --nodes 64 --gpus-per-node 8 --device-memory 32GiB \
    --host-memory 3TiB | python3 -c "
import json, sys
p = json.load(sys.stdin)
assert p['devices'] == 512, p
assert p['pseudo']['fits'] == 'resident', p['pseudo']
assert p['real']['fits'] == 'offloaded', p['real']
assert p['real']['resident_slots'] == 4 and p['real']['offloaded_slots'] == 44, p['real']
" || fail "plan --json at scale"
rc=0; ctl plan "$EX" --nodes 0 --device-memory 32GiB 2>"$T/pn.err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--nodes: want a whole number" "$T/pn.err" || fail "plan --nodes 0: rc $rc"
rc=0; ctl plan "$EX" --nodes 2 --daemon 2>"$T/pd.err" || rc=$?
[ "$rc" = 2 ] && grep -q "leave out --daemon" "$T/pd.err" || fail "plan --nodes --daemon: rc $rc"
rc=0; ctl plan "$EX" --nodes 2 2>"$T/pm.err" || rc=$?
[ "$rc" = 2 ] && grep -q "give --device-memory" "$T/pm.err" || fail "plan --nodes without memory: rc $rc"
ctl plan "$EX" --device-memory 4TiB >/dev/null || fail "the plain plan of the 10T spec"
echo "ok moe (12 steps, delink at 6, router figures in m6.db, status and metrics; a mixed run; the 10T plan at scale)"
