#!/bin/bash
# gen-tables.sh — regenerate README.md's two tables from the code: the spec
# keys (daemon/train/spec.c's key table) and the m6ctl commands (m6ctl.c's
# command table), both printed by `m6ctl help --markdown TABLE`. Each table
# sits between marker lines in README.md:
#   <!-- BEGIN spec-keys --> ... <!-- END spec-keys -->
#   <!-- BEGIN commands -->  ... <!-- END commands -->
#
#   docs/gen-tables.sh [M6CTL [README]]          rewrite README in place
#   docs/gen-tables.sh --check [M6CTL [README]]  exit 1 with a diff if README
#                                                 is not what it would write
# M6CTL defaults to build/client/m6ctl, README to the repository's README.md.
# The meson test doc_tables runs the --check form.
set -euo pipefail

check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
m6ctl=${1:-$root/build/client/m6ctl}
readme=${2:-$root/README.md}
[ -x "$m6ctl" ] || { echo "gen-tables: $m6ctl: not an executable m6ctl" >&2; exit 2; }
[ -f "$readme" ] || { echo "gen-tables: $readme: no such file" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/README.md
cp "$readme" "$out"
for table in spec-keys commands; do
    begin="<!-- BEGIN $table -->" end="<!-- END $table -->"
    if [ "$(grep -cxF "$begin" "$out")" != 1 ] || [ "$(grep -cxF "$end" "$out")" != 1 ]; then
        echo "gen-tables: $readme: want one line '$begin' and one '$end'" >&2
        exit 2
    fi
    "$m6ctl" help --markdown "$table" > "$tmp/$table.md" ||
        { echo "gen-tables: $m6ctl help --markdown $table failed" >&2; exit 2; }
    # keep the marker lines, replace what is between them
    awk -v begin="$begin" -v end="$end" -v table="$tmp/$table.md" '
        $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
        $0 == end   { skip = 0 }
        !skip       { print }' "$out" > "$tmp/next"
    mv "$tmp/next" "$out"
done

if [ $check = 1 ]; then
    if ! diff -u "$readme" "$out"; then
        echo "gen-tables: $readme's tables differ from the code (above);" \
             "run docs/gen-tables.sh to regenerate them" >&2
        exit 1
    fi
    exit 0
fi
cmp -s "$out" "$readme" || cp "$out" "$readme"
