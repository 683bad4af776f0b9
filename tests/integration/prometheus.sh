#!/usr/bin/env bash
# prometheus.sh — m6d --metrics-listen: GET /metrics during a real
# Pseudo-to-Real run passes `promtool check metrics`; with every step made
# 200 ms long (the test hook M6_TEST_STEP_DELAY_MS) the step-duration
# histogram says ~0.2 s in the (0.1, 0.25] bucket; over 50 scrapes every
# counter is non-decreasing and tokens processed = steps x B*T*grad_accum
# (4*32*2 = 256, from the spec below); other paths get 404, other methods
# 405, 40 KB of headers 431, and none of that (nor a client that never
# finishes its request) holds up the control socket; a port in use stops
# m6d before it touches its state, naming the port; a restart starts the
# counters again under a new process_start_time_seconds.
. "$(dirname "$0")/lib.sh"
PROM="python3 $(dirname "$0")/prom.py"
command -v promtool >/dev/null || { echo "SKIP: promtool not installed (Debian: prometheus)"; exit 77; }

prepare_data "$T/data"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
STEPS=24 PSEUDO=12 TOKENS_PER_STEP=$((4 * 32 * 2))
spec_file "$T/spec.json" prom <<JSON
  "model": $(tiny_model),
  "pseudo": {"steps": $PSEUDO},
  "train": {"steps": $STEPS, "batch_size": 4, "grad_accum": 2, "eval_every": 8, "seed": 7},
  "checkpoint": {"every": 12, "keep": 2}
JSON

export M6_TEST_STEP_DELAY_MS=200
start_daemon "$T/s" --metrics-listen "127.0.0.1:$PORT"
suite_step_delay  # the suite's delay (lib.sh) for the m6d started next
$PROM fetch "$URL/metrics" >"$T/idle.txt" || fail "GET /metrics of an idle m6d"
promtool check metrics <"$T/idle.txt" >"$T/promtool.log" 2>&1 || fail "promtool (idle): $(cat "$T/promtool.log")"

t_submit=$EPOCHREALTIME
R=$(ctl submit "$T/spec.json")
wait_step "$R" 2
$PROM fetch "$URL/metrics" >"$T/run.txt" || fail "GET /metrics during the run"
promtool check metrics <"$T/run.txt" >"$T/promtool.log" 2>&1 || fail "promtool (running): $(cat "$T/promtool.log")"
grep -q "^m6_step_duration_seconds_bucket{run=\"$R\",name=\"prom\",node=\"[^\"]*\",phase=\"pseudo\",le=\"0.25\"}" "$T/run.txt" \
    || fail "no step-duration histogram of run $R: $(grep step_duration "$T/run.txt" | head -3)"

# Bad requests: answered, and the control socket goes on answering
# meanwhile, as does /metrics, while a client sits on an unfinished request.
$PROM slow 127.0.0.1 "$PORT" 4 &
SLOW=$!
nap 0.3
for c in "/nope GET 404" "/metrics POST 405" "/metrics PUT 405" "/api/runs/x GET 404" \
         "/metrics GET 200" "/ GET 200"; do
    set -- $c
    got=$($PROM http "$URL$1" "$2")
    [ "$got" = "$3" ] || fail "$2 $1: $got, want $3"
done
got=$($PROM http "$URL/metrics" GET 40000)
[ "$got" = 431 ] || fail "GET /metrics with 40 KB of headers: $got, want 431"
t0=$(date +%s%N)
ctl list >/dev/null || fail "m6ctl list while HTTP clients misbehave"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$ms" -lt 3000 ] || fail "m6ctl list took $ms ms while a client held an unfinished HTTP request"
kill "$SLOW" 2>/dev/null || true; wait "$SLOW" 2>/dev/null || true
ctl status 999 >/dev/null 2>&1 && fail "status of run 999 succeeded"

# 50 scrapes while it trains
mkdir "$T/scrapes"
$PROM scrape "$URL/metrics" 50 0.1 "$T/scrapes" "$TOKENS_PER_STEP" >"$T/scrape.out" 2>&1 \
    || fail "scrapes: $(cat "$T/scrape.out")"
log "$(cat "$T/scrape.out")"
[ "$(field "$R" state)" = running ] || log "note: the run ended during the scrapes"
wait_state "$R" completed 120
t_done=$EPOCHREALTIME

