#!/usr/bin/env bash
# crash_soak.sh — kill -9 m6d at random moments, N times, restarting it
# each time, and check that nothing was lost.
#
#   bench/crash_soak.sh [--kills N] [--seed S] [--keep]
#
# One small Pseudo-to-Real run (2 layers, C 32, T 32; delink at step
# 2N+10, a validation pass every 5 steps, a checkpoint every 3) trains
# across N+1 lives of m6d. Each life but the last ends in a SIGKILL, chosen
# at random (bash's RANDOM, seeded by --seed, printed) among:
#   timing  kill -9 from outside, 0-20 ms after the run made 1-8 steps:
#           anywhere (mid-step, mid-eval, mid-checkpoint, mid-commit)
#   step, eval, ckpt, delink, commit
#           m6d kills itself at that point (daemon/common/crashpoint.h,
#           M6_TEST_CRASH): mid-step before the update, mid-validation,
#           a checkpoint's tensors written but not its meta.json, the model
#           delinked but not recorded, a state DB transaction's rows written
#           but not committed
#   pause   `m6ctl pause` acknowledged, then kill -9 0-10 ms later: the
#           next life must find the run paused (then it is resumed)
# A run found paused is resumed, again in the next life when m6d dies
# before it acknowledges; an acknowledged resume must hold across a kill.
# The checks, at the end: every checkpoint on disk loads (ckpt_check),
# m6.db holds one metrics row per step (no gap, no duplicate), the run
# completed once with one real phase from pseudo.steps, every acknowledged
# pause and resume held, and the loss curve is bitwise the uninterrupted run's (a
# reference run of the same spec on a fresh m6d first).
# Prints figures; the last line is key=value pairs. Exit 0 when every check
# holds, 1 otherwise, 77 without the fortunes text (the training data).
#
# M6D, M6CTL, CKPT_CHECK: the binaries (default: build/ of this checkout).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
M6D=${M6D:-$root/build/daemon/control/m6d}
M6CTL=${M6CTL:-$root/build/client/m6ctl}
CKPT_CHECK=${CKPT_CHECK:-$root/build/bench/ckpt_check}
FORTUNES=${FORTUNES:-/usr/share/games/fortunes}
N=100
SEED=$(( $(date +%s) % 32768 ))
KEEP=0
while [ $# -gt 0 ]; do
    case $1 in
    --kills) N=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "crash_soak: unknown option $1 (--kills N, --seed S, --keep)" >&2; exit 2 ;;
    esac
done
case $N in ''|*[!0-9]*) echo "crash_soak: --kills: want a count, got '$N'" >&2; exit 2 ;; esac
for b in "$M6D" "$M6CTL" "$CKPT_CHECK"; do
    [ -x "$b" ] || { echo "crash_soak: $b: not built (ninja -C build)" >&2; exit 2; }
done
command -v sqlite3 >/dev/null || { echo "SKIP: no sqlite3 shell"; exit 77; }
[ -d "$FORTUNES" ] || { echo "SKIP: no $FORTUNES (the training text)"; exit 77; }

T=$(mktemp -d "${TMPDIR:-/tmp}/m6-soak.XXXXXX")
PID=
cleanup_() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -9 "$PID"; fi
    if [ "$KEEP" = 1 ]; then echo "# kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup_ EXIT
die() { echo "crash_soak: $*" >&2; KEEP=1; exit 1; }
RANDOM=$SEED
echo "crash_soak: seed $SEED, $N kills (rerun with the same draws: --seed $SEED)" >&2

"$M6CTL" data prepare --out "$T/data" --val-fraction 0.05 "$FORTUNES" \
    >"$T/prepare.out" 2>&1 || die "data prepare: $(tail -3 "$T/prepare.out")"
