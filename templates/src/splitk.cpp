// The split-K reduction (templates/splitk/reduce.cu): fp32 partials -> epilogue -> output dtype.
#include <fmt/format.h>

#include "families.h"
#include "kiln/templates/epilogue.h"

namespace kiln::templates::detail {

void add_splitk_templates(std::vector<TemplateDef>& out) {
  TemplateDef d = builtin_def("splitk_reduce", "splitk_reduce",
                              "sums split-K fp32 partials, applies the epilogue, writes the output dtype",
                              "splitk/reduce.cu", "kiln_splitk_reduce");
  std::vector<Value> epilogues;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (Value& v : epilogue_samples(t)) epilogues.push_back(std::move(v));
  }
  d.params = {
      code_param("epilogue", ParamRole::kProblem, std::move(epilogues), "",
                 "render_epilogue() snippet; its output dtype is the output's"),
      int_param("threads", ParamRole::kTunable, {64, 128, 256, 512}, "t", "threads per block"),
      int_param("vec", ParamRole::kTunable, {1, 2, 4}, "v", "consecutive elements per thread per step"),
  };
  d.constraints = [](const Params& p, const DeviceLimits& l) -> Status {
    const int64_t threads = get_int(p, "threads"), vec = get_int(p, "vec");
    if (threads < 32 || threads % 32 || threads > l.max_threads_per_block) {
      return make_error(ErrorCode::kOutOfRange, fmt::format("threads {} is not a multiple of 32 in [32, {}]", threads,
                                                            l.max_threads_per_block));
    }
    if (vec != 1 && vec != 2 && vec != 4) return make_error(ErrorCode::kOutOfRange, fmt::format("vec {} is not 1, 2 or 4", vec));
    return Status();
  };
  d.geometry = [](const Params& p, const Shape& s) -> Result<Launch> {
    Launch l;
    const int64_t threads = get_int(p, "threads"), vec = get_int(p, "vec");
    // One vector per thread when the grid allows; the kernel loops (grid-stride) beyond 2^31-1 blocks.
    int64_t blocks = std::max<int64_t>(1, (s.m * s.n + threads * vec - 1) / (threads * vec));
    l.grid.x = static_cast<unsigned>(std::min<int64_t>(blocks, 0x7fffffff));
    if (s.m * s.n == 0) l.grid.x = 0;
    l.block.x = static_cast<unsigned>(threads);
    return l;  // alignment is checked by the kernel itself (it has a scalar path)
  };
  out.push_back(std::move(d));
}

}  // namespace kiln::templates::detail
