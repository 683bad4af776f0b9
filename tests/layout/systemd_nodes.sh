#!/bin/sh
# systemd_nodes.sh M6D UNITDIR — the many-nodes units (m6d-coordinator.service,
# m6d-worker@.service) pass `systemd-analyze verify` with no message at all
# (verify exits 0 on an unknown key, printing a warning: any output fails);
# they carry m6d.service's hardening block byte for byte (one block, kept
# alike: the two touch the network), and `systemd-analyze security
# --offline=yes` rates each of the three units at 2.0 or less.
# The units name /usr/local/bin/m6d, where make install puts it; here that
# path is replaced with the m6d just built, in a copy.
set -u
m6d=${1:?usage: systemd_nodes.sh M6D UNITDIR}
dir=${2:?usage: systemd_nodes.sh M6D UNITDIR}
command -v systemd-analyze >/dev/null || { echo "SKIP: no systemd-analyze"; exit 77; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
for u in m6d-coordinator.service m6d-worker@.service; do
    [ -f "$dir/$u" ] || { echo "FAIL: $dir/$u missing"; exit 1; }
    sed "s#/usr/local/bin/m6d#$m6d#g" "$dir/$u" >"$tmp/$u"
done
out=$(cd "$tmp" && systemd-analyze verify --man=no ./m6d-coordinator.service \
      ./m6d-worker@.service 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify (exit $rc):"
    echo "$out"
    exit 1
fi
# the worker joins its instance name; the coordinator listens
grep -q -- '--join %i' "$dir/m6d-worker@.service" || { echo "FAIL: worker unit does not --join %i"; exit 1; }
grep -q -- '--role coordinator --listen' "$dir/m6d-coordinator.service" || { echo "FAIL: coordinator unit does not listen"; exit 1; }
# the hardening block: from "# --- hardening" to the [Install] section
block_() { sed -n '/^# --- hardening/,/^\[Install\]/p' "$1"; }
ref=$(block_ "$dir/m6d.service")
[ -n "$ref" ] || { echo "FAIL: m6d.service has no '# --- hardening' block"; exit 1; }
for u in m6d-coordinator.service m6d-worker@.service; do
    if [ "$(block_ "$dir/$u")" != "$ref" ]; then
        echo "FAIL: $u's hardening block differs from m6d.service's:"
        block_ "$dir/$u" | diff -u - /dev/stdin <<EOF2 | head -20
$ref
EOF2
        exit 1
    fi
done
# the exposure score of each (the worker under an instance name)
cp "$dir/m6d.service" "$tmp/m6d.service"
cp "$tmp/m6d-worker@.service" "$tmp/m6d-worker@127.0.0.1:7070.service"
scores=""
for u in m6d.service m6d-coordinator.service m6d-worker@127.0.0.1:7070.service; do
    out=$(cd "$tmp" && systemd-analyze security --offline=yes "./$u" 2>&1)
    score=$(echo "$out" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
    [ -n "$score" ] || { echo "FAIL: no score from systemd-analyze security $u:"; echo "$out" | tail -3; exit 1; }
    awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' || {
        echo "FAIL: $u: exposure $score, want at most 2.0:"; echo "$out" | grep '✗'; exit 1; }
    scores="$scores $u=$score"
done
echo "systemd_nodes: ok (the many-nodes units verify cleanly; exposure:$scores)"
