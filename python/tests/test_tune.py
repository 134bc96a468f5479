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


# buffers() is called once before anything needs a device, so what it returns is checked here without a GPU:
# a tensor the kernels never get, or a key kiln does not read, would otherwise surface as every variant
# failing on the device (an in-place y listed under "outputs" was such a case).
class _FakeTensor:
    pass


@pytest.mark.parametrize("made, match", [
    ({"args": [1], "output": [1]}, 'has "output"; its keys are "args", "outputs" and "inouts"'),
    ({"outputs": []}, 'needs "args"'),
    ({"args": [_FakeTensor(), 2], "outputs": [_FakeTensor()]}, r"outputs\[0\] is not among the args"),
    ({"args": [_FakeTensor(), 2], "inouts": [_FakeTensor()]}, r"inouts\[0\] is not among the args"),
])
def test_what_buffers_returns_is_checked_before_the_device(made, match):
    with pytest.raises(kiln.InvalidArgumentError, match=match):
        kiln.tune([kiln.Variant("a", AXPY, "axpy")], 1024, op="t.axpy_buffers", buffers=lambda sizes, seed: made)


def test_every_variant_failing_warns_with_the_first_failure():
    report = {"chosen": "vec1", "choices": [
        {"name": "vec1", "ok": False, "error": "WRONG_RESULT: 4096 of 4096 elements of output 'output0' were not written or are not finite"},
        {"name": "vec2", "ok": False, "error": "WRONG_RESULT: the same"}]}
    with pytest.warns(RuntimeWarning, match='every variant failed.*belongs under "inouts"'):
        kiln._warn_if_all_failed("t.axpy", report)
    report["choices"][1] = {"name": "vec2", "ok": True}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln._warn_if_all_failed("t.axpy", report)


def make_buffers(sizes, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = sizes[0]
    x = torch.rand(n, device="cuda", generator=g)
    y = torch.rand(n, device="cuda", generator=g)
    return {"args": [x, y, 2.0, n], "inouts": [y]}  # axpy updates y in place


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
    assert '"ok":false' not in op.report(), op.report()
    assert len(checked) == len(variants()) and all(n == 1 << 20 for n in checked)
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
        with pytest.warns(RuntimeWarning, match="never right"):
            op = kiln.tune(variants()[:2], 4096, check, op="test.axpy_bad", buffers=make_buffers, tuner=tuner)
    assert "never right" in op.report()


@needs_torch_gpu
def test_an_in_place_tensor_under_outputs_fails_every_variant_and_says_where_it_belongs(cache_dir):
    def poisoned(sizes, seed):
        made = make_buffers(sizes, seed)
        return {"args": made["args"], "outputs": made["inouts"]}

    with kiln.Tuner(cache_dir=cache_dir, mode="off") as tuner:
        with pytest.warns(RuntimeWarning, match='belongs under "inouts"'):
            kiln.tune(variants()[:2], 4096, op="test.axpy_poisoned", buffers=poisoned, tuner=tuner)
