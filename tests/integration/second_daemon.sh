#!/usr/bin/env bash
# second_daemon.sh — a second m6d started on a state dir that a live m6d
# already serves must refuse before it touches the runs: it must not resume
# the live run, truncate its metrics or write checkpoints into its directory.
# Both with the same socket (refused, but only after the worker started) and
# with another --socket (not refused at all when this test was written).
# And one on another state dir whose socket is busy must not open its state.
. "$(dirname "$0")/lib.sh"

# m6d_refused LOG WHAT ARGS...: m6d with ARGS exits, not 0, within 10 s
# (124: it ran on, i.e. was not refused); its stderr appended to LOG.
m6d_refused() {
    local log=$1 what=$2 rc=0
    shift 2
    timeout 10 "$M6D" --threads 1 "$@" 2>>"$log" || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "$what: m6d exited $rc, want refused"
}

prepare_data "$T/data"
CKPT_EVERY=50 write_spec "$T/long.json" long 100000 0 '"device": {"threads": 1}'
start_daemon "$T/s"
R=$(ctl submit "$T/long.json")
wait_state "$R" running
wait_step "$R" 120  # a checkpoint exists, and metrics past it

for i in 1 2 3 4 5; do
    m6d_refused "$T/m6d-second.log" "second m6d (same socket)" --state-dir "$T/s"
done
m6d_refused "$T/m6d-second.log" "second m6d (other socket)" --state-dir "$T/s" \
    --socket "$T/other.sock"

grep -q 'run.recover\|run.restore\|checkpoint.saved' "$T/m6d-second.log" \
    && fail "a refused m6d resumed the live run: $(grep -m3 'run\.\|checkpoint' "$T/m6d-second.log")"
# An m6d on another state dir whose socket is the live one's: refused before
# it opens its state -- a fresh dir gets no m6.db, and a run left running
# in its own dir (killed m6d) is not taken up, so not trained or changed.
mkdir -p "$T/fresh"
m6d_refused "$T/m6d-fresh.log" "m6d on a busy socket" --state-dir "$T/fresh" \
    --socket "$T/s/m6d.sock"
grep -q "server.error" "$T/m6d-fresh.log" || fail "busy socket: no server.error: $(cat "$T/m6d-fresh.log")"
[ ! -e "$T/fresh/m6.db" ] || fail "m6d refused for a busy socket created $T/fresh/m6.db"
LIVE_PID=$DAEMON_PID LIVE_SOCK=$SOCK
start_daemon "$T/o"
O=$(ctl submit "$T/long.json")
wait_step "$O" 10
kill9_daemon
K=$(db "$T/o" "select step from runs where id=$O")
m6d_refused "$T/m6d-o2.log" "m6d (own state, busy socket)" --state-dir "$T/o" \
    --socket "$LIVE_SOCK"
grep -q 'run.recover\|checkpoint.saved' "$T/m6d-o2.log" \
    && fail "m6d refused for a busy socket took up its run: $(grep -m3 'run\.\|checkpoint' "$T/m6d-o2.log")"
[ "$(db "$T/o" "select step from runs where id=$O")" = "$K" ] || fail "run $O moved under a refused m6d"
DAEMON_PID=$LIVE_PID SOCK=$LIVE_SOCK

# --state-dir "" (an unset variable) is refused, not the default dir.
rc=0
HOME=$T/home "$M6D" --state-dir "" --socket "$T/e.sock" 2>"$T/e.err" || rc=$?
[ "$rc" = 2 ] || fail "m6d --state-dir \"\": exit $rc, want 2"
grep -q -- '--state-dir: want a path' "$T/e.err" || fail "empty --state-dir: $(cat "$T/e.err")"
[ ! -e "$T/home" ] || fail "m6d --state-dir \"\" created the default state dir"

# An m6.db this user may not write (root's, mode 0644, m6d as nobody): refused
# at the start with the file, the uid and what to check -- not served
# read-only, failing every write.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    chmod 711 "$T"  # nobody must reach $T/ro
    # the dir nobody's (it makes its lock and socket there), not mode 0777:
    # m6d refuses a state dir that others may write (access, issue 16)
    mkdir -p "$T/ro" && chown 65534 "$T/ro" && chmod 755 "$T/ro"
    sqlite3 "$T/ro/m6.db" 'pragma user_version=0'  # a root-owned m6.db
    chmod 644 "$T/ro/m6.db"
    rc=0
    timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \
        "$M6D" --state-dir "$T/ro" --socket "$T/ro/m6d.sock" 2>"$T/ro.err" || rc=$?
    [ "$rc" = 1 ] || fail "m6d on a read-only m6.db: exit $rc, want 1: $(cat "$T/ro.err")"
    grep -q "m6.db: m6d (uid 65534) may not write it" "$T/ro.err" || fail "read-only m6.db: $(cat "$T/ro.err")"
else
    log "not root or no setpriv: the read-only m6.db case is not run"
fi

gaps=$(db "$T/s" "select count(*) from metrics a where a.run=$R and a.step>1 and not exists
              (select 1 from metrics b where b.run=$R and b.step=a.step-1)")
[ "$gaps" = 0 ] || fail "the live run's metrics have $gaps gap(s) after a second m6d"
ctl stop "$R" >/dev/null
stop_daemon
echo "ok second_daemon"
