"""Llama-3-8B MLP block (hidden 4096, intermediate 14336, bf16): down(silu(gate(x)) * up(x)) at M = 1, 16,
128, 2048, through kiln's custom ops (gate and up as one merged GEMM, silu·mul in torch, down) against torch
eager and torch.compile(mode="max-autotune"), each eagerly and replayed from a CUDA graph, in the same run,
interleaved. Device time per block from CUDA events, median over rounds.

  python bench/python/llama_mlp.py [--json out.json] [--sizes 1 16 128 2048]
"""
import argparse
import tempfile

import torch
import torch.nn.functional as F

import kiln
import kiln.torch  # noqa: F401
from common import environment, interleaved, table, write_json

H, I = 4096, 14336


def torch_mlp(x, wgu, wd):
    gu = x @ wgu.t()
    g, u = gu.chunk(2, dim=-1)
    return (F.silu(g) * u) @ wd.t()


def kiln_mlp(x, wgu, wd):
    gu = torch.ops.kiln.gemm(x, wgu.t())
    g, u = gu.chunk(2, dim=-1)
    return torch.ops.kiln.gemm((F.silu(g) * u).contiguous(), wd.t())


def graphed(fn, *args):
    fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    return g.replay


def device_us(fn, reps=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 128, 2048])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cache-dir", default="")
    args = ap.parse_args()
    wgu = torch.randn(2 * I, H, device="cuda", dtype=torch.bfloat16) / 64
    wd = torch.randn(H, I, device="cuda", dtype=torch.bfloat16) / 128
    compiled = torch.compile(torch_mlp, mode="max-autotune-no-cudagraphs", dynamic=False)
    compiled_graphs = torch.compile(torch_mlp, mode="max-autotune", dynamic=False)
    rows = []
    with kiln.Tuner(cache_dir=args.cache_dir or tempfile.mkdtemp(prefix="kiln-mlp-")):
        for m in args.sizes:
            x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
            want = torch_mlp(x.float(), wgu.float(), wd.float())
            got = kiln_mlp(x, wgu, wd)  # tunes both GEMMs
            err = ((got.float() - want).norm() / want.norm()).item()
            for _ in range(3):
                compiled(x, wgu, wd), compiled_graphs(x, wgu, wd)
            variants = {
                "torch eager": lambda: torch_mlp(x, wgu, wd),
                "torch.compile max-autotune": lambda: compiled(x, wgu, wd),
                "kiln": lambda: kiln_mlp(x, wgu, wd),
                "torch eager + graph": graphed(torch_mlp, x, wgu, wd),
                "torch.compile max-autotune (graphs)": lambda: compiled_graphs(x, wgu, wd),
                "kiln + graph": graphed(kiln_mlp, x, wgu, wd),
            }
            res = interleaved(variants, args.rounds, device_us)
            best_torch = min(res[k]["median"] for k in res if not k.startswith("kiln"))
            for name, r in res.items():
                rows.append({"M": m, "path": name, "us": round(r["median"], 2), "min_us": round(r["min"], 2),
                             "vs_best_torch": round(best_torch / r["median"], 3),
                             "rel_error": f"{err:.1e}" if name.startswith("kiln") else ""})
    print(table(rows, ["M", "path", "us", "min_us", "vs_best_torch", "rel_error"]))
    write_json(args.json, {"bench": "python_llama_mlp", **environment(), "rows": rows,
                           "note": "vs_best_torch > 1: faster than the best torch path at that M (graphs or not)"})


if __name__ == "__main__":
    main()
