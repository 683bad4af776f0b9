# lib.sh — helpers for the integration tests: a real m6d, real m6ctl, real
# SQLite and real text (fortunes). Sourced by each test; M6D and M6CTL come
# from meson (tests/integration/meson.build).
set -euo pipefail

: "${M6D:?set M6D to the m6d binary}"
: "${M6CTL:?set M6CTL to the m6ctl binary}"
FORTUNES=${FORTUNES:-/usr/share/games/fortunes}
command -v jq >/dev/null || { echo "FAIL: jq not installed (Debian: jq; .ci/setup installs it)" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/m6-it.XXXXXX")
# nap SECONDS: sleep without starting a process. The waits below poll every
# few tens of ms, and a start of /usr/bin/sleep costs ~10 ms of CPU on the
# suite's VMs (process starts are their dearest syscalls): nap times out a
# read on a FIFO that no one writes, in bash itself.
mkfifo "$T/nap"
exec {NAP_FD}<>"$T/nap"
nap() { read -rt "$1" -u "$NAP_FD" _ || true; }
# backoff VAR: naps VAR ms (the caller's variable, set to the first wait
# before its loop), then makes the next nap half as long again, 100 ms at
# most: a wait that ends soon sees it at once, a long one polls (starts a
# process) a few times a second, not fifty.
backoff() {
    local -n ms_=$1
    local s
    printf -v s '%d.%03d' $((ms_ / 1000)) $((ms_ % 1000))
    nap "$s"
    ms_=$((ms_ * 3 / 2 > 100 ? 100 : ms_ * 3 / 2))
}
DAEMON_PID=
declare -A M6D_PIDS  # name -> pid of every m6d start_m6d started
cleanup_() {
    touch "$T/stop-reader"  # ends any background reader loop
    local j n
    for j in $(jobs -p); do kill "$j" 2>/dev/null || true; done
    for n in "${!M6D_PIDS[@]}"; do kill -9 "${M6D_PIDS[$n]}" 2>/dev/null || true; done
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -9 "$DAEMON_PID" 2>/dev/null || true
    fi
    if [ "${KEEP:-0}" = 1 ] || [ "${FAILED:-0}" = 1 ]; then
        echo "# kept $T" >&2
    else
        rm -rf "$T"
    fi
}
trap cleanup_ EXIT
trap 'FAILED=1' ERR

# The suite's speed knobs (docs: how to run the suite slowed, fast and
# contended). M6_TEST_STEP_DELAY_MS=N, inherited by every m6d the test
# starts, makes each training step N ms longer (runner.c's test hook); a
# test that sets its own delay for one daemon puts the suite's back after
# (SUITE_STEP_DELAY_MS). M6_TEST_BUSY=N runs N busy loops beside the test
# for its lifetime (each ends by itself after 900 s at most).
SUITE_STEP_DELAY_MS=${M6_TEST_STEP_DELAY_MS:-}
if [ "${M6_TEST_BUSY:-0}" -gt 0 ]; then
    for _ in $(seq 1 "$M6_TEST_BUSY"); do
        timeout 900 sh -c 'while :; do :; done' &
    done
fi
# suite_step_delay: the suite's step delay back in the environment (after
# a test set its own for one daemon)
suite_step_delay() {
    if [ -n "$SUITE_STEP_DELAY_MS" ]; then
        export M6_TEST_STEP_DELAY_MS=$SUITE_STEP_DELAY_MS
    else
        unset M6_TEST_STEP_DELAY_MS
    fi
}

log() { echo "# $*" >&2; }
fail() { FAILED=1; echo "FAIL: $*" >&2; for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done; exit 1; }

ctl() { "$M6CTL" --socket "$SOCK" "$@"; }
# polled CMD...: CMD with LeakSanitizer's check at exit off, for the
# commands a wait repeats (field, node_field, the loops of wait_for,
# wait_m6d, wait_state): in the sanitized pass each such m6ctl exit's leak
# check costs more than the call itself (60 ms of 90 here), and a wait
# makes hundreds. AddressSanitizer still checks them; the tests' own m6ctl
# calls of the same requests keep the leak check.
polled() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$@"; }

# jqr FILTER [jq options]: jq -r on stdin, with scalar_ defined (a value as
# one line: "" for null, objects and arrays as JSON). jq, not a Python
# start (a third of a second here) in every poll of a wait.
jqr() {
    local f=$1; shift
    jq -r "$@" 'def scalar_: if . == null then "" elif type == "object" or type == "array"
        then tojson else . end; '"$f"
}
# since T0: seconds since T0 (an $EPOCHREALTIME), two decimals
since() {
    local us=$((${EPOCHREALTIME//[.,]/} - ${1//[.,]/}))
    printf '%d.%02d\n' $((us / 1000000)) $((us % 1000000 / 10000))
}
# le A B: whether the number A <= B (decimals allowed)
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

# prepare_data DIR: shards from the fortunes text (once per test).
prepare_data() {
    [ -d "$FORTUNES" ] || { echo "SKIP: no $FORTUNES"; exit 77; }
    "$M6CTL" data prepare --out "$1" --val-fraction 0.05 "$FORTUNES" \
        >"$T/prepare.out" 2>"$T/prepare.err" || fail "data prepare: $(cat "$T/prepare.err")"
}

# write_token FILE [BYTES]: a fresh random token of BYTES (32) bytes, in
# hex, readable by its owner only (m6d --token-file: not readable by others)
write_token() {
    head -c "${2:-32}" /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
    chmod 600 "$1"
}

# tiny_model [N_LAYER [MEMBERS]]: the tests' tiny model as a JSON object:
# V 256, C 32 in 2 heads, T 32, N_LAYER blocks (2 by default), and MEMBERS
# (e.g. a "moe" member) added inside.
tiny_model() {
    echo "{\"vocab_size\": 256, \"n_layer\": ${1:-2}, \"n_embd\": 32, \"n_head\": 2, \"seq_len\": 32${2:+, $2}}"
}

# spec_file FILE NAME < MEMBERS: the spec named NAME training on
# prepare_data's shards in $T/data, the rest of its members (model, pseudo,
# train, ...: JSON text, "key": value lines separated by commas) read from
# stdin, written to FILE.
spec_file() {
    {
        printf '{\n  "name": "%s",\n' "$2"
        printf '  "data": {"train": "%s", "val": "%s"},\n' \
            "$T/data/train_*.bin" "$T/data/val_*.bin"
        cat
        printf '}\n'
    } >"$1"
}

# write_spec FILE NAME STEPS PSEUDO_STEPS [extra top-level JSON members]
# M6_TEST_MODEL (a JSON object) replaces the model, e.g. a tinier one for
# steps at their fastest (docs: how to run the suite slowed, fast and
# contended); a test that checks sizes of its own model may not pass then.
write_spec() {
    spec_file "$1" "$2" <<JSON
  "model": ${M6_TEST_MODEL:-$(tiny_model)},
  "pseudo": {"steps": $4},
  "train": {"steps": $3, "batch_size": 4, "eval_every": 10, "seed": 7},
  "checkpoint": {"every": ${CKPT_EVERY:-10}, "keep": 3}${5:+,
  $5}
JSON
}

# start_m6d NAME|DIR [m6d args...]: one m6d in the background, the only
# way the tests start a long-lived m6d. State dir DIR (an absolute path) or
# $T/NAME; its stderr appended to $T/m6d-NAME.log (NAME: DIR's last part);
# its pid in M6D_PIDS[NAME] and M6D_PID; cleanup_ kills it. Does not wait
# for its socket (wait_m6d). Arguments always given: --threads 1
# --log-level info, then $M6D_ARGS (word-split; e.g. --node-timeout), then
# the caller's. M6D_PREFIX (word-split) runs before m6d (e.g. `ip netns
# exec NS`, `setpriv ...`); M6D_UMASK sets its umask. With ULIMIT set
# (ulimit's arguments, e.g. "-n 64", or "-S -n 64" for the soft limit
# only), m6d starts under it. With M6D_VALGRIND=1, m6d runs under valgrind
# memcheck (its report in $T/valgrind-PID.log; any error, or a definite or
# indirect leak, makes m6d's exit status 42).
M6D_WRAP=
if [ "${M6D_VALGRIND:-0}" = 1 ]; then
    command -v valgrind >/dev/null || { echo "SKIP: no valgrind"; exit 77; }
    # OMP_WAIT_POLICY set: m6d does not re-exec itself to set it (the new
    # image would run outside valgrind)
    M6D_WRAP="env OMP_WAIT_POLICY=passive valgrind --log-file=$T/valgrind-%p.log --error-exitcode=42 \
--leak-check=full --show-leak-kinds=definite,indirect \
--errors-for-leak-kinds=definite,indirect --num-callers=30"
fi
start_m6d() {
    local name=$1 dir=$1; shift
    case $dir in /*) name=$(basename "$dir") ;; *) dir=$T/$name ;; esac
    (
        if [ -n "${ULIMIT:-}" ]; then ulimit ${ULIMIT}; fi
        if [ -n "${M6D_UMASK:-}" ]; then umask "$M6D_UMASK"; fi
        # shellcheck disable=SC2086
        exec ${M6D_PREFIX:-} $M6D_WRAP "$M6D" --state-dir "$dir" --threads 1 --log-level info \
            ${M6D_ARGS:-} "$@"
    ) 2>>"$T/m6d-$name.log" &
    M6D_PID=$!
    M6D_PIDS[$name]=$M6D_PID
}

# wait_listen NAME [TRIES]: until m6d NAME (start_m6d's name: log
# $T/m6d-NAME.log, socket $T/NAME/m6d.sock) has logged the TCP port it
# listens on and answers on its socket (TRIES polls 50 ms apart, 100 by
# default); sets PORT, or fails the test.
wait_listen() {
    local name=$1 tries=${2:-100}
    PORT=
    for _ in $(seq 1 "$tries"); do
        PORT=$(grep -o 'cluster.listen addr=127.0.0.1:[0-9]*' "$T/m6d-$name.log" |
            sed 's/.*://') || true
        [ -n "$PORT" ] && "$M6CTL" --socket "$T/$name/m6d.sock" list >/dev/null 2>&1 &&
            return 0
        nap 0.05
    done
    fail "m6d $name did not log its cluster port (or answer on its socket)"
}

# free_port: a TCP port on 127.0.0.1, outside the ephemeral range (a
# connection's own port cannot take it while its daemon is down), free
# now: for a coordinator that restarts on the same address. Fails the
# test when none is found.
free_port() {
    local p
    p=$(python3 -c '
import random, socket
for _ in range(200):
    p = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()')
    [ -n "$p" ] || fail "no free port"
    echo "$p"
}

# node_field HOSTNAME KEY: the node's KEY in `m6ctl nodes --json` of the
# coordinator started as start_m6d c ("" when there is no such node)
node_field() {
    polled "$M6CTL" --socket "$T/c/m6d.sock" nodes --json \
        | jqr 'map(select(.hostname == $h))[0] // {} | .[$k] | scalar_' --arg h "$1" --arg k "$2"
}
# wait_node HOSTNAME STATE SECONDS: until the node is in STATE there;
# prints the seconds it took, or fails the test
wait_node() {
    local t0=$EPOCHREALTIME s=
    while :; do
        s=$(node_field "$1" state)
        [ "$s" = "$2" ] && { since "$t0"; return 0; }
        le "$3" "$(since "$t0")" && break
        nap 0.05
    done
    fail "node $1: state '$s', want $2 within $3 s"
}

# wait_m6d SOCKET PID [WHAT]: until m6d answers on SOCKET (5 s; 60 s under
# valgrind); PID exiting first fails the test, naming WHAT and its log.
wait_m6d() {
    local sock=$1 pid=$2 what=${3:-m6d} tries=100
    [ -z "$M6D_WRAP" ] || tries=1200
    for _ in $(seq 1 $tries); do
        if polled "$M6CTL" --socket "$sock" list >/dev/null 2>&1; then return 0; fi
        kill -0 "$pid" 2>/dev/null || fail "$what exited at start"
        nap 0.05
    done
    fail "$what did not answer on $sock within $((tries / 20)) s"
}

# start_daemon STATE_DIR [extra args]: the test's one m6d (DAEMON_PID,
# SOCK = STATE_DIR/m6d.sock), started by start_m6d; waits for its socket.
start_daemon() {
    local dir=$1; shift
    SOCK=$dir/m6d.sock
    start_m6d "$dir" "$@"
    DAEMON_PID=$M6D_PID
    wait_m6d "$SOCK" "$DAEMON_PID"
}

stop_daemon() {  # SIGTERM and wait; asserts exit 0
    kill -TERM "$DAEMON_PID"
    local rc=0
    wait "$DAEMON_PID" || rc=$?
    DAEMON_PID=
    if [ "$rc" != 0 ] && [ -n "$M6D_WRAP" ]; then
        grep -hE "ERROR SUMMARY|definitely lost|indirectly lost" "$T"/valgrind-*.log >&2 || true
        fail "m6d exited $rc after SIGTERM under valgrind (42: memcheck found errors or leaks; $T/valgrind-*.log)"
    fi
    [ "$rc" = 0 ] || fail "m6d exited $rc after SIGTERM"
    if [ -n "$M6D_WRAP" ]; then
        log "valgrind: $(grep -h "ERROR SUMMARY" "$T"/valgrind-*.log | sed 's/==[0-9]*== //' | tail -n 1)"
    fi
}

kill9_daemon() {
    kill -9 "$DAEMON_PID"
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=
}

field() {  # field RUN KEY -> value from status --json ("" for null)
    polled ctl status "$1" --json | jqr '.[$k] | scalar_' --arg k "$2"
}

# run_state RUN: the run's last state in one line, from the state
# database (what a failing wait prints)
run_state() {
    db "$(dirname "$SOCK")" "select 'state=' || state || ' phase=' || phase || ' step=' || step
        || '/' || total_steps || coalesce(' error=' || error, '') from runs where id=$1" 2>/dev/null \
        || echo "(state database unreadable)"
}

# wait_for WHAT TMO CMD...: runs CMD until it succeeds (backoff between
# tries), at most TMO s. On timeout the test fails naming WHAT, CMD's last
# output (what it saw instead) and, with WAIT_RUN set, that run's last
# state (run_state).
wait_for() {
    local what=$1 tmo=$2 out= end ms=10
    shift 2
    end=$((SECONDS + tmo))
    while :; do
        out=$(polled "$@" 2>&1) && return 0
        [ "$SECONDS" -lt "$end" ] || break
        backoff ms
    done
    fail "waited ${tmo}s for $what; saw instead: '${out:-nothing}'${WAIT_RUN:+; run $WAIT_RUN: $(run_state "$WAIT_RUN")}"
}

# has [GREP OPTIONS] PATTERN: whether a line of stdin matches, as grep -q
# but reading all of stdin: grep -q stops at the first match, and the
# writer it leaves behind (tail of a long log, m6ctl events) dies of
# SIGPIPE, which pipefail turns into a failure although the line was there.
has() {
    grep -c "$@" >/dev/null
}

# log_has FILE ERE [N]: FILE has at least N (1) lines matching ERE; else
# prints how many (for wait_for)
log_has() {
    local c
    c=$(grep -Ec -- "$2" "$1" 2>/dev/null || true)
    [ "${c:-0}" -ge "${3:-1}" ] && return 0
    echo "${c:-0} lines of $1 match '$2', want ${3:-1}"
    return 1
}

# wait_state RUN STATE [timeout s]: until the run is in STATE; a run that
# reaches another final state first fails at once
wait_state() {
    local run=$1 want=$2 tmo=${3:-60} s= end ms=10
    end=$((SECONDS + tmo))
    while [ "$SECONDS" -le "$end" ]; do
        s=$(field "$run" state)
        [ "$s" = "$want" ] && return 0
        case $s in completed | failed | stopped)
            fail "run $run: wanted state $want, it ended $s instead; last state: $(run_state "$run")" ;;
        esac
        backoff ms
    done
    fail "run $run: wanted state $want within ${tmo}s, saw $s; last state: $(run_state "$run")"
}

# wait_step RUN N: until step >= N. Polls the state database (one sqlite3
# process, a few ms) rather than `field` (m6ctl and jq), with backoff. The
# step is the one m6d commits at the end of each step. A run that ends
# (completed, failed, stopped) before step N fails at once: a test that
# must act while the run is alive keeps it alive by design (a step count it
# cannot finish, or the boundary hold hook), never by racing it.
wait_step() {
    local run=$1 n=$2 tmo=${3:-60} s= st= end ms=5
    end=$((SECONDS + tmo))
    while [ "$SECONDS" -le "$end" ]; do
        IFS='|' read -r s st < <(db "$(dirname "$SOCK")" "select step, state from runs where id=$run") || true
        [ -n "$s" ] && [ "$s" -ge "$n" ] && return 0
        case $st in completed | failed | stopped)
            fail "run $run: wanted step >= $n, it ended first; last state: $(run_state "$run")" ;;
        esac
        backoff ms
    done
    fail "run $run: wanted step >= $n within ${tmo}s, saw step ${s:-?}; last state: $(run_state "$run")"
}

# events_has RUN ERE: a line of RUN's events matches ERE; else prints the
# events (for wait_for)
events_has() {
    local ev
    ev=$(ctl events "$1" 2>&1) || true
    grep -Eq -- "$2" <<<"$ev" && return 0
    echo "no event of run $1 matches '$2'; its events: $ev"
    return 1
}

# wait_event RUN ERE [timeout s]: until a line of RUN's events matches ERE
# (5 s by default)
wait_event() { wait_for "an event of run $1" "${3:-5}" events_has "$1" "$2"; }

# left_running_at RUN T0: the time (as $EPOCHREALTIME) at which m6d
# recorded RUN leaving running after T0: its first pause, paused.error,
# stop, failed or completed event at or after T0, from the events table
# (m6d's own clock, so the test's polling is not counted); empty if none
left_running_at() {
    ctl events "$1" --json | jqr '[.[] | select(.kind
        | IN("pause", "paused.error", "stop", "failed", "completed")) | .time
        | select(. >= $t0)] | min | scalar_' --argjson t0 "$2"
}

# within_ RUN T0 LIMIT WHAT: RUN left running (left_running_at) within
# LIMIT seconds of T0, taken at WHAT; the seconds into TOOK, else fails
within_() {
    local at
    at=$(left_running_at "$1" "$2")
    [ -n "$at" ] || fail "run $1 left running after $4 without an event saying so: $(ctl events "$1")"
    TOOK=$(awk -v a="$at" -v b="$2" 'BEGIN { printf "%.2f", a - b }')
    le "$TOOK" "$3" \
        || fail "run $1 left running ${TOOK} s after $4 (m6d's event time), want <= $3 s"
}

# wait_paused_within RUN T0 LIMIT WHAT: until RUN is paused (10 s at
# most), then requires that m6d paused it within LIMIT seconds of T0 (an
# $EPOCHREALTIME, taken at WHAT: "the cut", "kill -9"), by the time of
# the event that recorded it (within_); the seconds it took into TOOK
wait_paused_within() {
    local run=$1 t0=$2 limit=$3 what=$4
    for _ in $(seq 1 400); do
        [ "$(field "$run" state)" = paused ] && break
        nap 0.025
    done
    [ "$(field "$run" state)" = paused ] \
        || fail "run $run not paused 10 s after $what: $(field "$run" state)"
    within_ "$run" "$t0" "$limit" "$what"
}

# wait_gone PID SECONDS WHAT: process PID (WHAT, for the message) ends
# within SECONDS, else the test fails (it hung)
wait_gone() {
    for _ in $(seq 1 $(($2 * 20))); do
        kill -0 "$1" 2>/dev/null || return 0
        nap 0.05
    done
    kill -0 "$1" 2>/dev/null && fail "$3 still running $2 s after it was told to stop"
    return 0
}

# The step-boundary hold (runner.c's test hook): every m6d started with
# M6_TEST_HOLD_BOUNDARY=$HOLD_FILE in its environment waits at its step
# boundary while HOLD_FILE exists (log line test.hold; SIGTERM ends the
# wait). hold_boundary [nowait]: makes the runner hold at its next boundary
# and waits until it does, so the run is alive, whatever the speed of a
# step, for what the test does next (nowait: a paused run's runner holds
# only once a command wakes it). release_boundary: lets it go on.
HOLD_FILE=$T/hold
hold_boundary() {
    local lg before
    lg=$T/m6d-$(basename "$(dirname "$SOCK")").log
    before=$(grep -c 'test.hold' "$lg" || true)
    touch "$HOLD_FILE"
    [ "${1:-}" = nowait ] && return 0
    wait_for "the runner to hold at its step boundary (log line test.hold)" 20 \
        log_has "$lg" 'test.hold' $((before + 1))
}
release_boundary() { rm -f "$HOLD_FILE"; }
# hold_at_step N [nowait]: the runner holds at the first boundary after
# step N or later (the step count in HOLD_FILE), however fast the run
# trains: give it before the run can reach N (a short run could otherwise
# end between a wait_step and a hold_boundary). Waits for the hold as
# hold_boundary does; with nowait, wait_held does (after a submit or a
# resume that lets the run get there).
hold_at_step() {
    HOLD_LOG=$T/m6d-$(basename "$(dirname "$SOCK")").log
    HOLD_SEEN=$(grep -c 'test.hold' "$HOLD_LOG" 2>/dev/null || true)
    HOLD_STEP=$1
    echo "$1" >"$HOLD_FILE.tmp" && mv "$HOLD_FILE.tmp" "$HOLD_FILE"
    [ "${2:-}" = nowait ] || wait_held
}
wait_held() {
    wait_for "the runner to hold at the boundary after step $HOLD_STEP (log line test.hold)" 60 \
        log_has "$HOLD_LOG" 'test.hold' $((HOLD_SEEN + 1))
}

# pause_at_step RUN N: pauses RUN at the boundary after step N (held there
# while the pause is sent, so it lands then, whatever the speed of a step;
# the run must not be past N yet for it to be exactly N) and waits until it
# is paused
pause_at_step() {
    hold_at_step "$2"
    pause_held_ "$1" "$2"
}
pause_held_() {
    ctl pause "$1" >/dev/null || fail "pause of run $1 at step $2 refused"
    release_boundary
    wait_state "$1" paused
}

# submit_paused_at SPEC N: submits SPEC with the hold after step N given
# first (so a short run cannot pass N before the pause), pauses the run
# there and waits until it is paused; its id in RUN.
submit_paused_at() {
    hold_at_step "$2" nowait
    RUN=$(ctl submit "$1") || fail "submit of $1 refused"
    wait_held
    pause_held_ "$RUN" "$2"
}

# reference_losses STATE_DIR SPEC CSV [WHAT]: the uninterrupted run of SPEC
# on a fresh m6d in STATE_DIR, its loss curve (losses) into CSV; m6d is
# stopped again. WHAT names the run in a failure ("reference run").
reference_losses() {
    local r
    start_daemon "$1"
    r=$(ctl submit "$2")
    timeout "${WAIT:-300}" "$M6CTL" --socket "$SOCK" watch "$r" >/dev/null ||
        fail "${4:-reference run} did not complete"
    losses "$r" >"$3"
    stop_daemon
}

# start_coordinator NAME [M6D ARGS...]: m6d NAME as the coordinator on a
# free loopback port with $T/token (its boundary held by the test hook):
# SOCK is its socket, ADDR its HOST:PORT for --join.
start_coordinator() {
    local name=$1
    shift
    M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_m6d "$name" --role coordinator \
        --listen 127.0.0.1:0 --token-file "$T/token" "$@"
    SOCK=$T/$name/m6d.sock
    wait_listen "$name"
    ADDR=127.0.0.1:$PORT
}

# resume_after_kill9 DIR RUN STEPS REF_CSV WHAT: m6d in DIR was killed
# (kill -9) while RUN trained, before its step STEPS: sets K (the step the
# run had reached) and C (its newest checkpoint), restarts m6d there; the
# run resumes from C (its run.recover line) and ends with REF_CSV's
# losses digit for digit; else fails naming WHAT
resume_after_kill9() {
    local dir=$1 run=$2 steps=$3 ref=$4 what=$5
    K=$(db "$dir" "select step from runs where id=$run")
    C=$(db "$dir" "select max(step) from checkpoints where run=$run")
    [ "$K" -lt "$steps" ] || fail "$what: run finished before kill -9"
    start_daemon "$dir"
    ctl watch "$run" >/dev/null || fail "$what: the resumed run did not complete"
    same_losses "$run" "$ref" "$what: losses differ after kill -9 at $K"
    grep -q "run.recover run=$run step=$C" "$T/m6d-$(basename "$dir").log" \
        || fail "$what: did not resume from checkpoint $C"
}

# same_losses RUN REF_CSV WHAT: RUN's losses are REF_CSV's (as `losses`
# writes them, reference_losses), digit for digit; else fails with WHAT
# and the first lines of the difference
same_losses() {
    losses "$1" | diff "$2" - >"$T/diff" || fail "$3: $(head "$T/diff")"
}

# wait_paused_error RUN ERE: until the run is paused with an error matching
# ERE (a restart first shows the error of the life before); m6d stopping or
# the run failing on the way fails the test. Prints the error.
# resume_refused RUN ERE: `m6ctl resume RUN` must be refused (exit 1,
# the run stays paused) with a message matching ERE; prints the message.
resume_refused() {
    local out rc=0
    out=$(ctl resume "$1" 2>&1) || rc=$?
    [ "$rc" = 1 ] || fail "resume of run $1 (want refused, exit 1): exit $rc: $out"
    echo "$out" | has "run $1 could not resume, it stays paused: " \
        || fail "resume of run $1: refusal does not say it stays paused: '$out'"
    echo "$out" | has -E "$2" || fail "resume of run $1: '$out' does not match '$2'"
    [ "$(field "$1" state)" = paused ] || fail "run $1 not paused after a refused resume: $(field "$1" state)"
    echo "$out"
}

# resume_to_reference RUN WHAT: once the cause of a pause is fixed (WHAT),
# resume is taken, the run completes, and its losses are the uninterrupted
# reference's, $T/ref.csv (same_losses).
resume_to_reference() {
    ctl resume "$1" >/dev/null || fail "resume ($2)"
    ctl watch "$1" >/dev/null || fail "run $1 did not complete ($2)"
    same_losses "$1" "$T/ref.csv" "run $1's losses differ from the reference ($2)"
}

wait_paused_error() {
    local e= s=
    for _ in $(seq 1 600); do
        kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died (run $1)"
        s=$(field "$1" state)
        [ "$s" != failed ] || fail "run $1 failed, wanted paused: $(field "$1" error)"
        if [ "$s" = paused ]; then
            e=$(field "$1" error)
            echo "$e" | has -E "$2" && { echo "$e"; return 0; }
        fi
        nap 0.05
    done
    fail "run $1 did not pause with an error like '$2' within 30 s (state $s, error '$e'); last state: $(run_state "$1")"
}

# db STATE_DIR SQL: the test's own read queries. Read-only: a read-write
# sqlite3 connection, as it closes, tries to become the last one (to
# checkpoint the WAL) and for that instant makes other new readers fail
# with "database is locked" -- the harness must not cause that for the
# dashboard reader it tests (measured: 3-5 of ~1,100 reads failed next to a
# second plain reader, 0 next to a -readonly one). Writes: sqlite3 direct.
db() { sqlite3 -readonly -cmd '.timeout 5000' "$1/m6.db" "$2"; }

# losses RUN: the loss curve, bitwise (floats in their shortest round-trip
# form), without the timing columns.
losses() { ctl metrics "$1" --csv | cut -d, -f1-5,7; }

# losses_close A.csv B.csv N TOL [--same-first K] [--falls]: two runs'
# losses tables (losses RUN) have N rows each, every train loss finite,
# and the train losses differ by at most TOL (absolute, nats) row by row;
# --same-first K: the first K the same bits; --falls: A's last loss below
# its first. Prints the largest difference; exit 1 (after saying which
# assertion) when any of these does not hold.
losses_close() {
    python3 - "$@" <<'PY'
import csv, math, sys
fa, fb, n, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
opt = sys.argv[5:]
a, b = (list(csv.DictReader(open(f))) for f in (fa, fb))
assert len(a) == len(b) == n, (len(a), len(b), n)
la, lb = ([float(r['train_loss']) for r in x] for x in (a, b))
assert all(math.isfinite(v) for v in la + lb)
d = max(abs(x - y) for x, y in zip(la, lb))
if "--same-first" in opt:
    k = int(opt[opt.index("--same-first") + 1])
    assert la[:k] == lb[:k], (la[:k], lb[:k])
assert d <= tol, (d, tol, la, lb)
if "--falls" in opt:
    assert la[-1] < la[0], (la[0], la[-1])
print(f"# max |d loss| {d:.2e} over {n} steps; loss {la[0]:.4f} -> {la[-1]:.4f}")
PY
}

# lost_is RUN "RANK LOCAL_RANK RANKS HOSTNAME": RunInfo.lost of `m6ctl
# status RUN --json` names those ranks of the node HOSTNAME, by its id in
# `m6ctl nodes` too; the pause's reason (error) and the text status say
# so in words
lost_is() {
    local want got id
    read -r rank local ranks host <<<"$2"
    id=$(node_field "$host" id)
    want="$rank $local $ranks $host $id"
    got=$(ctl status "$1" --json | jqr '.lost // null
        | if . then "\(.rank) \(.local_rank) \(.ranks) \(.hostname) \(.node_id)" else "none" end')
    [ "$got" = "$want" ] || fail "run $1: lost ranks '$got', want '$want'"
    local words="rank $rank was lost (node $host, id $id, local rank $local)"
    [ "$ranks" -gt 1 ] && words="ranks $rank-$((rank + ranks - 1)) were lost (node $host, id $id, local ranks $local-$((local + ranks - 1)))"
    field "$1" error | has -F "$words" \
        || fail "run $1: the pause's reason does not say '$words': $(field "$1" error)"
    ctl status "$1" | has -E "^ *lost: +rank.*node $host \(id $id\)" \
        || fail "run $1: text status does not show the lost ranks: $(ctl status "$1")"
}

# rel_close A.csv B.csv TOL: two runs of ep_spec's 16 steps (losses RUN):
# same steps and phases, train and val losses and gradient norms within
# TOL relative; prints the largest difference
rel_close() {
    python3 - "$@" <<'PY'
import csv, math, sys
a = list(csv.reader(open(sys.argv[1])))
b = list(csv.reader(open(sys.argv[2])))
tol = float(sys.argv[3])
assert a[0] == b[0], (a[0], b[0])
h = a[0]
assert len(a) == len(b) == 17, ("rows", len(a), len(b))
worst = 0.0
for ra, rb in zip(a[1:], b[1:]):
    assert ra[:2] == rb[:2], ("step/phase", ra, rb)
    for c in (h.index("train_loss"), h.index("val_loss"),
              h.index("grad_norm")):
        if ra[c] in ("", "nan") and rb[c] in ("", "nan"):
            continue
        x, y = float(ra[c]), float(rb[c])
        assert math.isfinite(x) and math.isfinite(y), (ra, rb)
        d = abs(x - y) / abs(y)
        worst = max(worst, d)
        assert d <= tol, ("step", ra[0], h[c], x, y, d)
print(f"# worst relative difference {worst:.3g} over {len(a) - 1} steps")
PY
}

# The expert-parallel tests' model (ep_nodes, ep_stop): E = 4 experts in
# k = 2 prototypes, every block MoE, so at nodes.expert_parallel 2 each
# rank holds 2 of each MoE slot's 4 experts.
MOE='"moe": {"num_experts": 4, "prototypes": 2, "expert_hidden": 48}'
# ep_spec FILE NAME [NODES]: that model in 16 steps, the delink after 6, a checkpoint
# every 4, a validation pass every 4 (4 batches: whole ones on every rank
# at world 2 and 4); NODES the members of "nodes"
ep_spec() {
    local nodes=
    [ -z "${3:-}" ] || nodes=",
  \"nodes\": {$3}"
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 2 "$MOE"),
  "pseudo": {"steps": 6},
  "train": {"steps": 16, "batch_size": 4, "grad_accum": 4, "eval_every": 4,
            "eval_batches": 4, "seed": 7},
  "checkpoint": {"every": 4, "keep": 5}$nodes
JSON
}

# ep_setup: the start of an expert-parallel test on loopback nodes (TMO:
# seconds of --node-timeout and nodes.timeout): the data, the token,
# M6D_ARGS, and the specs one.json (one rank) and ep.json (world 2, P 2).
ep_setup() {
    M6D_ARGS="--node-timeout $TMO"
    prepare_data "$T/data"
    write_token "$T/token"
    ep_spec "$T/one.json" one
    ep_spec "$T/ep.json" ep "\"world_size\": 2, \"expert_parallel\": 2, \"timeout\": $TMO"
}
