// Internal declarations shared by the GEMM family sources (gemm.cpp, gemm_sm80.cpp, gemm_sm90.cpp).
#pragma once

#include <string>
#include <vector>

#include "families.h"
#include "kiln/templates/launch.h"
#include "kiln/templates/template.h"

namespace kiln::templates::detail {

/// dtype, layout_a, layout_b, epilogue, partials: the problem parameters both families declare first.
std::vector<ParamSpec> gemm_problem_specs();
/// The grid's sample epilogue values.
std::vector<Value> gemm_epilogue_values();
/// Checks both families make of every problem: sizes below 2^31, splits only with partials.
Status gemm_problem_common(const Params& p, const Shape& s);
/// "bf16_rc_bias_gelu_bf16[_partials]": the problem part of a configuration name.
std::string gemm_problem_suffix(const Params& p);

TemplateDef gemm_mma_sm80_def();
TemplateDef gemm_wgmma_sm90_def();

/// launch_gemm() for gemm_wgmma_sm90 configurations (gemm_sm90.cpp).
Status launch_gemm_tma(const Kernel& kernel, const Params& params, const Launch& geometry, const GemmArgs& args,
                       CUstream stream, CUdeviceptr lowered_flags);

}  // namespace kiln::templates::detail