# 4-5 steps a life on average on a loaded 2-core machine (a delink life
# up to 30), so 16 per kill leaves room: a run that completes before its N
# kills fails the soak
STEPS=$((16 * N + 40))
# the delink where the kills still come: a life makes about 5 steps on
# average, so N kills end near step 5N; at half of STEPS (8N) the delink
# came after the last kill and its crash point never fired
PSEUDO=$((2 * N + 10))
cat >"$T/spec.json" <<JSON
{
  "name": "soak",
  "data": {"train": "$T/data/train_*.bin", "val": "$T/data/val_*.bin"},
  "model": {"vocab_size": 256, "n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 32},
  "pseudo": {"steps": $PSEUDO},
  "train": {"steps": $STEPS, "batch_size": 4, "eval_every": 5, "eval_batches": 2, "seed": 11},
  "checkpoint": {"every": 3, "keep": 3},
  "device": {"threads": 1}
}
JSON

ctl() { "$M6CTL" --socket "$SOCK" "$@"; }
db() { sqlite3 -readonly -cmd '.timeout 5000' "$1/m6.db" "$2"; }
# start DIR [ENV=VALUE]: m6d in the background on DIR, until it answers
start() {
    local dir=$1
    SOCK=$dir/m6d.sock
    if [ -n "${2:-}" ]; then
        env "$2" "$M6D" --state-dir "$dir" --threads 1 --log-level info \
            2>>"$dir.log" &
    else
        "$M6D" --state-dir "$dir" --threads 1 --log-level info 2>>"$dir.log" &
    fi
    PID=$!
    for _ in $(seq 1 400); do
        ctl list >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || return 1  # died at start (a hook)
        sleep 0.01
    done
    die "m6d did not answer on $SOCK"
}
# reap: wait for m6d's end; 0 if SIGKILL ended it
reap() {
    local rc=0
    wait "$PID" 2>/dev/null || rc=$?
    PID=
    [ "$rc" = 137 ]
}
losses() { ctl metrics "$1" --csv | cut -d, -f1-5,7; }
step_of() { db "$S" "select step from runs where id=$R"; }
state_of() { db "$S" "select state from runs where id=$R"; }
phase_of() { db "$S" "select phase from runs where id=$R"; }

t0=$SECONDS
# 1. the reference: the same spec, uninterrupted
start "$T/ref" || die "reference m6d did not start"
RR=$(ctl submit "$T/spec.json")
ctl watch "$RR" >/dev/null || die "reference run did not complete"
losses "$RR" >"$T/ref.csv"
kill -TERM "$PID"; wait "$PID" || die "reference m6d exited $?"
PID=
ref_s=$((SECONDS - t0))

# 2. the soak. bash reports each m6d it reaps after a SIGKILL ("Killed"):
# its stderr goes to a file meanwhile (fd 3 keeps ours, for die)
exec 3>&2 2>>"$T/shell.err"
die() { echo "crash_soak: $*" >&3; KEEP=1; exit 1; }
S=$T/soak
start "$S" || die "m6d did not start"
R=$(ctl submit "$T/spec.json")
# check_ckpts: right after a kill, before m6d cleans up, every complete
# checkpoint directory (not a *.tmp-* one) must load
ck_seen=0 ck_bad=0
check_ckpts() {
    local d dirs=() out
    for d in "$S/runs/$R/checkpoints"/*; do
        case $d in *.tmp-*) continue ;; esac
        [ -d "$d" ] && dirs+=("$d")
    done
    db "$S" "select spec from runs where id=$R" >"$T/run-spec.json"
    out=$("$CKPT_CHECK" "$T/run-spec.json" "${dirs[@]}" 2>&1) || true
    ck_seen=$((ck_seen + ${#dirs[@]}))
    ck_bad=$((ck_bad + $(echo "$out" | grep -c '^bad ' || true)))
    echo "$out" | grep '^bad ' >>"$T/ckpt-bad.log" || true
}
kinds=(timing step eval ckpt delink commit pause)
declare -A count=()
kills=0 lives=1 acked=0 held=0 owed_pause=0 not_killed=0
resumed=0 resumes_lost=0 owed_resume=0
# resume_: when the run is paused, `m6ctl resume` until m6d acknowledges
# it or dies (a hook may end this life first: the next life tries again;
# a resume lost so, or one sent while m6d still sets the run up, would
# otherwise leave the run paused for good and every later kill idle)
resume_() {
    for _ in $(seq 1 400); do
        [ "$(state_of)" = paused ] || return 0
        if ctl resume "$R" >"$T/resume.out" 2>&1; then
            resumed=$((resumed + 1)); owed_resume=1
            echo "  resumed at step $(step_of)" >>"$T/lives.log"
            return 0
        fi
        echo "  resume: $(head -n 1 "$T/resume.out")" >>"$T/lives.log"
        kill -0 "$PID" 2>/dev/null || return 0
        sleep 0.01
    done
}
# settle_: at the start of a life, the pause (or else the resume) that an
# earlier life acknowledged must show in m6.db within 4 s of this m6d's
# start. A life that a hook ends before m6d records it decides nothing:
# the command is still pending, and the next m6d replays it. Then resume
# the run if it is paused.
settle_() {
    local want= got=0
    if [ "$owed_pause" = 1 ]; then want=paused
    elif [ "$owed_resume" = 1 ]; then want=running; fi
    if [ -n "$want" ]; then
        for _ in $(seq 1 400); do
            case $want/$(state_of) in
            paused/paused) got=1; break ;;
            running/paused) ;;
            running/*) got=1; break ;;
            esac
            kill -0 "$PID" 2>/dev/null || return 0  # a hook: the next life
            sleep 0.01
        done
        if [ "$want" = paused ]; then
            if [ $got = 1 ]; then held=$((held + 1)); fi
            owed_pause=0
        else
            if [ $got = 0 ]; then resumes_lost=$((resumes_lost + 1)); fi
            owed_resume=0
        fi
    fi
    resume_
}
k=timing  # the first life (the submit's) ends by the clock
while [ "$kills" -lt "$N" ]; do
    if [ -z "$PID" ]; then
        lives=$((lives + 1))
        hook=
        k=${kinds[RANDOM % ${#kinds[@]}]}
        # a delink kill only where this life reaches the delink soon, and
        # the first time the run is that close, always one
        s=$(step_of)
        near=0
        if [ "$(phase_of)" = pseudo ] && [ $((PSEUDO - s)) -le 30 ]; then near=1; fi
        if [ "$near" = 1 ] && [ "${count[delink]:-0}" = 0 ]; then k=delink; fi
        if [ "$k" = delink ] && [ "$near" = 0 ]; then k=commit; fi
        case $k in
        step) hook=M6_TEST_CRASH=step:$((1 + RANDOM % 6)) ;;
        eval) hook=M6_TEST_CRASH=eval:$((1 + RANDOM % 2)) ;;
        ckpt) hook=M6_TEST_CRASH=ckpt:$((1 + RANDOM % 2)) ;;
        delink) hook=M6_TEST_CRASH=delink:1 ;;
        commit) hook=M6_TEST_CRASH=commit:$((1 + RANDOM % 12)) ;;
        esac
        echo "life $lives: step $(step_of) kind $k ${hook:-}" >>"$T/lives.log"
        if ! start "$S" "$hook"; then
            # the hook fired while m6d set the run up
            reap || die "m6d exited at start, not by SIGKILL ($hook)"
            kills=$((kills + 1)); count[$k]=$(( ${count[$k]:-0} + 1 ))
            check_ckpts
            continue
        fi
        [ "$(state_of)" = completed ] && break
        settle_
    fi
    s0=$(step_of)
    case $k in
    timing|pause)
        want=$((s0 + 1 + RANDOM % 8))
        for _ in $(seq 1 1000); do
            [ "$(step_of)" -ge "$want" ] && break
            [ "$(state_of)" = running ] || break
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.005
        done
        if [ "$k" = pause ]; then
            if ctl pause "$R" >/dev/null 2>&1; then
                acked=$((acked + 1)); owed_pause=1; owed_resume=0
            fi
            sleep "0.00$((RANDOM % 10))"
        else
            sleep "0.0$((RANDOM % 20 / 10))$((RANDOM % 10))"
        fi
        kill -9 "$PID" 2>/dev/null || true ;;
    *)
        # the hook fires within a few steps (a delink's at the delink);
        # 12 steps past that without it, kill -9 from outside
        limit=$((s0 + 12))
        [ "$k" = delink ] && limit=$((PSEUDO + 12))
        for _ in $(seq 1 4000); do
            kill -0 "$PID" 2>/dev/null || break
            [ "$(step_of)" -ge "$limit" ] && break
            [ "$(state_of)" = running ] || break  # ended, or paused itself
            sleep 0.005
        done
        if kill -0 "$PID" 2>/dev/null; then
            not_killed=$((not_killed + 1))
            kill -9 "$PID"
        fi ;;
    esac
    reap || die "m6d ended otherwise than by SIGKILL (kind $k); see $S.log"
    kills=$((kills + 1)); count[$k]=$(( ${count[$k]:-0} + 1 ))
    check_ckpts
    [ "$(state_of)" = completed ] && break
done
# the last life: no kill; it trains to the end
if [ -z "$PID" ]; then
    lives=$((lives + 1))
    start "$S" || die "m6d did not start for the last life"
    settle_
fi
# watch would wait for ever on a paused run
[ "$(state_of)" != paused ] || die "the run is still paused in the last life (resume refused?)"
ctl watch "$R" >/dev/null || die "the soaked run did not complete: $(state_of)"
losses "$R" >"$T/soak.csv"
kill -TERM "$PID"; wait "$PID" || die "m6d exited $? after SIGTERM"
PID=
soak_s=$((SECONDS - t0 - ref_s))

exec 2>&3 3>&-
die() { echo "crash_soak: $*" >&2; KEEP=1; exit 1; }

# 3. the checks, on a clean start's m6.db (reconciled) and the disk
db "$S" "select spec from runs where id=$R" >"$T/run-spec.json"
dirs=()
for d in "$S/runs/$R/checkpoints"/*; do [ -d "$d" ] && dirs+=("$d"); done
set +e
"$CKPT_CHECK" "$T/run-spec.json" "${dirs[@]}" >"$T/ckpt.out" 2>&1
set -e
ckpts=$(sed -n 's/^checkpoints=\([0-9]*\) .*/\1/p' "$T/ckpt.out")
ckpt_bad=$(sed -n 's/.* bad=\([0-9]*\)$/\1/p' "$T/ckpt.out")
[ -n "$ckpts" ] || die "ckpt_check: $(cat "$T/ckpt.out")"
ckpts=$((ckpts + ck_seen))
ckpt_bad=$((ckpt_bad + ck_bad))
tmp_left=$(find "$S/runs/$R/checkpoints" -maxdepth 1 -name '*.tmp-*' | wc -l)
table_missing=0
while read -r p; do
    [ -z "$p" ] || [ -d "$p" ] || [ -d "$S/$p" ] || table_missing=$((table_missing + 1))
done < <(db "$S" "select path from checkpoints where run=$R")
rows=$(db "$S" "select count(*) from metrics where run=$R")
distinct=$(db "$S" "select count(distinct step) from metrics where run=$R")
inrange=$(db "$S" "select count(*) from metrics where run=$R and step between 1 and $STEPS")
rows_lost=$((STEPS - inrange))
rows_extra=$((rows - distinct + rows - inrange))
losses_equal=0
cmp -s "$T/ref.csv" "$T/soak.csv" && losses_equal=1
completed=$(db "$S" "select count(*) from events where run=$R and kind='completed'")
real_from=$(db "$S" "select group_concat(from_step) from phases where run=$R and phase='real'")
delinks=$(db "$S" "select count(*) from events where run=$R and kind='delink'")
replays=$(db "$S" "select count(*) from events where run=$R and kind='delink' and detail like '%reason=replay%'")
pending=$(db "$S" "select count(*) from commands where run=$R and state='pending'")
acks_lost=$((acked - held))

echo "seed $SEED, $STEPS steps (delink at $PSEUDO), $lives lives of m6d"
printf 'kills: %d (' "$kills"
for k in "${kinds[@]}"; do printf ' %s %d' "$k" "${count[$k]:-0}"; done
echo " ); hooks that did not fire in 12 steps (killed from outside): $not_killed"
echo "reference run ${ref_s} s; soak ${soak_s} s"
echo "checkpoint loads (after each kill and at the end): $ckpts, failing: $ckpt_bad; *.tmp-* left: $tmp_left; table rows without a directory: $table_missing"
echo "metrics rows: $rows for $STEPS steps ($distinct distinct; lost $rows_lost, extra $rows_extra)"
echo "loss curve bitwise the uninterrupted run's: $([ $losses_equal = 1 ] && echo yes || echo NO)"
echo "completed events: $completed; real phase from: $real_from; delink events: $delinks ($replays replays after a restart from an older checkpoint)"
echo "pauses acknowledged before a kill: $acked, held after the restart: $held; resumes acknowledged: $resumed, lost: $resumes_lost; commands left pending: $pending"
ok=1
[ "$ckpt_bad" = 0 ] && [ "$tmp_left" = 0 ] && [ "$table_missing" = 0 ] || ok=0
[ "$rows_lost" = 0 ] && [ "$rows_extra" = 0 ] || ok=0
[ "$losses_equal" = 1 ] && [ "$completed" = 1 ] && [ "$real_from" = "$PSEUDO" ] || ok=0
[ "$acks_lost" = 0 ] && [ "$resumes_lost" = 0 ] && [ "$pending" = 0 ] || ok=0
if [ "$kills" != "$N" ]; then
    ok=0
    echo "the run completed after $kills of $N kills: too few steps for the soak" >&2
fi
if [ $ok = 0 ]; then
    KEEP=1
    [ $losses_equal = 1 ] || diff "$T/ref.csv" "$T/soak.csv" | head -5 >&2
fi
echo "kills=$kills lives=$lives checkpoints=$ckpts ckpt_bad=$ckpt_bad rows_lost=$rows_lost rows_extra=$rows_extra losses_equal=$losses_equal acks_lost=$acks_lost resumes_lost=$resumes_lost seed=$SEED seconds=$soak_s ok=$ok"
[ $ok = 1 ]
