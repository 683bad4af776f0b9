#!/usr/bin/env bash
# local_files.sh — m6 on a shared host, where other local users can plant
# files: a FIFO given where a file belongs is refused at once, naming it (a
# pool thread that opened it would hang until a writer came); the state
# dir's lock file cannot be held by a group member who may read the state
# dir (a shared flock on it kept m6d from starting); a symbolic link
# planted under a temporary name of `m6ctl data prepare` is not followed.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
start_daemon "$T/s"

# --- a FIFO as init.from's meta.json and as its model.safetensors ---------
mkdir -p "$T/init1" "$T/init2"
mkfifo "$T/init1/meta.json"
printf '{"n_slots": 2, "slot_of": [0, 1]}\n' >"$T/init2/meta.json"
mkfifo "$T/init2/model.safetensors"
for k in 1 2; do
    write_spec "$T/fifo$k.json" "fifo$k" 20 0 "\"init\": {\"from\": \"$T/init$k\"}"
    t0=$(date +%s%N)
    rc=0
    timeout 10 "$M6CTL" --socket "$SOCK" submit "$T/fifo$k.json" \
        >"$T/fifo$k.out" 2>"$T/fifo$k.err" || rc=$?
    [ "$rc" != 0 ] || fail "a FIFO in init.from ($T/init$k) was accepted: $(cat "$T/fifo$k.out")"
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "$rc" != 124 ] || fail "submit with a FIFO in init.from hung (killed after 10 s)"
    [ "$ms" -lt 1000 ] || fail "submit with a FIFO in init.from took $ms ms, want < 1000"
    grep -q "is a FIFO, not a regular file" "$T/fifo$k.err" \
        || fail "the refusal does not name the FIFO: $(cat "$T/fifo$k.err")"
    log "FIFO init.from ($k) refused in $ms ms: $(cat "$T/fifo$k.err")"
done
# init.from a FIFO itself: named as such
mkfifo "$T/initfifo"
write_spec "$T/fifo3.json" fifo3 20 0 "\"init\": {\"from\": \"$T/initfifo\"}"
rc=0
timeout 10 "$M6CTL" --socket "$SOCK" submit "$T/fifo3.json" >"$T/fifo3.out" 2>"$T/fifo3.err" || rc=$?
[ "$rc" = 1 ] || fail "init.from a FIFO: exit $rc, want 1: $(cat "$T/fifo3.out" "$T/fifo3.err")"
grep -qF "init.from: $T/initfifo is a FIFO, not a directory" "$T/fifo3.err" \
    || fail "init.from a FIFO: the refusal does not name it: $(cat "$T/fifo3.err")"
# m6d answers the next command: no pool thread is stuck on the FIFO
ctl list >/dev/null || fail "m6d does not answer after the FIFO submits"
kill -0 "$DAEMON_PID" || fail "m6d died"

# --- a FIFO where m6ctl reads a file: refused at once, as plan refuses it --
mkfifo "$T/spec.fifo"
# fifo_refused WHAT CMD...: CMD (an m6ctl command given the FIFO) exits 1
# within 10 s naming the FIFO as such
fifo_refused() {
    local what=$1 rc=0
    shift
    timeout 10 "$@" >"$T/fifo.out" 2>"$T/fifo.err" || rc=$?
    [ "$rc" != 124 ] || fail "$what of a FIFO hung (killed after 10 s)"
    [ "$rc" = 1 ] || fail "$what of a FIFO: exit $rc, want 1: $(cat "$T/fifo.out" "$T/fifo.err")"
    grep -qF "$T/spec.fifo is a FIFO, not a regular file" "$T/fifo.err" \
        || fail "$what of a FIFO: the refusal does not name it: $(cat "$T/fifo.err")"
}
fifo_refused submit "$M6CTL" --socket "$SOCK" submit "$T/spec.fifo"
fifo_refused plan "$M6CTL" plan "$T/spec.fifo"
fifo_refused "plan --daemon" "$M6CTL" --socket "$SOCK" plan --daemon "$T/spec.fifo"
fifo_refused "import llmc" "$M6CTL" import llmc "$T/spec.fifo" --out "$T/imported"
fifo_refused "data prepare" "$M6CTL" data prepare --out "$T/prepared" "$T/spec.fifo"
log "a FIFO given to submit, plan, import and data prepare: refused"

