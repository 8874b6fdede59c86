#!/usr/bin/env python3
"""Per-step medians of a Go execution trace's user regions.

Reads `go tool trace -d=parsed TRACE` on stdin and prints, for each region
name, how many times it ran, its median and its median sum per enclosing
root region (e.g. sandbox.create), so nested steps that run several times
per create (ledger.record) show their whole cost. make bench-trace uses it
for the create-path breakdown in docs/ARCHITECTURE.md.
"""
import re
import statistics
import sys
from collections import defaultdict

ev = re.compile(r'G=(\d+) (RegionBegin|RegionEnd) Time=(\d+) .*Type="([^"]+)"')
stacks = defaultdict(list)          # goroutine -> [(name, start, per-root sums)]
durs = defaultdict(list)            # name -> [ms]
per_root = defaultdict(list)        # (root, name) -> [ms summed per root instance]
roots = set(sys.argv[1:]) or {"sandbox.create", "sandbox.terminate", "sandbox.exec"}
for line in sys.stdin:
    m = ev.search(line)
    if not m:
        continue
    g, kind, t, name = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    st = stacks[g]
    if kind == "RegionBegin":
        st.append((name, t, defaultdict(float)))
        continue
    if not st or st[-1][0] != name:
        continue
    _, t0, sums = st.pop()
    d = (t - t0) / 1e6
    durs[name].append(d)
    # Charge this region to the nearest enclosing root region.
    for (rname, _, rsums) in reversed(st):
        if rname in roots:
            rsums[name] += d
            break
    if name in roots:
        for k, v in sums.items():
            per_root[(name, k)].append(v)
print(f"{'step':40} {'n':>6} {'median ms':>10} {'per root, median ms':>20}")
for name in sorted(durs, key=lambda n: -statistics.median(durs[n])):
    pr = [statistics.median(v) for (r, k), v in per_root.items() if k == name]
    print(f"{name:40} {len(durs[name]):6d} {statistics.median(durs[name]):10.2f} {(f'{pr[0]:.2f}' if pr else ''):>20}")
