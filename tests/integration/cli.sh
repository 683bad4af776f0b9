#!/usr/bin/env bash
# cli.sh — m6ctl's user-facing contract: exit codes (the same for the same
# mistake in every command), argument checks that name the option, and
# what data prepare leaves behind and says, also when interrupted.
. "$(dirname "$0")/lib.sh"

# expect_rc WANT CMD...: run CMD (stderr in $T/err), assert its exit status.
expect_rc() {
    local want=$1 rc=0; shift
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = "$want" ] || fail "$* exited $rc, want $want: $(cat "$T/err")"
}

prepare_data "$T/data"
TXT=$FORTUNES/fortunes

# data prepare's summary says what was read and, apart, what was not and
# why: fortunes holds a binary index (.dat) and a symlink (.u8) per text.
read -r texts bins links < <(python3 - "$FORTUNES" <<'PY'
import os, sys
d = sys.argv[1]; t = b = l = 0
for n in os.listdir(d):
    p = os.path.join(d, n)
    if os.path.islink(p):
        l += os.path.isfile(p)
    elif os.path.isfile(p):
        if b"\0" in open(p, "rb").read(8192): b += 1
        else: t += 1
print(t, b, l)
PY
)
grep -Eqx "$texts text files read: [0-9]+ train tokens in 1 shard, [0-9]+ val tokens in 1 shard" \
    "$T/prepare.out" || fail "prepare summary: $(cat "$T/prepare.out")"
grep -Eqx "not read: $bins binary files \(a NUL byte in the first 8 KiB, such as [^/]+\), $links duplicates \(a symlink, hard link or repeated path to a file already read\)" \
    "$T/prepare.out" || fail "prepare summary, what was not read: $(cat "$T/prepare.out")"

# Numeric options: one parser; non-numbers, fractions where a count is
# wanted and out-of-range values are refused naming the option (exit 2,
# nothing written). 5000000000 passed the old check and was cut to
# INT32_MAX tokens without a word.
for v in 2000.7 0x800 " 2048" 1023 5000000000 -2048 inf; do
    expect_rc 2 "$M6CTL" data prepare --out "$T/num" --shard-tokens "$v" "$TXT"
    grep -q -- '--shard-tokens: want a whole number in \[1024, 2147483647\]' "$T/err" \
        || fail "--shard-tokens '$v': $(cat "$T/err")"
    [ -e "$T/num" ] && fail "--shard-tokens '$v': $T/num was made"
done
expect_rc 0 "$M6CTL" data prepare --out "$T/num" --shard-tokens 2147483647 "$TXT"
for v in 0.6 0x0.1 " 0.1" nan; do
    expect_rc 2 "$M6CTL" data prepare --out "$T/num2" --val-fraction "$v" "$TXT"
    grep -q -- '--val-fraction: want a number in \[0, 0.5\]' "$T/err" || fail "--val-fraction '$v': $(cat "$T/err")"
done
for o in --interval --reconnect; do
    expect_rc 2 "$M6CTL" --socket "$T/none.sock" watch 1 "$o" 1e-400
    grep -q -- "$o: want a number in" "$T/err" || fail "$o 1e-400: $(cat "$T/err")"
done
# A socket path that is a directory or a regular file is named as not a
# socket (exit 4, as any unreachable m6d), not as a refused connection.
touch "$T/plain.file"
for p in "$T" "$T/plain.file"; do
    expect_rc 4 "$M6CTL" --socket "$p" list
    grep -q "cannot reach m6d at $p: not a socket" "$T/err" || fail "--socket $p: $(cat "$T/err")"
done
# Output formats that exclude each other are refused, in either order and
# wherever --json stands, not settled silently.
for args in "metrics 1 --csv --json" "metrics 1 --json --csv" "--json metrics 1 --csv"; do
    # shellcheck disable=SC2086
    expect_rc 2 "$M6CTL" --socket "$T/none.sock" $args
    grep -q 'metrics: --json and --csv exclude each other' "$T/err" || fail "$args: $(cat "$T/err")"
done

# A failed data prepare removes the directories it made for --out, all of
# them, and none that was there before.
printf 'not\0text' >"$T/binary.dat"
expect_rc 1 "$M6CTL" data prepare --out "$T/made/a/b" "$T/binary.dat"
grep -q 'no text in the inputs' "$T/err" || fail "binary-only prepare: $(cat "$T/err")"
[ -e "$T/made" ] && fail "a failed prepare left $(find "$T/made")"
mkdir -p "$T/there/keep"
expect_rc 1 "$M6CTL" data prepare --out "$T/there/keep/new/" "$T/binary.dat"
[ -d "$T/there/keep" ] && [ ! -e "$T/there/keep/new" ] || fail "failed prepare under an existing dir: $(find "$T/there")"

