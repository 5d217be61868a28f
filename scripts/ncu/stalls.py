#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction, from an ncu report.

On the GPU machine, with the kernels compiled with line info:

    KILN_CUDA_NVRTC_FLAGS=-lineinfo KILN_CUDA_GRAPHS=0 ncu --kernel-name regex:NAME \
        --launch-skip 12 --launch-count 1 --import-source yes \
        --section WarpStateStats --section SourceCounters -o /tmp/rep kiln bench ...
    ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv
    python3 scripts/ncu/stalls.py /tmp/src.csv

prints the stall samples of every loop (a backward branch and its target)
holding more than 2% of them, then the instructions with the most samples
inside the busiest loop and outside it, each with the stall reasons that
make up a fifth or more of its samples. Compact on purpose: the device tool
returns only the tail of a call's output.
"""
import csv
import re
import sys

REASONS = ['stall_long_sb', 'stall_wait', 'stall_short_sb', 'stall_barrier', 'stall_math', 'stall_mio', 'stall_lg',
           'stall_branch_resolving', 'stall_no_inst', 'stall_selected', 'stall_not_selected']


def num(x):
    try:
        return float(x.replace(',', ''))
    except ValueError:
        return 0.0


def main(path, top=16):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if 'Address' in r and 'Source' in r)
    h, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    col = {name: h.index(name) for name in h}
    samples = next(i for i, name in enumerate(h) if name.startswith('Warp Stall Sampling (All'))
    src, addr = col['Source'], [int(r[col['Address']], 16) for r in data]
    reasons = {r: col[r] for r in REASONS if r in col}
    s = [num(r[samples]) for r in data]
    total = sum(s)
    print(f'{total:.0f} samples over {len(data)} instructions')
    where = {a: i for i, a in enumerate(addr)}
    loops = []
    for i, r in enumerate(data):
        m = re.search(r'BRA (0x[0-9a-f]+)', r[src])
        if m and int(m.group(1), 16) < addr[i] and int(m.group(1), 16) in where:
            j = where[int(m.group(1), 16)]
            loops.append((j, i, sum(s[j:i + 1])))
    for j, i, n in loops:
        if n > 0.02 * total:
            print(f'loop {j}..{i} ({i - j + 1} instructions): {n:.0f} samples ({100 * n / total:.1f}%)')
    if not loops:
        return

    def show(k):
        tags = ' '.join(f'{r[6:]}={num(data[k][c]):.0f}' for r, c in reasons.items() if num(data[k][c]) >= 0.2 * max(1, s[k]))
        print(f'{k:5d} {s[k]:6.0f}  {data[k][src].strip()[:60]:60s} {tags}')

    j, i, _ = max(loops, key=lambda x: x[2])
    print(f'-- the busiest loop ({j}..{i})')
    for k in sorted(range(j, i + 1), key=lambda k: -s[k])[:top]:
        show(k)
    out = [k for k in range(len(data)) if not j <= k <= i]
    print(f'-- outside it: {sum(s[k] for k in out):.0f} samples')
    for k in sorted(out, key=lambda k: -s[k])[:top]:
        show(k)


if __name__ == '__main__':
    main(sys.argv[1])
