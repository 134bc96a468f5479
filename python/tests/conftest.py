"""Shared fixtures. GPU tests skip with a message when kiln sees no CUDA device; torch tests skip without torch."""
import os
import pathlib
import shutil

import pytest

import kiln

HAS_GPU = kiln._C.device_count() > 0
try:
    import torch  # noqa: F401
    HAS_TORCH = True
except ImportError:
    HAS_TORCH = False

needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA device (or driver) here: GPU test skipped")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed: torch test skipped")
needs_torch_gpu = pytest.mark.skipif(not (HAS_GPU and HAS_TORCH and torch.cuda.is_available()),
                                     reason="needs torch with a CUDA device: GPU test skipped")

SOURCE_DIR = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")


@pytest.fixture
def kiln_cli():
    cli = os.environ.get("KILN_CLI") or shutil.which("kiln")
    if not cli or not os.path.exists(cli):
        pytest.skip("the kiln command is not found (set KILN_CLI): CLI test skipped")
    return cli


AXPY = r'''
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
'''

SCALE_TEMPLATE = r'''
template <typename T, int N>
__global__ void scale(T* x, T s, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  for (int j = 0; j < N; ++j) if (i + j < n) x[i + j] *= s;
}
'''
