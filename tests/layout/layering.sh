#!/bin/sh
# layering.sh SRCROOT — the model and the kernels sit below the run: no file
# under daemon/model/ or kernels/ includes a header of daemon/train/ (the run
# spec, trainer, data, backends) or daemon/control/ (the protocol edge).
# Checks both spellings an include can take: the directory-qualified one
# ("train/spec.h") and a bare name that is a header of those folders
# ("spec.h") where the including folder has no header of that name.
# Prints every offending line and exits 1; exits 0 when there is none.
set -u
root=${1:?usage: layering.sh SRCROOT}
cd "$root" || exit 2
[ -d daemon/model ] && [ -d kernels ] && [ -d daemon/train ] \
  && [ -d daemon/control ] || { echo "layering: $root is not m6's source root"; exit 2; }

out=$(mktemp) || exit 2
trap 'rm -f "$out"' EXIT
banned=$(cd daemon && ls train/*.h control/*.h 2>/dev/null | sed 's|.*/||' | sort -u)
bad=0
for f in $(find daemon/model kernels -type f \( -name '*.c' -o -name '*.h' \
             -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) | sort); do
  dir=$(dirname "$f")
  # every quoted include: LINE:PATH
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
    sed 's/^\([0-9]*\):.*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1:\2/' |
  while IFS=: read -r line inc; do
    case "$inc" in
      train/*|control/*|*/train/*|*/control/*)
        echo "$f:$line: includes \"$inc\" (daemon/train or daemon/control)"
        echo x ;;
      */*) ;;
      *)
        if [ ! -e "$dir/$inc" ] && echo "$banned" | grep -qx "$inc"; then
          echo "$f:$line: includes \"$inc\", a header of daemon/train or daemon/control"
          echo x
        fi ;;
    esac
  done
done > "$out" 2>&1
grep -v '^x$' "$out"
grep -qx x "$out" && bad=1
if [ $bad -ne 0 ]; then
  echo "layering: FAIL: daemon/model/ and kernels/ must not include train/ or control/ headers"
  exit 1
fi
echo "layering: ok (daemon/model/ and kernels/ include no train/ or control/ header)"
exit 0
