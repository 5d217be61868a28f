"""Prints the kernels of decode steps from ktrace.c's records.

    python3 ktrace.py TRACE.csv [--first KERNEL] [--steps N]
    python3 ktrace.py TRACE.csv --requests

A step starts at its first kernel (--first, a name prefix: the token
embedding by default). For the last N complete steps (one before the last
seen) it prints each kernel of the last of them: its start and duration,
its start against the previous kernel's end (negative: it overlapped, as
programmatic dependent launch allows), and its advance, how far it moved
the step's end, which is what leaving the kernel out could save at most.
Then the GPU's idle time between steps (the host's work, and the trace's
own), and the advance summed by kernel name over one step, averaged over
the N steps, largest first; all in microseconds.

With --requests (a serving benchmark's trace, requests apart in time, as
kiln bench serve --think-time sends a conversation's turns) it cuts the
record where the GPU idled over 200 ms and prints, for each part, the GPU
time from its first kernel to the end of its first sampling kernel (a
request's first token, less the host's work before its first launch), the
kernels' busy time in it, the idle gaps over 0.3 ms with the kernels on
both sides (host work: planning, loading kernels) and its largest
kernels; in milliseconds.
"""
import argparse
import collections
import csv

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--first", default="embed")
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--requests", action="store_true")
args = ap.parse_args()

ks = []
for r in csv.reader(open(args.trace)):
    if len(r) < 7:
        continue
    ks.append((int(r[0]), int(r[1]), ",".join(r[6:]), f"({r[2]},{r[3]},{r[4]})x{r[5]}"))
ks.sort()


def requests():
    parts, cur, end = [], [], 0
    for k in ks:
        if cur and k[0] - end > 200e6:
            parts.append(cur)
            cur = []
        cur.append(k)
        end = max(end, k[1])
    parts.append(cur)
    for i, part in enumerate(parts):
        t0 = part[0][0]
        first = next((k[1] for k in part if k[2].startswith("sample")), None)
        if first is None:
            print(f"part {i}: {len(part)} kernels, no sampling")
            continue
        busy, end, gaps, prev = 0, t0, [], ""
        window = [k for k in part if k[0] < first]
        for s, e, name, _ in window:
            if s - end > 300e3:
                gaps.append(f"{(s - end) / 1e6:.2f} {prev[:24]}->{name[:24]}")
            busy += max(0, e - max(s, end))
            end, prev = max(end, e), name
        tot = collections.Counter()
        for s, e, name, _ in window:
            tot[name[:32]] += e - s
        print(f"part {i} at {(t0 - ks[0][0]) / 1e9:.2f} s: first sampling ends {(first - t0) / 1e6:.2f} ms in, "
              f"busy {busy / 1e6:.2f} ms, {len(window)} kernels; gaps: {'; '.join(gaps[:6]) or '-'}")
        print("    " + ", ".join(f"{n} {v / 1e6:.2f}" for n, v in tot.most_common(7)))


if args.requests:
    requests()
    raise SystemExit
firsts = [i for i, k in enumerate(ks) if k[2].startswith(args.first) or k[2].startswith("q" + args.first)]
if len(firsts) < 3:
    raise SystemExit(f"fewer than three steps starting at {args.first!r} in {len(ks)} kernels")
bounds = list(zip(firsts[:-1], firsts[1:]))[:-1][-args.steps:]


def walk(step):
    t0, end = step[0][0], step[0][0]
    for s, e, name, shape in step:
        adv = max(0, e - end)
        yield s - t0, e - s, s - end, adv, name, shape
        end = max(end, e)


a, b = bounds[-1]
step = ks[a:b]
for off, dur, gap, adv, name, shape in walk(step):
    print(f"{off / 1e3:9.2f} {dur / 1e3:7.2f} start-prev-end {gap / 1e3:7.2f} advance {adv / 1e3:6.2f}  {name[:44]} {shape}")
span = [ks[b - 1][1] - ks[a][0] for a, b in bounds]
print(f"step {span[-1] / 1e3:.1f} us ({len(step)} kernels); mean over {len(bounds)} steps {sum(span) / len(span) / 1e3:.1f} us")
# The GPU idle between a step's last kernel and the next step's first: the
# host's work (sampling's read-back, planning, the launch), and the tracer's.
idle = sorted(ks[b][0] - max(k[1] for k in ks[a:b]) for a, b in bounds)
print(f"idle between steps: median {idle[len(idle) // 2] / 1e3:.1f} us (min {idle[0] / 1e3:.1f}, max {idle[-1] / 1e3:.1f})")
tot, dsum, n = collections.Counter(), collections.Counter(), collections.Counter()
for a, b in bounds:
    for _, dur, _, adv, name, _ in walk(ks[a:b]):
        tot[name] += adv
        dsum[name] += dur
        n[name] += 1
print(f"{'kernel':44s} {'advance':>9s} {'busy':>9s} {'calls':>6s}  (a step)")
for name, adv in tot.most_common():
    print(f"{name[:44]:44s} {adv / len(bounds) / 1e3:9.2f} {dsum[name] / len(bounds) / 1e3:9.2f} {n[name] / len(bounds):6.1f}")
