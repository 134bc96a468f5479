import numpy as np
import pytest

import kiln
from conftest import AXPY


def test_every_code_has_its_class():
    codes = kiln._C.error_codes
    assert codes["ok"] == 0
    assert len(codes) == len(kiln.errors._BY_CODE) + 1
    for name, value in codes.items():
        if value == 0:
            continue
        with pytest.raises(kiln.KilnError) as e:
            kiln._C._raise_status(value, f"boom {name}", "the detail")
        assert type(e.value) is kiln.errors._BY_CODE[value]
        assert e.value.code == name
        assert e.value.message == f"boom {name}"
        assert e.value.detail == "the detail"
        assert e.value.context == ["in a test"]
        assert f"boom {name}" in str(e.value)


def test_python_bases():
    assert issubclass(kiln.InvalidArgumentError, ValueError)
    assert issubclass(kiln.NotFoundError, LookupError)
    assert issubclass(kiln.TimeoutError, TimeoutError)
    assert issubclass(kiln.CaptureMissError, kiln.FailedPreconditionError)


def test_bad_mode_is_invalid_argument():
    with pytest.raises(kiln.InvalidArgumentError, match="tune"):
        kiln.Tuner(mode="fastest")
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.Tuner(executor="gpu")


def test_compile_error_carries_nvrtc_log():
    with pytest.raises(kiln.CompileError) as e:
        kiln.compile('extern "C" __global__ void k() { this is not cuda; }', arch="sm_90")
    assert e.value.code == "compile error"
    assert "error" in e.value.detail  # NVRTC's log


def test_cpu_tensor_is_rejected_with_a_clear_message():
    a = np.ones((4, 4), dtype=np.float16)
    with pytest.raises(kiln.InvalidArgumentError, match="CPU"):
        kiln.gemm(a, a)


def test_non_tensor_is_rejected():
    with pytest.raises(kiln.InvalidArgumentError, match="expected a tensor"):
        kiln.softmax([1.0, 2.0])


def test_bad_arch():
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.compile(AXPY, arch="sm_1")


def test_bad_workload_names_the_field(cache_dir):
    with pytest.raises(kiln.InvalidArgumentError, match="op"):
        kiln.precompile([{"m": 1}], arch="sm_90", cache_dir=cache_dir)


def test_tuner_configs_default_to_the_efforts_sample_and_refuse_negatives(tmp_path):
    # 0 (the default) is the tune's effort's sample, as kiln tune and kiln precompile use: a cache they built
    # serves this tuner without compiling (python/tests/test_warmup.py::test_serving_recipe on a GPU).
    kiln.Tuner(cache_dir=str(tmp_path), configs=0)
    with pytest.raises(kiln.InvalidArgumentError, match="configs"):
        kiln.Tuner(cache_dir=str(tmp_path), configs=-1)
