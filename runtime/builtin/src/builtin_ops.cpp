// The built-in ops: gemm (template configurations of every GEMM family, split-K and unfused subgraphs,
// cuBLAS and cuBLASLt), rmsnorm, layernorm and softmax (template configurations and a plain reference).
#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "builtin_ops.h"
#include "kiln/runtime/extern_choices.h"
#include "kiln/runtime/helper_kernels.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/registry.h"

namespace kiln::runtime::detail {
namespace {

using templates::Params;
using templates::TemplatePtr;
using templates::Value;

// The (target, limits) a template compiles for in this context, or nothing when it cannot run here.
std::optional<std::pair<Target, templates::DeviceLimits>> target_for(const templates::Template& t, const ChoiceContext& ctx) {
  const bool specific = t.def().needs_arch_specific;
  const Target& target = specific ? ctx.arch_target : ctx.target;
  if (!t.supports(target).ok()) return std::nullopt;
  return std::make_pair(target, specific ? ctx.arch_limits : ctx.limits);
}

// Whether the context names `t` (or "all") among the superseded families to try anyway.
bool asked_for(const templates::Template& t, const ChoiceContext& ctx) {
  return std::find(ctx.families.begin(), ctx.families.end(), t.name()) != ctx.families.end() ||
         std::find(ctx.families.begin(), ctx.families.end(), "all") != ctx.families.end();
}

// Configurations that won on the H200 in the GEMM sweep (bench/results/gemm-nvidia-h200-2026-11-21.md): the
// 4096^3 winners of each family and the decode winners (small M). They are tried first, before the
// deterministic sample, so a small sample cannot miss them; a seed the device or problem rules out is skipped.
std::vector<Params> seed_configurations(const std::string& tmpl, const templates::Shape& shape, int64_t sms,
                                       bool b_constant) {
  auto ints = [](std::initializer_list<std::pair<const char*, int64_t>> kv) {
    Params p;
    for (const auto& [k, v] : kv) p.emplace(k, Value::integer(v));
    return p;
  };
  std::vector<Params> out;
  if (tmpl == "gemm_wgmma_sm90") {
    auto w = [&](int64_t bm, int64_t bn, int64_t consumers, int64_t stages, int64_t group, bool persistent,
                 int64_t cluster_k, int64_t blocks, bool swap_ab = false) {
      Params p = ints({{"bm", bm}, {"bn", bn}, {"consumers", consumers}, {"stages", stages}, {"group_m", group},
                       {"cluster_k", cluster_k}, {"blocks_per_sm", blocks}});
      p.emplace("persistent", Value::boolean(persistent));
      p.emplace("swap_ab", Value::boolean(swap_ab));
      return p;
    };
    // A persistent swap-AB stream-K tile (optionally the free-running form).
    auto stream_k = [&](int64_t bn, int64_t stages, bool even) {
      Params p = w(64, bn, 1, stages, 1, true, 1, 1, true);
      p.emplace("stream_k", Value::boolean(true));
      p.emplace("sk_even", Value::boolean(even));
      return p;
    };
    // The deepest ring (up to 16 stages) of a 64 x bn tile that fits sm_90's 227 KiB.
    auto deepest = [](int64_t bn) { return std::min<int64_t>(16, (232448 - 2048) / ((64 + bn) * 128 + 16)); };
    out.push_back(w(128, 256, 2, 4, 16, true, 1, 1));  // 4096^3: 0.90-0.92 of cuBLAS
    // The staged epilogue (epi=smem), measured on an H200 beside the direct one
    // (bench/results/gemm-suite-epi-nvidia-h200-2026-11-26-f0e03a8.md): 4096^3 191 -> 177 us (0.96x of cuBLAS);
    // 128x128 at M = 1000, N = 6144: 80 -> 69 us.
    Params staged = w(128, 256, 2, 4, 16, true, 1, 1);
    staged.emplace("epi", Value::enumeration("smem"));
    out.push_back(staged);
    staged = w(128, 128, 2, 6, 8, true, 1, 1);
    staged.emplace("epi", Value::enumeration("smem"));
    out.push_back(staged);
    out.push_back(w(64, 64, 1, 8, 1, false, 2, 1));     // decode, cluster split-K
    out.push_back(w(64, 64, 1, 6, 1, false, 1, 2));     // decode, two blocks per SM
    // Decode with swap-AB: N on wgmma's M side, M padded only to the tile's bn (a multiple of 8), K split over a
    // cluster when the tiles are few; not yet measured (bench_gemm_suite decides which to keep here).
    if (shape.m <= 256) {
      const int64_t bn = std::max<int64_t>(8, (shape.m + 7) / 8 * 8);
      const int64_t consumers = bn > 128 ? 2 : 1;
      for (int64_t ck : {1, 2, 4}) out.push_back(w(128, bn, consumers, 8, 1, false, ck, 1, true));
      out.push_back(w(64, bn, 1, 8, 1, false, 2, 1, true));
      // Memory-bound decode: the deepest ring (up to 16 stages) that fits sm_90's 227 KiB, alone and split over a
      // cluster of two; it won 11 of the suite's 69 shapes with M <= 128 on an H200 (28 Nov, against the same tile
      // with 8 stages: 77x4608x3584 11.8 vs 12.7 us, 64x4096x4096 12.1 vs 13.2).
      for (int64_t ck : {1, 2}) out.push_back(w(64, bn, 1, deepest(bn), 1, false, ck, 1, true));
      if (shape.m <= 32) {
        // Two blocks per SM on the deepest ring that fits both, letting the next kernel launch after the last load
        // (trigger 2: its blocks run their prologue beside this one's tail), whole or split over a cluster of two. The
        // suite's M <= 32 shapes at >= 1.05x of cuBLAS on an H200, best of each candidate set in the same sweep (30 Nov,
        // bench/results/gemm-early-weights-nvidia-h200-2026-11-30.md): 30-31 before, 33 with these, 34-35 with the
        // same tiles without the trigger as well (left out here: four more compiles per M for one or two shapes).
        // Early weights only under the caller's promise that B is constant (GemmProblem::b_constant, below).
        // Split four ways too when the tiles are so few that a split of two leaves most SMs idle and K has 16 steps for each block,
        // as the suite's cluster_for() picks: 1x1536x7168 and 1x1280x8192 on an H200 (30 Nov, 0855a78) went to
        // cuBLASLt at 1.04-1.06x of the exhaustive effort's four-way two-per-SM split, which the sample lacked.
        const int64_t two = std::min<int64_t>(16, (232448 / 2 - 2048) / ((64 + bn) * 128 + 16));
        const int64_t tiles = (shape.n + 63) / 64;
        const bool few = tiles * 2 < sms * 3 / 4 && (shape.k + 63) / 64 >= 16;
        for (int64_t ck : {int64_t{1}, int64_t{2}, few ? int64_t{4} : int64_t{0}}) {
          if (ck == 0) continue;
          Params b2 = w(64, bn, 1, two, 1, false, ck, 2, true);
          b2.emplace("trigger", Value::integer(2));
          out.push_back(b2);
          if (b_constant) {
            // With the caller's promise that B is constant: the weights of the first half of the ring requested
            // before the wait, and (whole) of all of it with the next kernel let launch at the start. The suite's
            // M <= 32 winners on an H200 (30 Nov, 677c1ad): ten of the first, five of the second, of 32 at >= 1.05x.
            Params early = b2;
            early.insert_or_assign("early", Value::integer(two / 2));
            out.push_back(early);
            if (ck == 1) {
              early.insert_or_assign("early", Value::integer(two));
              early.insert_or_assign("trigger", Value::integer(1));
              out.push_back(early);
            }
          }
        }
      }
      // Stream-K over every SM, both forms, for tile counts that leave the last wave partial: with the flags kept
      // lowered (no memset per launch) the suite's best at N >= 28672 and on some narrower shapes on an H200 (28 Nov,
      // bench/results/gemm-suite-nvidia-h200-2026-11-28-a0971ff.md: 32x28672x4096, 1x37888x3584, 3x28672x4096 sk_even).
      for (bool even : {false, true}) out.push_back(stream_k(bn, 8, even));
    } else if (shape.m <= 512) {
      // Swap-AB past decode: M in two column tiles of round_up(M / 2, 8), so M = 333 computes 336 rows where
      // 128-row tiles compute 384 (bench/results/gemm-issue15-nvidia-h200-2026-11-27.md: 333x4096x4096 0.88 ->
      // 0.99 of cuBLAS, 333x4096x14336 0.88 -> 1.01). The deeper pipeline where it fits, else five stages.
      const int64_t bn = (shape.m / 2 + shape.m % 2 + 7) / 8 * 8;
      for (int64_t stages : {7, 5}) out.push_back(w(64, bn, 1, stages, 8, true, 1, 1, true));
    }
    if (shape.m > 128 && shape.m <= 512 && (shape.n + 63) / 64 * 2 < 132) {
      // Small N past decode: M in four narrow column tiles on the deepest ring, stream-K over every SM (333x576x7168
      // on an H200: 0.76 -> 0.91 of cuBLAS, whose own kernels there are 64 x 48-112 tiles with deep rings and
      // split-K; bench/results/gemm-suite-nvidia-h200-2026-11-28-8d26001.md).
      const int64_t narrow = ((shape.m + 3) / 4 + 7) / 8 * 8;
      out.push_back(stream_k(narrow, deepest(narrow), false));
    }
    if (shape.m >= 128) {
      // Tiles as wide as make whole waves: 128 rows by the N width that puts waves x SMs tiles on the device
      // (2048x7392x8192 on an H200: 128x224 in exactly 4 waves, 331 us against 346 for the best 64-multiple width;
      // 512x14336x8192: 162 against 171; bench/results/gemm-suite-wavefit-nvidia-h200-2026-11-29.md). The sampled
      // grid has only multiples of 64 from 128 up; the model's wave count ranks these.
      for (int64_t bn : templates::wave_fit_widths(shape.m, shape.n, sms)) {
        const int64_t stages = std::min<int64_t>(8, (232448 - 2048) / ((128 + bn) * 128));
        for (bool persistent : {true, false}) out.push_back(w(128, bn, 2, stages, 8, persistent, 1, 1));
      }
    }
  } else if (tmpl == "gemm_mma_sm80") {
    out.push_back(ints({{"bm", 128}, {"bn", 128}, {"bk", 32}, {"warps_m", 2}, {"warps_n", 2}, {"stages", 4}, {"group_m", 8}}));
    out.push_back(ints({{"bm", 16}, {"bn", 64}, {"bk", 64}, {"warps_m", 1}, {"warps_n", 4}, {"stages", 6}, {"group_m", 1}}));
  }
  return out;
}

// Up to `n` configurations of `t` with `fixed` problem parameters that fit the device and the problem's sizes,
// rendered, seeds first. Deterministic.
std::vector<std::pair<templates::Rendered, Target>> configurations(const TemplatePtr& t, const Params& fixed,
                                                                   const templates::Shape& shape,
                                                                   const ChoiceContext& ctx, size_t n,
                                                                   bool b_constant = false) {
  std::vector<std::pair<templates::Rendered, Target>> out;
  auto where = target_for(*t, ctx);
  if (!where) return out;
  if (templates::superseded_on(*t, ctx.arch_target) != nullptr && !asked_for(*t, ctx)) return out;
  Params given;
  for (const auto& [k, v] : fixed) {
    if (t->param(k) != nullptr) given.emplace(k, v);
  }
  auto grid = templates::Grid::create(t, given);
  if (!grid.ok()) return out;
  std::vector<Params> candidates;
  for (Params seed : seed_configurations(t->name(), shape, std::max(ctx.device.sm_count, ctx.limits.sm_count),
                                         b_constant)) {
    for (const auto& [k, v] : given) seed.insert_or_assign(k, v);
    candidates.push_back(std::move(seed));
  }
  for (Params& p : templates::sample(*grid, where->second, n)) candidates.push_back(std::move(p));
  std::set<std::string> names;
  for (const Params& p : candidates) {
    if (!t->check(p, where->second).ok() || !t->check_problem(p, shape).ok()) continue;
    auto r = t->render(p);
    if (r.ok() && names.insert(r->config_name).second) out.emplace_back(std::move(r).value(), where->first);
  }
  return out;
}

Result<std::vector<ChoicePtr>> gemm_choices(const Problem& problem, const ChoiceContext& ctx) {
  const auto& p = std::get<GemmProblem>(problem.desc);
  const templates::Shape shape = problem.shape();
  std::vector<ChoicePtr> out;
  const bool has_epilogue = !p.epilogue.ops.empty();

  if (p.a == p.b) {
    Params fixed = templates::gemm_problem_params(p.a, p.a_layout, p.b_layout, p.epilogue);
    fixed.insert_or_assign("align", Value::integer(templates::gemm_alignment(templates::dense_lda(p.a_layout, shape),
                                                                             templates::dense_ldb(p.b_layout, shape))));
    KILN_ASSIGN_OR_RETURN(TemplatePtr reduce, templates::find_template("splitk_reduce"));
    Params reduce_params{{"threads", Value::integer(256)}, {"vec", Value::integer(4)}};
    for (const TemplatePtr& t : templates::templates_for("gemm")) {
      auto configs = configurations(t, fixed, shape, ctx, static_cast<size_t>(ctx.max_template_configs), p.b_constant);
      for (auto& [r, target] : configs) out.push_back(make_template_choice(t, r, target, shape));

      // Split-K helps when the output has too few tiles to fill the device and K is long; with one slice the
      // same subgraph is the unfused pair (plain GEMM to fp32, then the epilogue kernel).
      std::vector<int> slice_counts;
      if (has_epilogue) slice_counts.push_back(1);
      const int64_t sms = std::max(ctx.device.sm_count, ctx.limits.sm_count);
      if (ctx.split_k && p.k >= 1024 && (p.m / 64 + 1) * (p.n / 128 + 1) < sms) {
        for (int s : {2, 4, 8}) {
          if (p.k / s >= 256) slice_counts.push_back(s);
        }
      }
      if (slice_counts.empty()) continue;
      // Small-M tiles suit these shapes: the two configurations with the fewest rows per block.
      std::vector<std::pair<templates::Rendered, Target>> small = configs;
      std::stable_sort(small.begin(), small.end(), [](const auto& a, const auto& b) {
        return templates::get_int(a.first.params, "bm") < templates::get_int(b.first.params, "bm");
      });
      small.resize(std::min<size_t>(small.size(), 2));
      for (const auto& [r, target] : small) {
        // The partials variant of the configuration must itself be valid (cluster split-K, for one, is not).
        templates::Params partials = r.params;
        partials.insert_or_assign("partials", Value::boolean(true));
        auto limits = target_for(*t, ctx);
        if (!limits || !t->check(partials, limits->second).ok()) continue;
        for (int s : slice_counts) {
          auto graph = templates::make_splitk_gemm(t, r.params, reduce_params, p.epilogue, shape, s);
          if (graph.ok()) out.push_back(make_subgraph_choice(std::move(graph).value(), target, shape));
        }
      }
    }
  }

  if (!ctx.has_device) return out;  // externs need a device to enumerate (kiln precompile has none)
  if (!has_epilogue) {
    out.push_back(make_cublas_default_choice(p));
  } else {
    KILN_ASSIGN_OR_RETURN(ChoicePtr reference, make_unfused_choice(p, make_cublas_default_choice_f32(p), ctx.target));
    out.push_back(std::move(reference));
  }
  // cuBLASLt: its algorithms with the epilogue fused when it can express it; plain ones otherwise (alone for a
  // plain GEMM, or paired with the epilogue kernel).
  if (!has_epilogue || cublaslt_can_fuse(p)) {
    if (auto algos = cublaslt_algorithms(p, true, p.epilogue.out, ctx.max_cublas_algos); algos.ok()) {
      for (const auto& a : *algos) out.push_back(make_cublaslt_choice(p, true, p.epilogue.out, a));
    } else if (ctx.has_device) {
      // The tune goes on without them, but not unnoticed: cuBLASLt's algorithms are often the ones to beat (a
      // thread with no current context got none on 2 Dec, and the suite's tunes lost them silently).
      static std::once_flag once;
      std::call_once(once, [&] {
        spdlog::warn("kiln: cuBLASLt's algorithms are left out of the GEMM choices: {}", algos.status().to_string());
      });
    }
  }
  if (has_epilogue) {
    if (auto algos = cublaslt_algorithms(p, false, DType::kF32, 2); algos.ok()) {
      for (const auto& a : *algos) {
        auto pair = make_unfused_choice(p, make_cublaslt_choice(p, false, DType::kF32, a), ctx.target);
        if (pair.ok()) out.push_back(std::move(pair).value());
      }
    }
  }
  return out;
}

std::string gemm_reference(const Problem& problem) {
  const auto& p = std::get<GemmProblem>(problem.desc);
  if (p.epilogue.ops.empty()) return "cublas_default";
  auto unfused = make_unfused_choice(p, make_cublas_default_choice_f32(p), Target{"sm_90"});
  return unfused.ok() ? (*unfused)->name() : "cublas_default";
}

// ---- buffers

struct Allocator {
  std::vector<DeviceBuffer>* storage;
  uint32_t seed;
  Result<CUdeviceptr> random(int64_t count, DType t, float lo, float hi) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(static_cast<size_t>(count) * templates::dtype_bytes(t)));
    KILN_RETURN_IF_ERROR(fill_uniform(b.ptr(), count, t, seed++, lo, hi, nullptr));
    CUdeviceptr p = b.ptr();
    storage->push_back(std::move(b));
    return p;
  }
  Result<CUdeviceptr> output(int64_t count, DType t) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(static_cast<size_t>(count) * templates::dtype_bytes(t)));
    KILN_RETURN_IF_ERROR(b.fill_bytes(0xff));
    CUdeviceptr p = b.ptr();
    storage->push_back(std::move(b));
    return p;
  }
};

