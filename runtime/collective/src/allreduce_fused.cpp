// The fused step after every attention and MLP block of tensor-parallel inference: h = all-reduce(x) + residual
// -> residual_out, y = RMSNorm(h) * weight. Running a fused template configuration or an unfused pair (an
// all-reduce choice, then kiln's tuned RMSNorm), tuning them against each other per row count with a CPU
// reference check, and the row-count dispatcher run_fused() reads.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "allreduce_impl.h"
#include "kiln/runtime/builtin.h"

namespace kiln::runtime {

using namespace detail;

std::vector<std::string> AllReduce::fused_choice_names(const FusedArgs& a) const {
  std::vector<std::string> out;
  const size_t bytes = static_cast<size_t>(a.rows * a.cols) * impl_->elem_bytes;
  for (const auto& c : impl_->fused_choices) {
    if (!c.kernel || (c.push && bytes > impl_->push_slot_bytes)) continue;
    if (c.tmpl->check_problem(c.params, templates::Shape{.m = a.rows, .n = a.cols}).ok()) out.push_back(c.name);
  }
  return out;
}

Status AllReduce::run_fused_choice(const std::string& name, const FusedArgs& a, CUstream stream) const {
  const Impl& s = *impl_;
  const int64_t count = a.rows * a.cols;
  if (a.rows <= 0 || a.cols <= 0 || count > std::numeric_limits<int>::max()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("fused step of {} x {}", a.rows, a.cols));
  }
  if (name.rfind(kUnfused, 0) == 0) {
    // "unfused:<all-reduce>+<norm>": the norm selection is found among the tuned picks.
    for (auto it = s.fused_picks.rbegin(); it != s.fused_picks.rend(); ++it) {
      const FusedPick& p = *it;
      if (p.name == name && p.norm) {
        if (s.fused_tmp.size() < static_cast<size_t>(count) * s.elem_bytes) {
          return make_error(ErrorCode::kFailedPrecondition, "the unfused pair's buffer is smaller than this call");
        }
        KILN_RETURN_IF_ERROR(s.run_named(p.allreduce, a.x, s.fused_tmp.ptr(), count, stream));
        KilnNormArgs n{};
        n.x = reinterpret_cast<const void*>(static_cast<uintptr_t>(s.fused_tmp.ptr()));
        n.residual = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.residual));
        n.residual_out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.residual_out));
        n.weight = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.weight));
        n.y = reinterpret_cast<void*>(static_cast<uintptr_t>(a.y));
        n.rows = static_cast<int>(a.rows);
        n.cols = static_cast<int>(a.cols);
        n.ld_x = n.ld_residual = n.ld_residual_out = n.ld_y = a.cols;
        n.eps = a.eps;
        return p.norm->run(OpArgs{n}, stream);
      }
    }
    return make_error(ErrorCode::kNotFound, fmt::format("no tuned unfused pair '{}'", name));
  }
  const TemplateChoice* c = s.find(s.fused_choices, name);
  if (!c) return make_error(ErrorCode::kNotFound, fmt::format("no fused choice '{}'", name));
  if (!c->kernel) return c->status;
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  if (bytes > s.staging->bytes()) return make_error(ErrorCode::kInvalidArgument, "the rows exceed the staging buffers");
  KILN_RETURN_IF_ERROR(c->tmpl->check_problem(c->params, templates::Shape{.m = a.rows, .n = a.cols}));
  KILN_RETURN_IF_ERROR(s.not_in_staging(a.residual_out, "residual output"));
  KILN_RETURN_IF_ERROR(s.not_in_staging(a.y, "output"));
  const Operand where = s.locate(a.x, bytes);
  if (where.region && ((a.y < a.x + bytes && a.x < a.y + bytes) ||
                       (a.residual_out < a.x + bytes && a.x < a.residual_out + bytes))) {
    return make_error(ErrorCode::kInvalidArgument, "fused step: an output overlaps the symmetric input x");
  }
  KilnAllReduceArgs k = s.base;
  KILN_RETURN_IF_ERROR(s.stage_input(*c, where, false, a.x, bytes, stream, k));
  k.out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.y));
  k.residual = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.residual));
  k.residual_out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.residual_out));
  k.weight = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.weight));
  k.count = static_cast<int>(count);
  k.rows = static_cast<int>(a.rows);
  k.cols = static_cast<int>(a.cols);
  k.eps = a.eps;
  return (*c->kernel)(impl_->launch_config(c->launch, stream), k);
}