# --- m6.db a FIFO: m6d refuses to start, naming it -------------------------
mkdir "$T/fifodb"
mkfifo "$T/fifodb/m6.db"
rc=0
timeout 10 "$M6D" --state-dir "$T/fifodb" --threads 1 2>"$T/fifodb.log" || rc=$?
[ "$rc" != 124 ] || fail "m6d with m6.db a FIFO hung (killed after 10 s)"
[ "$rc" != 0 ] || fail "m6d started with m6.db a FIFO"
grep -qF "$T/fifodb/m6.db is a FIFO, not a regular file" "$T/fifodb.log" \
    || fail "m6d with m6.db a FIFO does not say so: $(tail -n 3 "$T/fifodb.log")"
log "m6.db a FIFO: m6d exits $rc, naming it"

# --- the lock file: 0600 --------------------------------------------------
mode=$(stat -c %a "$T/s/m6d.lock")
[ "$mode" = 600 ] || fail "m6d.lock has mode $mode, want 600"
stop_daemon
chmod 0640 "$T/s/m6d.lock"   # as an older m6d left it
start_daemon "$T/s"
mode=$(stat -c %a "$T/s/m6d.lock")
[ "$mode" = 600 ] || fail "m6d did not make an old 0640 m6d.lock 0600 (mode $mode)"
stop_daemon

# a state dir shared with a group (--group: the unit's Group=, whose
# members may read the state dir): a member cannot hold the lock. Needs
# root, to act as that member (nobody:nogroup). m6d makes its socket's
# directory (here the state dir) 02750 with --group's group, or its own
# group without one: the member must reach the lock file for this case
# to show anything, so that is checked first.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null && command -v flock >/dev/null \
   && getent group nogroup >/dev/null && id nobody >/dev/null 2>&1; then
    chmod 0711 "$T"
    G=$T/g
    mkdir "$G"
    chgrp nogroup "$G"
    chmod 2750 "$G"
    member() { runuser -u nobody -g nogroup -- "$@"; }
    start_daemon "$G" --group nogroup
    stop_daemon
    ls -ld "$G" "$G/m6d.lock" >&2
    member ls "$G" >/dev/null 2>"$T/member.err" \
        || fail "the group member cannot list the state dir, so the lock case proves nothing: $(cat "$T/member.err")"
    # a group member opens the lock read-only and holds a shared flock
    member flock -s -n "$G/m6d.lock" sleep 30 2>"$T/flock.err" &
    FL=$!
    nap 0.5
    if kill -0 "$FL" 2>/dev/null; then
        log "a group member holds a shared flock on m6d.lock"
    else
        log "the group member could not lock m6d.lock: $(cat "$T/flock.err")"
    fi
    start_daemon "$G" --group nogroup  # fails the test when m6d cannot start
    stop_daemon
    kill "$FL" 2>/dev/null || true
    wait "$FL" 2>/dev/null || true
else
    log "not root (or no runuser/flock/nobody): the group-member lock case is not run"
fi

# --- data prepare does not follow a link planted at a temporary name -----
mkdir -p "$T/out"
echo "precious" >"$T/victim"
ln -s "$T/victim" "$T/out/train_000000.bin.tmp"
ln -s "$T/victim" "$T/out/val_000000.bin.tmp"
"$M6CTL" data prepare --out "$T/out" --val-fraction 0.05 "$FORTUNES" \
    >"$T/prep2.out" 2>"$T/prep2.err" || fail "data prepare: $(cat "$T/prep2.err")"
[ "$(cat "$T/victim")" = precious ] \
    || fail "data prepare wrote through a planted symbolic link into $T/victim"
cmp -s "$T/out/train_000000.bin" "$T/data/train_000000.bin" \
    || fail "the shards written beside the planted links differ from a clean prepare"
ls "$T/out" | has '\.tmp-' && fail "data prepare left temporary files: $(ls "$T/out")"
echo "local_files: ok"
