// The public GEMM suite's shapes: the linear layers of public model configurations (Hugging Face config.json
// figures), as D[M,N] = X[M,K] . W, W being the layer's weight ([N,K] as stored by PyTorch: B col-major, or
// [K,N]: B row-major), at the token counts M that decode, batched decode, MoE expert routing and prefill give.
// Pure data, no GPU: the suite's CPU test checks it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/templates/template.h"

namespace kiln::bench::suite {

struct SuiteShape {
  std::string model;  // "llama3-8b", "qwen2.5-72b tp8", ...
  std::string layer;  // "qkv", "o", "gate_up", "down", "lm_head", "expert w13", ...
  int64_t m = 1, n = 1, k = 1;
  templates::DType dtype = templates::DType::kBF16;
  templates::Layout layout_b = templates::Layout::kColMajor;
  /// "m8192_n4096_k4096_bf16_c": unique within the suite, used by --shapes and in the JSON.
  std::string id() const;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

/// Every shape of the suite, in run order (cheap shapes first within each model).
std::vector<SuiteShape> suite_shapes();

/// The shapes whose id, model or layer contains one of the comma-separated `filter` terms (all when empty);
/// a term "m<=N" keeps shapes with M <= N, and "max=N" keeps the first N after the other terms.
std::vector<SuiteShape> filter_shapes(const std::vector<SuiteShape>& all, const std::string& filter);

}  // namespace kiln::bench::suite
