// The template families built into kiln::templates. Each family's source file defines one function that
// appends its TemplateDefs; registry.cpp calls them all. Internal.
//
// GEMM engineer: define `void kiln::templates::detail::add_gemm_templates(std::vector<TemplateDef>&)` in any
// templates/src/gemm*.cpp. templates/CMakeLists.txt globs src/gemm*.cpp and, when there is one, defines
// KILN_HAVE_GEMM_TEMPLATES so registry.cpp calls it; texts under templates/gemm/ are embedded by a glob too.
#pragma once

#include <string>
#include <utility>
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

/// A built-in family's identity: its `name`, the `problem` it solves, its text `file` and `entry` kernel; its
/// headers are the device helpers (common/kiln_device.cuh) then `more_headers`.
inline TemplateDef builtin_def(std::string name, std::string problem, std::string description, std::string file,
                               std::string entry, std::vector<std::string> more_headers = {}) {
  TemplateDef d;
  d.name = std::move(name);
  d.problem = std::move(problem);
  d.description = std::move(description);
  d.file = std::move(file);
  d.headers = {"common/kiln_device.cuh"};
  d.headers.insert(d.headers.end(), more_headers.begin(), more_headers.end());
  d.entry = std::move(entry);
  return d;
}

/// Small shared helpers for families.
inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace kiln::templates::detail
