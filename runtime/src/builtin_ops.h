// The built-in op definitions the global registry starts with.
#pragma once

#include <vector>

#include "kiln/runtime/ops.h"

namespace kiln::runtime::detail {

std::vector<OpDef> builtin_ops();

/// cuBLAS's default GEMM computing a plain fp32 D: the first half of the unfused reference pair.
ChoicePtr make_cublas_default_choice_f32(const GemmProblem& p);

}  // namespace kiln::runtime::detail
