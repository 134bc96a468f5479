#!/usr/bin/env python3
"""Replays the default effort's plan over recorded exhaustive tunes, offline (issue 16).

An exhaustive tune measures every sampled template (with its model rank and score) and every extern. For each
problem of a suite part, in tuning order, this picks the templates a plan would keep, and asks whether the best
of those and the externs is within 1% of the best measured; it counts the distinct templates the plans of a
part name (each compiles once per part: sizes are run-time arguments). Readings of dropped choices are 3-run
estimates, and extern-first pruning is not replayed (it removes templates, never adds), so the figures compare
plans with each other rather than predict a run.

  scripts/replay_plan.py bench/results/tuning-reports-nvidia-h200-2026-11-30-6878bdf-part-*.jsonl.xz
"""
import argparse
import collections
import json
import lzma
import re
import sys


def variant(c):
    """structure_class() of runtime/tune/src/perf_model.cpp, from a report's parameters."""
    p = c["parameters"]
    t = p.get("template", "")
    if t == "gemm_wgmma_sm90":
        ck = int(p.get("cluster_k", "1"))
        split = f"ck{ck}" if ck > 1 else ("none" if p.get("stream_k") != "true" else
                                          "ske" if p.get("sk_even") == "true" else "sk")
        return "wgmma/{}/{}/{}/b{}".format("swab" if p.get("swap_ab") == "true" else "tile", split,
                                           "p" if p.get("persistent") == "true" else "np", p.get("blocks_per_sm", "1"))
    if t == "gemm_mma_sm80":
        return "mma_sm80"
    if "threads" in p:
        return f"{t}/i{p.get('items', '1')}"
    return t


