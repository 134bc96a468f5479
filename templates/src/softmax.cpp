// Row softmax (templates/softmax/softmax.cu) and the split-row softmax for long rows over a thread-block
// cluster (templates/softmax/softmax_cluster.cu).
#include <fmt/format.h>

#include "families.h"

namespace kiln::templates::detail {
namespace {

struct ClusterConfig {
  int64_t threads, vec, items, cluster;
  int64_t columns() const { return cluster * threads * vec * items; }
};
ClusterConfig cluster_config(const Params& p) {
  return {get_int(p, "threads"), get_int(p, "vec"), get_int(p, "items"), get_int(p, "cluster")};
}

Status cluster_constraints(const Params& p, const DeviceLimits& l) {
  const ClusterConfig c = cluster_config(p);
  const int bytes = dtype_bytes(get_dtype(p, "dtype"));
  auto fail = [](std::string msg) { return make_error(ErrorCode::kOutOfRange, std::move(msg)); };
  if (c.threads < 64 || c.threads > std::min(1024, l.max_threads_per_block) || (c.threads & (c.threads - 1))) {
    return fail(fmt::format("threads {} is not a power of two in [64, 1024]", c.threads));
  }
  if (c.vec < 1 || (c.vec & (c.vec - 1)) || c.vec * bytes > 16) {
    return fail(fmt::format("vec {} x {} bytes is not a power-of-two access of at most 16 bytes", c.vec, bytes));
  }
  if (c.items < 1) return fail("items must be >= 1");
  // Portable cluster sizes only (a launch of more than 8 needs a non-portable opt-in per kernel).
  if (c.cluster < 2 || c.cluster > 8 || (c.cluster & (c.cluster - 1))) {
    return fail(fmt::format("cluster {} is not 2, 4 or 8", c.cluster));
  }
  // The kept slice (raw, in 32-bit registers) and ~40 for addresses, statistics and the conversion.
  const int64_t regs = c.items * c.vec * bytes / 4 + 40;
  const int64_t budget = std::min<int64_t>(l.max_regs_per_thread, l.regs_per_sm / c.threads);
  if (regs > budget) {
    return fail(fmt::format("~{} registers per thread exceed the {} a {}-thread block allows", regs, budget, c.threads));
  }
  return Status();
}

Status cluster_problem(const Params& p, const Shape& s) {
  const ClusterConfig c = cluster_config(p);
  if (s.n % c.vec) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("cols {} is not a multiple of vec {}", s.n, c.vec));
  }
  if (s.n > c.columns()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("cols {} exceed the {} a cluster keeps in registers", s.n, c.columns()));
  }
  // A cluster for a row that one block's registers could hold is all barrier and no gain.
  if (s.n * 2 <= c.threads * c.vec * c.items) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("cols {} fit in half of one block: no point splitting the row", s.n));
  }
  return Status();
}

Result<Launch> cluster_geometry(const Params& p, const Shape& s) {
  const ClusterConfig c = cluster_config(p);
  if (s.m * c.cluster > INT32_MAX) return make_error(ErrorCode::kInvalidArgument, "softmax_cluster: too many rows");
  Launch l;
  l.grid.x = static_cast<unsigned>(s.m * c.cluster);
  l.block.x = static_cast<unsigned>(c.threads);
  l.cluster.x = static_cast<unsigned>(c.cluster);
  l.align_elems = static_cast<unsigned>(c.vec);
  l.align_bytes = l.align_elems * dtype_bytes(get_dtype(p, "dtype"));
  return l;
}

}  // namespace

void add_softmax_templates(std::vector<TemplateDef>& out) {
  TemplateDef d = builtin_def("softmax", "softmax", "softmax(scale * x) over rows, fp32 arithmetic",
                              "softmax/softmax.cu", "kiln_softmax");
  d.params = row_params({dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16, DType::kF32}, "",
                                     "x and y dtype")});
  d.params.push_back(derived_param("row_threads", ParamKind::kInt, "threads per row"));
  d.derive = [](const Params& p) -> Result<Params> {
    int64_t rpb = get_int(p, "rows_per_block");
    return Params{{"row_threads", Value::integer(rpb > 0 ? get_int(p, "threads") / rpb : 0)}};
  };
  d.constraints = [](const Params& p, const DeviceLimits& l) { return row_constraints(p, l, 24); };
  d.problem_constraints = row_problem;
  d.geometry = row_geometry;
  out.push_back(std::move(d));

  TemplateDef c = builtin_def("softmax_cluster", "softmax",
                              "softmax over long rows, each split over a thread-block cluster reducing in distributed "
                              "shared memory (one read of x, sm_90+)",
                              "softmax/softmax_cluster.cu", "kiln_softmax_cluster");
  c.min_cc = 90;
  c.params = {dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16, DType::kF32}, "", "x and y dtype"),
              int_param("threads", ParamRole::kTunable, {256, 512, 1024}, "t", "threads per block"),
              int_param("vec", ParamRole::kTunable, {8, 4, 2, 1}, "v", "elements per vector access"),
              int_param("items", ParamRole::kTunable, {1, 2, 3, 4, 6, 8}, "i", "vectors kept per thread"),
              int_param("cluster", ParamRole::kTunable, {2, 4, 8}, "c", "blocks per row (the cluster)")};
  c.specialization_note = "rows and cols are run-time arguments; cols at most cluster * threads * vec * items";
  c.constraints = cluster_constraints;
  c.problem_constraints = cluster_problem;
  c.geometry = cluster_geometry;
  out.push_back(std::move(c));
}

}  // namespace kiln::templates::detail
