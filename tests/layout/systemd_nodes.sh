#!/bin/sh
# systemd_nodes.sh M6D UNITDIR — the many-nodes units (m6d-coordinator.service,
# m6d-worker@.service) pass `systemd-analyze verify` with no message at all
# (verify exits 0 on an unknown key, printing a warning: any output fails).
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
echo "systemd_nodes: ok (m6d-coordinator.service, m6d-worker@.service verify cleanly)"