template <class T>
T* ptr(CUdeviceptr p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

Result<OpBuffers> gemm_buffers(const Problem& problem, uint32_t seed) {
  const auto& p = std::get<GemmProblem>(problem.desc);
  OpBuffers out;
  Allocator alloc{&out.storage, seed};
  KilnGemmArgs a = templates::dense_gemm_args(problem.shape(), p.a_layout, p.b_layout);
  KILN_ASSIGN_OR_RETURN(CUdeviceptr A, alloc.random(p.m * p.k, p.a, -1, 1));
  KILN_ASSIGN_OR_RETURN(CUdeviceptr B, alloc.random(p.k * p.n, p.b, -1, 1));
  KILN_ASSIGN_OR_RETURN(CUdeviceptr D, alloc.output(p.m * p.n, p.epilogue.out));
  a.a = ptr<const void>(A);
  a.b = ptr<const void>(B);
  a.d = ptr<void>(D);
  a.ep.alpha = 0.5f;
  a.ep.beta = 1.0f;
  a.ep.ld_residual = p.n;
  if (p.b_constant) a.flags |= KILN_GEMM_B_CONSTANT;  // the benchmark never writes B
  if (p.epilogue.has(templates::EpilogueOp::kBias)) {
    KILN_ASSIGN_OR_RETURN(CUdeviceptr bias, alloc.random(p.n, p.epilogue.bias_dtype, -1, 1));
    a.ep.bias = ptr<const void>(bias);
  }
  if (p.epilogue.has(templates::EpilogueOp::kResidual)) {
    KILN_ASSIGN_OR_RETURN(CUdeviceptr res, alloc.random(p.m * p.n, p.epilogue.residual_dtype, -1, 1));
    a.ep.residual = ptr<const void>(res);
  }
  out.args = a;
  out.outputs.push_back({D, p.epilogue.out, p.m, p.n, p.n, "d"});
  return out;
}

// The buffers every row op has: x (random in [lo, hi]) and the output y, rows x cols, dense. `more(p, a,
// alloc, out)` sets the op's other arguments and makes its other buffers, drawing on the same seed sequence.
template <class Args, class RowProblem, class More>
Result<OpBuffers> row_buffers(const Problem& problem, uint32_t seed, float lo, float hi, More more) {
  const auto& p = std::get<RowProblem>(problem.desc);
  Args a{};
  a.rows = static_cast<int>(p.rows);
  a.cols = static_cast<int>(p.cols);
  a.ld_x = a.ld_y = p.cols;
  OpBuffers out;
  Allocator alloc{&out.storage, seed};
  KILN_ASSIGN_OR_RETURN(CUdeviceptr x, alloc.random(p.rows * p.cols, p.dtype, lo, hi));
  KILN_ASSIGN_OR_RETURN(CUdeviceptr y, alloc.output(p.rows * p.cols, p.dtype));
  a.x = ptr<const void>(x);
  a.y = ptr<void>(y);
  out.outputs.push_back({y, p.dtype, p.rows, p.cols, p.cols, "y"});
  KILN_RETURN_IF_ERROR(more(p, a, alloc, out));
  out.args = a;
  return out;
}

Result<OpBuffers> norm_buffers(const Problem& problem, uint32_t seed) {
  auto more = [](const NormProblem& p, KilnNormArgs& a, Allocator& alloc, OpBuffers& out) -> Status {
    a.ld_residual = a.ld_residual_out = p.cols;
    a.eps = p.eps;
    KILN_ASSIGN_OR_RETURN(CUdeviceptr w, alloc.random(p.cols, p.dtype, 0.5f, 1.5f));
    a.weight = ptr<const void>(w);
    if (p.residual) {
      KILN_ASSIGN_OR_RETURN(CUdeviceptr r, alloc.random(p.rows * p.cols, p.dtype, -2, 2));
      KILN_ASSIGN_OR_RETURN(CUdeviceptr ro, alloc.output(p.rows * p.cols, p.dtype));
      a.residual = ptr<const void>(r);
      a.residual_out = ptr<void>(ro);
      out.outputs.push_back({ro, p.dtype, p.rows, p.cols, p.cols, "residual_out"});
    }
    if (p.bias) {
      KILN_ASSIGN_OR_RETURN(CUdeviceptr b, alloc.random(p.cols, p.dtype, -0.5f, 0.5f));
      a.bias = ptr<const void>(b);
    }
    return Status();
  };
  return row_buffers<KilnNormArgs, NormProblem>(problem, seed, -2, 2, more);
}

Result<OpBuffers> softmax_buffers(const Problem& problem, uint32_t seed) {
  return row_buffers<KilnSoftmaxArgs, SoftmaxProblem>(
      problem, seed, -4, 4, [](const SoftmaxProblem& p, KilnSoftmaxArgs& a, Allocator&, OpBuffers&) {
        a.scale = p.scale;
        return Status();
      });
}

// ---- memory-bound ops

// The plain reference implementation of a norm or softmax problem (one block per row, statistics in double).
class ReferenceRowChoice final : public Choice {
 public:
  explicit ReferenceRowChoice(Problem p) : problem_(std::move(p)) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kExtern; }
  Status prepare(const Binaries&) override { return helper_kernels().status(); }
  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    KILN_ASSIGN_OR_RETURN(const HelperKernels* h, helper_kernels());
    LaunchConfig cfg;
    cfg.block = {256};
    cfg.stream = stream;
    if (const auto* n = std::get_if<KilnNormArgs>(&args)) {
      const auto& p = std::get<NormProblem>(problem_.desc);
      cfg.grid = {static_cast<unsigned>(n->rows)};
      int dt = static_cast<int>(p.dtype), mode = p.layernorm ? 1 : 0, res = p.residual, bias = p.bias;
      return h->reference_norm(cfg, *n, dt, mode, res, bias);
    }
    if (const auto* s = std::get_if<KilnSoftmaxArgs>(&args)) {
      const auto& p = std::get<SoftmaxProblem>(problem_.desc);
      cfg.grid = {static_cast<unsigned>(s->rows)};
      int dt = static_cast<int>(p.dtype);
      return h->reference_softmax(cfg, *s, dt);
    }
    return make_error(ErrorCode::kInvalidArgument, "the reference runs norm and softmax arguments only");
  }

 private:
  Problem problem_;
  std::string name_ = "reference";
};

