# Inductor max-autotune on every problem of a kiln workload file (examples/llama3-8b.json), timed the way
# ../shared/device/inductor_anchor.py times a @ b: first call, then triton.testing.do_bench medians (L2 flushed)
# of the compiled function and of eager PyTorch (cuBLAS for the GEMMs). One JSON line per problem size, so a
# partial run still leaves figures. Compared with kiln's per-problem report by scripts/compare_workload.py.
# Usage: python3 inductor_workload.py WORKLOAD.json [op ...]   (ops: gemm rmsnorm softmax; default all)
import json, os, sys, time
import torch
import torch._inductor.config as cfg
from triton.testing import do_bench

cfg.max_autotune = True
cfg.max_autotune_gemm_backends = os.environ.get("BACKENDS", "ATEN,TRITON")
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def gemm_case(p, m):
    x = torch.randn(m, p["k"], device="cuda", dtype=DT[p["dtype"]])
    if p.get("layout_b", "row") == "col":  # weight stored [N, K] as nn.Linear keeps it
        w = torch.randn(p["n"], p["k"], device="cuda", dtype=DT[p["dtype"]])
        return (lambda x, w: x @ w.t()), (x, w), f"gemm:{m},{p['n']},{p['k']}"
    w = torch.randn(p["k"], p["n"], device="cuda", dtype=DT[p["dtype"]])
    return (lambda x, w: x @ w), (x, w), f"gemm:{m},{p['n']},{p['k']}"


def rmsnorm_case(p, rows):
    cols, eps = p["cols"], p.get("eps", 1e-5)
    x = torch.randn(rows, cols, device="cuda", dtype=DT[p["dtype"]])
    r = torch.randn(rows, cols, device="cuda", dtype=DT[p["dtype"]])
    w = torch.randn(cols, device="cuda", dtype=DT[p["dtype"]])

    def f(x, r, w):  # residual add, then RMSNorm with fp32 statistics; returns the normed rows and the sum
        h = x + r if p.get("residual") else x
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        return y.to(x.dtype), h

    return f, (x, r, w), f"rmsnorm:{rows},{cols}"


def softmax_case(p, rows):
    x = torch.randn(rows, p["cols"], device="cuda", dtype=DT[p["dtype"]])
    return (lambda x: torch.softmax(x.float(), -1).to(x.dtype)), (x,), f"softmax:{rows},{p['cols']}"


def main():
    workload = json.load(open(sys.argv[1]))
    ops = set(sys.argv[2:]) or {"gemm", "rmsnorm", "softmax"}
    for p in workload["problems"]:
        if p["op"] not in ops:
            continue
        sizes = p["m"] if p["op"] == "gemm" else p["rows"]
        for s in sizes:
            torch.manual_seed(0)
            f, args, label = {"gemm": gemm_case, "rmsnorm": rmsnorm_case, "softmax": softmax_case}[p["op"]](p, s)
            torch._dynamo.reset()
            g = torch.compile(f, mode="max-autotune-no-cudagraphs", dynamic=False)
            torch.cuda.synchronize()
            t0 = time.time(); g(*args); torch.cuda.synchronize(); first = time.time() - t0
            t_comp = do_bench(lambda: g(*args), warmup=50, rep=200, return_mode="median")
            t_eager = do_bench(lambda: f(*args), warmup=50, rep=200, return_mode="median")
            print(json.dumps(dict(name=p["name"], problem=label, first_call_s=round(first, 2),
                                  compiled_us=round(t_comp * 1e3, 2), eager_us=round(t_eager * 1e3, 2))), flush=True)


if __name__ == "__main__":
    main()
