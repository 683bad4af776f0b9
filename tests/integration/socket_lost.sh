#!/usr/bin/env bash
# socket_lost.sh — m6d's socket file removed under it (by hand, or by a
# cleaner of /tmp or /run): m6d binds the path again within a few seconds
# and says so, and a run it acknowledged goes on. A path that meanwhile
# holds something else is left alone: a regular file, or a socket another
# process listens on, which m6d's exit does not unlink either.
. "$(dirname "$0")/lib.sh"

wait_answer() {  # wait_answer SECONDS: m6ctl list answers again
    for _ in $(seq 1 $(( $1 * 10 ))); do
        ctl list >/dev/null 2>&1 && return 0
        nap 0.1
    done
    return 1
}

prepare_data "$T/data"
# The run is held at its boundary (lib.sh hold_boundary) while the socket
# comes and goes, so it is running through all of it however short its
# steps; released at the end, it completes.
CKPT_EVERY=500 write_spec "$T/s.json" lost 200 100
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE
start_daemon "$T/d"
LOG=$T/m6d-d.log
hold_at_step 5 nowait
R=$(ctl submit "$T/s.json") || fail "submit"
wait_held

# 1. removed: reachable again, said in the log
rm "$SOCK"
ctl list >/dev/null 2>&1 && fail "m6ctl reached m6d with no socket file"
wait_answer 8 || fail "m6d did not bind $SOCK again within 8 s"
[ "$(field "$R" state)" = running ] || fail "run $R is $(field "$R" state), want running through the loss"
grep -q "server.socket_restored .*socket=$SOCK" "$LOG" || fail "no server.socket_restored line"
[ "$(stat -c %a "$SOCK")" = 660 ] || fail "the new socket is mode $(stat -c %a "$SOCK"), want 660"

# 2. replaced by a regular file: left alone, logged once
echo keep >"$T/file"
mv -f "$T/file" "$SOCK"
# m6d looks at its socket path every 2 s (server.c PATH_CHECK_MS): the
# loss line, then two more looks that must not repeat it
WAIT_RUN=$R wait_for "the server.socket_lost line" 10 log_has "$LOG" "server.socket_lost .*socket=$SOCK"
nap 4.5
[ -f "$SOCK" ] && [ "$(cat "$SOCK")" = keep ] || fail "m6d touched the file put at $SOCK"
n=$(grep -c "server.socket_lost .*socket=$SOCK" "$LOG")
[ "$n" = 1 ] || fail "server.socket_lost logged $n times over 5 s, want once"
grep -q "server.socket_lost .*exists and is not a socket" "$LOG" || fail "the loss line does not say why"
kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died"
rm "$SOCK"
wait_answer 8 || fail "m6d did not bind $SOCK again after the file went"

# 3. another process's live socket there: not removed, not even at exit
rm "$SOCK"
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(8)
open(sys.argv[2], "w").close()
time.sleep(60)' "$SOCK" "$T/other.ready" &
OTHER=$!
for _ in $(seq 1 50); do [ -e "$T/other.ready" ] && break; nap 0.1; done
[ -e "$T/other.ready" ] || fail "the other listener did not start"
WAIT_RUN=$R wait_for "the loss line for another process's socket" 10 \
    log_has "$LOG" "server.socket_lost .*another m6d is listening there"
grep -q "server.socket_lost .*another m6d is listening there" "$LOG" \
    || fail "no loss line for a path another process listens on"
ino=$(stat -c %i "$SOCK")

# the acknowledged run went on through all this; then m6d stops cleanly
# (signal: no socket to reach it by) and leaves the other socket in place
stop_daemon
[ -S "$SOCK" ] && [ "$(stat -c %i "$SOCK")" = "$ino" ] || fail "m6d's exit removed another process's socket"
kill "$OTHER" 2>/dev/null || true
wait "$OTHER" 2>/dev/null || true
rm -f "$SOCK"
release_boundary
start_daemon "$T/d"
wait_state "$R" completed 120 || fail "run $R did not complete after the restart"
stop_daemon
echo "PASS: socket_lost"
