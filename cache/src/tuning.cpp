#include "kiln/cache/tuning.h"

#include <fmt/format.h>

#include <cstdlib>

#include "stamp.h"

namespace kiln::cache {

std::string_view tune_mode_name(TuneMode mode) {
  switch (mode) {
    case TuneMode::kTune: return "tune";
    case TuneMode::kUse: return "use";
    case TuneMode::kStrict: return "strict";
    case TuneMode::kOff: return "off";
  }
  return "?";
}

Result<TuneMode> parse_tune_mode(std::string_view name) {
  for (TuneMode m : {TuneMode::kTune, TuneMode::kUse, TuneMode::kStrict, TuneMode::kOff}) {
    if (tune_mode_name(m) == name) return m;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown tune mode '{}' (one of tune, use, strict, off)", name));
}

Result<TuneMode> tune_mode_from_env(TuneMode fallback) {
  const char* v = std::getenv("KILN_TUNE_MODE");
  if (v == nullptr || *v == '\0') return fallback;
  return parse_tune_mode(v).with_context("reading KILN_TUNE_MODE");
}

Result<std::unique_ptr<TuningCache>> TuningCache::open(TuneMode mode, StoreOptions options) {
  std::shared_ptr<Store> store;
  if (mode != TuneMode::kOff) {
    KILN_ASSIGN_OR_RETURN(auto s, Store::open(std::move(options)));
    store = std::move(s);
  }
  return std::make_unique<TuningCache>(mode, std::move(store));
}

TuningCache::TuningCache(TuneMode mode, std::shared_ptr<Store> store) : mode_(mode), store_(std::move(store)) {
  if (mode_ == TuneMode::kOff) store_.reset();
}

Result<std::shared_ptr<const Decision>> TuningCache::lookup_decision(std::string_view problem) const {
  if (mode_ == TuneMode::kOff) {
    std::lock_guard lock(mu_);
    auto it = own_decisions_.find(problem);
    return it == own_decisions_.end() ? nullptr : it->second;
  }
  auto d = store_->decision(problem);
  if (!d && mode_ == TuneMode::kStrict) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("tune mode 'strict': no cached decision for {} (tune it first: KILN_TUNE_MODE=tune, "
                                  "or import a cache bundle)",
                                  problem));
  }
  return d;
}

std::optional<TimingRecord> TuningCache::cached_timing(std::string_view problem, std::string_view choice) const {
  if (mode_ == TuneMode::kOff) {
    std::lock_guard lock(mu_);
    auto p = own_timings_.find(problem);
    if (p == own_timings_.end()) return std::nullopt;
    auto c = p->second.find(choice);
    if (c == p->second.end()) return std::nullopt;
    return c->second;
  }
  return store_->timing(problem, choice);
}

bool TuningCache::should_measure(std::string_view problem, std::string_view choice) const {
  if (mode_ == TuneMode::kUse || mode_ == TuneMode::kStrict) return false;
  return !cached_timing(problem, choice).has_value();
}

std::vector<TimingRecord> TuningCache::timings(std::string_view problem) const {
  if (mode_ != TuneMode::kOff) return store_->timings(problem);
  std::lock_guard lock(mu_);
  std::vector<TimingRecord> out;
  if (auto p = own_timings_.find(problem); p != own_timings_.end()) {
    for (const auto& [choice, t] : p->second) out.push_back(t);
  }
  return out;
}

Status TuningCache::check_may_record() const {
  if (mode_ == TuneMode::kUse || mode_ == TuneMode::kStrict) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("tune mode '{}' never measures, so it records no timings or decisions",
                                  tune_mode_name(mode_)));
  }
  return Status();
}

Status TuningCache::record_timing(TimingRecord timing) {
  KILN_RETURN_IF_ERROR(check_may_record());
  if (mode_ != TuneMode::kOff) return store_->put_timing(std::move(timing));
  KILN_RETURN_IF_ERROR(stamp_record(timing, Toolchain::current()));
  std::lock_guard lock(mu_);
  auto& per_problem = own_timings_[timing.problem];
  per_problem[timing.choice] = std::move(timing);
  return Status();
}

Status TuningCache::record_failure(std::string_view problem, std::string_view choice, const Status& why) {
  TimingRecord t;
  t.problem = problem;
  t.choice = choice;
  t.ok = false;
  t.error = why.ok() ? ErrorCode::kInternal : why.code();
  t.reason = why.ok() ? "failed (no reason given)" : why.to_string();
  return record_timing(std::move(t));
}

Status TuningCache::record_decision(Decision decision) {
  KILN_RETURN_IF_ERROR(check_may_record());
  if (mode_ != TuneMode::kOff) return store_->put_decision(std::move(decision));
  KILN_RETURN_IF_ERROR(stamp_record(decision, Toolchain::current()));
  std::lock_guard lock(mu_);
  std::string problem = decision.problem;
  own_decisions_[problem] = std::make_shared<const Decision>(std::move(decision));
  return Status();
}

Result<std::shared_ptr<const Binary>> TuningCache::lookup_binary(const KernelKey& key, std::string_view arch) const {
  if (mode_ == TuneMode::kOff) return make_error(ErrorCode::kNotFound, "tune mode 'off' caches no binaries");
  return store_->get_binary(key, arch);
}

Status TuningCache::record_binary(const Binary& binary) {
  if (mode_ == TuneMode::kOff) return Status();
  return store_->put_binary(binary);
}

}  // namespace kiln::cache