# Ctrl-C in the middle of a data prepare: exit 128 + SIGINT, said, and no
# shard of it left for a train_*.bin glob. The prepare is frozen
# (SIGSTOP) once its first shard is there, sent SIGINT, then let go, so
# the signal lands mid-run whatever the machine's speed.
python3 -c "import sys; sys.stdout.write('the quick brown fox jumps. ' * 1000000)" >"$T/big.txt"
"$M6CTL" data prepare --out "$T/int" --shard-tokens 1048576 "$T/big.txt" \
    >"$T/int.out" 2>"$T/int.err" &
pid=$!
for _ in $(seq 1 1000); do
    compgen -G "$T/int/train_*.bin" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    nap 0.01
done
kill -STOP "$pid" 2>/dev/null || fail "data prepare ended before the test could stop it"
for _ in $(seq 1 200); do  # stopped (T), or already done (Z)
    st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
    [ "$st" = T ] || [ "$st" = Z ] || [ -z "$st" ] && break
    nap 0.01
done
[ "$st" = T ] || fail "data prepare ended (state ${st:-gone}) before the test could stop it: give it a bigger input"
compgen -G "$T/int/train_*.bin" >/dev/null || fail "no first shard seen: $(ls "$T/int")"
kill -INT "$pid"
kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 130 ] || fail "data prepare after SIGINT exited $rc, want 130: $(cat "$T/int.err")"
grep -q 'stopped by signal 2; the shards written so far were removed' "$T/int.err" \
    || fail "SIGINT: $(cat "$T/int.err")"
! compgen -G "$T/int/*_*.bin*" >/dev/null || fail "SIGINT left shards: $(ls "$T/int")"

write_spec "$T/spec.json" cli 100000 10
start_daemon "$T/s"

# Every command's --help: exit 0, on stdout, the options every command
# takes listed, no trailing blanks.
for c in submit list status watch pause resume delink stop metrics events "data prepare" plan; do
    expect_rc 0 ctl $c --help
    grep -q "^usage: m6ctl $c" "$T/out" || fail "$c --help: no usage line: $(head -2 "$T/out")"
    for o in --socket --no-color --help; do
        grep -q -- "^  $o" "$T/out" || fail "$c --help does not list $o"
    done
    ! grep -n ' $' "$T/out" || fail "$c --help: trailing blanks"
done

# A malformed RUN is a usage error (2) and an unknown one m6d's refusal (1),
# whichever command names it.
for c in status watch pause resume delink stop metrics events; do
    expect_rc 2 ctl "$c" 0
    grep -q 'RUN must be an id > 0' "$T/err" || fail "$c 0: $(cat "$T/err")"
    expect_rc 2 ctl "$c" 99999999999999999999
    expect_rc 2 ctl "$c" ""
    expect_rc 2 ctl "$c" " 1"
    grep -q 'RUN must be an id > 0 or a run name, got " 1"' "$T/err" || fail "$c ' 1': $(cat "$T/err")"
    expect_rc 2 ctl "$c" -1
    grep -q 'RUN must be an id > 0 or a run name, got "-1"' "$T/err" || fail "$c -1: $(cat "$T/err")"
    expect_rc 1 ctl "$c" 4242
    grep -q 'no run with id 4242' "$T/err" || fail "$c 4242: $(cat "$T/err")"
done

# nodes.world_size > 1 on an m6d that is no coordinator: refused at
# submit (no node could ever join it), nothing queued
write_spec "$T/dp.json" dp 100 10 '"nodes": {"world_size": 2}'
NRUNS=$(ctl --json list | wc -l)
expect_rc 1 ctl submit "$T/dp.json"
grep -q "nodes.world_size 2 needs a coordinator, and this m6d is not one" "$T/err" \
    || fail "world_size 2 on a plain m6d: $(cat "$T/err")"
[ "$(ctl --json list | wc -l)" = "$NRUNS" ] || fail "a refused multi-node run was queued"

# nodes.expert_parallel > 1 trains across ranks: a plain m6d refuses it
# at submit as any multi-rank run, nothing queued
M6_TEST_MODEL='{"vocab_size": 256, "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "moe": {"num_experts": 4}}' \
    write_spec "$T/ep.json" ep 100 10 '"nodes": {"world_size": 2, "expert_parallel": 2}'
