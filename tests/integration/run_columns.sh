#!/usr/bin/env bash
# run_columns.sh — the spec fields `m6ctl list` and `status` show
# (pseudo_steps, device_budget_bytes, backend, delink_policy) are stored as
# columns of runs at submit (schema 0009) and read from there; a row
# without them (a run submitted before the migration: columns NULL) shows
# the same figures, read from its spec.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
write_spec "$T/spec.json" cols 6 3 '"device": {"memory_budget": "512MiB"}'
start_daemon "$T/s"
R=$(ctl submit "$T/spec.json") || fail "submit"
wait_state "$R" completed 120
stop_daemon

cols=$(db "$T/s" "select pseudo_steps, device_budget, backend, delink_policy from runs where id=$R")
[ "$cols" = "3|536870912|cpu|step" ] || fail "runs columns at submit: '$cols', want 3|536870912|cpu|step"

# status and list, as JSON, of the four fields
show() {
    ctl status "$R" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["pseudo_steps"], r["device_budget_bytes"], r["backend"], r.get("delink_policy"))'
    ctl list --json | python3 -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["id"]=='"$R"'][0]; print(r["pseudo_steps"], r["device_budget_bytes"], r["backend"], r.get("delink_policy"))'
}
start_daemon "$T/s"
show >"$T/with.txt" || fail "status/list with the columns"
stop_daemon
want="3 536870912 cpu step"
[ "$(sort -u "$T/with.txt")" = "$want" ] || fail "status/list from the columns: $(cat "$T/with.txt"), want $want"

# a row from before the columns: the same figures, from its spec
sqlite3 "$T/s/m6.db" "update runs set pseudo_steps = NULL, device_budget = NULL, backend = NULL, delink_policy = NULL where id = $R" \
    || fail "clearing the columns"
start_daemon "$T/s"
show >"$T/without.txt" || fail "status/list without the columns"
stop_daemon
[ "$(sort -u "$T/without.txt")" = "$want" ] || fail "status/list from the spec: $(cat "$T/without.txt"), want $want"
echo "PASS: run_columns"
