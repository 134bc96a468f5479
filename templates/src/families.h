// The template families built into kiln::templates. Each family's source file defines one function that
// appends its TemplateDefs; registry.cpp calls them all. Internal.
//
// GEMM engineer: define `void kiln::templates::detail::add_gemm_templates(std::vector<TemplateDef>&)` in any
// templates/src/gemm*.cpp. templates/CMakeLists.txt globs src/gemm*.cpp and, when there is one, defines
// KILN_HAVE_GEMM_TEMPLATES so registry.cpp calls it; texts under templates/gemm/ are embedded by a glob too.
#pragma once

#include <vector>

#include "kiln/templates/template.h"

namespace kiln::templates::detail {

void add_norm_templates(std::vector<TemplateDef>& out);     // rmsnorm, layernorm (norms.cpp)
void add_softmax_templates(std::vector<TemplateDef>& out);  // softmax (softmax.cpp)
void add_splitk_templates(std::vector<TemplateDef>& out);   // splitk_reduce (splitk.cpp)
void add_gemm_templates(std::vector<TemplateDef>& out);     // the GEMM engineer's (gemm*.cpp)
void add_allreduce_templates(std::vector<TemplateDef>& out);  // allreduce, allreduce_rmsnorm (allreduce.cpp)

// The row families' shared pieces (norms.cpp): tunables threads/rows_per_block/vec/items after `problem`,
// their constraints (extra_regs: registers besides the kept values), cols % vec, and the launch geometry.
std::vector<ParamSpec> row_params(std::vector<ParamSpec> problem);
Status row_constraints(const Params& p, const DeviceLimits& limits, int extra_regs);
Status row_problem(const Params& p, const Shape& s);
Result<Launch> row_geometry(const Params& p, const Shape& s);

/// Small shared helpers for families.
inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace kiln::templates::detail