expect_rc 1 ctl submit "$T/ep.json"
grep -q "nodes.world_size 2 needs a coordinator, and this m6d is not one" "$T/err" \
    || fail "expert_parallel 2 on a plain m6d: $(cat "$T/err")"
[ "$(ctl --json list | wc -l)" = "$NRUNS" ] || fail "a refused expert-parallel run was queued"

: >"$T/empty.json"
expect_rc 1 ctl submit "$T/empty.json"
grep -q "$T/empty.json: empty, want a JSON run spec" "$T/err" || fail "empty spec file: $(cat "$T/err")"
printf ' \n\t\n' >"$T/blank.json"
expect_rc 1 ctl submit "$T/blank.json"
grep -q "$T/blank.json: only blanks, want a JSON run spec" "$T/err" || fail "blank spec file: $(cat "$T/err")"

# watch: 1 when the run failed, 4 when m6d went away under it: a script
# must tell a bad run from a lost daemon. B fails at its start: its shards
# are gone by then.
A=$(ctl submit "$T/spec.json")
wait_state "$A" running
cp -r "$T/data" "$T/data-b"
sed "s#$T/data/#$T/data-b/#g" "$T/spec.json" >"$T/spec-b.json"
B=$(ctl submit "$T/spec-b.json")
rm -r "$T/data-b"
ctl stop "$A" >/dev/null
expect_rc 1 ctl watch "$B" --interval 0.05
grep -q "run $B failed at step 0: .*no files match" "$T/out" || fail "watch of a failed run: $(cat "$T/out")"
# two ended runs named cli (A stopped, B failed), none live: the name is
# ambiguous, and the refusal lists the ids to choose from
expect_rc 1 ctl status cli
grep -qF "several runs are named \"cli\" (ids $A, $B); use the numeric id" "$T/err" \
    || fail "status of an ambiguous name: $(cat "$T/err")"
C=$(ctl submit "$T/spec.json")
wait_step "$C" 5
for r in 0 1; do
    (rc=0; ctl watch "$C" --interval 0.05 --reconnect $r >"$T/watch-$r.out" 2>"$T/watch-$r.err" || rc=$?
     echo "$rc" >"$T/watch-$r.rc") &
done
# both watches connected: each has shown the run once
watching() { [ -s "$T/watch-0.out" ] && [ -s "$T/watch-1.out" ] || { cat "$T"/watch-*.err; return 1; }; }
WAIT_RUN=$C wait_for "both watches to show run $C" 10 watching
kill9_daemon
wait
for r in 0 1; do
    [ "$(cat "$T/watch-$r.rc")" = 4 ] || fail "watch --reconnect $r, m6d killed: exit $(cat "$T/watch-$r.rc"), want 4: $(cat "$T/watch-$r.err")"
done
grep -q "m6d still unreachable after 1 s" "$T/watch-1.err" || fail "watch --reconnect 1: $(cat "$T/watch-1.err")"

# What m6ctl prints, as a newcomer reads it. The command list: one whole
# sentence per command (the events line used to stop mid-list at "pause,").
expect_rc 0 "$M6CTL" --help
sed -n '/^commands:$/,/^$/p' "$T/out" | sed '1d;$d' >"$T/cmds"
# (17: export, import, plot, nodes and checkpoints joined the 12)
[ "$(wc -l <"$T/cmds")" = 17 ] || fail "--help lists $(wc -l <"$T/cmds") commands: $(cat "$T/cmds")"
! grep -v '\.$' "$T/cmds" || fail "--help: a command's line does not end its sentence"
grep -qx '  events      RUN        What happened to a run, oldest first (its events table).' "$T/cmds" \
    || fail "--help, events: $(grep events "$T/cmds")"

start_daemon "$T/v"
# Floats in their shortest round-trip form: an lr of 0.0008 (a float32 of
# 0.00079999997979030013) prints as 0.0008 in --json and --csv alike.
write_spec "$T/lr.json" lr 12 4
sed -i 's/"seed": 7}/"seed": 7, "lr": 0.0008, "min_lr": 0.0008, "warmup_steps": 0}/' "$T/lr.json"
L=$(ctl submit "$T/lr.json")
ctl watch "$L" >"$T/watch-lr.out" || fail "lr run: $(cat "$T/watch-lr.out")"
ctl status "$L" --json >"$T/lr-status.json"
grep -qx '  "lr": 0.0008,' "$T/lr-status.json" || fail "status --json lr: $(grep '"lr"' "$T/lr-status.json")"
ctl metrics "$L" --json >"$T/lr-metrics.json"
[ "$(grep -c '^    "lr": 0.0008,$' "$T/lr-metrics.json")" = 12 ] \
    || fail "metrics --json lr: $(grep '"lr"' "$T/lr-metrics.json" | sort | uniq -c)"
