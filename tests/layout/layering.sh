#!/bin/sh
# layering.sh SRCROOT — dependencies run one way: every folder of daemon/,
# client/, kernels/ (and proto/) sits on a floor, and a file may include
# headers of its own folder and of folders on lower floors only. The floors,
# lowest first (a folder's subfolders are on its floor):
#
#   0  kernels  daemon/common
#   1  daemon/model  daemon/state  proto
#   2  daemon/spec
#   3  daemon/offload  daemon/ckpt  daemon/dist
#   4  daemon/train
#   5  daemon/http
#   6  daemon/runner  daemon/cluster
#   7  daemon/control
#   8  client
#
# Checks both spellings an include can take: the directory-qualified one
# ("train/spec.h", resolved against the source root, kernels/ and daemon/,
# as meson's include path) and a bare name ("spec.h"), resolved in the
# including folder first, else to every header of that name in the tree
# (an upward include if none of them is on an allowed floor). Headers not
# in the tree (m6.pb-c.h, system headers) are not checked. A folder with no
# floor fails too: a new folder must be placed. Prints every offending
# line and exits 1; exits 0 when there is none.
set -u
root=${1:?usage: layering.sh SRCROOT}
cd "$root" || exit 2
[ -d daemon/model ] && [ -d kernels ] && [ -d client ] \
  || { echo "layering: $root is not m6's source root"; exit 2; }

# floor_of PATH: the floor of the file or folder PATH; "" when none
floor_of() {
  case "$1" in
    kernels|kernels/*|daemon/common|daemon/common/*) echo 0 ;;
    daemon/model|daemon/model/*|daemon/state|daemon/state/*|proto|proto/*) echo 1 ;;
    daemon/spec|daemon/spec/*) echo 2 ;;
    daemon/offload|daemon/offload/*|daemon/ckpt|daemon/ckpt/*|daemon/dist|daemon/dist/*) echo 3 ;;
    daemon/train|daemon/train/*) echo 4 ;;
    daemon/http|daemon/http/*) echo 5 ;;
    daemon/runner|daemon/runner/*|daemon/cluster|daemon/cluster/*) echo 6 ;;
    daemon/control|daemon/control/*) echo 7 ;;
    client|client/*) echo 8 ;;
    *) echo "" ;;
  esac
}
# top_of PATH: the folder PATH's floor is named by (daemon/X, client, ...)
top_of() {
  case "$1" in
    daemon/*) echo "$1" | cut -d/ -f1-2 ;;
    *) echo "$1" | cut -d/ -f1 ;;
  esac
}

out=$(mktemp) || exit 2
hdrs=$(mktemp) || exit 2
trap 'rm -f "$out" "$hdrs"' EXIT
find daemon client kernels proto -type f \( -name '*.h' -o -name '*.cuh' \) | sort > "$hdrs"

# every folder with sources must have a floor
for d in $(find daemon client kernels proto -type f \( -name '*.c' -o -name '*.h' \
             -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cc' \) \
             -exec dirname {} \; | sort -u); do
  [ -n "$(floor_of "$d")" ] || { echo "$d: a folder on no floor (place it in tests/layout/layering.sh)"; echo x; }
done > "$out"

for f in $(find daemon client kernels proto -type f \( -name '*.c' -o -name '*.h' \
             -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cc' \) | sort); do
  dir=$(dirname "$f")
  me=$(floor_of "$f")
  [ -n "$me" ] || continue
  mytop=$(top_of "$dir")
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
    sed 's/^\([0-9]*\):.*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1:\2/' |
  while IFS=: read -r line inc; do
    # the headers this include may name
    if [ -e "$dir/$inc" ]; then
      cands="$dir/$inc"
    else
      case "$inc" in
        */*) cands=$(for p in "$inc" "kernels/$inc" "daemon/$inc"; do
                       [ -e "$p" ] && echo "$p"; done) ;;
        *) cands=$(grep "/$inc\$" "$hdrs") ;;
      esac
    fi
    [ -n "$cands" ] || continue
    ok=0 worst=""
    for c in $cands; do
      c=$(echo "$c" | sed 's|^\./||')
      cf=$(floor_of "$c")
      ctop=$(top_of "$(dirname "$c")")
      if [ "$ctop" = "$mytop" ] || { [ -n "$cf" ] && [ "$cf" -lt "$me" ]; }; then
        ok=1
      else
        worst="$c (floor ${cf:-none})"
      fi
    done
    if [ $ok -eq 0 ]; then
      echo "$f:$line: #include \"$inc\": $worst is not below $mytop (floor $me)"
      echo x
    fi
  done
done >> "$out" 2>&1
grep -v '^x$' "$out"
if grep -qx x "$out"; then
  echo "layering: FAIL: an include climbs a floor (the floors: tests/layout/layering.sh)"
  exit 1
fi
echo "layering: ok (every folder of daemon/, client/, kernels/, proto/ includes only its own and lower floors)"
exit 0
