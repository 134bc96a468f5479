// Selection (a prepared winner with its workspace) and Dispatcher (a winner per size bucket).
#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "kiln/jit/driver.h"
#include "kiln/runtime/tuner.h"

namespace kiln::runtime {

Selection::Selection(Problem problem, ChoicePtr choice, TuneReport report)
    : problem_(std::move(problem)), choice_(std::move(choice)), report_(std::move(report)) {}

Status Selection::reserve_workspace(size_t bytes) const {
  std::lock_guard lock(mu_);
  if (workspace_.size() >= bytes) return Status();
  KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(bytes));
  workspace_ = std::move(b);
  return Status();
}

Status Selection::run(const OpArgs& args, CUstream stream) const {
  // The workspace scales with the call's sizes (split-K partials, an unfused intermediate): the tuned size's
  // workspace serves every smaller call; a larger one grows it, which is refused during graph capture.
  const size_t tuned = choice_->workspace_bytes();
  if (tuned > 0) {
    const int64_t dyn = dynamic_size_of(args), base = problem_.dynamic_size();
    const size_t need = dyn > base && base > 0 && choice_->workspace_scales()
                            ? tuned * static_cast<size_t>((dyn + base - 1) / base)
                            : tuned;
    CUdeviceptr ws;
    size_t have;
    {
      std::lock_guard lock(mu_);
      ws = workspace_.ptr();
      have = workspace_.size();
    }
    if (have < need) {
      KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
      CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
      KILN_CHECK(d->cuStreamIsCapturing(stream, &capturing));
      if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
        return make_error(ErrorCode::kFailedPrecondition,
                          fmt::format("{} needs {} bytes of workspace for this size, {} are reserved: call "
                                      "reserve_workspace() before capturing",
                                      choice_->name(), need, have));
      }
      KILN_RETURN_IF_ERROR(reserve_workspace(need));
      std::lock_guard lock(mu_);
      ws = workspace_.ptr();
    }
    return choice_->run(args, ws, stream);
  }
  return choice_->run(args, 0, stream);
}

Result<std::shared_ptr<Dispatcher>> Dispatcher::create(std::vector<int64_t> bounds,
                                                        std::vector<std::shared_ptr<Selection>> selections) {
  if (bounds.empty() || bounds.size() != selections.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("a dispatcher needs one selection per bound ({} bounds, {} selections)",
                                  bounds.size(), selections.size()));
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] <= 0 || (i > 0 && bounds[i] <= bounds[i - 1]) || !selections[i]) {
      return make_error(ErrorCode::kInvalidArgument, "dispatcher bounds must be positive and strictly ascending");
    }
  }
  auto d = std::make_shared<Dispatcher>();
  d->bounds_ = std::move(bounds);
  d->selections_ = std::move(selections);
  d->powers_of_two_ = std::all_of(d->bounds_.begin(), d->bounds_.end(), [](int64_t b) { return std::has_single_bit(static_cast<uint64_t>(b)); });
  if (d->powers_of_two_) {
    // by_log2_[e] serves sizes in (2^(e-1), 2^e]: the first bucket whose bound is >= 2^e.
    d->by_log2_.resize(64);
    for (int e = 0; e < 64; ++e) {
      const uint64_t top = uint64_t{1} << e;
      size_t i = 0;
      while (i + 1 < d->bounds_.size() && static_cast<uint64_t>(d->bounds_[i]) < top) ++i;
      d->by_log2_[e] = static_cast<uint8_t>(i);
    }
  }
  return d;
}

const Selection& Dispatcher::select(int64_t size) const {
  if (powers_of_two_) {
    // ceil(log2(size)): a table lookup, the same cost for every size.
    const uint64_t s = size <= 1 ? 1 : static_cast<uint64_t>(size);
    return *selections_[by_log2_[std::bit_width(s - 1)]];
  }
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), size);
  size_t i = it == bounds_.end() ? bounds_.size() - 1 : static_cast<size_t>(it - bounds_.begin());
  return *selections_[i];
}

Status Dispatcher::run(const OpArgs& args, CUstream stream) const { return select(dynamic_size_of(args)).run(args, stream); }

}  // namespace kiln::runtime
