#!/usr/bin/env bash
# access.sh — who may drive m6d (issue 16, item 1), with real local users
# that the test creates and removes (root only; else it skips):
#   D  m6d's user (a member of group G, as the unit's Group= would make it)
#   M  a member of G          O  a user outside G
# m6d runs as D under umask 000: the socket is 0660 D:G, the state dir 02750
# D:G, m6.db 0640. Root and M may do everything; O cannot connect (mode
# 0660). With --group-read-only M may read (list, status) and a pause is
# refused with STATUS_PERMISSION_DENIED (11) naming M's uid, logged; M's
# frame header announcing 1 MiB is refused (5) from the header, before the
# body is read (read requests are small). On a
# socket that anyone may connect to (systemd-socket-activate's, made 0666
# as by a unit with SocketMode=0666) O is refused by SO_PEERCRED with 11 naming its uid, and
# the connection closed, also when its first bytes announce a 1 MiB frame
# (refused at the header, not after the body); m6d keeps serving root. Paths: run names with
# "..", "/", absolute paths are refused at submit (7) and unknown by
# status/stop/pause (6); a data glob through a symlink and ".." only reads;
# nothing is created outside the state dir, runs/ holds only run ids.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (creates local users)"; exit 77; }
for t in useradd userdel groupadd groupdel usermod setpriv; do
    command -v "$t" >/dev/null || { echo "SKIP: no $t"; exit 77; }
done
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 77; }
CLIENT=$(cd "$(dirname "$0")" && pwd)/accessclient.py

S=$$
G=m6g$S D=m6d$S M=m6m$S O=m6o$S
A=$(mktemp -d /tmp/m6-acc.XXXXXX)
acc_cleanup_() {
    [ -n "${SA_PID:-}" ] && kill "$SA_PID" 2>/dev/null
    [ -n "$DAEMON_PID" ] && kill -9 "$DAEMON_PID" 2>/dev/null
    # the test's users' processes (m6d as D under systemd-socket-activate),
    # by pid, then the users once those are gone (userdel refuses before)
    local u p
    for u in "$D" "$M" "$O"; do
        id "$u" >/dev/null 2>&1 || continue
        for p in $(pgrep -u "$u" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        for _ in $(seq 1 100); do pgrep -u "$u" >/dev/null || break; nap 0.05; done
        userdel "$u" 2>/dev/null || echo "# userdel $u failed" >&2
    done
    getent group "$G" >/dev/null && groupdel "$G" 2>/dev/null
    rm -rf "$A"
    cleanup_
}
trap acc_cleanup_ EXIT
groupadd "$G" || fail "groupadd $G"
useradd -M -U -s /usr/sbin/nologin -G "$G" "$D" || fail "useradd $D"
useradd -M -U -s /usr/sbin/nologin -G "$G" "$M" || fail "useradd $M"
useradd -M -U -s /usr/sbin/nologin "$O" || fail "useradd $O"
UM=$(id -u "$M") UO=$(id -u "$O")
# the users reach the binaries and the test's files
for p in "$M6D" "$M6CTL" "$CLIENT"; do
    setpriv --reuid="$O" --regid="$O" --clear-groups test -r "$p" \
        || { echo "SKIP: $p is not readable by other users"; exit 77; }
done

as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --init-groups "$@"; }
actl() { local u=$1; shift; as "$u" "$M6CTL" --socket "$SOCK" "$@"; }

chown "$D:$D" "$A"
chmod 0755 "$A"
prepare_data "$A/data"
chmod -R a+rX "$A/data"
CKPT_EVERY=1000 write_spec "$A/run.json" acc 2000 50 '"device": {"threads": 1}'
sed -i "s|$T/data/|$A/data/|g" "$A/run.json"
chmod a+r "$A/run.json"
touch "$T/marker"

# start_as_d ARGS...: m6d as D, under umask 000, state dir $A/st, log
# $T/m6d-st.log
start_as_d() {
    M6D_UMASK=000 M6D_PREFIX="setpriv --reuid=$D --regid=$D --init-groups" \
        start_daemon "$A/st" --group "$G" "$@"
}

