#!/bin/sh
# examples/run-fortunes.sh — the main job, end to end, on a fresh Debian 12:
# install and build (.ci/setup), start m6d on its embedded defaults, turn the
# fortunes text into byte-level shards, submit examples/fortunes-p2r.json
# (pseudo phase: 6 layers share 3 slots; delink at step 50; real phase),
# watch it to the end, and print the final validation loss and where the
# checkpoints and m6.db are. Stops the m6d it started. State: M6_STATE_DIR
# (default $XDG_STATE_HOME/m6, else ~/.local/state/m6); if m6d does not come
# up, the end of its log says why.
set -eu
cd "$(dirname "$0")/.."
M6_SETUP_MAIN=1 .ci/setup
M6D=build/daemon/control/m6d
M6CTL=build/client/m6ctl
STATE=${M6_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/m6}
export M6_SOCKET="$STATE/m6d.sock"

if [ ! -f data/fortunes/train_000000.bin ]; then
    $M6CTL data prepare --out data/fortunes --val-fraction 0.1 /usr/share/games/fortunes
fi

mkdir -p "$STATE"
if $M6CTL list >/dev/null 2>&1; then
    echo "run-fortunes: using the m6d already serving $M6_SOCKET"
    DAEMON=
else
    $M6D --state-dir "$STATE" 2>>"$STATE/m6d.log" &
    DAEMON=$!
    trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null' EXIT INT TERM
    up=
    for _ in $(seq 100); do
        if $M6CTL list >/dev/null 2>&1; then up=1; break; fi
        kill -0 $DAEMON 2>/dev/null || break   # it exited: say why below
        sleep 0.1
    done
    if [ -z "$up" ]; then
        echo "run-fortunes: m6d did not come up; the end of $STATE/m6d.log:" >&2
        tail -n 5 "$STATE/m6d.log" >&2
        exit 1
    fi
    echo "run-fortunes: m6d started (state $STATE, log $STATE/m6d.log)"
fi

RUN=$($M6CTL submit examples/fortunes-p2r.json)
echo "run-fortunes: submitted run $RUN"
$M6CTL watch "$RUN"
$M6CTL status "$RUN"
echo
echo "phases:"
sqlite3 -header -column "$STATE/m6.db" \
    "select phase, from_step, datetime(at, 'unixepoch') as at from phases where run = $RUN order by from_step"
VAL=$($M6CTL status "$RUN" --json | /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["val_loss"])')
echo
echo "final validation loss: $VAL nats/byte (bigram statistics of this text: 2.59)"
echo "checkpoints: $STATE/runs/$RUN/checkpoints"
echo "state DB:    $STATE/m6.db  (sqlite3 $STATE/m6.db 'select * from metrics where run=$RUN')"
