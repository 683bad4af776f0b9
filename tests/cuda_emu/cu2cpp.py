#!/usr/bin/env python3
"""cu2cpp.py IN.cu OUT.cpp -- make a .cu file compile as C++ on the CPU
emulation of CUDA (tests/cuda_emu): every launch
    kernel<<<grid, block[, smem[, stream]]>>>(args)
becomes
    ::emu::launch(kernel, grid, block[, smem[, stream]])(args)
Nothing else changes (line numbers included), and a #line directive keeps
compiler messages pointing at the .cu file."""
import re
import sys

LAUNCH = re.compile(r'([A-Za-z_]\w*(?:\s*<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(',
                    re.S)


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path) as f:
        src = f.read()
    out, n = LAUNCH.subn(
        lambda m: '::emu::launch(%s, %s)(' % (m.group(1), m.group(2)), src)
    if '<<<' in out:
        line = out[:out.index('<<<')].count('\n') + 1
        sys.exit('%s:%d: a <<<...>>> launch cu2cpp.py cannot rewrite'
                 % (src_path, line))
    with open(out_path, 'w') as f:
        f.write('#line 1 "%s"\n' % src_path)
        f.write(out)


if __name__ == '__main__':
    main()