Result<std::vector<ChoicePtr>> row_choices(const Problem& problem, const ChoiceContext& ctx) {
  std::vector<ChoicePtr> out;
  Params fixed;
  if (const auto* n = std::get_if<NormProblem>(&problem.desc)) {
    fixed = {{"dtype", Value::dtype(n->dtype)}, {"residual", Value::boolean(n->residual)}};
    if (n->layernorm) fixed.emplace("has_bias", Value::boolean(n->bias));
  } else {
    fixed = {{"dtype", Value::dtype(std::get<SoftmaxProblem>(problem.desc).dtype)}};
  }
  const templates::Shape shape = problem.shape();
  // Four times a GEMM template's sample: a norm or softmax grid is small (~256 configurations, each compiling in
  // tens of milliseconds), so at default effort (64) the model ranks the whole of it. With 64, the H200 suite of
  // 26 Nov never generated the exhaustive winner of 5 of its 9 row problems (2-11% faster than what was chosen).
  const size_t sample = 4 * static_cast<size_t>(std::max(ctx.max_template_configs, 0));
  for (const TemplatePtr& t : templates::templates_for(problem.op)) {
    for (auto& [r, target] : configurations(t, fixed, shape, ctx, sample)) {
      out.push_back(make_template_choice(t, r, target, shape));
    }
  }
  if (ctx.has_device) out.push_back(std::make_shared<ReferenceRowChoice>(problem));
  return out;
}

