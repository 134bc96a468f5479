#!/usr/bin/env python3
"""Per-problem comparison of a `kiln tune --report` file with bench/runtime/inductor_workload.py's lines.

For each problem: kiln's chosen kernel time, kiln's own timing of cuBLAS's default algorithm (GEMMs), Inductor's
compiled time and eager PyTorch's, and the ratio of kiln's choice to the better of cuBLAS default and Inductor
(issue 6's target: <= 1.02). kiln's and Inductor's figures come from different harnesses (kiln's CUDA-event
medians, Inductor's do_bench medians, both with L2 flushed); eager PyTorch's cuBLAS, timed by do_bench, beside
kiln's cuBLAS default shows how far the two harnesses agree.
Usage: compare_workload.py KILN_REPORT.json INDUCTOR.jsonl [--json OUT.json] > table.md
"""
import json, re, sys


def key_of(problem):
    m = re.match(r"(\w+) (\d+)x(\d+)(?:x(\d+))?", problem)
    if not m:
        return None
    op, a, b, c = m.groups()
    return f"{op}:{a},{b},{c}" if c else f"{op}:{a},{b}"


def main():
    report = json.load(open(sys.argv[1]))
    ind = {}
    for line in open(sys.argv[2]):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            ind[r["problem"]] = r
    rows = []
    for p in report["problems"]:
        key = key_of(p["problem"])
        times = {c["name"]: c.get("median_us") for c in p["choices"] if c.get("ok") and c.get("median_us")}
        chosen_us = times.get(p["chosen"])
        cublas_us = times.get("cublas_default")
        i = ind.get(key, {})
        peers = [t for t in (cublas_us, i.get("compiled_us")) if t]
        ratio = chosen_us / min(peers) if chosen_us and peers else None
        rows.append(dict(label=p.get("label"), problem=key, chosen=p["chosen"], chosen_us=chosen_us,
                         cublas_default_us=cublas_us, inductor_us=i.get("compiled_us"), eager_us=i.get("eager_us"),
                         ratio=ratio, choices=p["candidates"], failures=p["failures"]))
    f = lambda v: f"{v:.2f}" if isinstance(v, float) else ("—" if v is None else str(v))
    print("| problem | kiln chosen | kiln µs | cuBLAS default µs (kiln) | Inductor µs | eager µs (do_bench) | ratio | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        met = "—" if r["ratio"] is None else ("yes" if r["ratio"] <= 1.02 else "no")
        print(f"| {r['label']} {r['problem']} | {r['chosen'][:48]} | {f(r['chosen_us'])} | {f(r['cublas_default_us'])} | "
              f"{f(r['inductor_us'])} | {f(r['eager_us'])} | {f(r['ratio'])} | {met} |")
    rated = [r for r in rows if r["ratio"] is not None]
    print(f"\n{sum(r['ratio'] <= 1.02 for r in rated)} of {len(rated)} rated problems within 1.02x; "
          f"worst {max((r['ratio'] for r in rated), default=0):.3f}")
    if "--json" in sys.argv:
        json.dump(rows, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
