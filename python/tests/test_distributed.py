"""kiln.distributed: the CPU parts run everywhere (import, op registration and schemas, fake-tensor tracing under
make_fx and torch.compile, argument checks on a test instance without a communicator, the unfused step's math);
the multi-GPU test spawns 2 ranks and compares every call with torch.distributed (distributed_worker.py)."""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from conftest import SOURCE_DIR

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.distributed tests skipped")
import torch.distributed as dist  # noqa: E402

import kiln  # noqa: E402
import kiln.distributed  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def test_imports_without_a_gpu_and_registers_the_ops():
    code = ("import os; os.environ['CUDA_VISIBLE_DEVICES'] = ''\n"
            "import torch, kiln.distributed\n"
            "print(torch.ops.kiln.all_reduce.default._schema)\n"
            "print(torch.ops.kiln.all_reduce_fused_add_rmsnorm.default._schema)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "kiln::all_reduce(Tensor(a!) x, int handle) -> ()"
    assert out[1] == ("kiln::all_reduce_fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, "
                      "int handle) -> Tensor")


@pytest.mark.parametrize("order", ["torch first", "distributed first"])
def test_lives_beside_kiln_torch(order):
    # kiln.torch owns the namespace's DEF library; kiln.distributed adds a FRAGMENT: either import order works.
    mods = ["kiln.torch", "kiln.distributed"] if order == "torch first" else ["kiln.distributed", "kiln.torch"]
    code = f"import torch, {mods[0]}, {mods[1]}\nprint(all(hasattr(torch.ops.kiln, o) for o in " \
           "['gemm', 'fused_add_rmsnorm', 'all_reduce', 'all_reduce_fused_add_rmsnorm']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_public_names():
    assert issubclass(kiln.distributed.AllReduce, kiln._C.AllReduce)
    assert kiln.distributed.all_reduce is torch.ops.kiln.all_reduce
    for name in ["tune", "empty", "all_reduce", "fused_add_rmsnorm", "close", "is_symmetric", "choice_for"]:
        assert getattr(kiln.distributed.AllReduce, name).__doc__, name
    assert "AllReduce" in (pathlib.Path(kiln.__file__).parent / "_C.pyi").read_text()


def step(x, res, w):
    torch.ops.kiln.all_reduce(x, 7)
    return torch.ops.kiln.all_reduce_fused_add_rmsnorm(x, res, w, 1e-5, 7)


def test_fake_tensor_tracing_make_fx():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    x, res, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    gm = make_fx(step, tracing_mode="fake")(x, res, w)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.kiln.all_reduce.default in targets
    assert torch.ops.kiln.all_reduce_fused_add_rmsnorm.default in targets
    with FakeTensorMode() as mode:
        out = step(mode.from_tensor(x), mode.from_tensor(res), mode.from_tensor(w))
        assert tuple(out.shape) == (4, 64) and out.dtype == x.dtype
        with pytest.raises(Exception, match="hidden size 64 vs weight 32"):
            step(mode.from_tensor(x), mode.from_tensor(res), mode.from_tensor(torch.randn(32)))
    with torch.device("meta"):
        assert step(torch.empty(2, 8, 16), torch.empty(2, 8, 16), torch.empty(16)).shape == (2, 8, 16)


def test_torch_compile_fullgraph_traces_the_ops():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: [torch.zeros(4, 64)]  # no GPU here: stand in for the kernels' output

    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend=backend)(torch.randn(4, 64), torch.randn(4, 64), torch.randn(64))
    assert len(graphs) == 1
    text = str(graphs[0].graph)
    assert "kiln.all_reduce" in text and "kiln.all_reduce_fused_add_rmsnorm" in text


def test_torch_compile_functionalizes_the_mutating_ops():
    # AOT autograd's functionalization (what Inductor sees): the in-place ops trace through their fake impls.
    from torch._dynamo.backends.common import aot_autograd

    class StandIn(Exception):
        pass

    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            raise StandIn()
        return run

    def f(x, res, w):
        y = x * 2
        torch.ops.kiln.all_reduce(y, 7)
        return y, torch.ops.kiln.all_reduce_fused_add_rmsnorm(y, res, w, 1e-5, 7)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=fw))
    with pytest.raises(StandIn):
        compiled(torch.randn(4, 64), torch.randn(4, 64), torch.randn(64))
    text = str(graphs[0].graph)
    assert "kiln.all_reduce.default" in text and "kiln.all_reduce_fused_add_rmsnorm.default" in text


