"""Serving start-up on a warm cache: a fresh process imports kiln, warms up the Llama-3-8B workload
(examples/llama3-8b.json) and runs its first op; timed from `import kiln` to the first op done (synchronised).
torch's own import and CUDA initialisation come before and are reported apart. Goal: ≤ 100 ms.

The cache is made warm first (a setup process tunes the workload once, as `kiln tune` would); then --runs
fresh processes are timed.

  python bench/python/startup.py [--json out.json] [--workload examples/llama3-8b.json] [--cache-dir D]
                                 [--background] [--threads N]

--background warms up with kiln.warmup(..., wait=False): the first op is timed while the warm-up loads, and
`warmup_ms` is the call's return (the task's report gives the loading time). --threads N: warm-up threads
(0: kiln's choice). Each run also reports the warm-up's own split (opening the cache and tuner, fetching and
loading binaries, summed over its threads), the first op's host return apart from its completion, and a
second op (what is left of the first op's cost once everything is warm).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import environment, table, write_json

CHILD = r'''
import json, sys, time
background, threads = sys.argv[3] == "1", int(sys.argv[4])
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
t1 = time.perf_counter()
import kiln, kiln.torch
t2 = time.perf_counter()
report = kiln.warmup(sys.argv[1], sys.argv[2], wait=not background, threads=threads)
t3 = time.perf_counter()
x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t4 = time.perf_counter()
y = torch.ops.kiln.gemm(x, w.t())
t4b = time.perf_counter()
torch.cuda.synchronize()
t5 = time.perf_counter()
y = torch.ops.kiln.gemm(x, w.t())
torch.cuda.synchronize()
t6 = time.perf_counter()
if background:
    report = report.wait()
s = kiln.current_tuner().stats()
print(json.dumps({"torch_and_cuda_ms": (t1 - t0) * 1e3, "import_kiln_ms": (t2 - t1) * 1e3,
                  "warmup_ms": (t3 - t2) * 1e3, "first_op_ms": (t5 - t4) * 1e3,
                  "import_to_first_op_ms": (t3 - t1 + t5 - t4) * 1e3, "ready": report.ready,
                  "problems": report.problems, "compiled": report.compiled, "tuned": report.tuned,
                  "first_op_hit": s["hits"] >= 1 and s["misses"] == 0,
                  "warmup_open_ms": report.open_seconds * 1e3, "warmup_fetch_ms": report.fetch_seconds * 1e3,
                  "warmup_load_ms": report.load_seconds * 1e3, "warmup_report_ms": report.seconds * 1e3,
                  "warmup_threads": report.threads, "first_op_host_ms": (t4b - t4) * 1e3,
                  "second_op_ms": (t6 - t5) * 1e3, "slowest": report.slowest}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--workload", default=os.path.join(os.path.dirname(__file__), "..", "..", "examples", "llama3-8b.json"))
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--background", action="store_true", help="kiln.warmup(..., wait=False)")
    ap.add_argument("--threads", type=int, default=0, help="warm-up threads (0: kiln's choice)")
    args = ap.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kiln-startup-")
    setup = subprocess.run([sys.executable, "-c", "import sys, kiln; print(kiln.warmup(sys.argv[1], sys.argv[2]))",
                            cache, args.workload], capture_output=True, text=True)
    print("setup (tunes what the cache lacks):", setup.stdout.strip() or setup.stderr[-2000:])
    runs = []
    for _ in range(args.runs):
        r = subprocess.run([sys.executable, "-c", CHILD, cache, args.workload, "1" if args.background else "0",
                            str(args.threads)], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:])
            sys.exit(1)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    keys = ["torch_and_cuda_ms", "import_kiln_ms", "warmup_ms", "first_op_ms", "import_to_first_op_ms",
            "warmup_open_ms", "warmup_fetch_ms", "warmup_load_ms", "warmup_report_ms", "first_op_host_ms", "second_op_ms"]
    rows = [{"phase": k, "median_ms": round(statistics.median(r[k] for r in runs), 1),
             "min_ms": round(min(r[k] for r in runs), 1), "max_ms": round(max(r[k] for r in runs), 1)} for k in keys]
    print(table(rows, ["phase", "median_ms", "min_ms", "max_ms"]))
    print("per run: ready/problems, compiled, tuned, first op a hit:",
          [(r["ready"], r["problems"], r["compiled"], r["tuned"], r["first_op_hit"]) for r in runs])
    print("warm-up threads:", sorted({r["warmup_threads"] for r in runs}), "background:", args.background)
    print("slowest problems of the last run (fetch ms, load ms, chosen):")
    for s in runs[-1]["slowest"]:
        print(f"  {s['fetch_seconds'] * 1e3:7.2f} {s['load_seconds'] * 1e3:7.2f}  {s['chosen']}  {s['problem']}")
    write_json(args.json, {"bench": "python_startup", **environment(), "workload": args.workload, "rows": rows,
                           "runs": runs, "goal_ms": 100, "background": args.background, "threads": args.threads})


if __name__ == "__main__":
    main()
