#!/bin/sh
# m6ctl_deps.sh BINARY — the thin client links only what it uses (protocol,
# spec parser, planner, data prepare): BINARY (build/client/m6ctl) must not
# depend on the engine's libraries: libdnnl (oneDNN), libopenblas, libgomp
# (OpenMP), libcudart or libcublas. Looks at the binary's own DT_NEEDED entries (readelf -d) and
# at everything the loader would map (ldd: what those libraries pull in).
# Prints each offending library and exits 1; 0 when there is none; 77 (skip)
# when neither readelf nor ldd is there.
set -u
bin=${1:?usage: m6ctl_deps.sh BINARY}
[ -f "$bin" ] || { echo "m6ctl_deps: $bin: no such file"; exit 1; }
banned='libdnnl|libopenblas|libblas|libgomp|libomp|libcudart|libcublas'
found=''
if command -v readelf >/dev/null 2>&1; then
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
  [ -n "$needed" ] || { echo "m6ctl_deps: readelf -d $bin lists no NEEDED entry"; exit 1; }
  echo "m6ctl_deps: $bin NEEDED: $(echo $needed)"
  found=$(echo "$needed" | grep -E "^($banned)" || true)
fi
if command -v ldd >/dev/null 2>&1; then
  mapped=$(ldd "$bin" 2>&1 | awk '{print $1}')
  found="$found
$(echo "$mapped" | grep -E "^($banned)" || true)"
elif [ -z "${needed:-}" ]; then
  echo "m6ctl_deps: SKIP: neither readelf nor ldd found"; exit 77
fi
found=$(echo "$found" | grep -v '^$' | sort -u)
if [ -n "$found" ]; then
  echo "m6ctl_deps: FAIL: $bin depends on the engine's libraries:"
  echo "$found" | sed 's/^/  /'
  exit 1
fi
echo "m6ctl_deps: ok ($bin depends on none of libdnnl, libopenblas, libgomp, libcudart, libcublas)"
exit 0
