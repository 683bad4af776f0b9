#!/usr/bin/env python3
"""cu2cpp.py IN.cu OUT.cpp [DEPFILE [INCDIR...]] -- make a .cu file compile as C++ on the CPU
emulation of CUDA (tests/cuda_emu):
 - every launch  kernel<<<grid, block[, smem[, stream]]>>>(args)  becomes
   ::emu::launch(kernel, grid, block[, smem[, stream]])(args);
 - every  __shared__ T a[..], b[..];  declaration is followed, on the same
   line, by  ::emu::shared_fresh(a, sizeof a); ...  which fills the array
   with 0xff bytes (NaN) the first time a thread of a new block reaches it,
   as a GPU's shared memory holds garbage, not zeros, at a block's start;
 - a  #include "X.cuh"  found next to the file, or else in one of the
   INCDIRs (in order, as the compiler's -I), is read in, rewritten the
   same way (once per file: the headers have include guards anyway).
Line numbers are kept (#line directives), so compiler messages point at
the .cu and .cuh files. DEPFILE (Make syntax) lists the .cuh files read in,
so that the build rewrites OUT.cpp when one of them changes."""
import os
import re
import sys

LAUNCH = re.compile(r'([A-Za-z_]\w*(?:\s*<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(',
                    re.S)
SHARED = re.compile(r'__shared__\s+([A-Za-z_][\w:<>]*)\s+([^;()]+);')
ARRAY = re.compile(r'([A-Za-z_]\w*)\s*(?:\[[^\]]*\])+')
INCLUDE = re.compile(r'^#include "([^"]+\.cuh)"[ \t]*$', re.M)


def shared_(m):
    names = ARRAY.findall(m.group(2))
    if not names:
        return m.group(0)  # a scalar: left as it is
    return m.group(0) + ' ' + ' '.join(
        '::emu::shared_fresh(%s, sizeof %s);' % (n, n) for n in names)


def find_(path, name, incdirs):
    for d in [os.path.dirname(path)] + incdirs:
        inc = os.path.join(d, name)
        if os.path.exists(inc):
            return inc
    return None


def rewrite(path, done, incdirs):
    with open(path) as f:
        src = f.read()
    src = LAUNCH.sub(
        lambda m: '::emu::launch(%s, %s)(' % (m.group(1), m.group(2)), src)
    src = SHARED.sub(shared_, src)
    if '<<<' in src:
        line = src[:src.index('<<<')].count('\n') + 1
        sys.exit('%s:%d: a <<<...>>> launch cu2cpp.py cannot rewrite'
                 % (path, line))

    def include_(m):
        inc = find_(path, m.group(1), incdirs)
        if inc is None:
            return m.group(0)
        if inc in done:
            return ''
        done.add(inc)
        line = src[:m.start()].count('\n') + 2
        return '%s\n#line %d "%s"' % (rewrite(inc, done, incdirs), line,
                                       path)

    return '#line 1 "%s"\n' % path + INCLUDE.sub(include_, src)


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    done = set()
    out = rewrite(src_path, done, sys.argv[4:])
    with open(out_path, 'w') as f:
        f.write(out)
    if len(sys.argv) > 3:
        with open(sys.argv[3], 'w') as f:
            f.write('%s: %s\n' % (out_path.replace(' ', '\\ '), ' '.join(
                p.replace(' ', '\\ ') for p in [src_path] + sorted(done))))


if __name__ == '__main__':
    main()
