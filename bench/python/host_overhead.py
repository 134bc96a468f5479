"""Host overhead of one kiln.gemm call against torch.mm at M = 1 and 16 (N = K = 4096, bf16): the time for
the Python call to return (argument reading, selection lookup, launch), measured as the mean over 200 calls
without synchronising, rounds interleaved. Also torch.ops.kiln.gemm (the custom op through torch's
dispatcher), and kiln's C++ dispatch overhead from bench_runtime (`bench_runtime dispatch`) when given.
Goal: kiln.gemm within +2 µs of torch.mm.

  python bench/python/host_overhead.py [--json out.json] [--bench-runtime build/bin/bench_runtime] [--parts]

--parts adds rows for the parts of a call, timed the same way: allocating the output as kiln does
(`x.new_empty(M, N)`), reading one tensor (`kiln._C._tensor_info(x)`), and `torch.ops.aten.mm` (torch's own
op dispatch from Python, the floor under any `torch.ops.*` call, custom or not).
"""
import argparse
import json
import os
import subprocess
import tempfile

import torch

import kiln
import kiln.torch  # noqa: F401
from common import environment, host_us, interleaved, table, write_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--bench-runtime", default=os.environ.get("KILN_BENCH_RUNTIME", ""))
    ap.add_argument("--cache-dir", default=os.environ.get("KILN_CACHE_DIR", ""))
    ap.add_argument("--parts", action="store_true", help="also time the parts of a call (see the top)")
    args = ap.parse_args()
    torch.cuda.init()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kiln-host-")
    rows = []
    with kiln.Tuner(cache_dir=cache):
        for m in [1, 16]:
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            wt = w.t()
            out = torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)
            kiln.gemm(x, wt)  # tune before timing
            torch.cuda.synchronize()
            variants = {
                "torch.mm": lambda: torch.mm(x, wt),
                "kiln.gemm": lambda: kiln.gemm(x, wt),
                "kiln.gemm(out=)": lambda: kiln.gemm(x, wt, out=out),
                "torch.ops.kiln.gemm": lambda: torch.ops.kiln.gemm(x, wt),
            }
            if args.parts:
                variants.update({
                    "torch.ops.aten.mm": lambda: torch.ops.aten.mm(x, wt),
                    "x.new_empty(M, N)": lambda: x.new_empty(m, 4096),
                    "kiln._C._tensor_info(x)": lambda: kiln._C._tensor_info(x),
                })

            def measure(fn):
                torch.cuda.synchronize()
                t = host_us(fn)
                torch.cuda.synchronize()
                return t

            for _ in range(3):  # warm up every path
                for fn in variants.values():
                    measure(fn)
            res = interleaved(variants, args.rounds, measure)
            base = res["torch.mm"]["median"]
            for name, r in res.items():
                rows.append({"M": m, "call": name, "host_us": round(r["median"], 2), "min_us": round(r["min"], 2),
                             "vs_torch_mm_us": round(r["median"] - base, 2)})
    print(table(rows, ["M", "call", "host_us", "min_us", "vs_torch_mm_us"]))
    dispatch = None
    if args.bench_runtime and os.path.exists(args.bench_runtime):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            run = subprocess.run([args.bench_runtime, "dispatch", "--json", f.name], capture_output=True, text=True)
            print(run.stdout)
            if run.returncode == 0:
                dispatch = json.load(open(f.name))
    else:
        print("C++ dispatch overhead: pass --bench-runtime build/bin/bench_runtime")
    write_json(args.json, {"bench": "python_host_overhead", **environment(), "rows": rows, "cpp_dispatch": dispatch})


if __name__ == "__main__":
    main()
