"""What kiln reads from tensors: DLPack, __cuda_array_interface__ and torch's fast path agree."""
import numpy as np
import pytest

import kiln
from conftest import needs_torch

info = kiln._C._tensor_info


class CAI:
    """A minimal __cuda_array_interface__ producer (what CuPy and Numba expose)."""

    def __init__(self, shape, typestr, ptr, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


class OnlyDLPack:
    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def test_dlpack_from_numpy():
    a = np.zeros((3, 5), dtype=np.float16)
    i = info(a)
    assert i["shape"] == (3, 5) and i["strides"] == (5, 1)
    assert i["dtype"] == "float16" and i["device"] == "cpu"
    assert i["ptr"] == a.ctypes.data
    t = info(a.T)
    assert t["shape"] == (5, 3) and t["strides"] == (1, 5)
    assert info(np.zeros(4, dtype=np.float64))["dtype"] == "float64"


def test_cuda_array_interface():
    i = info(CAI((2, 8), "<f4", 0x1000))
    assert i == {"ptr": 0x1000, "shape": (2, 8), "strides": (8, 1), "dtype": "float32", "device": "cuda",
                 "device_index": -1, "torch": False}
    j = info(CAI((2, 8), "<f2", 0x2000, strides=(2, 4)))  # bytes -> elements
    assert j["strides"] == (1, 2) and j["dtype"] == "float16"
    assert info(CAI((4,), "|V2", 0x10))["dtype"] == "bfloat16"
    with pytest.raises(kiln.InvalidArgumentError, match="whole number"):
        info(CAI((2, 2), "<f4", 0, strides=(6, 4)))


@needs_torch
def test_torch_fast_path_and_dlpack_agree():
    import torch
    t = torch.zeros(4, 6, dtype=torch.bfloat16)[:, 1:5]
    fast = info(t)
    slow = info(OnlyDLPack(t))
    assert fast["torch"] and not slow["torch"]
    for key in ["ptr", "shape", "strides", "dtype", "device"]:
        assert fast[key] == slow[key], key
    assert fast["dtype"] == "bfloat16" and fast["strides"] == (6, 1)
    assert info(t.t())["strides"] == (1, 6)


def test_stream_resolution():
    class TorchLike:
        cuda_stream = 77

    class CupyLike:
        ptr = 88

    class Protocol:
        def __cuda_stream__(self):
            return (0, 99)

    assert kiln._C._resolve_stream(None, None) == 0
    assert kiln._C._resolve_stream(None, 1234) == 1234
    assert kiln._C._resolve_stream(None, TorchLike()) == 77
    assert kiln._C._resolve_stream(None, CupyLike()) == 88
    assert kiln._C._resolve_stream(None, Protocol()) == 99
    with pytest.raises(kiln.InvalidArgumentError, match="stream"):
        kiln._C._resolve_stream(None, "default")
