#!/usr/bin/env bash
# offload_spec.sh — offload.speculative (issue 19) on a real m6d: the same
# offloaded spec with the speculative host AdamW on and off trains to
# bitwise the same losses; every metrics row of the speculative run records
# offload_redo_steps 1 exactly when its recorded gradient norm exceeds
# grad_clip (counted here from the rows), 0 otherwise; the run without
# speculation records NULL.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"

spec_() { # FILE NAME SPECULATIVE BUDGET
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 4),
  "train": {"steps": 30, "batch_size": 4, "eval_every": 10, "seed": 5,
            "grad_clip": 1.5},
  "device": {"memory_budget": $4},
  "offload": {"speculative": "$3"},
  "checkpoint": {"every": 0, "keep": 2}
JSON
}
spec_ "$T/probe.json" probe on 0
read -r MIN SLOT < <("$M6CTL" plan "$T/probe.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["min_budget_bytes"], p["breakdown"]["slot_bytes"])') || fail "plan --json"
BUDGET=$((MIN + SLOT)) # one of 4 slots resident
spec_ "$T/on.json" spec-on on $BUDGET
spec_ "$T/off.json" spec-off off $BUDGET
"$M6CTL" plan "$T/on.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
b = p["breakdown"]
n = len(p["offloaded_slots"])
assert n == 3, p
# cpu: 12 bytes per offloaded parameter; a slot region is 16 bytes each
assert p["host_bytes"] == n * b["host_slot_bytes"] * (16 + 12) // 16, p
' || fail "plan of the speculative spec: $("$M6CTL" plan "$T/on.json" --json)"

start_daemon "$T/s"
A=$(ctl submit "$T/on.json")
rc=0; ctl watch "$A" >"$T/watch-a.out" || rc=$?
[ "$rc" = 0 ] || fail "speculative run: watch exit $rc"
B=$(ctl submit "$T/off.json")
rc=0; ctl watch "$B" >"$T/watch-b.out" || rc=$?
[ "$rc" = 0 ] || fail "plain offloaded run: watch exit $rc"

losses "$A" >"$T/loss-a.csv"
[ "$(wc -l <"$T/loss-a.csv")" = 31 ] || fail "rows: $(wc -l <"$T/loss-a.csv")"
same_losses "$B" "$T/loss-a.csv" "losses of the speculative and plain runs differ"

db "$T/s" "select step, grad_norm, ifnull(offload_redo_steps, 'null') from metrics where run = $A order by step" >"$T/a.rows"
db "$T/s" "select count(*) from metrics where run = $B and offload_redo_steps is not null" >"$T/b.count"
python3 - "$T/a.rows" <<'PY' || fail "redo counts: $(cat "$T/a.rows")"
import struct, sys
rows = [l.split("|") for l in open(sys.argv[1]).read().split()]
assert len(rows) == 30, rows
f32 = lambda x: struct.unpack("f", struct.pack("f", float(x)))[0]
over = [int(f32(g) > 1.5) for _, g, _ in rows]
got = [int(r) for _, _, r in rows]
assert got == over, (got, over)
assert 0 < sum(over) < 30, over  # both kept and redone steps
print("# %d of 30 steps over the clip, %d redone" % (sum(over), sum(got)))
PY
[ "$(cat "$T/b.count")" = 0 ] || fail "the run without speculation recorded redo figures"
stop_daemon
echo "ok offload_spec (losses bitwise with and without speculation; redo rows = steps over the clip)"