# --- modes under umask 000, and full rights for root and a member
start_as_d
[ "$(stat -c '%a %U %G' "$SOCK")" = "660 $D $G" ] || fail "socket: $(stat -c '%a %U %G' "$SOCK"), want 660 $D $G"
[ "$(stat -c '%a %U %G' "$A/st")" = "2750 $D $G" ] || fail "state dir: $(stat -c '%a %U %G' "$A/st"), want 2750 $D $G"
[ "$(stat -c '%a %G' "$A/st/m6.db")" = "640 $G" ] || fail "m6.db: $(stat -c '%a %G' "$A/st/m6.db"), want 640 $G (the state dir's setgid group: members read it)"
ctl list >/dev/null || fail "root may not list"
R=$(actl "$M" submit "$A/run.json") || fail "member $M may not submit"
wait_state "$R" running
out=$(actl "$M" pause "$R" 2>&1) || fail "member $M may not pause: $out"
wait_state "$R" paused
actl "$M" resume "$R" >/dev/null || fail "member $M may not resume"
out=$(actl "$O" list 2>&1) && fail "non-member $O could list: $out"
echo "$out" | has "Permission denied" || fail "non-member $O: '$out' (want the socket's Permission denied)"
ctl watch "$R" >/dev/null || fail "run $R did not complete"
# a member reads m6.db as a dashboard would (read-only, while m6d runs),
# and the run's checkpoints; O may not
out=$(as "$M" sqlite3 -readonly -cmd '.timeout 1000' "$A/st/m6.db" \
      "select state from runs where id=$R" 2>&1) || fail "member $M cannot read m6.db: $out"
[ "$out" = completed ] || fail "member $M reads m6.db: '$out', want completed"
ck=$(db "$A/st" "select path from checkpoints where run=$R order by step desc limit 1")
[ -n "$ck" ] && as "$M" cat "$ck/model.safetensors" >/dev/null 2>"$T/ck.err" \
    || fail "member $M cannot read checkpoint '$ck': $(cat "$T/ck.err" 2>/dev/null)"
as "$O" sqlite3 -readonly "$A/st/m6.db" "select 1" >/dev/null 2>&1 && fail "non-member $O could read m6.db"
stop_daemon

# --- --group-read-only: a member reads, a write is refused naming its uid
start_as_d --group-read-only
actl "$M" list >/dev/null || fail "read-only member may not list"
actl "$M" status "$R" >/dev/null || fail "read-only member may not see status"
out=$(actl "$M" checkpoints "$R" 2>&1) || fail "read-only member may not list checkpoints: $out"
has -F "$ck" <<<"$out" || fail "read-only checkpoints does not list $ck: $out"
actl "$M" nodes >/dev/null || fail "read-only member may not list nodes"
out=$(as "$M" "$PY" "$CLIENT" "$SOCK" status:"$R" pause:"$R" list)
log "read-only member: $out"
echo "$out" | has "^status 0 " || fail "read-only status: $out"
echo "$out" | has "^pause 11 permission denied: uid $UM may only read" || fail "read-only pause not refused naming uid $UM: $out"
echo "$out" | has "^list 0 " || fail "read-only: the connection should go on after a refused write: $out"
out=$(actl "$M" submit "$A/run.json" 2>&1) && fail "read-only member could submit: $out"
echo "$out" | has "uid $UM" || fail "read-only submit refusal does not name uid $UM: $out"
grep -q "request.refused request=pause status=11 .*uid $UM" "$T/m6d-st.log" || fail "refused pause not logged"
# a read-only member's large frame: refused from its header (the body of
# 1 MiB is never sent; m6d waiting for it would be a timeout)
out=$(as "$M" "$PY" "$CLIENT" "$SOCK" list big:1048576)
log "read-only member, 1 MiB frame header: $out"
echo "$out" | has "^big 5 frame of 1048576 bytes refused: uid $UM may only read here" \
    || fail "a read-only member's 1 MiB frame was not refused from its header: $out"