def by_rank(ranked, keep, planned, share):
    """The plan before variants (EffortPolicy::diverse false): the first quarter by rank, the rest from within
    `share` of the keep-th score, shared first."""
    if len(ranked) <= keep:
        return list(ranked)
    fixed = max(1, (keep + 2) // 4)
    window = ranked[keep - 1]["model_us"] * (1 + share)
    rest = [c for i, c in enumerate(ranked) if i >= fixed and (i < keep or c["model_us"] <= window)]
    rest = [c for c in rest if c["name"] in planned] + [c for c in rest if c["name"] not in planned]
    return ranked[:fixed] + rest[:keep - fixed]


def diverse(ranked, keep, planned, share, top=0):
    """EffortPolicy::diverse: the first `top` by rank as ranked (EffortPolicy::keep_top), then each other variant's
    best-ranked (or a shared one of it within `share`), then the window. The first alone never swapped was tried
    on 29 Nov (+2-3 of 120 in the replays, no gain on the device for 15% more tune time); the first 3 with 8 kept
    is the default since 30 Nov."""
    out = list(ranked[:top])
    seen = {variant(c) for c in out}
    for i, best in enumerate(ranked):
        if len(out) >= keep:
            break
        if variant(best) in seen:
            continue
        seen.add(variant(best))
        pick = best
        for c in ranked[i:]:
            if best["name"] in planned or c["model_us"] > best["model_us"] * (1 + share):
                break
            if variant(c) == variant(best) and c["name"] in planned:
                pick = c
                break
        out.append(pick)
    if len(ranked) > keep:
        window = ranked[keep - 1]["model_us"] * (1 + share)
        rest = [c for i, c in enumerate(ranked) if c not in out and (i < keep or c["model_us"] <= window)]
        rest = [c for c in rest if c["name"] in planned] + [c for c in rest if c["name"] not in planned]
    else:
        rest = [c for c in ranked if c not in out]
    return out + rest[:keep - len(out)]


def widen_kept(kept, ranked, externs, widen, variants, near_extern, rounds):
    """Diverse widening (Tuner, EffortPolicy::widen_variants): each round takes the next `widen` of each of the
    `variants` fastest kept variants whose fastest beats the best extern or trails it by under `near_extern`, and
    was not widened around before; it stops when nothing new is taken."""
    around = set()
    best_extern = min(externs) if externs else float("inf")
    widened = False
    for _ in range(rounds):
        fastest = {}
        for c in kept:
            v = variant(c)
            if v not in fastest or c["median_us"] < fastest[v]["median_us"]:
                fastest[v] = c
        order = sorted(fastest.values(), key=lambda c: c["median_us"])[:variants]
        chosen = [c for c in order if c["median_us"] < best_extern * (1 + near_extern) and c["name"] not in around]
        more = []
        for c in chosen:
            around.add(c["name"])
            more += [x for x in ranked if variant(x) == variant(c) and x not in kept and x not in more][:widen]
        if not more:
            break
        widened = True
        kept = kept + more
    return kept, widened


def replay(problems, plan, keep, share, widen, variants=1, near_extern=0.0, rounds=2):
    within, worst, widened, replayed = 0, 1.0, 0, 0
    names = collections.defaultdict(set)
    for part, report in problems:
        ok = [c for c in report["choices"] if c.get("ok") and c.get("runs", 0) > 0]
        if not ok:
            continue  # nothing measured (a failed tune): no best to compare with
        replayed += 1
        best = min(c["median_us"] for c in ok)
        externs = [c["median_us"] for c in ok if "model_rank" not in c]
        ranked = sorted((c for c in ok if "model_rank" in c), key=lambda c: c["model_rank"])
        kept = plan(ranked, keep, names[part], share)
        if kept and widen:
            kept, w = widen_kept(kept, ranked, externs, widen, variants, near_extern, rounds)
            widened += w
        names[part].update(c["name"] for c in kept)
        got = min(externs + [c["median_us"] for c in kept])
        within += got <= 1.01 * best
        worst = max(worst, got / best)
    return within, replayed, sum(len(v) for v in names.values()), widened, worst


def exhaustive_reports(paths):
    """(path, problem, report) for every exhaustive line of bench_tuning_speed's tuning-reports-*.jsonl[.xz];
    exits naming the file when one cannot be read or a line is not such a report."""
    for path in paths:
        opener = lzma.open if path.endswith(".xz") else open
        try:
            with opener(path, "rt") as f:
                for n, line in enumerate(f, 1):
                    o = json.loads(line)
                    if not isinstance(o, dict) or o.get("effort") != "exhaustive":
                        continue
                    report = o.get("report")
                    if not isinstance(report, dict) or not isinstance(report.get("choices"), list) or \
                            not all(isinstance(c, dict) for c in report["choices"]):
                        sys.exit(f"{path}:{n}: an exhaustive line without a report's choices")
                    for c in report["choices"]:
                        for key in ("runs", "median_us", "model_rank", "model_us"):
                            if key in c and (isinstance(c[key], bool) or not isinstance(c[key], (int, float))):
                                sys.exit(f"{path}:{n}: choice {c.get('name')!r} has a {key} that is not a number")
                    yield path, o.get("problem"), report
        except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as e:
            sys.exit(f"cannot read {path}: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="tuning-reports-*-part-N.jsonl[.xz] from bench_tuning_speed suite")
    ap.add_argument("--share", type=float, default=0.08)
    args = ap.parse_args()
    if not args.share >= 0:
        sys.exit(f"--share must be a fraction >= 0, not {args.share}")
    problems = []
    for path, _, report in exhaustive_reports(args.reports):
        m = re.search(r"part-(\d+)", path)
        problems.append((m.group(1) if m else path, report))
    if not problems:
        sys.exit("no exhaustive reports in the files given")
    print(f"{len(problems)} problems; share margin {args.share}")
    print("plan                                    keep widen  within 1%  distinct templates  widened  worst")
    for label, plan, widen, variants, near in (
            ("by rank", by_rank, 0, 1, 0.0), ("one per variant first", diverse, 0, 1, 0.0),
            ("one per variant + widen the fastest", diverse, 2, 1, 0.0),
            ("  the same, the first never swapped", lambda r, k, p, sh: diverse(r, k, p, sh, top=1), 2, 1, 0.0),
            ("  the same, the first 3 (default)", lambda r, k, p, sh: diverse(r, k, p, sh, top=3), 2, 1, 0.0),
            ("+ widen the two fastest", diverse, 2, 2, 0.0),
            ("+ widen the two fastest, 3% of extern", diverse, 2, 2, 0.03)):
        for keep in (8, 10, 12):
            w, replayed, d, n, worst = replay(problems, plan, keep, args.share, widen, variants, near)
            print(f"{label:39s} {keep:4d} {widen:5d}  {w:4d}/{replayed}  {d:18d}  {n:7d}  {worst:.3f}")


if __name__ == "__main__":
    main()
