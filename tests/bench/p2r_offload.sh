#!/usr/bin/env bash
# p2r_offload.sh — bench/p2r_offload at a tiny shape (a few seconds): its
# key=value line against its own curve files (final losses, the first
# point at or below scratch's final loss, the wall-clocks there and their
# ratio, the phase of every point and the delink), the step counts against
# the options, the placements the trainer reported against m6ctl plan's
# for the same spec and budget (the pseudo phase all resident, the real
# phase with --offload-frac of its slots offloaded, and one byte less
# budget offloading more), --backend cuda's skip where there is no GPU,
# --prepare, and bad options exit 2. Nothing here is timed.
# $1: the p2r_offload binary, $2: m6ctl, $3: the backend (cpu, the
# default; cuda: a build on the CUDA emulation, or a GPU). Skips (77)
# without Debian's fortunes.
set -u
P2R=$1 M6CTL=$2 BACKEND=${3:-cpu}
[ -d /usr/share/games/fortunes ] || { echo "SKIP: no /usr/share/games/fortunes"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/m6-p2roff-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
L=4 STEPS=40 EVERY=5
A=(--data "$T/data" --layers $L --embd 32 --heads 2 --seq 16 --batch 2 --lr 3e-3
   --steps $STEPS --warmup 2 --eval-every $EVERY --eval-batches 2
   --pseudo-frac 0.25 --offload-frac 0.75 --threads 1 --backend "$BACKEND")
out=$("$P2R" "${A[@]}" --out "$T/c" 2>&1) || { echo "$out"; fail "p2r_offload exited $?"; exit 1; }
last=$(tail -1 <<<"$out")
kv() { tr ' ' '\n' <<<"$last" | sed -n "s/^$1=//p"; }
for k in steps scratch_steps p2r_steps pseudo_steps real_steps delink_step \
         budget_bytes pseudo_resident pseudo_offloaded real_resident \
         real_offloaded scratch_resident scratch_offloaded wall_ratio \
         tok_s_pseudo tok_s_real tok_s_scratch; do
    [ -n "$(kv $k)" ] || fail "no $k= on the last line: $last"
done
# step counts: --steps each, --pseudo-frac 0.25 of them pseudo, the delink
# after the last pseudo step
[ "$(kv scratch_steps)" = $STEPS ] && [ "$(kv p2r_steps)" = $STEPS ] ||
    fail "steps: scratch $(kv scratch_steps), p2r $(kv p2r_steps), want $STEPS"
[ "$(kv pseudo_steps)" = 10 ] && [ "$(kv real_steps)" = 30 ] && [ "$(kv delink_step)" = 10 ] ||
    fail "phases: pseudo $(kv pseudo_steps) real $(kv real_steps) delink $(kv delink_step), want 10 30 10"
# the curves: a point every EVERY steps, scratch real throughout, p2r
# pseudo up to the delink and real after; the figures of the last line
# recomputed from them
sc=$T/c/scratch.csv pc=$T/c/p2r.csv
[ -f "$sc" ] && [ -f "$pc" ] || { fail "no curve files: $(ls "$T/c" 2>&1)"; exit 1; }
grep -q "^# p2r: delink_step=10 " "$pc" || fail "p2r.csv's delink: $(head -1 "$pc")"
grep -q "^# scratch: delink_step=-1 " "$sc" || fail "scratch.csv's delink: $(head -1 "$sc")"
awk -F, -v sc="$sc" -v every=$EVERY -v steps=$STEPS -v d=10 -v line="$last" '
    BEGIN {
        n = split(line, kvs, " ")
        for (i = 1; i <= n; i++) { split(kvs[i], p, "="); k[p[1]] = p[2] }
    }
    /^#/ || $1 == "step" { next }
    FILENAME == sc {
        ns++; if ($1 != ns * every) bad("scratch.csv point " ns " at step " $1)
        if ($4 != "real") bad("scratch.csv step " $1 " phase " $4)
        sv[ns] = $2; sw[ns] = $3; ss[ns] = $1; next
    }
    {
        np++; if ($1 != np * every) bad("p2r.csv point " np " at step " $1)
        want = $1 <= d ? "pseudo" : "real"
        if ($4 != want) bad("p2r.csv step " $1 " phase " $4 ", want " want)
        pv[np] = $2; pw[np] = $3; ps[np] = $1
    }
    function bad(m) { print "FAIL: " m; nbad++ }
    function near(a, b, tol) { return a - b <= tol && b - a <= tol }
    END {
        if (ns != steps / every || np != steps / every) bad("points: scratch " ns ", p2r " np)
        target = sv[ns]
        if (sprintf("%.6f", target) != k["scratch_final_val"]) bad("scratch_final_val " k["scratch_final_val"] ", curve " target)
        if (sprintf("%.6f", pv[np]) != k["p2r_final_val"]) bad("p2r_final_val " k["p2r_final_val"] ", curve " pv[np])
        for (i = 1; i <= ns; i++) if (sv[i] <= target) { ia = i; break }
        for (i = 1; i <= np; i++) if (pv[i] <= target) { ib = i; break }
        if (ss[ia] != k["scratch_steps_to_target"]) bad("scratch_steps_to_target " k["scratch_steps_to_target"] ", curve " ss[ia])
        if (!near(sw[ia], k["scratch_wall_to_target_s"], 0.0011)) bad("scratch_wall_to_target_s " k["scratch_wall_to_target_s"] ", curve " sw[ia])
        if (ib == "") {
            if (k["p2r_steps_to_target"] != -1 || k["wall_ratio"] != "nan") bad("p2r never reaches " target " but the line says step " k["p2r_steps_to_target"] ", ratio " k["wall_ratio"])
        } else {
            if (ps[ib] != k["p2r_steps_to_target"]) bad("p2r_steps_to_target " k["p2r_steps_to_target"] ", curve " ps[ib])
            if (!near(pw[ib], k["p2r_wall_to_target_s"], 0.0011)) bad("p2r_wall_to_target_s " k["p2r_wall_to_target_s"] ", curve " pw[ib])
            r = pw[ib] / sw[ia]
            if (!near(r, k["wall_ratio"], 1e-3 + 1e-3 * r)) bad("wall_ratio " k["wall_ratio"] ", curves " r)
        }
        # wall-clocks only grow along a curve
        for (i = 2; i <= ns; i++) if (sw[i] < sw[i-1]) bad("scratch wall goes back at " ss[i])
        for (i = 2; i <= np; i++) if (pw[i] < pw[i-1]) bad("p2r wall goes back at " ps[i])
        exit nbad > 0
    }' "$sc" "$pc" || fails=$((fails + 1))
# tokens/s of each phase: there, positive (not judged)
for k in tok_s_pseudo tok_s_real tok_s_scratch; do
    awk -v v="$(kv $k)" 'BEGIN { exit !(v > 0) }' || fail "$k=$(kv $k)"
done
# the device bytes the trainer reported stay within the budget
for k in peak_scratch_bytes peak_pseudo_bytes peak_real_bytes; do
    awk -v v="$(kv $k)" -v b="$(kv budget_bytes)" 'BEGIN { exit !(v > 0 && v <= b) }' ||
        fail "$k=$(kv $k), budget $(kv budget_bytes)"
done
# placements: the trainer's, against m6ctl plan on the same spec and budget
[ "$(kv placement_varied)" = 0 ] || fail "a placement changed within a phase"
[ "$(kv scratch_resident)/$(kv scratch_offloaded)" = "$(kv real_resident)/$(kv real_offloaded)" ] ||
    fail "scratch placed $(kv scratch_resident)/$(kv scratch_offloaded), p2r's real phase $(kv real_resident)/$(kv real_offloaded)"
spec() { # BUDGET: the bench's p2r run as a spec
    cat >"$T/spec.json" <<EOF
{"name": "p2roff", "data": {"train": "$T/data/train_*.bin", "val": "$T/data/val_*.bin"},
 "model": {"vocab_size": 256, "n_layer": $L, "n_head": 2, "n_embd": 32, "seq_len": 16},
 "pseudo": {"share_groups": 1, "steps": 10},
 "train": {"steps": $STEPS, "batch_size": 2, "lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2, "eval_every": $EVERY, "eval_batches": 2},
 "device": {"backend": "$BACKEND", "memory_budget": $1}}
EOF
}
# "real pseudo" slot counts resident/offloaded of m6ctl plan --json
plan_counts() {
    "$M6CTL" plan --json "$T/spec.json" 2>&1 | python3 -c '
import json, sys
p = json.load(sys.stdin)
q = p["pseudo"]
print("%d/%d %d/%d" % (len(p["resident_slots"]), len(p["offloaded_slots"]),
                      len(q["resident_slots"]), len(q["offloaded_slots"])))'
}
B=$(kv budget_bytes)
spec "$B"
pc_=$(plan_counts) || fail "m6ctl plan: $pc_"
want="1/3 1/0"  # L 4, 0.75 offloaded: 1 resident; pseudo S 1 resident
[ "$pc_" = "$want" ] || fail "m6ctl plan at budget $B: $pc_, want $want"
[ "$(kv real_resident)/$(kv real_offloaded) $(kv pseudo_resident)/$(kv pseudo_offloaded)" = "$pc_" ] ||
    fail "trainer placed real $(kv real_resident)/$(kv real_offloaded), pseudo $(kv pseudo_resident)/$(kv pseudo_offloaded); m6ctl plan: $pc_"
grep -Eq "^  p2r +pseudo 1/0 over 10 steps \(plan 1/0\)" <<<"$out" || fail "placement table: $(grep -A3 '^placements' <<<"$out")"
# the budget is the least that keeps that placement: a byte less offloads
# one more real slot
spec $((B - 1))
pc_=$(plan_counts) || fail "m6ctl plan: $pc_"
[ "${pc_%% *}" = "0/4" ] || fail "m6ctl plan at budget $((B - 1)): $pc_, want 0/4 for the real phase"
# --backend cuda with the cpu build: runs on a GPU, else skips saying why
if [ "$BACKEND" = cpu ]; then
    rc=0; cout=$("$P2R" "${A[@]}" --backend cuda --steps 4 --eval-every 2 --pseudo-frac 0.5 2>&1) || rc=$?
    case $rc in
        0) echo "p2r_offload --backend cuda ran (a GPU is here)";;
        77) grep -Eq "^p2r_offload: SKIP: device.backend: 'cuda': (this m6d was built without CUDA|no CUDA device)" <<<"$cout" ||
                fail "cuda skip said: $cout";;
        *) fail "--backend cuda exited $rc: $cout";;
    esac
fi
# --prepare: the shards, no training
pout=$("$P2R" --prepare --data "$T/data2" 2>&1) || fail "--prepare exited $?: $pout"
[ -s "$T/data2/train_000000.bin" ] && [ -s "$T/data2/val_000000.bin" ] &&
    [ "$pout" = "p2r_offload: shards in $T/data2" ] || fail "--prepare: $pout; $(ls "$T/data2")"
# bad options
for bad in "--offload-frac 0" "--offload-frac 1.5" "--backend tpu" "--share-groups 4" \
           "--budget 12x" "--pseudo-frac 1" "--steps 1" "--layers x"; do
    # shellcheck disable=SC2086
    want 2 '^p2r_offload: --' "$P2R" --data "$T/data" --layers 4 --embd 16 --heads 2 $bad
done
[ "$fails" = 0 ] || exit 1
echo "p2r_offload ($BACKEND): ok (curves, step counts and placements checked; wall_ratio=$(kv wall_ratio))"
