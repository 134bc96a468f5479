"""Serving start-up on a warm cache: a fresh process imports kiln, warms up the Llama-3-8B workload
(examples/llama3-8b.json) and runs its first op; timed from `import kiln` to the first op done (synchronised).
torch's own import and CUDA initialisation come before and are reported apart. Goal: ≤ 100 ms.

The cache is made warm first (a setup process tunes the workload once, as `kiln tune` would); then --runs
fresh processes are timed.

  python bench/python/startup.py [--json out.json] [--workload examples/llama3-8b.json] [--cache-dir D]
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
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
t1 = time.perf_counter()
import kiln, kiln.torch
t2 = time.perf_counter()
report = kiln.warmup(sys.argv[1], sys.argv[2])
t3 = time.perf_counter()
x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
t4 = time.perf_counter()
y = torch.ops.kiln.gemm(x, w.t())
torch.cuda.synchronize()
t5 = time.perf_counter()
s = kiln.current_tuner().stats()
print(json.dumps({"torch_and_cuda_ms": (t1 - t0) * 1e3, "import_kiln_ms": (t2 - t1) * 1e3,
                  "warmup_ms": (t3 - t2) * 1e3, "first_op_ms": (t5 - t4) * 1e3,
                  "import_to_first_op_ms": (t3 - t1 + t5 - t4) * 1e3, "ready": report.ready,
                  "problems": report.problems, "compiled": report.compiled, "tuned": report.tuned,
                  "first_op_hit": s["hits"] == 1 and s["misses"] == 0}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--workload", default=os.path.join(os.path.dirname(__file__), "..", "..", "examples", "llama3-8b.json"))
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kiln-startup-")
    setup = subprocess.run([sys.executable, "-c", "import sys, kiln; print(kiln.warmup(sys.argv[1], sys.argv[2]))",
                            cache, args.workload], capture_output=True, text=True)
    print("setup (tunes what the cache lacks):", setup.stdout.strip() or setup.stderr[-2000:])
    runs = []
    for _ in range(args.runs):
        r = subprocess.run([sys.executable, "-c", CHILD, cache, args.workload], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:])
            sys.exit(1)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    keys = ["torch_and_cuda_ms", "import_kiln_ms", "warmup_ms", "first_op_ms", "import_to_first_op_ms"]
    rows = [{"phase": k, "median_ms": round(statistics.median(r[k] for r in runs), 1),
             "min_ms": round(min(r[k] for r in runs), 1), "max_ms": round(max(r[k] for r in runs), 1)} for k in keys]
    print(table(rows, ["phase", "median_ms", "min_ms", "max_ms"]))
    print("per run: ready/problems, compiled, tuned, first op a hit:",
          [(r["ready"], r["problems"], r["compiled"], r["tuned"], r["first_op_hit"]) for r in runs])
    write_json(args.json, {"bench": "python_startup", **environment(), "workload": args.workload, "rows": rows,
                           "runs": runs, "goal_ms": 100})


if __name__ == "__main__":
    main()
