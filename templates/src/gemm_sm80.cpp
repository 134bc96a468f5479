// gemm_mma_sm80 (templates/gemm/mma_sm80.cu): mma.sync + cp.async GEMM for sm_80 and later.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gemm_family.h"
#include "kiln/templates/gemm.h"

namespace kiln::templates::detail {
namespace {

struct Sm80Config {
  int64_t bm, bn, bk, warps_m, warps_n, stages, align;
  int64_t threads() const { return 32 * warps_m * warps_n; }
  int64_t stage_bytes() const { return (bm * bk + bk * bn) * 2; }
  // Global loads per thread per stage; fully unrolled for align >= 4, each holding an address and a predicate.
  int64_t load_iters() const { return (bm * bk + bk * bn) / align / threads(); }
  int64_t smem_bytes() const { return stages * stage_bytes(); }
  // Accumulators, two buffers of A and B fragments, and ~40 for addresses, loop state and the epilogue.
  int64_t regs_estimate() const {
    const int64_t wm = bm / warps_m, wn = bn / warps_n;
    return wm * wn / 32 + 2 * ((wm / 16) * 4 + (wn / 8) * 2) + 40;
  }
};

Sm80Config config_of(const Params& p) {
  return {get_int(p, "bm"), get_int(p, "bn"),     get_int(p, "bk"),   get_int(p, "warps_m"),
          get_int(p, "warps_n"), get_int(p, "stages"), get_int(p, "align")};
}

// A configuration's NVRTC compile time (TemplateDef::compile_cost), log-linear like gemm_wgmma_sm90's: the tile
// each warp unrolls (bm x bn / warps; x1.28 per doubling), the pipeline's depth (x1.06 a stage), and an
// fp32-partials store without the epilogue (x0.76). Fitted to 64 sampled configurations compiled on the
// development machine (88-632 ms, two at a time): rank correlation 0.92-0.98 on held-out quarters.
double compile_seconds(const Params& p) {
  const Sm80Config c = config_of(p);
  const double warp_tile = static_cast<double>(c.bm * c.bn) / static_cast<double>(std::max<int64_t>(1, c.warps_m * c.warps_n));
  double ln_ms = 1.622 + 0.361 * std::log2(std::max(1.0, warp_tile)) + 0.055 * static_cast<double>(c.stages);
  if (get_bool(p, "partials")) ln_ms -= 0.277;
  return std::exp(ln_ms) / 1000.0;  // ln_ms: the natural log of milliseconds
}

Status constraints(const Params& p, const DeviceLimits& l) {
  const Sm80Config c = config_of(p);
  auto fail = [](ErrorCode code, std::string msg) { return make_error(code, std::move(msg)); };
  if (c.bm < 16 || c.bn < 16 || c.bk < 16 || c.warps_m < 1 || c.warps_n < 1 || c.stages < 2) {
    return fail(ErrorCode::kOutOfRange, "bm, bn, bk >= 16, warps >= 1 and stages >= 2");
  }
  if (c.bk % 16 || c.bm % (16 * c.warps_m) || c.bn % (16 * c.warps_n)) {
    return fail(ErrorCode::kInvalidArgument,
                fmt::format("bk {} must be a multiple of 16, bm {} of 16 x warps_m {}, bn {} of 16 x warps_n {}", c.bk,
                            c.bm, c.warps_m, c.bn, c.warps_n));
  }
  if (c.align != 1 && c.align != 2 && c.align != 4 && c.align != 8) {
    return fail(ErrorCode::kInvalidArgument, fmt::format("align {} is not 1, 2, 4 or 8", c.align));
  }
  if (c.threads() > l.max_threads_per_block || c.threads() > 512) {
    return fail(ErrorCode::kOutOfRange, fmt::format("{} threads: more than 16 warps", c.threads()));
  }
  if (c.smem_bytes() > l.smem_per_block_optin) {
    return fail(ErrorCode::kOutOfRange, fmt::format("{} bytes of shared memory > the device's {} per block",
                                                    c.smem_bytes(), l.smem_per_block_optin));
  }
  // Measured on an H200: configurations with more than 16 unrolled wide loads per thread per stage ran out of
  // registers (255) and spilled; narrow loads (align <= 2) are not unrolled.
  if (c.align >= 4 && c.load_iters() > 16) {
    return fail(ErrorCode::kOutOfRange, fmt::format("{} global loads per thread per stage > 16 (too few threads "
                                                    "for the tile: registers would spill)", c.load_iters()));
  }
  const int64_t regs = c.regs_estimate();
  if (regs > l.max_regs_per_thread || regs * c.threads() > l.regs_per_sm) {
    return fail(ErrorCode::kOutOfRange,
                fmt::format("~{} registers per thread x {} threads do not fit (warp tile {}x{})", regs, c.threads(),
                            c.bm / c.warps_m, c.bn / c.warps_n));
  }
  return Status();
}

Status problem_constraints(const Params& p, const Shape& s) {
  KILN_RETURN_IF_ERROR(gemm_problem_common(p, s));
  const int64_t align = get_int(p, "align");
  const int64_t lda = dense_lda(get_layout(p, "layout_a"), s), ldb = dense_ldb(get_layout(p, "layout_b"), s);
  if (lda % align || ldb % align) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("align {} does not divide lda {} and ldb {}", align, lda, ldb));
  }
  return Status();
}

