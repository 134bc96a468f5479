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
import math
import sys

from replay_plan import exhaustive_reports


def load_reports(paths):
    """Each problem's measured times (choice name -> median us) in the judge's exhaustive reports."""
    best = {}
    for path, problem, report in exhaustive_reports(paths):
        times = {c.get("name"): c.get("median_us") for c in report["choices"]
                 if c.get("ok") and c.get("runs", 0) > 0 and isinstance(c.get("median_us"), (int, float))
                 and c["median_us"] > 0}
        if times:
            best[problem] = times
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
                problem, pick = p.get("problem"), p.get(f"{effort}_choice")
                if not isinstance(problem, str) or not isinstance(pick, str):
                    continue  # not judged: a problem without a name or a pick (an error in that run)
                times = judge.get(problem)
                if times and pick in times:
                    ratios.append(times[pick] / min(times.values()))
            if not ratios:
                print(f"{path.rsplit('/', 1)[-1][-36:]} / {effort}: no pick found in the judge's reports")
                continue
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            label = f"{path.rsplit('/', 1)[-1][-36:]} / {effort}"
            print(f"{label:46s} {len(ratios):6d}  {sum(r <= 1.01 for r in ratios):9d}  {sum(r <= 1.03 for r in ratios):9d}"
                  f"  {geo:7.4f}  {max(ratios):.3f}")


if __name__ == "__main__":
    main()
