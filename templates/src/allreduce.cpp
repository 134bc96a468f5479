// All-reduce across GPUs through peer-mapped buffers (templates/collectives/allreduce.cu): one-shot and two-shot
// sums, and the sum fused with the residual add and RMSNorm that follow it in tensor-parallel inference. The
// runtime's collectives (runtime/collective/src/collective*.cpp) launch them with KilnAllReduceArgs.
#include <fmt/format.h>

#include "families.h"

namespace kiln::templates::detail {
namespace {

Status allreduce_constraints(const Params& p, const DeviceLimits& limits, bool fused) {
  const int64_t world = get_int(p, "world"), vec = get_int(p, "vec"), threads = get_int(p, "threads"),
                blocks = get_int(p, "blocks"), items = get_int(p, "items");
  const int bytes = dtype_bytes(get_dtype(p, "dtype"));
  if (world < 2 || world > KILN_AR_MAX_RANKS) {
    return make_error(ErrorCode::kOutOfRange, fmt::format("world {} is not in [2, {}]", world, KILN_AR_MAX_RANKS));
  }
  if (vec < 1 || (vec & (vec - 1)) || vec * bytes > 16) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("vec {} x {} bytes is not a power-of-two access of at most 16 bytes", vec, bytes));
  }
  if (threads < 64 || threads > limits.max_threads_per_block || (threads & (threads - 1))) {
    return make_error(ErrorCode::kOutOfRange, fmt::format("threads {} is not a power of two in [64, {}]", threads,
                                                          limits.max_threads_per_block));
  }
  if (blocks < 1 || blocks > KILN_AR_MAX_BLOCKS) {
    return make_error(ErrorCode::kOutOfRange, fmt::format("blocks {} is not in [1, {}]", blocks, KILN_AR_MAX_BLOCKS));
  }
  if (fused) {
    // Each thread keeps items x vec fp32 values of its row; ~40 more for addresses and the reduction.
    const int64_t budget = std::min<int64_t>(limits.max_regs_per_thread, limits.regs_per_sm / threads);
    if (items * vec + 40 > budget) {
      return make_error(ErrorCode::kOutOfRange, fmt::format("~{} registers per thread exceed the {} a {}-thread block allows",
                                                            items * vec + 40, budget, threads));
    }
  }
  return Status();
}

}  // namespace

void add_allreduce_templates(std::vector<TemplateDef>& out) {
  for (bool fused : {false, true}) {
    const char* name = fused ? "allreduce_rmsnorm" : "allreduce";
    TemplateDef d = builtin_def(
        name, name,
        fused ? "all-reduce (sum) across GPUs fused with residual add and RMSNorm, fp32 statistics"
              : "all-reduce (sum) across GPUs through peer-mapped buffers, one-shot or two-shot",
        "collectives/allreduce.cu", "kiln_allreduce");
    d.params = {
        dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16, DType::kF32}, "", "element dtype"),
        int_param("world", ParamRole::kProblem, {2, 4, 8}, "w", "ranks taking part"),
    };
    if (!fused) {
      d.params.push_back(enum_param("algo", ParamRole::kTunable, {"oneshot", "twoshot", "push", "push2"}, "",
                                    "one-shot (read every peer), two-shot (reduce-scatter, pushed all-gather), "
                                    "push (write to every peer, one barrier) or push2 (two-shot by writes only; "
                                    "in-place calls on peer-mapped tensors)"));
    } else {
      d.params.push_back(enum_param("algo", ParamRole::kTunable, {"oneshot", "push"}, "",
                                    "read every peer's rows, or push this rank's rows to every peer (one barrier)"));
    }
    d.params.push_back(int_param("vec", ParamRole::kTunable, {2, 4, 8}, "v", "elements per vector access"));
    d.params.push_back(int_param("threads", ParamRole::kTunable, {128, 256, 512, 1024}, "t", "threads per block"));
    d.params.push_back(int_param("blocks", ParamRole::kTunable, fused ? std::vector<int64_t>{16, 32, 64, 128}
                                                                      : std::vector<int64_t>{8, 16, 32, 64, 128, 256},
                                 "b", "blocks (the grid; flags are per block index)"));
    if (fused) {
      d.params.push_back(int_param("items", ParamRole::kTunable, {1, 2, 4, 8}, "i",
                                   "vectors per thread kept in registers: rows up to threads*vec*items columns"));
      d.params.push_back(derived_param("twoshot", ParamKind::kBool, "always false when fused"));
      d.params.push_back(derived_param("push", ParamKind::kBool, "algo == push"));
      d.params.push_back(derived_param("push2", ParamKind::kBool, "always false when fused"));
    } else {
      d.params.push_back(derived_param("twoshot", ParamKind::kBool, "algo == twoshot"));
      d.params.push_back(derived_param("push", ParamKind::kBool, "algo == push"));
      d.params.push_back(derived_param("push2", ParamKind::kBool, "algo == push2"));
      d.params.push_back(derived_param("items", ParamKind::kInt, "1 (rows are a fused-only notion)"));
    }
    d.params.push_back(derived_param("fused", ParamKind::kBool, "the fused residual + RMSNorm variant"));
    d.derive = [fused](const Params& p) -> Result<Params> {
      Params o;
      o.emplace("fused", Value::boolean(fused));
      if (fused) {
        o.emplace("twoshot", Value::boolean(false));
        o.emplace("push", Value::boolean(get_enum(p, "algo") == "push"));
        o.emplace("push2", Value::boolean(false));
      } else {
        o.emplace("twoshot", Value::boolean(get_enum(p, "algo") == "twoshot"));
        o.emplace("push", Value::boolean(get_enum(p, "algo") == "push"));
        o.emplace("push2", Value::boolean(get_enum(p, "algo") == "push2"));
        o.emplace("items", Value::integer(1));
      }
      return o;
    };
    d.constraints = [fused](const Params& p, const DeviceLimits& l) { return allreduce_constraints(p, l, fused); };
    // Shape: all-reduce m = elements; fused m = rows, n = cols.
    d.problem_constraints = [fused](const Params& p, const Shape& s) -> Status {
      const int64_t vec = get_int(p, "vec");
      if (!fused) {
        return require(s.m % vec == 0, ErrorCode::kInvalidArgument,
                       fmt::format("{} elements are not a multiple of vec {}", s.m, vec));
      }
      if (s.n % vec) {
        return make_error(ErrorCode::kInvalidArgument, fmt::format("cols {} is not a multiple of vec {}", s.n, vec));
      }
      const int64_t fits = get_int(p, "threads") * vec * get_int(p, "items");
      return require(s.n <= fits, ErrorCode::kInvalidArgument,
                     fmt::format("cols {} exceed the {} a configuration keeps in registers", s.n, fits));
    };
    d.geometry = [](const Params& p, const Shape&) -> Result<Launch> {
      Launch l;
      l.grid.x = static_cast<unsigned>(get_int(p, "blocks"));
      l.block.x = static_cast<unsigned>(get_int(p, "threads"));
      l.align_elems = static_cast<unsigned>(get_int(p, "vec"));
      l.align_bytes = l.align_elems * dtype_bytes(get_dtype(p, "dtype"));
      return l;
    };
    out.push_back(std::move(d));
  }
}

}  // namespace kiln::templates::detail
