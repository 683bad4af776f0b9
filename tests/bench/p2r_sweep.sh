#!/usr/bin/env bash
# p2r_sweep.sh — bench/p2r_sweep at a tiny shape: every run of the grid
# trains, results.csv's figures agree with the curve files (recomputed here
# from them), a second invocation resumes (trains nothing), a different
# shape on the same --out is refused, and bad options exit 2.
# $1: the p2r_sweep binary. Skips (77) without Debian's fortunes.
set -u
SWEEP=$1
[ -d /usr/share/games/fortunes ] || { echo "SKIP: no /usr/share/games/fortunes"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/m6-sweep-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
A=(--out "$T/s" --corpora fortunes --layers 2 --embd 16 --heads 2 --seq 16
   --batch 2 --steps 30 --warmup 3 --eval-every 5 --eval-batches 2
   --share-groups 1 --pseudo-frac 0.2,0.5 --delink-optimizer copy,reset
   --rewarm 0,0.1 --seeds 3,4 --jobs 2)
out=$("$SWEEP" "${A[@]}" 2>&1) || fail "first sweep exited $?: $out"
csv=$T/s/results.csv
# 2 seeds x 2 x 2 x 2 settings, one row each
rows=$(($(wc -l <"$csv") - 1))
[ "$rows" = 16 ] || fail "results.csv has $rows rows, want 16"
# each row against the curve files: final val = the curve's last val,
# scratch's likewise, the ratio their quotient, steps_to_target the first
# evaluation at or below scratch's final val
tail -n +2 "$csv" | while IFS=, read -r corpus seed S frac opt rw gs lrs steps fv sfv ratio stt sstt sr ws sws wr; do
    name=$corpus-seed$seed-S$S-f$frac-$opt-r$rw
    cf=$T/s/curves/$name.csv sf=$T/s/curves/$corpus-seed$seed-scratch.csv
    [ -f "$cf" ] && [ -f "$sf" ] || { echo "FAIL: no curve $cf or $sf"; continue; }
    awk -F, -v fv="$fv" -v sfv="$sfv" -v ratio="$ratio" -v stt="$stt" \
        -v cf="$cf" -v name="$name" '
        FNR == 1 || /^#/ { next }
        FILENAME == cf { last = $2; if (reach == "" && $2 <= sfv + 1e-9) reach = $1; next }
        { slast = $2 }
        END {
            bad = 0
            if (sprintf("%.6f", last) != fv) { print "FAIL: " name " final_val " fv ", curve " last; bad = 1 }
            if (sprintf("%.6f", slast) != sfv) { print "FAIL: " name " scratch_final_val " sfv ", curve " slast; bad = 1 }
            if ((fv / sfv) - ratio > 2e-6 || ratio - (fv / sfv) > 2e-6) { print "FAIL: " name " ratio " ratio " != " fv / sfv; bad = 1 }
            if (reach == "") reach = -1
            if (reach != stt) { print "FAIL: " name " steps_to_target " stt ", curve says " reach; bad = 1 }
        }' "$cf" "$sf"
done >"$T/rows.out"
if [ -s "$T/rows.out" ]; then cat "$T/rows.out"; fails=$((fails + 1)); fi
# the last line: key=value pairs naming the best setting
last=$(tail -1 <<<"$out")
grep -Eq '^settings=8 runs=18 trained=18 .*best=S1-f0\.[25]-(copy|reset)-r0(\.1)? best_ratio=[0-9.]+ ' <<<"$last" \
    || fail "last line: $last"
[ -s "$T/s/sweep-fortunes.svg" ] && grep -q '<svg' "$T/s/sweep-fortunes.svg" \
    || fail "no sweep-fortunes.svg"
# resume: a curve removed (an interrupted run) is the only one trained again
rm "$T/s/curves/fortunes-seed4-S1-f0.5-reset-r0.1.csv"
touch "$T/s/curves/fortunes-seed4-S1-f0.5-reset-r0.1.csv.tmp-99"
out2=$("$SWEEP" "${A[@]}" 2>&1) || fail "second sweep exited $?"
grep -q '17 already done' <<<"$out2" || fail "resume: $(sed -n 2p <<<"$out2")"
grep -q 'trained=1 ' <<<"$(tail -1 <<<"$out2")" || fail "resume trained: $(tail -1 <<<"$out2")"
# another grid on the same --out (the pseudo-phase options): only its new
# settings train, scratch is shared; its own table names the options
out3=$("$SWEEP" "${A[@]}" --pseudo-frac 0.2 --delink-optimizer copy --rewarm 0 \
        --grad-scale sum,mean --pseudo-lr-scale 0.5,1 --tag knobs 2>&1) \
    || fail "knobs sweep exited $?: $out3"
grep -q 'trained=6 ' <<<"$(tail -1 <<<"$out3")" || fail "knobs sweep trained: $(tail -1 <<<"$out3")"
k=$T/s/results-knobs.csv
[ "$(grep -c ',mean,0.5,' "$k")" = 2 ] && [ "$(grep -c ',sum,1,' "$k")" = 2 ] \
    || fail "results-knobs.csv: $(cat "$k")"
[ -f "$T/s/curves/fortunes-seed3-S1-f0.2-copy-r0-mean-lr0.5.csv" ] \
    || fail "no curve for the mean, lr 0.5 setting: $(ls "$T/s/curves")"
[ -s "$T/s/sweep-knobs-fortunes.svg" ] || fail "no sweep-knobs-fortunes.svg"
# another shape on the same --out: refused, nothing touched
rc=0; err=$("$SWEEP" "${A[@]}" --steps 31 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -q 'holds a sweep of another shape' <<<"$err" || fail "other shape: rc $rc, $err"
# bad options
for bad in "--share-groups 2" "--pseudo-frac 1" "--delink-optimizer keep" \
           "--corpora wiki" "--seeds x" "--jobs 0" "--grad-scale avg" \
           "--pseudo-lr-scale 0" "--tag ../x"; do
    # shellcheck disable=SC2086
    want 2 '^p2r_sweep: --' "$SWEEP" --out "$T/bad" --layers 2 --embd 16 --heads 2 $bad
done
[ "$fails" = 0 ] || exit 1
echo "p2r_sweep: ok ($rows rows checked against their curves)"
