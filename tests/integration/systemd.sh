#!/usr/bin/env bash
# systemd.sh — the units in systemd/ and socket activation (issue 16,
# item 9), without PID 1:
#   - `systemd-analyze verify` passes for every unit in systemd/ (copies
#     whose ExecStart= names the m6d just built: verify checks that the
#     binary exists);
#   - `systemd-analyze security --offline=yes` rates m6d.service's
#     hardening at most 2.5 (it was 8.7 "EXPOSED" before; 1.7 when this was
#     written), so an option dropped by mistake fails here;
#   - m6d started by systemd-socket-activate takes the listening socket it
#     inherits (sd_listen_fds): m6ctl lists, submits and watches a run to
#     its end through it, m6d logs "socket=fd 3", and leaves the socket
#     (systemd's, not its own) in place when it stops.
. "$(dirname "$0")/lib.sh"

UNITS=$(cd "$(dirname "$0")/../../systemd" && pwd)

if command -v systemd-analyze >/dev/null; then
    mkdir -p "$T/units"
    for u in "$UNITS"/*.service "$UNITS"/*.socket; do
        sed "s|^ExecStart=/usr/local/bin/m6d|ExecStart=$M6D|" "$u" >"$T/units/$(basename "$u")"
    done
    n=0
    for u in "$T"/units/*; do
        out=$(systemd-analyze verify "$u" 2>&1) || fail "systemd-analyze verify $(basename "$u"): $out"
        # verify exits 0 on some complaints: none may be printed
        [ -z "$out" ] || fail "systemd-analyze verify $(basename "$u") complains: $out"
        n=$((n + 1))
    done
    [ "$n" -ge 2 ] || fail "only $n units in $UNITS"
    log "systemd-analyze verify: $n units pass"
    if out=$(systemd-analyze security --offline=yes "$T/units/m6d.service" 2>&1); then
        score=$(echo "$out" | sed -n 's/.*Overall exposure level for m6d.service: \([0-9.]*\).*/\1/p')
        [ -n "$score" ] || fail "no score in systemd-analyze security: $(echo "$out" | tail -3)"
        log "systemd-analyze security --offline=yes m6d.service: $score"
        awk -v s="$score" 'BEGIN { exit !(s <= 2.5) }' \
            || fail "m6d.service exposure $score, want at most 2.5: $(echo "$out" | grep '✗')"
    else
        log "systemd-analyze security --offline=yes cannot run here: $(echo "$out" | tail -1)"
    fi
else
    log "no systemd-analyze: the units are not verified"
fi

if ! command -v systemd-socket-activate >/dev/null; then
    echo "SKIP: no systemd-socket-activate (units verified only)"
    exit 77
fi
prepare_data "$T/data"
CKPT_EVERY=100 write_spec "$T/run.json" act 200 50 '"device": {"threads": 1}'
SOCK=$T/act.sock
systemd-socket-activate -l "$SOCK" "$M6D" --state-dir "$T/st" --threads 1 \
    2>>"$T/m6d-act.log" &
DAEMON_PID=$!
for _ in $(seq 1 100); do [ -S "$SOCK" ] && break; nap 0.05; done
[ -S "$SOCK" ] || fail "systemd-socket-activate made no socket at $SOCK"
ctl list >/dev/null || fail "m6ctl list through the activated socket"
R=$(ctl submit "$T/run.json") || fail "submit through the activated socket"
ctl watch "$R" >/dev/null || fail "run $R did not complete"
[ "$(field "$R" state)" = completed ] || fail "run $R: $(field "$R" state)"
grep -q "server.listen socket=fd 3 " "$T/m6d-act.log" \
    || fail "m6d did not take the inherited socket: $(grep server.listen "$T/m6d-act.log")"
[ "$(ps -o comm= -p "$DAEMON_PID")" = m6d ] || fail "pid $DAEMON_PID is $(ps -o comm= -p "$DAEMON_PID"), not m6d"
stop_daemon
[ -S "$SOCK" ] || fail "m6d removed the socket systemd made"
echo "PASS: systemd"
