#!/usr/bin/env bash
# run_columns.sh — the spec fields `m6ctl list` and `status` show
# (pseudo_steps, device_budget_bytes, backend, delink_policy; world_size
# and expert_parallel; precision and master_precision) are stored as
# columns of runs at submit (schemas 0009, 0015, 0016) and read from
# there; a row
# without them (a run submitted before the migration: columns NULL) shows
# the same figures, read from its spec.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
write_spec "$T/spec.json" cols 6 3 '"device": {"memory_budget": "512MiB", "precision": "bf16"},
  "optimizer": {"master": "bf16"}'
start_daemon "$T/s"
R=$(ctl submit "$T/spec.json") || fail "submit"
wait_state "$R" completed 120
stop_daemon

cols=$(db "$T/s" "select pseudo_steps, device_budget, backend, delink_policy, world_size, expert_parallel, precision, master_precision from runs where id=$R")
[ "$cols" = "3|536870912|cpu|step|1|1|bf16|bf16" ] || fail "runs columns at submit: '$cols', want 3|536870912|cpu|step|1|1|bf16|bf16"

# status and list, as JSON, of the eight fields, and status' line
show() {
    local f='"\(.pseudo_steps) \(.device_budget_bytes) \(.backend) \(.delink_policy) \(.world_size) \(.expert_parallel) \(.precision) \(.master_precision)"'
    ctl status "$R" --json | jq -r "$f"
    ctl list --json | jq -r ".[] | select(.id == $R) | $f"
    ctl status "$R" | grep '^precision:' | tr -s ' '
}
start_daemon "$T/s"
show >"$T/with.txt" || fail "status/list with the columns"
stop_daemon
want="3 536870912 cpu step 1 1 bf16 bf16
precision: bf16 GEMM inputs, fp32 sums; masters bf16"
[ "$(sort -u "$T/with.txt")" = "$want" ] || fail "status/list from the columns: $(cat "$T/with.txt"), want $want"

# rows from between the migrations (0009's columns, not 0015's or 0016's):
# the same figures, the missing ones from the spec
for cols in "world_size = NULL, expert_parallel = NULL" \
            "precision = NULL, master_precision = NULL"; do
    sqlite3 "$T/s/m6.db" "update runs set $cols where id = $R" \
        || fail "clearing $cols"
    start_daemon "$T/s"
    show >"$T/between.txt" || fail "status/list without $cols"
    stop_daemon
    [ "$(sort -u "$T/between.txt")" = "$want" ] || fail "status/list after $cols: $(cat "$T/between.txt"), want $want"
done

# a row from before the columns: the same figures, from its spec
sqlite3 "$T/s/m6.db" "update runs set pseudo_steps = NULL, device_budget = NULL, backend = NULL, delink_policy = NULL, world_size = NULL, expert_parallel = NULL, precision = NULL, master_precision = NULL where id = $R" \
    || fail "clearing the columns"
start_daemon "$T/s"
show >"$T/without.txt" || fail "status/list without the columns"
stop_daemon
[ "$(sort -u "$T/without.txt")" = "$want" ] || fail "status/list from the spec: $(cat "$T/without.txt"), want $want"
echo "PASS: run_columns"