Result<Launch> geometry(const Params& p, const Shape& s) {
  const Sm80Config c = config_of(p);
  Launch l;
  const int64_t tiles = ((s.m + c.bm - 1) / c.bm) * ((s.n + c.bn - 1) / c.bn);
  if (tiles > INT32_MAX) return make_error(ErrorCode::kInvalidArgument, "gemm: too many tiles");
  l.grid.x = static_cast<unsigned>(tiles);
  l.grid.z = static_cast<unsigned>(get_bool(p, "partials") ? s.splits : 1);
  if (s.m == 0 || s.n == 0) l.grid.x = 0;
  l.block.x = static_cast<unsigned>(c.threads());
  l.shared_bytes = static_cast<unsigned>(c.smem_bytes());
  return l;
}

std::string config_name(const Params& p) {
  const Sm80Config c = config_of(p);
  return fmt::format("gemm_mma_{}x{}x{}_w{}x{}_s{}_g{}_a{}_{}", c.bm, c.bn, c.bk, c.warps_m, c.warps_n, c.stages,
                     get_int(p, "group_m"), c.align, gemm_problem_suffix(p));
}

}  // namespace

TemplateDef gemm_mma_sm80_def() {
  TemplateDef d = builtin_def("gemm_mma_sm80", "gemm",
                              "tensor-core GEMM: mma.sync m16n8k16 with a cp.async multi-stage pipeline (sm_80+)",
                              "gemm/mma_sm80.cu", "kiln_gemm_mma_sm80", {"gemm/gemm_common.cuh"});
  d.min_cc = 80;
  // Measured on an H200 (issue 15): 3-12x slower than the wgmma family on every problem.
  d.superseded_by = "gemm_wgmma_sm90";
  d.params = gemm_problem_specs();
  d.params.push_back(int_param("align", ParamRole::kProblem, {8, 1}, "a",
                               "elements per global load of A and B: divides lda and ldb (gemm_alignment)"));
  d.params.push_back(int_param("bm", ParamRole::kTunable, {16, 32, 64, 128, 256}, "", "block tile rows (M)"));
  d.params.push_back(int_param("bn", ParamRole::kTunable, {32, 64, 128, 256}, "", "block tile columns (N)"));
  d.params.push_back(int_param("bk", ParamRole::kTunable, {32, 64}, "", "K step per pipeline stage"));
  d.params.push_back(int_param("warps_m", ParamRole::kTunable, {1, 2, 4}, "", "warps along M"));
  d.params.push_back(int_param("warps_n", ParamRole::kTunable, {1, 2, 4}, "", "warps along N"));
  d.params.push_back(int_param("stages", ParamRole::kTunable, {2, 3, 4}, "s", "cp.async pipeline depth"));
  d.params.push_back(int_param("group_m", ParamRole::kTunable, {1, 8}, "g",
                               "block rasterisation: tile rows walked before the next tile column (L2 reuse)"));
  d.specialization_note = "M, N, K, leading dimensions and split-K slices are run-time arguments";
  d.constraints = constraints;
  d.problem_constraints = problem_constraints;
  d.geometry = geometry;
  d.config_name = config_name;
  d.compile_cost = compile_seconds;
  return d;
}

}  // namespace kiln::templates::detail