double tolerance(DType t) { return t == DType::kF32 ? 1e-3 : 1e-2; }

// The parameters of `t` from the short texts a decision stored under `prefix` (code parameters are the
// problem's epilogue, which decisions do not store). kNotFound when one is missing.
Result<Params> stored_params(const templates::Template& t, const std::map<std::string, std::string>& by_name,
                             const std::string& prefix, const Problem& problem) {
  Params params;
  for (const auto& spec : t.params()) {
    if (spec.role == templates::ParamRole::kDerived) continue;
    if (spec.kind == templates::ParamKind::kCode) {
      const auto* g = std::get_if<GemmProblem>(&problem.desc);
      if (!g) return make_error(ErrorCode::kNotFound, "a code parameter outside a GEMM");
      params.emplace(spec.name, templates::epilogue_value(g->epilogue));
      continue;
    }
    auto v = by_name.find(prefix + spec.name);
    if (v == by_name.end()) return make_error(ErrorCode::kNotFound, fmt::format("the decision lacks '{}{}'", prefix, spec.name));
    const std::string& text = v->second;
    switch (spec.kind) {
      case templates::ParamKind::kInt: params.emplace(spec.name, Value::integer(std::stoll(text))); break;
      case templates::ParamKind::kBool: params.emplace(spec.name, Value::boolean(text == "true")); break;
      case templates::ParamKind::kDType: {
        KILN_ASSIGN_OR_RETURN(DType d, templates::parse_dtype(text));
        params.emplace(spec.name, Value::dtype(d));
        break;
      }
      case templates::ParamKind::kLayout:
        params.emplace(spec.name, Value::layout(text == "col" ? Layout::kColMajor : Layout::kRowMajor));
        break;
      case templates::ParamKind::kEnum: params.emplace(spec.name, Value::enumeration(text)); break;
      case templates::ParamKind::kCode: break;
    }
  }
  return params;
}

