#!/usr/bin/env bash
# metrics.sh — `m6ctl metrics` streams every row of a long run, page by
# page (no silent cut: m6d used to stop at 100,000 rows), and m6d keeps
# answering status within 50 ms while it does (the pages are read on its
# thread pool, not on the event loop).
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
write_spec "$T/spec.json" long 300000 100000
start_daemon "$T/s"
R=$(ctl submit "$T/spec.json")
wait_step "$R" 1
ctl stop "$R" >/dev/null
wait_state "$R" stopped

# 200,000 synthetic rows in place of the run's own, written by sqlite3
# directly: steps 1..200000, the Real phase from step 100001, train_loss
# 2.5 + step/10^6, an evaluation (2.25) every 1000 steps.
N=200000
sqlite3 -cmd '.timeout 5000' "$T/s/m6.db" "
    delete from metrics where run=$R;
    with recursive s(i) as (select 1 union all select i + 1 from s where i < $N)
    insert into metrics(run, step, phase, train_loss, val_loss, lr, tokens_per_s,
                        grad_norm, resident_slots, offloaded_slots, peak_device_bytes)
    select $R, i, case when i <= 100000 then 'pseudo' else 'real' end,
           2.5 + i * 1e-6, case when i % 1000 = 0 then 2.25 end, 0.0008,
           12345.5, 0.5, 2, 0, 1000000 from s;" || fail "synthetic rows"
[ "$(db "$T/s" "select count(*) from metrics where run=$R")" = $N ] || fail "rows in m6.db"

# The stream, and status round trips (on one open connection, so that
# neither m6ctl's nor Python's start-up counts) for as long as it runs.
# Up to 3 tries: on this shared 2-core machine a try now and then meets a
# scheduling stall of its own, while a loop blocked by the read (as m6d's
# was, 222 ms for its 100,000 rows) is blocked in every try.
# Under ASan+UBSan (M6_TEST_SANITIZED) one page's read takes about as long
# as the bound itself, so the bound could not tell a blocked loop from a
# free one there: that pass checks that status is answered during the
# stream and prints the times; the release pass holds the 50 ms.
max_ms=50
[ "${M6_TEST_SANITIZED:-0}" = 1 ] && max_ms=0
ok=0
for try in 1 2 3; do
    rm -f "$T/csv.done"
    python3 "$(dirname "$0")/rawclient.py" "$SOCK" --rtt "$R" "$T/csv.done" "$max_ms" \
        >"$T/rtt.out" 2>&1 &
    RTT_PID=$!
    nap 0.2  # connected and sampling
    t0=$(date +%s.%N)
    rc=0; ctl metrics "$R" --csv >"$T/m.csv" 2>"$T/m.err" || rc=$?
    t1=$(date +%s.%N)
    touch "$T/csv.done"
    rtt_rc=0; wait "$RTT_PID" || rtt_rc=$?
    [ "$rc" = 0 ] || fail "metrics --csv: exit $rc: $(cat "$T/m.err")"
    log "try $try: metrics --csv of $N rows: $(echo "$t1 - $t0" | bc) s; $(tail -1 "$T/rtt.out")"
    if [ "$rtt_rc" = 0 ]; then ok=1; break; fi
done
[ "$ok" = 1 ] || fail "status during the metrics stream, 3 tries: $(cat "$T/rtt.out")"

# Every row, once, in order; the first and the last as written (floats in
# their shortest round-trip form: float32(2.500001) prints as 2.500001).
[ "$(wc -l <"$T/m.csv")" = $((N + 1)) ] || fail "metrics --csv: $(($(wc -l <"$T/m.csv") - 1)) rows, want $N"
awk -F, 'NR > 1 && $1 != NR - 1 { print "line " NR ": step " $1; exit 1 }' "$T/m.csv" \
    || fail "metrics --csv: steps not 1..$N in order"
[ "$(sed -n 2p "$T/m.csv")" = "1,pseudo,2.500001,,0.0008,12345.5,0.5,2,0,1000000,,," ] \
    || fail "first row: $(sed -n 2p "$T/m.csv")"
[ "$(tail -1 "$T/m.csv")" = "200000,real,2.7,2.25,0.0008,12345.5,0.5,2,0,1000000,,," ] \
    || fail "last row: $(tail -1 "$T/m.csv")"
# --json and the text table stream all of them too.
ctl metrics "$R" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
assert len(rows) == 200000, len(rows)
assert [r["step"] for r in rows] == list(range(1, 200001))
assert rows[0]["train_loss"] == 2.500001 and rows[-1]["val_loss"] == 2.25, (rows[0], rows[-1])
' || fail "metrics --json"
ctl metrics "$R" >"$T/m.txt"
[ "$(wc -l <"$T/m.txt")" = $((N + 1)) ] || fail "metrics table: $(wc -l <"$T/m.txt") lines"

stop_daemon
echo "ok metrics ($N rows streamed; $(tail -1 "$T/rtt.out"))"