R2=$(ctl submit "$A/run.json") || fail "root may not submit under --group-read-only"
ctl stop "$R2" >/dev/null || fail "root may not stop under --group-read-only"
stop_daemon

# --- a socket anyone may connect to: SO_PEERCRED refuses O
if command -v systemd-socket-activate >/dev/null; then
    SOCK=$A/sa.sock
    ( umask 000; exec systemd-socket-activate -l "$SOCK" \
        setpriv --reuid="$D" --regid="$D" --init-groups \
        "$M6D" --state-dir "$A/st" --threads 1 --group "$G" ) 2>>"$T/m6d-st.log" &
    SA_PID=$!
    for _ in $(seq 1 100); do [ -S "$SOCK" ] && break; nap 0.05; done
    [ -S "$SOCK" ] || fail "systemd-socket-activate made no socket"
    # as a unit with SocketMode=0666 would leave it: anyone may connect
    chmod 0666 "$SOCK"
    ctl list >/dev/null || fail "root through the activated socket"
    out=$(as "$O" "$PY" "$CLIENT" "$SOCK" list)
    log "non-member on an open socket: $out"
    echo "$out" | has "^hello 11 permission denied: uid $UO ($O) may not use this m6d" \
        || fail "non-member $O not refused by SO_PEERCRED naming uid $UO: $out"
    echo "$out" | has "^list closed" || fail "refused connection not closed: $out"
    out=$(as "$O" "$PY" "$CLIENT" "$SOCK" -n big:1048576)
    echo "$out" | has "^big 11 permission denied: uid $UO ($O) may not use this m6d" \
        || fail "non-member $O's 1 MiB frame header was not refused at once: $out"
    grep -q "conn.refused conn=[0-9]* uid=$UO " "$T/m6d-st.log" || fail "refusal of uid $UO not logged"
    ctl list >/dev/null || fail "m6d stopped serving after a refusal"
    kill -TERM "$SA_PID"
    wait "$SA_PID" || true
    SA_PID=
else
    log "no systemd-socket-activate: the SO_PEERCRED refusal on an open socket is not tested"
fi

# --- paths: names cannot leave runs/, nothing is written outside st/
start_as_d
mkdir -p "$A/elsewhere"
ln -s "$A/data" "$A/link"
chmod -R a+rX "$A"
for name in .. ../x a/b /etc/passwd "x/../../y" "$A/elsewhere/z"; do
    sed "s|\"name\": \"acc\"|\"name\": \"$name\"|" "$A/run.json" >"$A/bad.json"
    out=$("$PY" "$CLIENT" "$SOCK" submit:"$A/bad.json")
    echo "$out" | has "^submit 7 .*name" || fail "run name '$name' not refused at submit: $out"
done
for name in .. ../../etc /etc/passwd "1/../2" "$A/elsewhere" acc/../acc; do
    out=$("$PY" "$CLIENT" "$SOCK" status-name:"$name" stop-name:"$name" pause-name:"$name")
    [ "$(echo "$out" | grep -c " 6 ")" = 3 ] || fail "name '$name' by status/stop/pause: $out (want not found)"
done
# data through a symlink and "..": only read
sed "s|$A/data/|$A/link/../link/|g" "$A/run.json" >"$A/link.json"
RL=$(ctl submit "$A/link.json") || fail "submit through a symlinked glob"
ctl watch "$RL" >/dev/null || fail "run $RL (symlinked data) did not complete"
stop_daemon
new=$(find "$A" -newer "$T/marker" -not -path "$A/st" -not -path "$A/st/*" \
      -not -path "$A/bad.json" -not -path "$A/link.json" -not -path "$A/elsewhere" \
      -not -path "$A/link" -not -path "$A/sa.sock" -not -path "$A")
[ -z "$new" ] || fail "written outside the state dir: $new"
[ -z "$(ls "$A/elsewhere")" ] || fail "something in $A/elsewhere: $(ls "$A/elsewhere")"
other=$(ls "$A/st/runs" | grep -v '^[0-9][0-9]*$' || true)
[ -z "$other" ] || fail "runs/ holds more than run ids: $other"
echo "PASS: access"
