// What the two GEMM families share: problem parameters, alignment, configuration naming, and the launch
// entry point (see kiln/templates/gemm.h).
#include "gemm_family.h"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/templates/gemm.h"

namespace kiln::templates {

Params gemm_problem_params(DType in, Layout a, Layout b, const EpilogueSpec& epilogue, bool partials) {
  Params p;
  p.emplace("dtype", Value::dtype(in));
  p.emplace("layout_a", Value::layout(a));
  p.emplace("layout_b", Value::layout(b));
  p.emplace("epilogue", epilogue_value(epilogue));
  p.emplace("partials", Value::boolean(partials));
  return p;
}

int64_t stream_k_pieces(int64_t tiles, int64_t blocks, int64_t k) {
  if (tiles <= 0 || blocks <= 0) return 1;
  const int64_t rest = tiles % blocks;
  return rest == 0 ? 1 : std::max<int64_t>(1, std::min<int64_t>(blocks / rest, (k + 63) / 64 / 4));
}

std::vector<int64_t> wave_fit_widths(int64_t m, int64_t n, int64_t sms, int64_t max_waves) {
  std::vector<int64_t> out;
  if (m <= 0 || n <= 0 || sms <= 0) return out;
  const int64_t rows = (m + 127) / 128;
  for (int64_t waves = 1; waves <= max_waves; ++waves) {
    const int64_t cols = waves * sms / rows;
    if (cols < 1) continue;
    const int64_t bn = ((n + cols - 1) / cols + 7) / 8 * 8;
    if (bn < 64 || bn > 256 || bn % 64 == 0) continue;
    if (std::find(out.begin(), out.end(), bn) == out.end()) out.push_back(bn);
  }
  return out;
}

int gemm_alignment(int64_t lda, int64_t ldb) {
  for (int align : {8, 4, 2}) {
    if (lda % align == 0 && ldb % align == 0) return align;
  }
  return 1;
}

int64_t dense_lda(Layout a, const Shape& s) { return a == Layout::kRowMajor ? s.k : s.m; }
int64_t dense_ldb(Layout b, const Shape& s) { return b == Layout::kRowMajor ? s.n : s.k; }

GemmArgs dense_gemm_args(const Shape& s, Layout a, Layout b) {
  GemmArgs g{};
  g.m = static_cast<int>(s.m);
  g.n = static_cast<int>(s.n);
  g.k = static_cast<int>(s.k);
  g.split_k = 1;
  g.k_per_split = g.k;
  g.lda = dense_lda(a, s);
  g.ldb = dense_ldb(b, s);
  g.ldd = s.n;
  g.ep = default_epilogue_args();
  return g;
}

bool gemm_needs_tma(const Params& params) { return params.contains("consumers"); }

bool gemm_takes_flags(const Params& params) {
  auto it = params.find("stream_k");
  return gemm_needs_tma(params) && it != params.end() && it->second.kind() == ParamKind::kBool && it->second.as_bool();
}

Status launch_gemm(const Kernel& kernel, const Params& params, const Launch& geometry, const GemmArgs& args,
                   CUstream stream, CUdeviceptr lowered_flags) {
  if (gemm_needs_tma(params)) return detail::launch_gemm_tma(kernel, params, geometry, args, stream, lowered_flags);
  return launch(kernel, geometry, args, stream);
}

namespace detail {

std::vector<Value> gemm_epilogue_values() {
  // One sample epilogue keeps the grid (every tunable x every problem value) small enough to enumerate;
  // a problem's own epilogue is any EpilogueSpec (the GPU tests run each op and output dtype).
  return {epilogue_samples(DType::kBF16)[1]};  // bias_gelu_bf16
}

std::vector<ParamSpec> gemm_problem_specs() {
  return {
      dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16}, "", "A and B element type"),
      layout_param("layout_a", ParamRole::kProblem, "a", "A row-major (K contiguous) or col-major (M contiguous)"),
      layout_param("layout_b", ParamRole::kProblem, "b", "B row-major (N contiguous) or col-major (K contiguous)"),
      code_param("epilogue", ParamRole::kProblem, gemm_epilogue_values(), "",
                 "render_epilogue() snippet applied to each accumulator; its dtype is D's"),
      bool_param("partials", ParamRole::kProblem, "partials",
                 "split-K: write fp32 partials of K slice blockIdx.z to the workspace, no epilogue"),
  };
}

Status gemm_problem_common(const Params& p, const Shape& s) {
  if (s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX) {
    return make_error(ErrorCode::kInvalidArgument, "gemm: sizes must be < 2^31");
  }
  if (!get_bool(p, "partials") && s.splits != 1) {
    return make_error(ErrorCode::kInvalidArgument, "gemm: splits > 1 needs partials=true");
  }
  return Status();
}

std::string gemm_problem_suffix(const Params& p) {
  const Value& ep = p.find("epilogue")->second;
  return fmt::format("{}_{}{}_{}{}", dtype_name(get_dtype(p, "dtype")),
                     get_layout(p, "layout_a") == Layout::kRowMajor ? 'r' : 'c',
                     get_layout(p, "layout_b") == Layout::kRowMajor ? 'r' : 'c', ep.code_tag(),
                     get_bool(p, "partials") ? "_partials" : "");
}

void add_gemm_templates(std::vector<TemplateDef>& out) {
  out.push_back(gemm_mma_sm80_def());
  out.push_back(gemm_wgmma_sm90_def());
}

}  // namespace detail
}  // namespace kiln::templates