// A template configuration from the parameters a decision stored.
Result<ChoicePtr> rebuild_template(const Problem& problem, const std::string& name,
                                   const std::vector<std::pair<std::string, std::string>>& stored,
                                   const ChoiceContext& ctx) {
  std::map<std::string, std::string> by_name(stored.begin(), stored.end());
  auto it = by_name.find("template");
  if (it == by_name.end()) return make_error(ErrorCode::kNotFound, "no template named in the decision");
  KILN_ASSIGN_OR_RETURN(TemplatePtr t, templates::find_template(it->second));
  auto where = target_for(*t, ctx);
  if (!where) return make_error(ErrorCode::kNotFound, fmt::format("{} cannot run here", t->name()));
  KILN_ASSIGN_OR_RETURN(Params params, stored_params(*t, by_name, "", problem));
  KILN_ASSIGN_OR_RETURN(templates::Rendered r, t->render(params));
  if (r.config_name != name) {
    return make_error(ErrorCode::kNotFound, fmt::format("the decision's parameters render '{}', not '{}'", r.config_name, name));
  }
  return make_template_choice(t, std::move(r), where->first, problem.shape());
}

// A split-K subgraph (partial GEMM + reduction) from the parameters a decision stored.
Result<ChoicePtr> rebuild_splitk(const Problem& problem, const std::string& name,
                                 const std::vector<std::pair<std::string, std::string>>& stored, const ChoiceContext& ctx) {
  const auto& p = std::get<GemmProblem>(problem.desc);
  std::map<std::string, std::string> by_name(stored.begin(), stored.end());
  if (!by_name.count("step0.template") || !by_name.count("slices")) {
    return make_error(ErrorCode::kNotFound, "the decision does not describe a split-K subgraph");
  }
  KILN_ASSIGN_OR_RETURN(TemplatePtr gemm, templates::find_template(by_name["step0.template"]));
  KILN_ASSIGN_OR_RETURN(TemplatePtr reduce, templates::find_template("splitk_reduce"));
  auto where = target_for(*gemm, ctx);
  if (!where) return make_error(ErrorCode::kNotFound, fmt::format("{} cannot run here", gemm->name()));
  KILN_ASSIGN_OR_RETURN(Params gemm_params, stored_params(*gemm, by_name, "step0.", problem));
  gemm_params.insert_or_assign("partials", Value::boolean(false));  // make_splitk_gemm sets it
  Params reduce_params;
  for (const auto& spec : reduce->params()) {
    if (spec.role != templates::ParamRole::kTunable) continue;
    auto v = by_name.find("step1." + spec.name);
    if (v == by_name.end()) return make_error(ErrorCode::kNotFound, fmt::format("the decision lacks 'step1.{}'", spec.name));
    reduce_params.emplace(spec.name, Value::integer(std::stoll(v->second)));
  }
  KILN_ASSIGN_OR_RETURN(templates::Subgraph graph, templates::make_splitk_gemm(gemm, gemm_params, reduce_params, p.epilogue,
                                                                                problem.shape(), std::stoi(by_name["slices"])));
  if (graph.name != name) {
    return make_error(ErrorCode::kNotFound, fmt::format("the decision's parameters build '{}', not '{}'", graph.name, name));
  }
  return make_subgraph_choice(std::move(graph), where->first, problem.shape());
}