ctl metrics "$L" --csv >"$T/lr.csv"
[ "$(sed 1d "$T/lr.csv" | cut -d, -f5 | sort -u)" = 0.0008 ] \
    || fail "metrics --csv lr: $(sed 1d "$T/lr.csv" | cut -d, -f5 | sort | uniq -c)"
# Timestamps say they are UTC: created as date(1) writes m6.db's time.
created=$(db "$T/v" "select cast(created as integer) from runs where id=$L")
want=$(date -u -d "@$created" +%Y-%m-%dT%H:%M:%SZ)
ctl status "$L" >"$T/lr-status.txt"
grep -qx "created: *$want" "$T/lr-status.txt" || fail "status created, want $want: $(grep created "$T/lr-status.txt")"
# A CPU run's "device" is the budgeted memory pool: neither its status nor
# its plan speaks of device or pinned memory (but for the note naming the
# spec key and the option, device.memory_budget and --device-memory).
grep -q '^offload: *off (no budget): 2/2 slots resident, memory pool ' "$T/lr-status.txt" \
    || fail "cpu status offload line: $(grep offload "$T/lr-status.txt")"
ctl plan "$T/lr.json" >"$T/lr-plan.txt"
! grep -v '^note: no device.memory_budget' "$T/lr-plan.txt" | grep -Ein 'device|pinned' ||
    fail "cpu plan speaks of device or pinned memory"
grep -q '^budgeted memory pool (real): ' "$T/lr-plan.txt" || fail "cpu plan: $(cat "$T/lr-plan.txt")"

# Phases: a run without a Pseudo phase was trained from scratch (it never
# delinked, not "at step 0"); a run that ended in the Pseudo phase will not
# delink any more.
write_spec "$T/scratch.json" scratch 6 0
F=$(ctl submit "$T/scratch.json")
ctl watch "$F" >"$T/watch-f.out" || fail "from-scratch run: $(cat "$T/watch-f.out")"
! grep -q 'delinked' "$T/watch-f.out" || fail "watch of a from-scratch run: $(cat "$T/watch-f.out")"
ctl status "$F" >"$T/f.txt"
grep -qx 'phase: *real (trained from scratch)' "$T/f.txt" || fail "from-scratch phase: $(grep phase "$T/f.txt")"
write_spec "$T/never.json" never 300000 200000
P=$(ctl submit "$T/never.json")
wait_step "$P" 1
ctl status "$P" | has -x 'phase: *pseudo (delink at step 200000)' || fail "running pseudo phase: $(ctl status "$P")"
ctl stop "$P" >/dev/null
wait_state "$P" stopped
ctl status "$P" >"$T/p.txt"
grep -qx 'phase: *pseudo' "$T/p.txt" || fail "stopped pseudo run's phase: $(grep phase "$T/p.txt")"
stop_daemon

# M6_STATE_DIR: m6d without --state-dir keeps its state there, and m6ctl
# without --socket finds it there (nothing of either under HOME).
ENV_DIR=$T/env-state
(
    export M6_STATE_DIR=$ENV_DIR HOME=$T/no-home
    unset XDG_STATE_HOME STATE_DIRECTORY M6_SOCKET
    exec "$M6D" --threads 1
) 2>>"$T/m6d-env.log" &
M6D_PIDS[env]=$!
wait_for "m6d to answer at M6_STATE_DIR's socket" 30 \
    env M6_STATE_DIR="$ENV_DIR" HOME="$T/no-home" "$M6CTL" list
[ -f "$ENV_DIR/m6.db" ] || fail "M6_STATE_DIR: no m6.db in $ENV_DIR"
[ ! -e "$T/no-home" ] || fail "M6_STATE_DIR: m6d or m6ctl wrote under HOME"
kill "${M6D_PIDS[env]}"
wait "${M6D_PIDS[env]}" || fail "m6d with M6_STATE_DIR: exit $?"
unset 'M6D_PIDS[env]'

echo "cli: ok"