def test_argument_errors_name_what_is_wrong():
    ar = kiln._C.AllReduce._for_tests(0, 2, 0, "bfloat16")
    bf = torch.bfloat16
    cases = [
        (lambda: ar.all_reduce(torch.zeros(8)), "tensor: dtype float32; this AllReduce reduces bfloat16"),
        (lambda: ar.all_reduce(torch.zeros(8, 8, dtype=bf).t()), "tensor: not contiguous"),
        (lambda: ar.all_reduce(torch.zeros(8, dtype=bf), out=torch.zeros(9, dtype=bf)), "out: shape (9,) (9 elements)"),
        (lambda: ar.all_reduce(torch.zeros(8, dtype=bf), out=torch.zeros(8, dtype=torch.float16)), "out: dtype float16"),
        (lambda: ar.all_reduce(torch.zeros(8, dtype=bf)), "tensor: on the CPU"),
        (lambda: ar.all_reduce([1, 2]), "expected a tensor"),
        (lambda: ar.fused_add_rmsnorm(torch.zeros(2, 8, dtype=bf), torch.zeros(2, 4, dtype=bf), torch.zeros(8, dtype=bf)),
         "residual: shape (2, 4), but x is (2, 8)"),
        (lambda: ar.fused_add_rmsnorm(torch.zeros(2, 8, dtype=bf), torch.zeros(2, 8, dtype=bf), torch.zeros(4, dtype=bf)),
         "weight: shape (4,); expected (8,)"),
        (lambda: torch.ops.kiln.all_reduce(torch.zeros(8), ar.handle), "dtype float32"),
    ]
    for call, match in cases:
        with pytest.raises(kiln.InvalidArgumentError, match=re.escape(match)):
            call()
    with pytest.raises(kiln.FailedPreconditionError, match="no communicator"):
        ar._tune([])
    with pytest.raises(kiln.InvalidArgumentError, match="dtype int8"):
        kiln._C.AllReduce._for_tests(0, 2, 0, "int8")
    handle = ar.handle
    ar._close()
    assert ar.closed
    with pytest.raises(kiln.FailedPreconditionError, match="closed"):
        ar.all_reduce(torch.zeros(8, dtype=bf))
    with pytest.raises(kiln.NotFoundError, match=f"no open kiln AllReduce with handle {handle}"):
        torch.ops.kiln.all_reduce(torch.zeros(8, dtype=bf), handle)
    with pytest.raises(kiln.NotFoundError, match="handle 123456789"):
        torch.ops.kiln.all_reduce_fused_add_rmsnorm(torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(8), 1e-6, 123456789)


def test_constructor_needs_a_process_group_and_checks_its_arguments(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(kiln.FailedPreconditionError, match="init_process_group"):
        kiln.distributed.AllReduce()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(kiln.InvalidArgumentError, match="dtype torch.int32"):
            kiln.distributed.AllReduce(dtype=torch.int32)
        with pytest.raises(kiln.InvalidArgumentError, match="max_bytes"):
            kiln.distributed.AllReduce(max_bytes=0)
        with pytest.raises(kiln.InvalidArgumentError, match="hidden_size needs tune"):
            kiln.distributed.AllReduce(tune=False, hidden_size=4096)
        if not torch.cuda.is_available():
            with pytest.raises(kiln.NoDeviceError, match="needs a CUDA device"):
                kiln.distributed.AllReduce()
    finally:
        dist.destroy_process_group()


def test_unfused_step_math(monkeypatch):
    # The composition a call outside the fused table runs: kiln's all-reduce (here a world of one), then torch's
    # residual add and RMSNorm, rounded as the fused kernel rounds.
    class OneRank:
        @staticmethod
        def _all_reduce_by_handle(handle, x, out):
            out.copy_(x)

    monkeypatch.setattr(kiln.distributed, "_C", OneRank)
    x, res, w = torch.randn(3, 32).bfloat16(), torch.randn(3, 32).bfloat16(), torch.randn(32).bfloat16()
    y, res_out = torch.empty_like(x), torch.empty_like(res)
    kiln.distributed._unfused_step(1, x, res, w, 1e-5, y, res_out)
    h = x + res
    assert torch.equal(res_out, h)
    if hasattr(torch.nn.functional, "rms_norm"):
        want = torch.nn.functional.rms_norm(h.float(), (32,), w.float(), 1e-5).bfloat16()
        assert torch.allclose(y.float(), want.float(), atol=2e-2, rtol=2e-2)


def _distributed_blocks():
    docs = (SOURCE_DIR / "docs" / "python.md").read_text()
    section = docs.split("## Distributed")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "docs/python.md has no Distributed example"
    readme = re.findall(r"```python\n(.*?)```", (SOURCE_DIR / "README.md").read_text(), re.S)
    return blocks + [b for b in readme if "kiln.distributed" in b]


def test_docs_distributed_examples_name_real_api():
    import ast
    blocks = _distributed_blocks()
    assert len(blocks) >= 2, "the README's Python section has no kiln.distributed example"
    for code in blocks:
        for node in ast.walk(ast.parse(code)):
            if not isinstance(node, ast.Attribute):
                continue
            v = node.value
            if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and (v.value.id, v.attr) == ("kiln", "distributed"):
                assert hasattr(kiln.distributed, node.attr), f"kiln.distributed.{node.attr}"
            if isinstance(v, ast.Name) and v.id == "ar":
                assert hasattr(kiln.distributed.AllReduce, node.attr), f"AllReduce.{node.attr}"
            if isinstance(v, ast.Attribute) and v.attr == "kiln" and isinstance(v.value, ast.Attribute) and v.value.attr == "ops":
                assert hasattr(torch.ops.kiln, node.attr), f"torch.ops.kiln.{node.attr}"


# ---- two GPUs

def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2 or kiln._C.device_count() < 2,
                    reason=f"needs 2 CUDA devices, found {_gpus()}: multi-GPU test skipped")
def test_two_ranks_match_torch_distributed(tmp_path):
    import torch.multiprocessing as mp
    sys.path.insert(0, str(HERE))
    import distributed_worker
    world = 2
    results = tmp_path / "results"
    results.mkdir()
    ctx = mp.start_processes(distributed_worker.run, nprocs=world, join=False, start_method="spawn",
                             args=(world, str(tmp_path / "store"), str(tmp_path / "cache"), str(results)))
    deadline = time.monotonic() + float(os.environ.get("KILN_DIST_TEST_TIMEOUT", 900))
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail("the ranks did not finish in time (a hang in a collective?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    notes = [(results / f"rank{r}.txt").read_text() for r in range(world)]
    print("ranks:", notes)