Result<ChoicePtr> rebuild_gemm(const Problem& problem, const std::string& name,
                               const std::vector<std::pair<std::string, std::string>>& stored, const ChoiceContext& ctx) {
  const auto& p = std::get<GemmProblem>(problem.desc);
  if (name == "cublas_default" && p.epilogue.ops.empty()) return make_cublas_default_choice(p);
  if (name.rfind("splitk", 0) == 0) return rebuild_splitk(problem, name, stored, ctx);
  if (name.rfind("cublaslt_", 0) == 0) {
    const bool fuse = p.epilogue.ops.empty() || cublaslt_can_fuse(p);
    if (!fuse) return make_error(ErrorCode::kNotFound, "a plain cuBLASLt choice for an epilogue problem");
    return make_cublaslt_choice(p, true, p.epilogue.out, name);
  }
  return rebuild_template(problem, name, stored, ctx);
}

Result<ChoicePtr> rebuild_row(const Problem& problem, const std::string& name,
                              const std::vector<std::pair<std::string, std::string>>& stored, const ChoiceContext& ctx) {
  if (name == "reference") return ChoicePtr(std::make_shared<ReferenceRowChoice>(problem));
  return rebuild_template(problem, name, stored, ctx);
}

}  // namespace

std::vector<OpDef> builtin_ops() {
  std::vector<OpDef> ops;
  ops.push_back({"gemm", gemm_choices, gemm_reference, gemm_buffers, tolerance, rebuild_gemm});
  for (const char* name : {"rmsnorm", "layernorm"}) {
    ops.push_back({name, row_choices, [](const Problem&) { return std::string("reference"); }, norm_buffers, tolerance,
                   rebuild_row});
  }
  ops.push_back({"softmax", row_choices, [](const Problem&) { return std::string("reference"); }, softmax_buffers,
                 tolerance, rebuild_row});
  return ops;
}

}  // namespace kiln::runtime::detail
