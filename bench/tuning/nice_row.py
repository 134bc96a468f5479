#!/usr/bin/env python3
"""One row of bench/tuning/nice_ab.sh: a default-only suite part's mean tune time per problem, and the sums of
its reports' compile wait, measure and re-measure seconds.

  nice_row.py PART.json REPORTS.jsonl TAG
"""
import json
import sys

rows = json.load(open(sys.argv[1]))["problems"]
sums = {"compile_wait_seconds": 0.0, "measure_seconds": 0.0, "remeasure_seconds": 0.0, "benchmark_seconds": 0.0}
for line in open(sys.argv[2]):
    line = json.loads(line)
    if line.get("effort") != "default":
        continue
    report = line["report"]
    for k in sums:
        sums[k] += report.get(k, 0.0)
n = len(rows)
tuned = [r["default_s"] for r in rows if "default_s" in r]
print(f"{sys.argv[3]:<22} problems {n:3d}  mean {sum(tuned) / max(1, len(tuned)):.4f} s  "
      + "  ".join(f"{k.replace('_seconds', '')} {v:7.3f}" for k, v in sums.items()), flush=True)