$PROM fetch "$URL/metrics" >"$T/end.txt" || fail "GET /metrics after the run"
promtool check metrics <"$T/end.txt" >"$T/promtool.log" 2>&1 || fail "promtool (completed): $(cat "$T/promtool.log")"
get() { $PROM get "$T/end.txt" "$@"; }
L="run=$R"
[ "$(get m6_steps_total $L)" = "$STEPS.0" ] || fail "m6_steps_total: $(get m6_steps_total $L), want $STEPS"
[ "$(get m6_steps_total $L phase=pseudo)" = "$PSEUDO.0" ] || fail "pseudo steps: $(get m6_steps_total $L phase=pseudo)"
[ "$(get m6_run_step $L)" = "$(field "$R" step).0" ] || fail "m6_run_step $(get m6_run_step $L) vs status step $(field "$R" step)"
[ "$(get m6_tokens_total $L)" = "$((STEPS * TOKENS_PER_STEP)).0" ] \
    || fail "m6_tokens_total: $(get m6_tokens_total $L), want $STEPS * $TOKENS_PER_STEP"
[ "$(get m6_run_phase $L phase=real)" = 1.0 ] || fail "m6_run_phase real: $(get m6_run_phase $L phase=real)"
count=$(get m6_step_duration_seconds_count $L)
sum=$(get m6_step_duration_seconds_sum $L)
le010=$(get m6_step_duration_seconds_bucket $L le=0.1)
le025=$(get m6_step_duration_seconds_bucket $L le=0.25)
log "step duration: sum $sum s over $count steps; <= 0.1 s: $le010, <= 0.25 s: $le025"
[ "$count" = "$STEPS.0" ] || fail "histogram count $count, want $STEPS"
python3 - "$sum" "$count" "$le010" "$le025" "$(python3 -c "print($t_done - $t_submit)")" <<'PY' || fail "step-duration histogram (sum $sum count $count le0.1 $le010 le0.25 $le025)"
import sys
s, n, le010, le025, wall = map(float, sys.argv[1:])
# Bounds that hold at any speed: every step sleeps 0.2 s (a floor), the
# steps happened between the test's submit and its seeing the run
# completed (a ceiling: seconds, not ms), and each step past 0.25 s adds
# at least 0.05 s to the sum beyond the floor, so the buckets must agree
# with the sum.
assert 0.2 * n <= s <= wall, "sum %.3f s of %d steps, want within [%.1f, %.3f]" % (s, n, 0.2 * n, wall)
assert le010 == 0, "%d steps under 0.1 s" % le010
assert le010 <= le025 <= n, "buckets not cumulative: %d, %d of %d" % (le010, le025, n)
assert n - le025 <= (s - 0.2 * n) / 0.05 + 1e-6, \
    "%d steps over 0.25 s, but the sum leaves room for %.1f" % (n - le025, (s - 0.2 * n) / 0.05)
PY
hello=$(get m6_control_requests_total type=hello status=ok)
[ -n "$hello" ] && python3 -c "assert $hello >= 5" || fail "hello requests counted: '$hello'"
[ "$(get m6_control_requests_total type=status status=not_found)" = 1.0 ] \
    || fail "status not_found counted: '$(get m6_control_requests_total type=status status=not_found)'"
[ -n "$(get m6_http_requests_total code=405)" ] || fail "405s not counted"

# a port in use: refused, naming it, before the state is touched
rc=0; "$M6D" --state-dir "$T/s2" --metrics-listen "127.0.0.1:$PORT" 2>"$T/s2.err" || rc=$?
[ "$rc" = 1 ] || fail "second m6d on port $PORT: exit $rc, want 1"
grep -q "port $PORT is in use" "$T/s2.err" || fail "second m6d does not name the port: $(cat "$T/s2.err")"
[ ! -e "$T/s2/m6.db" ] || fail "second m6d made m6.db before failing"
for bad in "127.0.0.1:0" "127.0.0.1" "nosuchhost.invalid:9464"; do
    rc=0; "$M6D" --state-dir "$T/s3" --metrics-listen "$bad" 2>"$T/s3.err" || rc=$?
    [ "$rc" != 0 ] && grep -q "metrics-listen" "$T/s3.err" || fail "--metrics-listen $bad: exit $rc: $(cat "$T/s3.err")"
done
ctl list >/dev/null || fail "first m6d stopped answering"

# a restart: counters from 0 under a new start time
t_start=$(get process_start_time_seconds)
stop_daemon
nap 1
start_daemon "$T/s" --metrics-listen "127.0.0.1:$PORT"
$PROM fetch "$URL/metrics" >"$T/end.txt" || fail "GET /metrics after the restart"
python3 -c "assert $(get process_start_time_seconds) > $t_start" || fail "process_start_time_seconds did not move"
[ -z "$(get m6_steps_total)" ] || fail "steps counted again after the restart: $(get m6_steps_total)"
stop_daemon
echo "ok prometheus (mean step $(python3 -c "print(round($sum / $count, 4))") s)"