Result<std::vector<CollectiveReport>> AllReduce::tune_fused(int64_t cols, std::vector<int64_t> rows) {
  Impl& s = *impl_;
  if (!s.tuned) return make_error(ErrorCode::kFailedPrecondition, "tune_fused() needs tune() first");
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  if (rows.empty() || rows.front() <= 0 || cols <= 0) return make_error(ErrorCode::kInvalidArgument, "fused: rows and cols must be positive");
  const int64_t max_count = rows.back() * cols;
  const size_t max_bytes = static_cast<size_t>(max_count) * s.elem_bytes;
  if (max_bytes > s.staging->bytes()) return make_error(ErrorCode::kInvalidArgument, "fused: rows x cols exceed the staging buffers");
  KILN_RETURN_IF_ERROR(s.make_current());
  KILN_RETURN_IF_ERROR(s.agree(s.fused_choices));
  if (!s.norm_tuner) {
    TuneOptions o;
    o.cache = s.options.cache;
    if (!o.cache) {
      KILN_ASSIGN_OR_RETURN(auto off, cache::TuningCache::open(cache::TuneMode::kOff));
      o.cache = std::move(off);
    }
    o.executor = s.options.executor;
    o.device = s.comm->device();
    KILN_ASSIGN_OR_RETURN(s.norm_tuner, make_tuner(std::move(o)));
  }
  KILN_ASSIGN_OR_RETURN(s.fused_tmp, DeviceBuffer::allocate(max_bytes));
  // Buffers for the checks: x (the check input), residual, residual_out, weight, y.
  KILN_ASSIGN_OR_RETURN(DeviceBuffer residual, DeviceBuffer::allocate(max_bytes));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer residual_out, DeviceBuffer::allocate(max_bytes));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer weight, DeviceBuffer::allocate(static_cast<size_t>(cols) * s.elem_bytes));
  KILN_RETURN_IF_ERROR(s.ensure_check_buffers(max_bytes));
  {
    std::vector<float> w(cols), r(max_count);
    for (int64_t c = 0; c < cols; ++c) w[c] = 0.5f + 0.25f * static_cast<float>(c % 5);
    for (int64_t i = 0; i < max_count; ++i) r[i] = static_cast<float>(i % 9) - 4.f;
    auto wb = encode_elements(s.options.dtype, w), rb = encode_elements(s.options.dtype, r);
    KILN_RETURN_IF_ERROR(weight.copy_from_host(wb.data(), wb.size()));
    KILN_RETURN_IF_ERROR(residual.copy_from_host(rb.data(), rb.size()));
  }

  std::vector<CollectiveReport> reports;
  s.fused_bounds.clear();
  s.fused_picks.clear();
  for (int64_t nrows : rows) {
    const int64_t count = nrows * cols;
    const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
    KILN_RETURN_IF_ERROR(s.prepare_check(count));
    FusedArgs a;
    a.x = s.bench_input();
    a.residual = residual.ptr();
    a.residual_out = residual_out.ptr();
    a.weight = weight.ptr();
    a.y = s.check_out.ptr();
    a.rows = nrows;
    a.cols = cols;
    // The unfused pairs: NCCL and this size's all-reduce winner, each followed by kiln's tuned RMSNorm.
    NormProblem np;
    np.rows = nrows;
    np.cols = cols;
    np.dtype = s.options.dtype;
    np.residual = true;
    np.eps = a.eps;
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<Selection> norm, s.norm_tuner->tune(Problem::norm(np)));
    std::vector<std::string> names;
    const std::string& ar = choice_for(count, s.measuring);
    for (const std::string& pair_ar : {s.nccl_name, ar}) {
      FusedPick p;
      p.allreduce = pair_ar;
      p.norm = norm;
      p.name = fmt::format("{}{}+{}", kUnfused, pair_ar, norm->choice_name());
      if (std::find(names.begin(), names.end(), p.name) == names.end()) {
        names.push_back(p.name);
        s.fused_picks.push_back(std::move(p));  // findable by run_fused_choice while measuring (the latest wins)
      }
    }
    for (auto& n : fused_choice_names(a)) names.push_back(n);
    auto launch = [&](const std::string& n, CUstream st) { return run_fused_choice(n, a, st); };
    auto check = [&](const std::string& n) -> Status {
      KILN_RETURN_IF_ERROR(s.refresh_input(bytes));
      KILN_RETURN_IF_ERROR(s.check_out.fill_bytes(0xff, s.work.get()));
      KILN_RETURN_IF_ERROR(residual_out.fill_bytes(0xff, s.work.get()));
      KILN_RETURN_IF_ERROR(run_fused_choice(n, a, s.work.get()));
      KILN_RETURN_IF_ERROR(s.work.synchronize());
      std::vector<char> y(bytes), h(bytes), res(bytes), wt(static_cast<size_t>(cols) * s.elem_bytes);
      KILN_RETURN_IF_ERROR(s.check_out.copy_to_host(y.data(), bytes));
      KILN_RETURN_IF_ERROR(residual_out.copy_to_host(h.data(), bytes));
      KILN_RETURN_IF_ERROR(residual.copy_to_host(res.data(), bytes));
      KILN_RETURN_IF_ERROR(weight.copy_to_host(wt.data(), wt.size()));
      for (int64_t row = 0; row < nrows; ++row) {
        double sq = 0;
        std::vector<float> hr(cols);
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = row * cols + c;
          float sum = 0;
          for (int r = 0; r < s.comm->world(); ++r) sum += check_pattern(r, i);
          hr[c] = round_to(s.options.dtype, sum + decode_element(s.options.dtype, &res[i * s.elem_bytes]));
          const float got = decode_element(s.options.dtype, &h[i * s.elem_bytes]);
          if (got != hr[c]) {
            return make_error(ErrorCode::kInternal, fmt::format("wrong residual sum at row {} col {}: {} vs {}", row, c, got, hr[c]));
          }
          sq += double(hr[c]) * hr[c];
        }
        const double inv = 1.0 / std::sqrt(sq / cols + a.eps);
        for (int64_t c = 0; c < cols; ++c) {
          const double want = hr[c] * inv * decode_element(s.options.dtype, &wt[c * s.elem_bytes]);
          const float got = decode_element(s.options.dtype, &y[(row * cols + c) * s.elem_bytes]);
          if (!(std::abs(got - want) <= 0.02 * std::abs(want) + 0.02)) {
            return make_error(ErrorCode::kInternal, fmt::format("wrong norm at row {} col {}: {} vs {}", row, c, got, want));
          }
        }
      }
      return Status();
    };
    KILN_ASSIGN_OR_RETURN(auto timings, s.measure(names, bytes, launch, check));
    const int w = pick_collective(figures(timings));
    CollectiveReport r;
    r.bytes = bytes;
    r.rows = nrows;
    r.chosen = w >= 0 ? names[w] : names.front();
    r.choices = std::move(timings);
    FusedPick pick;
    pick.name = r.chosen;
    if (r.chosen.rfind(kUnfused, 0) == 0) {
      for (const auto& p : s.fused_picks) {
        if (p.name == r.chosen) pick = p;
      }
    } else {
      for (size_t i = 0; i < s.fused_choices.size(); ++i) {
        if (s.fused_choices[i].name == r.chosen) pick.fused = static_cast<int>(i);
      }
    }
    s.fused_bounds.push_back(nrows);
    s.fused_picks.push_back(pick);
    reports.push_back(std::move(r));
  }
  // Keep the per-bucket picks at the end in bucket order (the pairs measured along the way stay findable).
  std::vector<FusedPick> table(s.fused_picks.end() - static_cast<std::ptrdiff_t>(rows.size()), s.fused_picks.end());
  std::vector<FusedPick> pairs(s.fused_picks.begin(), s.fused_picks.end() - static_cast<std::ptrdiff_t>(rows.size()));
  s.fused_picks = std::move(pairs);
  s.fused_picks.insert(s.fused_picks.end(), table.begin(), table.end());
  return reports;
}

const std::string& AllReduce::fused_choice_for(int64_t rows) const {
  const Impl& s = *impl_;
  auto it = std::lower_bound(s.fused_bounds.begin(), s.fused_bounds.end(), rows);
  if (s.fused_bounds.empty()) return s.nccl_name;
  const size_t i = it == s.fused_bounds.end() ? s.fused_bounds.size() - 1 : static_cast<size_t>(it - s.fused_bounds.begin());
  return s.fused_picks[s.fused_picks.size() - s.fused_bounds.size() + i].name;
}

Status AllReduce::run_fused(const FusedArgs& a, CUstream stream) const {
  if (impl_->fused_bounds.empty()) return make_error(ErrorCode::kFailedPrecondition, "run_fused() needs tune_fused() first");
  KILN_RETURN_IF_ERROR(run_fused_choice(fused_choice_for(a.rows), a, stream));
  const size_t bytes = static_cast<size_t>(a.rows * a.cols) * impl_->elem_bytes;
  return impl_->track(impl_->heap_allocation(a.x, bytes), SymmetricHeap::npos, stream);
}

}  // namespace kiln::runtime
