#!/usr/bin/env python3
"""Judges tuning-speed runs' picks by another run's exhaustive measurements (issue 16).

An exhaustive tune measures every sampled choice of each problem. This takes the kernels that runs chose (both
efforts' picks of each merged tuning-speed JSON given) and looks each one up in the judge's exhaustive reports:
how far from the judge's best measured choice it is. Picks made under different measuring conditions (for
example the L2 flush by writing or by reading, bench_tuning_speed --l2-flush-by-writing) are so compared under
one condition, with measurements independent of those that made the picks.

  scripts/judge_picks.py --judge tuning-reports-part-0.jsonl.xz tuning-reports-part-1.jsonl.xz -- run-a.json run-b.json
"""
import argparse
import json
import lzma
import math
import sys


def load_reports(paths):
    best = {}
    for path in paths:
        opener = lzma.open if path.endswith(".xz") else open
        try:
            with opener(path, "rt") as f:
                for n, line in enumerate(f, 1):
                    o = json.loads(line)
                    if not isinstance(o, dict) or o.get("effort") != "exhaustive":
                        continue
                    report = o.get("report")
                    if not isinstance(report, dict) or not isinstance(report.get("choices"), list):
                        sys.exit(f"{path}:{n}: an exhaustive line without a report's choices")
                    times = {c["name"]: c["median_us"] for c in report["choices"]
                             if c.get("ok") and c.get("runs", 0) > 0 and c.get("median_us", 0) > 0}
                    if times:
                        best[o["problem"]] = times
        except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError, ValueError, KeyError, TypeError,
                AttributeError) as e:
            sys.exit(f"cannot read {path}: {e}")
    if not best:
        sys.exit("no exhaustive reports in the judge's files")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", nargs="+", required=True, help="the judge's tuning-reports-*.jsonl[.xz]")
    ap.add_argument("runs", nargs="+", help="merged tuning-speed-*.json whose picks are judged")
    args = ap.parse_args()
    judge = load_reports(args.judge)
    print("run / effort                                   judged  within 1%  within 3%  geomean  worst")
    for path in args.runs:
        try:
            with open(path) as f:
                problems = json.load(f)["problems"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"cannot read {path}: {e}")
        if not isinstance(problems, list) or not all(isinstance(p, dict) for p in problems):
            sys.exit(f"{path}: 'problems' is not a list of objects (a merged tuning-speed JSON has one)")
        for effort in ("default", "exhaustive"):
            ratios = []
            for p in problems:
                times = judge.get(p.get("problem"))
                pick = p.get(f"{effort}_choice")
                if times and pick in times:
                    ratios.append(times[pick] / min(times.values()))
            if not ratios:
                continue
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            label = f"{path.rsplit('/', 1)[-1][-36:]} / {effort}"
            print(f"{label:46s} {len(ratios):6d}  {sum(r <= 1.01 for r in ratios):9d}  {sum(r <= 1.03 for r in ratios):9d}"
                  f"  {geo:7.4f}  {max(ratios):.3f}")


if __name__ == "__main__":
    main()
