// The memory-bound row families: rmsnorm and layernorm (templates/norms/norm.cu), which share one text.
#include <fmt/format.h>

#include "families.h"

namespace kiln::templates::detail {
namespace {

// Tunables shared by the row templates (norms, softmax).
std::vector<ParamSpec> row_tunables() {
  return {
      int_param("threads", ParamRole::kTunable, {64, 128, 256, 512, 1024}, "t", "threads per block"),
      int_param("rows_per_block", ParamRole::kTunable, {1, 2, 4, 8}, "r", "rows per block (threads / rows per row)"),
      int_param("vec", ParamRole::kTunable, {1, 2, 4, 8}, "v", "elements per vector access"),
      int_param("items", ParamRole::kTunable, {1, 2, 4, 8}, "i",
                "vectors per thread kept in registers: rows up to threads/rows_per_block*vec*items stay in registers"),
  };
}

}  // namespace

// Constraints shared by the row templates: a whole number of warps per row, a power of two of them (for the
// reductions), accesses of at most 16 bytes, and an estimate of registers (kept values + ~32 for addressing
// and statistics) that fits the block (65536 / threads) without spilling.
Status row_constraints(const Params& p, const DeviceLimits& limits, int extra_regs) {
  const int64_t threads = get_int(p, "threads"), rpb = get_int(p, "rows_per_block"), vec = get_int(p, "vec"),
                items = get_int(p, "items");
  const int bytes = dtype_bytes(get_dtype(p, "dtype"));
  if (threads < 32 || threads > limits.max_threads_per_block || threads % 32) {
    return make_error(ErrorCode::kOutOfRange, fmt::format("threads {} is not a multiple of 32 in [32, {}]", threads,
                                                          limits.max_threads_per_block));
  }
  if (rpb < 1 || threads % rpb || (threads / rpb) % 32) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("threads {} / rows_per_block {} is not a whole number of warps", threads, rpb));
  }
  const int64_t warps = threads / rpb / 32;
  if (warps & (warps - 1)) {
    return make_error(ErrorCode::kOutOfRange, fmt::format("{} warps per row is not a power of two", warps));
  }
  if (vec < 1 || (vec & (vec - 1)) || vec * bytes > 16) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("vec {} x {} bytes is not a power-of-two access of at most 16 bytes", vec, bytes));
  }
  if (items < 1) return make_error(ErrorCode::kOutOfRange, "items must be >= 1");
  const int64_t regs = items * vec + extra_regs;
  const int64_t budget = std::min<int64_t>(limits.max_regs_per_thread, limits.regs_per_sm / threads);
  if (regs > budget) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("~{} registers per thread ({} kept values) exceed the {} a {}-thread block allows",
                                  regs, items * vec, budget, threads));
  }
  return Status();
}

Status row_problem(const Params& p, const Shape& s) {
  const int64_t vec = get_int(p, "vec");
  if (s.n % vec) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("cols {} is not a multiple of vec {}", s.n, vec));
  }
  return Status();
}

Result<Launch> row_geometry(const Params& p, const Shape& s) {
  Launch l;
  const int64_t rpb = get_int(p, "rows_per_block");
  l.grid.x = ceil_div(s.m, rpb);
  l.block.x = static_cast<unsigned>(get_int(p, "threads"));
  l.align_elems = static_cast<unsigned>(get_int(p, "vec"));
  l.align_bytes = l.align_elems * dtype_bytes(get_dtype(p, "dtype"));
  return l;
}

std::vector<ParamSpec> row_params(std::vector<ParamSpec> problem) {
  std::vector<ParamSpec> out = std::move(problem);
  for (auto& s : row_tunables()) out.push_back(std::move(s));
  return out;
}

void add_norm_templates(std::vector<TemplateDef>& out) {
  for (bool layer : {false, true}) {
    const char* name = layer ? "layernorm" : "rmsnorm";
    TemplateDef d = builtin_def(name, name,
                                layer ? "LayerNorm over rows (optional residual add and bias), fp32 statistics"
                                      : "RMSNorm over rows (optional residual add), fp32 statistics",
                                "norms/norm.cu", layer ? "kiln_layernorm" : "kiln_rmsnorm");
    std::vector<ParamSpec> problem = {
        dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16, DType::kF32}, "", "x, y, weight dtype"),
        bool_param("residual", ParamRole::kProblem, "res", "add residual first and write the sum to residual_out"),
    };
    if (layer) problem.push_back(bool_param("has_bias", ParamRole::kProblem, "bias", "add a bias after the weight"));
    d.params = row_params(std::move(problem));
    d.params.push_back(derived_param("row_threads", ParamKind::kInt, "threads per row"));
    d.params.push_back(derived_param("layernorm", ParamKind::kBool, "layernorm (true) or rmsnorm"));
    if (!layer) d.params.push_back(derived_param("has_bias", ParamKind::kBool, "always false for rmsnorm"));
    d.derive = [layer](const Params& p) -> Result<Params> {
      Params o;
      int64_t rpb = get_int(p, "rows_per_block");
      o.emplace("row_threads", Value::integer(rpb > 0 ? get_int(p, "threads") / rpb : 0));
      o.emplace("layernorm", Value::boolean(layer));
      if (!layer) o.emplace("has_bias", Value::boolean(false));
      return o;
    };
    d.constraints = [](const Params& p, const DeviceLimits& l) { return row_constraints(p, l, 32); };
    d.problem_constraints = row_problem;
    d.geometry = row_geometry;
    out.push_back(std::move(d));
  }
}

}  // namespace kiln::templates::detail
