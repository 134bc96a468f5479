#!/usr/bin/env python3
"""Replays EffortPolicy::stream_k_pick over recorded suite runs, offline (issue 16).

The default effort adds one choice where the model's first choice is memory-bound: the best-ranked swap-AB
persistent stream-K tile of one block per SM that the model calls memory-bound over more than one wave, if scored
within a margin of the first (runtime/tune/src/effort.cpp, stream_k_candidate). For every problem of the runs
given, this asks what the pick would have added: was the default tune's best timed choice already within 1% of
the exhaustive tune's best, would the pick have put it there, and how many picks measured far from the best
(a wasted compile and measurement). It ranks by the model alone, without the neighbours' calibration the tuner
applies (the tuner's order differs a little), and judges by the exhaustive tune's readings.

  build/bin/bench_calibration_replay --dump /tmp/dump.csv REPORTS...   # every exhaustive timing and its estimate
  scripts/replay_stream_k_pick.py /tmp/dump.csv REPORTS... [--margin 0.15] [--any-structure]
"""
import argparse
import collections
import csv
import json
import lzma
import os
import sys

SWAB = ("wgmma/swab/sk/p/b1",)
ANY = ("wgmma/swab/sk/p/b1", "wgmma/tile/sk/p/b1")


def pick(rows, structures, margin):
    """The tuner's rule over one problem's estimates (rows sorted by model_us), or None."""
    if not rows or rows[0]["bound"] != "memory":
        return None
    for r in rows:
        if r["structure"] in structures and r["bound"] == "memory" and r["waves"] > 1:
            return r if margin < 0 or r["model_us"] <= rows[0]["model_us"] * (1 + margin) else None
    return None


def regular_file(path):
    """Exits unless `path` is a regular file (a device such as /dev/zero would be read forever)."""
    if not os.path.isfile(path):
        sys.exit(f"cannot read {path}: not a regular file")


def number(row, key, where):
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        sys.exit(f"{where}: {key} is not a number: {row.get(key)!r}")


def read_reports(path):
    """{(problem, effort): report} of one tuning-reports-*.jsonl[.xz]; exits naming the file if unreadable."""
    regular_file(path)
    opener = lzma.open if path.endswith(".xz") else open
    out = {}
    try:
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):
                o = json.loads(line)
                if not isinstance(o, dict) or not isinstance(o.get("report"), dict):
                    sys.exit(f"{path}:{n}: not a tune report line")
                out[(o.get("problem"), o.get("effort"))] = o["report"]
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as e:
        sys.exit(f"cannot read {path}: {e}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="bench_calibration_replay --dump output (CSV) of the same report files")
    ap.add_argument("reports", nargs="+", help="tuning-reports-*-part-N.jsonl[.xz]")
    ap.add_argument("--margin", type=float, default=0.15, help="score margin behind the first (negative: none)")
    ap.add_argument("--any-structure", action="store_true", help="unswapped stream-K tiles too")
    args = ap.parse_args()
    structures = ANY if args.any_structure else SWAB
    estimates = collections.defaultdict(list)
    regular_file(args.dump)
    try:
        with open(args.dump, newline="") as f:
            for n, r in enumerate(csv.DictReader(f), 2):
                for key in ("waves", "model_us", "measured_us"):
                    r[key] = number(r, key, f"{args.dump}:{n}")
                # By file name: the dump names each report file as given to bench_calibration_replay.
                estimates[(os.path.basename(r["run"]), r["problem"])].append(r)
    except (OSError, KeyError, UnicodeDecodeError, csv.Error) as e:
        sys.exit(f"cannot read {args.dump}: {e}")
    count = collections.Counter()
    new_compiles = 0
    for path in args.reports:
        reports = read_reports(path)
        timed_in_part = set()
        for (_, effort), rep in reports.items():
            if effort == "default":
                timed_in_part.update(c.get("name") for c in rep.get("choices", [])
                                     if isinstance(c, dict) and isinstance(c.get("runs"), int) and c["runs"] > 0)
        picked = set()
        for (run, problem), rows in estimates.items():
            if run != os.path.basename(path):
                continue
            ex, de = reports.get((problem, "exhaustive")), reports.get((problem, "default"))
            if not ex or not de:
                continue
            measured = {c["name"]: c["median_us"] for c in ex.get("choices", [])
                        if isinstance(c, dict) and c.get("ok") and isinstance(c.get("median_us"), (int, float))
                        and isinstance(c.get("runs"), int) and c["runs"] > 0}
            if not measured:
                continue
            best = min(measured.values())
            timed = [measured[c["name"]] for c in de.get("choices", [])
                     if isinstance(c, dict) and isinstance(c.get("runs"), int) and c["runs"] > 0 and c.get("name") in measured]
            got = min(timed) if timed else float("inf")
            p = pick(sorted(rows, key=lambda r: r["model_us"]), structures, args.margin)
            if p is None:
                continue
            count["picks"] += 1
            picked.add(p["name"])
            us = p["measured_us"]
            count["pick beyond 1.5x the best"] += us > 1.5 * best
            if got <= 1.01 * best:
                count["within 1% without it"] += 1
            elif us <= 1.01 * best:
                count["within 1% by the pick"] += 1
                print(f"fixed: {path}: {problem}: {p['name']} {us:.2f} us (default's best {got:.2f}, best {best:.2f})")
            else:
                count["missed either way"] += 1
        new_compiles += len(picked - timed_in_part)
    if not count:
        sys.exit("no problem with both efforts' reports and estimates: are the dump and the reports of the same runs?")
    for k, v in count.items():
        print(f"{k}: {v}")
    print(f"picks no default tune of its part had timed (new compiles): {new_compiles} over {len(args.reports)} parts")


if __name__ == "__main__":
    main()
