# Inductor max-autotune of y = x @ W.T (W stored [N, K] like nn.Linear's weight: B column-major), timed as
# ../shared/device/inductor_anchor.py times a @ b: first call, then the compiled kernel with
# triton.testing.do_bench (median, L2 flushed). Prints one JSON line per shape.
# Usage: python3 inductor_linear.py M,N,K [M,N,K ...]
import json, os, sys, time
import torch
import torch._inductor.config as cfg
from triton.testing import do_bench

cfg.max_autotune = True
cfg.max_autotune_gemm_backends = os.environ.get("BACKENDS", "ATEN,TRITON")
for spec in sys.argv[1:]:
    M, N, K = (int(x) for x in spec.split(","))
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    f = lambda x, w: x @ w.t()
    torch._dynamo.reset()
    g = torch.compile(f, mode="max-autotune-no-cudagraphs", dynamic=False)
    torch.cuda.synchronize()
    t0 = time.time(); out = g(x, w); torch.cuda.synchronize(); first = time.time() - t0
    t_comp = do_bench(lambda: g(x, w), warmup=50, rep=200, return_mode="median")
    t_eager = do_bench(lambda: f(x, w), warmup=50, rep=200, return_mode="median")
    ref = (x.double() @ w.double().t()).float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(json.dumps(dict(shape=[M, N, K], layout="x@W.T", first_call_s=round(first, 2), compiled_ms=round(t_comp, 4),
                          eager_ms=round(t_eager, 4), rel_err=err)), flush=True)
