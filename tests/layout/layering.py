#!/usr/bin/python3
"""layering.py SRCROOT — dependencies run one way: every folder of daemon/,
client/, kernels/ (and proto/) sits on a floor, and a file may include
headers of its own folder and of folders on lower floors only. The floors,
lowest first (a folder's subfolders are on its floor), are FLOORS below.

Checks both spellings an include can take: the directory-qualified one
("train/spec.h", resolved against the source root, kernels/ and daemon/,
as meson's include path) and a bare name ("spec.h"), resolved in the
including folder first, else to every header of that name in the tree (an
upward include if none of them is on an allowed floor). Headers not in the
tree (m6.pb-c.h, system headers) are not checked. A folder with no floor
fails too: a new folder must be placed. Prints every offending line and
exits 1; exits 0 when there is none; 2 on a bad SRCROOT.
"""
import os
import re
import sys

FLOORS = [
    ["kernels", "daemon/common"],
    ["daemon/model", "daemon/state", "proto"],
    ["daemon/spec"],
    ["daemon/offload", "daemon/ckpt", "daemon/dist"],
    ["daemon/train"],
    ["daemon/http"],
    ["daemon/runner", "daemon/cluster"],
    ["daemon/control"],
    ["client"],
]
TREES = ["daemon", "client", "kernels", "proto"]
SOURCES = (".c", ".h", ".cu", ".cuh", ".cpp", ".cc")
HEADERS = (".h", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]*)"')


def floor_of(path):
    """The floor of the file or folder path (relative to the root), or None."""
    for n, tops in enumerate(FLOORS):
        for top in tops:
            if path == top or path.startswith(top + "/"):
                return n
    return None


def top_of(folder):
    """The folder whose floor folder is named by: daemon/X, client, ..."""
    parts = folder.split("/")
    return "/".join(parts[:2]) if parts[0] == "daemon" else parts[0]


def main():
    if len(sys.argv) != 2:
        print("usage: layering.py SRCROOT")
        return 2
    os.chdir(sys.argv[1])
    if not all(os.path.isdir(d) for d in ("daemon/model", "kernels", "client")):
        print("layering: %s is not m6's source root" % sys.argv[1])
        return 2
    files = sorted(os.path.join(d, f)
                   for t in TREES for d, _, fs in os.walk(t)
                   for f in fs if f.endswith(SOURCES))
    by_name = {}
    for f in files:
        if f.endswith(HEADERS):
            by_name.setdefault(os.path.basename(f), []).append(f)
    bad = []
    for d in sorted({os.path.dirname(f) for f in files}):
        if floor_of(d) is None:
            bad.append("%s: a folder on no floor (place it in "
                       "tests/layout/layering.py)" % d)
    for f in files:
        me = floor_of(f)
        if me is None:
            continue
        folder = os.path.dirname(f)
        mytop = top_of(folder)
        with open(f, errors="replace") as src:
            lines = src.readlines()
        for line, text in enumerate(lines, 1):
            m = INCLUDE.match(text)
            if not m:
                continue
            inc = m.group(1)
            here = os.path.normpath(os.path.join(folder, inc))
            if os.path.exists(here):
                cands = [here]
            elif "/" in inc:
                cands = [p for p in (inc, "kernels/" + inc, "daemon/" + inc)
                         if os.path.exists(p)]
            else:
                cands = by_name.get(inc, [])
            if not cands:
                continue
            worst = None
            for c in cands:
                cf = floor_of(c)
                if top_of(os.path.dirname(c)) == mytop or (cf is not None and cf < me):
                    break
                worst = "%s (floor %s)" % (c, "none" if cf is None else cf)
            else:
                bad.append('%s:%d: #include "%s": %s is not below %s (floor %d)'
                           % (f, line, inc, worst, mytop, me))
    for b in bad:
        print(b)
    if bad:
        print("layering: FAIL: an include climbs a floor (the floors: "
              "tests/layout/layering.py)")
        return 1
    print("layering: ok (every folder of daemon/, client/, kernels/, proto/ "
          "includes only its own and lower floors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
