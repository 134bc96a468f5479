"""kiln.torch: the custom ops trace through fake tensors (CPU, in CI) and run in eager mode, under
torch.compile(fullgraph=True) and inside CUDA-graph capture (GPU)."""
import json

import pytest

from conftest import needs_torch, needs_torch_gpu

torch = pytest.importorskip("torch", reason="torch is not installed: torch tests skipped")
import kiln  # noqa: E402
import kiln.torch  # noqa: E402,F401


def mlp(x, wgu, wd):
    gu = torch.ops.kiln.gemm(x, wgu.t())
    g, u = gu.chunk(2, dim=-1)
    return torch.ops.kiln.gemm(torch.nn.functional.silu(g) * u, wd.t(), None, "")


def test_ops_are_registered():
    for op in ["gemm", "rmsnorm", "fused_add_rmsnorm", "softmax"]:
        assert hasattr(torch.ops.kiln, op)
    assert kiln.torch.gemm is torch.ops.kiln.gemm


def test_fake_tensor_tracing_make_fx():
    from torch.fx.experimental.proxy_tensor import make_fx
    x, wgu, wd = torch.randn(16, 64), torch.randn(256, 64), torch.randn(64, 128)
    gm = make_fx(mlp, tracing_mode="fake")(x, wgu, wd)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.kiln.gemm.default) == 2
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        out = mlp(mode.from_tensor(x), mode.from_tensor(wgu), mode.from_tensor(wd))
    assert tuple(out.shape) == (16, 64) and out.dtype == x.dtype


def test_torch_compile_fullgraph_traces_the_ops():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        # Only the traced graph matters on a machine without a GPU: stand in for the kernels' output.
        return lambda *args: [torch.zeros(4, 48)]

    def f(x, w, b, nw, res):
        y = torch.ops.kiln.gemm(x, w.t(), b, "gelu")
        y = torch.ops.kiln.fused_add_rmsnorm(y, res, nw, 1e-5)
        z = torch.ops.kiln.rmsnorm(y, nw)
        return torch.ops.kiln.softmax(z, 0.5)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    compiled(torch.randn(4, 32), torch.randn(48, 32), torch.randn(48), torch.randn(48), torch.randn(4, 48))
    assert len(graphs) == 1
    text = str(graphs[0].graph)
    for op in ["kiln.gemm", "kiln.fused_add_rmsnorm", "kiln.rmsnorm", "kiln.softmax"]:
        assert op in text, op


def test_fake_impl_checks_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a, b = torch.empty(3, 5), torch.empty(6, 7)
        with pytest.raises(Exception, match="inner sizes"):
            torch.ops.kiln.gemm(a, b)
        assert torch.ops.kiln.gemm(a, torch.empty(5, 7)).shape == (3, 7)
        # The weights promise is part of the schema and traces like the rest.
        assert torch.ops.kiln.gemm(a, torch.empty(5, 7), b_constant=True).shape == (3, 7)
    assert "bool b_constant=False" in str(torch.ops.kiln.gemm.default._schema)


def test_torch_fallbacks_match_the_math():
    # The compositions a capture miss falls back on, on the CPU in fp32.
    a, b, bias, res = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3), torch.randn(4, 3)
    got = kiln.torch._gemm_torch(a, b, bias, "gelu+residual", res, 1.0, 0.5)
    want = torch.nn.functional.gelu(a @ b + bias, approximate="tanh") + 0.5 * res
    assert torch.allclose(got, want, atol=1e-5)
    x, w = torch.randn(2, 16), torch.randn(16)
    want = torch.nn.functional.rms_norm(x, (16,), w, 1e-6) if hasattr(torch.nn.functional, "rms_norm") else None
    if want is not None:
        assert torch.allclose(kiln.torch._rmsnorm_torch(x, w, 1e-6), want, atol=1e-5)


# ---- GPU ----

def _ref_gemm(a, b, bias=None):
    v = a.float() @ b.float()
    return v + bias.float() if bias is not None else v


