import numpy as np
import pytest

import kiln
from conftest import AXPY, SCALE_TEMPLATE, needs_torch_gpu


def test_compile_extern_c_without_gpu():
    k = kiln.compile(AXPY, arch="sm_90")
    assert k.entry == "axpy"
    assert k.arch == "sm_90"
    assert k.cubin[:4] == b"\x7fELF"
    assert len(k.key) == 32
    assert k.compile_seconds > 0


def test_key_is_deterministic_and_follows_the_source():
    a = kiln.compile(AXPY, arch="sm_90")
    b = kiln.compile(AXPY, arch="sm_90")
    c = kiln.compile(AXPY.replace("a * x[i]", "a * x[i] * 2"), arch="sm_90")
    d = kiln.compile(AXPY, arch="sm_80")
    assert a.key == b.key
    assert len({a.key, c.key, d.key}) == 3


def test_name_expressions_options_and_headers():
    src = '#include "consts.h"\n' + SCALE_TEMPLATE + "\ntemplate __global__ void scale<float, WIDTH>(float*, float, int);\n"
    k = kiln.compile(src, name_expressions=["scale<float, 4>", "scale<float, 1>"], arch="sm_90",
                     options=["-DWIDTH=4"], headers={"consts.h": "#define UNUSED 1\n"})
    assert k.entry == "scale<float, 4>"
    assert set(k.lowered_names) == {"scale<float, 4>", "scale<float, 1>"}
    other = k.get("scale<float, 1>")
    assert other.entry == "scale<float, 1>" and other.key == k.key
    with pytest.raises(kiln.InvalidArgumentError):
        k.get("scale<double, 2>")


def test_missing_entry():
    with pytest.raises(kiln.InvalidArgumentError, match="entry"):
        kiln.compile("__device__ int f() { return 1; }", arch="sm_90")


@needs_torch_gpu
def test_launch_on_torch_tensors():
    import torch
    k = kiln.compile(AXPY)  # the GPU's arch
    n = 1000
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    k.launch((n + 255) // 256, 256, [2.0, x, y, n])  # float -> 4 bytes, int -> 4 bytes: sized by the kernel
    torch.cuda.synchronize()
    assert torch.equal(y, 2 * x + 1)
    # Explicit stream, NumPy scalar for the float, torch's stream object.
    s = torch.cuda.Stream()
    k.launch([(n + 127) // 128], [128, 1, 1], [np.float32(1.0), x, y, n], stream=s)
    s.synchronize()
    assert torch.equal(y, 3 * x + 1)
    with pytest.raises(kiln.InvalidArgumentError, match="4 arguments, 3 given"):
        k.launch(1, 1, [1.0, x, y])


@needs_torch_gpu
def test_launch_template_kernel():
    import torch
    k = kiln.compile(SCALE_TEMPLATE, name_expressions=["scale<float, 4>"])
    x = torch.ones(1024, device="cuda")
    k.launch(1, 256, [x, 3.0, 1024])
    torch.cuda.synchronize()
    assert torch.all(x == 3)
