#!/usr/bin/env python3
"""One row of bench/tuning/nice_ab.sh: a default-only suite part's mean tune time per problem, and the sums of
its reports' compile wait, measure and re-measure seconds.

  nice_row.py PART.json REPORTS.jsonl TAG

A file that cannot be read, or is not what bench_tuning_speed writes, ends it with a message naming the file.
"""
import json
import os
import sys


def fail(msg):
    sys.exit(f"nice_row.py: {msg}")


def main():
    if len(sys.argv) != 4:
        fail("usage: nice_row.py PART.json REPORTS.jsonl TAG")
    part, reports, tag = sys.argv[1:]
    for path in (part, reports):
        if not os.path.isfile(path):  # a device such as /dev/zero would be read forever
            fail(f"cannot read {path}: not a regular file")
    try:
        with open(part) as f:
            rows = json.load(f).get("problems")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        fail(f"cannot read {part}: {e}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        fail(f"{part}: no 'problems' list (not a bench_tuning_speed suite JSON)")
    sums = {"compile_wait_seconds": 0.0, "measure_seconds": 0.0, "remeasure_seconds": 0.0, "benchmark_seconds": 0.0}
    try:
        with open(reports) as f:
            for n, text in enumerate(f, 1):
                line = json.loads(text)
                if not isinstance(line, dict) or line.get("effort") != "default":
                    continue
                report = line.get("report")
                if not isinstance(report, dict):
                    fail(f"{reports}:{n}: a default-effort line without a report")
                for k in sums:
                    v = report.get(k, 0.0)
                    if isinstance(v, bool) or not isinstance(v, (int, float)):
                        fail(f"{reports}:{n}: {k} is not a number")
                    sums[k] += v
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"cannot read {reports}: {e}")
    tuned = [r["default_s"] for r in rows if isinstance(r.get("default_s"), (int, float))]
    print(f"{tag:<22} problems {len(rows):3d}  mean {sum(tuned) / max(1, len(tuned)):.4f} s  "
          + "  ".join(f"{k.replace('_seconds', '')} {v:7.3f}" for k, v in sums.items()), flush=True)


if __name__ == "__main__":
    main()
