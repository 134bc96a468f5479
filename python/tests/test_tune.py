"""kiln.tune: a DSL's variants of one operation, tuned on a problem and cached (kiln/runtime/variants.h)."""
import subprocess
import sys

import pytest

import kiln
from conftest import needs_torch_gpu

AXPY = r'''
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  for (int j = 0; j < VEC; ++j) if (i + j < n) y[i + j] = a * x[i + j] + y[i + j];
}
'''


def variants():
    out = []
    for vec in (1, 2, 4):
        for block in (128, 256):
            out.append(kiln.Variant(
                name=f"vec{vec}_b{block}", source=AXPY, kernel="axpy", defines={"VEC": vec},
                geometry=lambda sizes, vec=vec, block=block: ((sizes[0] + vec * block - 1) // (vec * block), block),
                parameters={"vec": vec, "block": block}))
    return out


def test_bad_variants_are_invalid_arguments():
    with pytest.raises(kiln.InvalidArgumentError, match="has no variants"):
        kiln.tune([], 1024, op="t.axpy", buffers=lambda s, seed: [])
    twice = [kiln.Variant("a", AXPY, "axpy"), kiln.Variant("a", AXPY, "axpy")]
    with pytest.raises(kiln.InvalidArgumentError, match="two variants are named 'a'"):
        kiln.tune(twice, 1024, op="t.axpy", buffers=lambda s, seed: [])
    with pytest.raises(kiln.InvalidArgumentError, match="reference 'nope'"):
        kiln.tune([kiln.Variant("a", AXPY, "axpy")], 1024, op="t.axpy", buffers=lambda s, seed: [], reference="nope")
    with pytest.raises(kiln.InvalidArgumentError, match="buffers"):
        kiln.tune([kiln.Variant("a", AXPY, "axpy")], 1024, op="t.axpy", buffers=None)


def make_buffers(sizes, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = sizes[0]
    x = torch.rand(n, device="cuda", generator=g)
    y = torch.rand(n, device="cuda", generator=g)
    return {"args": [x, y, 2.0, n], "outputs": [y]}


@needs_torch_gpu
def test_tune_variants_then_a_second_process_loads_the_decision(cache_dir):
    import torch
    checked = []

    def check(sizes, args):
        checked.append(sizes[0])
        return bool(torch.isfinite(args[1]).all())

    with kiln.Tuner(cache_dir=cache_dir, mode="tune") as tuner:
        op = kiln.tune(variants(), 1 << 20, check, op="test.axpy", buffers=make_buffers, tuner=tuner)
    assert op.chosen.startswith("vec") and not op.from_cache
    assert checked and all(n == 1 << 20 for n in checked)
    x = torch.ones(1 << 20, device="cuda")
    y = torch.zeros(1 << 20, device="cuda")
    op.run([x, y, 3.0, 1 << 20])
    torch.cuda.synchronize()
    assert torch.all(y == 3)
    code = f"""
import kiln, sys
sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).parent))})
from test_tune import variants, make_buffers
with kiln.Tuner(cache_dir={cache_dir!r}, mode="strict") as t:
    op = kiln.tune(variants(), 1 << 20, op="test.axpy", buffers=make_buffers, tuner=t)
print(op.chosen, op.from_cache)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [op.chosen, "True"]


@needs_torch_gpu
def test_a_failing_check_fails_the_variant(cache_dir):
    def check(sizes, args):
        raise ValueError("never right")

    with kiln.Tuner(cache_dir=cache_dir, mode="off") as tuner:
        op = kiln.tune(variants()[:2], 4096, check, op="test.axpy_bad", buffers=make_buffers, tuner=tuner)
    assert "never right" in op.report()
