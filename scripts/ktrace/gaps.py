"""Prints how long the GPU idles between decode steps in ktrace.c's records.

    python3 gaps.py TRACE.csv [--first KERNEL] [--steps N]

A step starts at its first kernel (--first, a name prefix: the token
embedding by default). For the last N steps it prints the median period
(a step's first kernel to the next step's), the median span (first kernel
to the step's last kernel's end) and the median idle gap between them: the
host's work between steps (sampling's read-back, planning, the next
launch), in microseconds.
"""
import argparse
import csv
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--first", default="embed")
ap.add_argument("--steps", type=int, default=32)
args = ap.parse_args()

ks = sorted((int(r[0]), int(r[1]), ",".join(r[6:])) for r in csv.reader(open(args.trace)) if len(r) >= 7)
firsts = [i for i, k in enumerate(ks) if k[2].startswith(args.first)]
if len(firsts) < 3:
    raise SystemExit(f"fewer than three steps starting at {args.first!r} in {len(ks)} kernels")
periods, spans, gaps = [], [], []
for a, b in list(zip(firsts[:-1], firsts[1:]))[-args.steps:]:
    end = max(k[1] for k in ks[a:b])
    periods.append(ks[b][0] - ks[a][0])
    spans.append(end - ks[a][0])
    gaps.append(ks[b][0] - end)
med = lambda v: statistics.median(v) / 1e3
print(f"{len(periods)} steps: period {med(periods):.1f} us, span {med(spans):.1f} us, idle gap {med(gaps):.1f} us (min {min(gaps) / 1e3:.1f}, max {max(gaps) / 1e3:.1f})")
