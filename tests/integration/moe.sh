#!/usr/bin/env bash
# moe.sh — a short Pseudo-to-Real MoE run (every block MoE, E = 4 experts in
# k = 2 prototypes) through the real m6d and m6ctl on the fortunes text: it
# delinks and completes with a finite validation loss, every step's router
# figures are in m6.db, and status and metrics (text, --json, --csv) show
# them; a spec whose prototypes do not divide the experts is refused at
# submit naming the key.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
cat >"$T/moe.json" <<JSON
{
  "name": "moe-short",
  "data": {"train": "$T/data/train_*.bin", "val": "$T/data/val_*.bin"},
  "model": {"vocab_size": 256, "n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 32,
            "moe": {"num_experts": 4, "prototypes": 2, "expert_hidden": 48}},
  "pseudo": {"share_groups": 1, "steps": 6},
  "train": {"steps": 12, "batch_size": 4, "eval_every": 6, "eval_batches": 2, "seed": 7},
  "checkpoint": {"every": 6, "keep": 2}
}
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
sed -n 1p "$T/m.csv" | grep -q ",copy_hidden_fraction,moe_aux_loss,moe_z_loss,moe_dropped_fraction,moe_load_min,moe_load_max,moe_load_cv,moe_experts_empty$" \
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
sed -n 1p "$T/m.txt" | grep -q "HIDDEN .*AUX .*ZLOSS .*DROP .*LOAD_MIN .*LOAD_MAX .*LOAD_CV .*EMPTY" \
    || fail "metrics table header: $(sed -n 1p "$T/m.txt")"

# a dense run has none of it
write_spec "$T/dense.json" dense 2 0
D=$(ctl submit "$T/dense.json") || fail "submit dense"
ctl watch "$D" >/dev/null || fail "the dense run did not complete"
[ "$(db "$T/s" "select count(*) from metrics where run=$D and moe_aux_loss is null")" = 2 ] \
    || fail "dense run has MoE figures"
ctl status "$D" >"$T/dstatus.txt"
! grep -q "^moe:" "$T/dstatus.txt" || fail "dense status has a moe line"
ctl metrics "$D" --csv | sed -n 1p | grep -q "copy_hidden_fraction$" || fail "dense csv header"
stop_daemon
echo "ok moe (12 steps, delink at 6, router figures in m6.db, status and metrics)"
