#!/usr/bin/env bash
# dashboard.sh — the dashboard (GET / of m6d --metrics-listen) in headless
# Chromium, driven over the DevTools protocol (cdp.py): for a finished
# Pseudo-to-Real run it draws every metrics row m6ctl has, the val points,
# and the delink marker at the step m6ctl reports, at the x its own axis
# gives that step; while a run trains, a new point appears without a
# reload. Skips (77) without chromium.
. "$(dirname "$0")/lib.sh"
CDP="/usr/bin/python3 $(dirname "$0")/cdp.py"
[ -x /usr/bin/python3 ] || { echo "SKIP: no /usr/bin/python3"; exit 77; }
command -v "${CHROMIUM:-chromium}" >/dev/null || { echo "SKIP: chromium not installed"; exit 77; }

prepare_data "$T/data"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
export M6_TEST_STEP_DELAY_MS=100  # the live run's steps: ten a second
start_daemon "$T/s" --metrics-listen "127.0.0.1:$PORT"
suite_step_delay  # the suite's delay (lib.sh) for the m6d started next
write_spec "$T/p2r.json" p2r 24 9
R=$(ctl submit "$T/p2r.json")
ctl watch "$R" >/dev/null || fail "run $R did not complete"
DELINK=$(field "$R" delink_step)
ROWS=$(( $(ctl metrics "$R" --csv | wc -l) - 1 ))
VALS=$(ctl metrics "$R" --json | python3 -c 'import json,sys; print(sum(r["val_loss"] is not None for r in json.load(sys.stdin)))')
[ "$DELINK" = 9 ] && [ "$ROWS" = 24 ] || fail "run $R: delink_step $DELINK, $ROWS rows (want 9, 24)"

# the finished run
READ='(() => {
  const q = s => document.querySelector(s);
  const svg = q("#loss-chart"), m = q("#delink-marker"), tr = q("#runs tbody tr[data-run=\"'$R'\"]");
  return {train: q("#loss-chart path.train").dataset.n, val: svg.querySelectorAll("circle.val-pt").length,
          marker: m && m.dataset.step, marker_x: m && Number(m.getAttribute("x1")),
          s0: Number(svg.dataset.s0), s1: Number(svg.dataset.s1), x0: Number(svg.dataset.x0), x1: Number(svg.dataset.x1),
          real_from: q("#timeline rect.seg-real") && q("#timeline rect.seg-real").dataset.from,
          row: tr && tr.textContent, slots: document.querySelectorAll("#slots rect").length};
})()'
$CDP "$URL/#run=$R" 'm6dash.polls >= 1 && document.querySelector("#delink-marker")' "$READ" \
    >"$T/done.json" 2>"$T/cdp.err" || fail "dashboard of run $R: $(cat "$T/done.json" "$T/cdp.err")"
log "finished run: $(cat "$T/done.json")"
python3 - "$T/done.json" "$DELINK" "$ROWS" "$VALS" <<'PY' || fail "dashboard of run $R: $(cat "$T/done.json")"
import json, sys
d = json.load(open(sys.argv[1]))
delink, rows, vals = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert int(d["train"]) == rows, "train curve has %s points, m6ctl metrics %d rows" % (d["train"], rows)
assert d["val"] == vals, "%d val points, m6ctl has %d val losses" % (d["val"], vals)
assert d["marker"] is not None and int(d["marker"]) == delink, "delink marker at %s, m6ctl says %d" % (d["marker"], delink)
# where the chart's own axis puts step `delink` (the axis runs s0..s1 over pixels x0..x1)
want = d["x0"] + (delink - d["s0"]) / (d["s1"] - d["s0"]) * (d["x1"] - d["x0"])
assert abs(d["marker_x"] - want) < 0.5, "marker drawn at x %.2f, step %d is at %.2f" % (d["marker_x"], delink, want)
assert d["s1"] == rows, "axis ends at %s, the run at step %d" % (d["s1"], rows)
assert d["real_from"] is not None and int(d["real_from"]) == delink, "timeline: real from %s" % d["real_from"]
assert "completed" in d["row"] and "24/24" in d["row"], d["row"]
assert d["slots"] == 2, "%d slots drawn, the model has 2 (L=2)" % d["slots"]
PY

# a run that trains: the page, left open, shows a new point
write_spec "$T/live.json" live 100000 50
R2=$(ctl submit "$T/live.json")
wait_step "$R2" 2
LIVE='(() => { const p = document.querySelector("#loss-chart path.train");
  return {first: m6dash.firstStep, last: p && Number(p.dataset.lastStep), polls: m6dash.polls}; })()'
$CDP "$URL/?poll=200#run=$R2" \
    'm6dash.polls >= 2 && Number(document.querySelector("#loss-chart path.train").dataset.lastStep) > m6dash.firstStep' \
    "$LIVE" --timeout 30 >"$T/live.out" 2>"$T/cdp.err" || fail "no new point on the live run: $(cat "$T/live.out" "$T/cdp.err")"
log "live run: $(cat "$T/live.out")"
python3 -c "
import json; d = json.load(open('$T/live.out'))
assert d['first'] >= 2 and d['last'] > d['first'], d" || fail "live run: $(cat "$T/live.out")"
[ "$(field "$R2" state)" = running ] || fail "the live run is not running: $(field "$R2" state)"
ctl stop "$R2" >/dev/null
wait_state "$R2" stopped
stop_daemon
echo "ok dashboard (delink at $DELINK, $ROWS points; live $(cat "$T/live.out"))"
