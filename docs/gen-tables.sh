#!/bin/bash
# gen-tables.sh — regenerate the docs' two generated tables from the code:
# the spec keys (daemon/spec/spec_keys.c's key table) and the m6ctl commands
# (m6ctl.c's command table), both in docs/OPERATIONS.md, both printed by
# `m6ctl help --markdown TABLE`. Each table sits between marker lines in
# exactly one of the files (a second copy, in README.md say, fails):
#   <!-- BEGIN spec-keys --> ... <!-- END spec-keys -->
#   <!-- BEGIN commands -->  ... <!-- END commands -->
#
#   docs/gen-tables.sh [M6CTL [FILE...]]          rewrite the files in place
#   docs/gen-tables.sh --check [M6CTL [FILE...]]  exit 1 with a diff if a
#                                                  file is not what it would
#                                                  write
# M6CTL defaults to build/client/m6ctl, the files to README.md and
# docs/OPERATIONS.md. The meson test doc_tables runs the --check form.
set -euo pipefail

check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
m6ctl=${1:-$root/build/client/m6ctl}
shift || true
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$root/README.md" "$root/docs/OPERATIONS.md")
[ -x "$m6ctl" ] || { echo "gen-tables: $m6ctl: not an executable m6ctl" >&2; exit 2; }
for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "gen-tables: $f: no such file" >&2; exit 2; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in "${!files[@]}"; do cp "${files[$i]}" "$tmp/$i.md"; done
for table in spec-keys commands; do
    begin="<!-- BEGIN $table -->" end="<!-- END $table -->"
    # the one file that holds the table
    at=
    for i in "${!files[@]}"; do
        nb=$(grep -cxF "$begin" "$tmp/$i.md" || true)
        ne=$(grep -cxF "$end" "$tmp/$i.md" || true)
        if [ "$nb" != 0 ] || [ "$ne" != 0 ]; then
            if [ "$nb" != 1 ] || [ "$ne" != 1 ] || [ -n "$at" ]; then
                echo "gen-tables: want one line '$begin' and one '$end' in one of: ${files[*]}" >&2
                exit 2
            fi
            at=$i
        fi
    done
    [ -n "$at" ] || { echo "gen-tables: no '$begin' in ${files[*]}" >&2; exit 2; }
    out=$tmp/$at.md
    "$m6ctl" help --markdown "$table" > "$tmp/$table.table" ||
        { echo "gen-tables: $m6ctl help --markdown $table failed" >&2; exit 2; }
    # keep the marker lines, replace what is between them
    awk -v begin="$begin" -v end="$end" -v table="$tmp/$table.table" '
        $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
        $0 == end   { skip = 0 }
        !skip       { print }' "$out" > "$tmp/next"
    mv "$tmp/next" "$out"
done

rc=0
for i in "${!files[@]}"; do
    f=${files[$i]}
    if [ $check = 1 ]; then
        if ! diff -u "$f" "$tmp/$i.md"; then
            echo "gen-tables: $f's tables differ from the code (above);" \
                 "run docs/gen-tables.sh to regenerate them" >&2
            rc=1
        fi
    else
        cmp -s "$tmp/$i.md" "$f" || cp "$tmp/$i.md" "$f"
    fi
done
exit $rc
