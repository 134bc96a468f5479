// Small kernels the jit tests compile.
#pragma once

namespace kiln::test_kernels {

inline constexpr const char* kAxpy = R"(
extern "C" __global__ void axpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

inline constexpr const char* kTemplated = R"(
template <typename T, int Factor>
__global__ void scale(int n, const T* in, T* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * T(Factor);
}
)";

}  // namespace kiln::test_kernels

#include <string>

#include "kiln/jit/kernel_source.h"

namespace kiln::test_kernels {

/// The source the key tests hash in this process and in kiln_key_probe: an in-memory header, a header from
/// `include_dir` (which must hold kiln_probe/tile.cuh) when one is given, options and a name expression.
inline KernelSource probe_source(const std::string& include_dir) {
  KernelSource s;
  s.name = "probe";
  s.source = "#include \"probe/consts.h\"\n";
  if (!include_dir.empty()) {
    s.source += "#include \"kiln_probe/tile.cuh\"\n";
    s.include_dirs = {include_dir};
  }
  s.source += "#include <cuda_fp16.h>\n" + std::string(kTemplated);
  s.headers = {{"probe/consts.h", "constexpr int kProbe = 3;\n"}};
  s.options = {"-DA=1", "--use_fast_math", "-DB=2"};
  s.name_expressions = {"scale<float, 3>"};
  s.entry = "scale<float, 3>";
  return s;
}

}  // namespace kiln::test_kernels
