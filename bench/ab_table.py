#!/usr/bin/env python3
"""ab_table.py FILE.jsonl... — the table of an A/B run (bench/ab_bench.sh): one row per shape and
pass, one column per build, each cell the median over rounds of the per-run medians in µs (the
spread of those medians in brackets when there are several rounds). Needs no GPU."""
import collections
import json
import statistics
import sys

runs = collections.defaultdict(list)
builds = []
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        runs[(r["shape"], r["pass"], r["build"])].append(r["median_ms"] * 1000)
        if r["build"] not in builds:
            builds.append(r["build"])
rows = sorted({(s, p) for s, p, _ in runs},
              key=lambda k: ([int(v) for v in k[0].split(",")][::-1], ["fwd", "bwd", "both"].index(k[1])))
print("| T,n,D | pass | " + " | ".join(builds) + " |")
print("|---|---|" + "---|" * len(builds))
for s, p in rows:
    cells = []
    for b in builds:
        v = runs.get((s, p, b))
        if not v:
            cells.append("")
        elif len(v) == 1:
            cells.append(f"{v[0]:.1f}")
        else:
            cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})")
    print(f"| {s} | {p} | " + " | ".join(cells) + " |")