@needs_torch_gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_eager_ops_match_torch(m, cache_dir):
    with kiln.Tuner(cache_dir=cache_dir, mode="tune", configs=4):
        x = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) / 16
        b = torch.randn(512, device="cuda", dtype=torch.bfloat16)
        y = torch.ops.kiln.gemm(x, w.t(), b, "gelu")
        want = torch.nn.functional.gelu(_ref_gemm(x, w.t(), b), approximate="tanh")
        assert torch.allclose(y.float(), want, rtol=2e-2, atol=2e-2)
        nw = torch.randn(512, device="cuda", dtype=torch.bfloat16)
        r = torch.ops.kiln.rmsnorm(y, nw)
        assert torch.allclose(r.float(), kiln.torch._rmsnorm_torch(y, nw, 1e-6).float(), rtol=2e-2, atol=2e-2)
        s = torch.ops.kiln.softmax(y, 1.0)
        assert torch.allclose(s.float(), torch.softmax(y.float(), -1), atol=1e-2)
        res = torch.randn_like(y)
        res0 = res.clone()
        out = torch.ops.kiln.fused_add_rmsnorm(y, res, nw)
        assert torch.allclose(res.float(), (res0 + y).float(), atol=2e-2)
        assert torch.allclose(out.float(), kiln.torch._rmsnorm_torch(res0 + y, nw, 1e-6).float(), rtol=2e-2, atol=2e-2)


@needs_torch_gpu
@pytest.mark.parametrize("m", [1, 16])
def test_b_constant_gemm_matches_torch_and_is_tuned_apart(m, cache_dir):
    # Decode shapes with the weights promise also try the early-weights kernels; each call passes the promise on.
    with kiln.Tuner(cache_dir=cache_dir, mode="tune", configs=4) as t:
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16) / 16
        want = _ref_gemm(x, w.t())
        y = torch.ops.kiln.gemm(x, w.t(), b_constant=True)
        assert torch.allclose(y.float(), want, rtol=2e-2, atol=2e-2)
        z = kiln.gemm(x, w.t(), b_constant=True)
        assert torch.allclose(z.float(), want, rtol=2e-2, atol=2e-2)
        assert torch.allclose(kiln.gemm(x, w.t()).float(), want, rtol=2e-2, atol=2e-2)
        problems = [json.loads(r)["problem"] for r in t.reports()]
        assert sum("B constant" in p for p in problems) == 1, problems
        assert len(problems) == 2, problems


@needs_torch_gpu
def test_torch_compile_runs_kiln_ops(cache_dir):
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    wgu = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16) / 16
    wd = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) / 16
    with kiln.Tuner(cache_dir=cache_dir, configs=4):
        eager = mlp(x, wgu, wd)
        torch._dynamo.reset()
        compiled = torch.compile(mlp, fullgraph=True)(x, wgu, wd)
    assert torch.allclose(eager.float(), compiled.float(), rtol=2e-2, atol=2e-2)


@needs_torch_gpu
def test_cuda_graph_capture_hit_nearest_and_fallback(cache_dir):
    x16 = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) / 16
    with kiln.Tuner(cache_dir=cache_dir, configs=4) as tuner:
        torch.ops.kiln.gemm(x16, w.t())  # tuned before capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        x8 = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
        xs = torch.randn(4, 96, device="cuda", dtype=torch.bfloat16)
        ws = torch.randn(96, 40, device="cuda", dtype=torch.bfloat16)
        with torch.cuda.graph(g):
            hit = torch.ops.kiln.gemm(x16, w.t())      # a hit
            near = torch.ops.kiln.gemm(x8, w.t())      # a miss: the M=16 selection serves M=8
            fell = torch.ops.kiln.gemm(xs, ws)         # a miss of a new problem: torch's fallback
        g.replay()
        torch.cuda.synchronize()
        stats = tuner.stats()
    assert stats["capture_nearest"] == 1 and stats["capture_errors"] == 1
    assert torch.allclose(hit.float(), _ref_gemm(x16, w.t()), rtol=2e-2, atol=2e-2)
    assert torch.allclose(near.float(), _ref_gemm(x8, w.t()), rtol=2e-2, atol=2e-2)
    assert torch.allclose(fell.float(), _ref_gemm(xs, ws), rtol=2e-2, atol=2e-2)


@needs_torch_gpu
def test_strict_mode_miss_in_capture_is_a_clear_error(cache_dir):
    x = torch.randn(4, 96, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(96, 40, device="cuda", dtype=torch.bfloat16)
    with kiln.Tuner(cache_dir=cache_dir, mode="strict"):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            with pytest.raises(kiln.CaptureMissError, match="not tuned before CUDA-graph capture"):
                torch.ops.kiln.gemm(x, w)
