#include "kiln/cache/tuning.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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

Result<std::unique_ptr<TuningCache>> TuningCache::open(TuneMode mode, StoreOptions options,
                                                       std::shared_ptr<RemoteTier> remote) {
  std::shared_ptr<Store> store;
  if (mode != TuneMode::kOff) {
    KILN_ASSIGN_OR_RETURN(auto s, Store::open(std::move(options)));
    store = std::move(s);
  }
  return std::make_unique<TuningCache>(mode, std::move(store), std::move(remote));
}

TuningCache::TuningCache(TuneMode mode, std::shared_ptr<Store> store, std::shared_ptr<RemoteTier> remote)
    : mode_(mode), store_(std::move(store)), remote_(std::move(remote)) {
  if (mode_ == TuneMode::kOff) {
    store_.reset();
    remote_.reset();
  }
}

LookupCounters TuningCache::counters() const {
  return LookupCounters{local_hits_.load(), local_misses_.load(), remote_hits_.load()};
}

void TuningCache::fetch_remote_timings(std::string_view problem) const {
  if (!remote_) return;
  {
    std::lock_guard lock(fetched_mu_);
    if (!fetched_timings_.emplace(problem).second) return;
  }
  auto remote = remote_->fetch_timings(problem);
  if (remote.empty()) return;
  if (Status s = store_->put_all(std::move(remote), {}); !s.ok()) {
    spdlog::warn("kiln cache: could not store the timings {} sent: {}", remote_->describe(), s.to_string());
  }
}

Result<std::shared_ptr<const Decision>> TuningCache::lookup_decision(std::string_view problem) const {
  if (mode_ == TuneMode::kOff) {
    std::lock_guard lock(mu_);
    auto it = own_decisions_.find(problem);
    return it == own_decisions_.end() ? nullptr : it->second;
  }
  auto d = store_->decision(problem);
  ++(d ? local_hits_ : local_misses_);
  if (!d && remote_) {
    if (auto r = remote_->fetch_decision(problem)) {
      Status stored = store_->put_decision(*r);
      d = store_->decision(problem);
      // Not stored (a full disk, say): still used in this process when it is current.
      if (!stored.ok() && !d && r->toolchain == store_->toolchain()) d = std::make_shared<const Decision>(std::move(*r));
      if (d) ++remote_hits_;
    }
  }
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
  fetch_remote_timings(problem);
  return store_->timing(problem, choice);
}

bool TuningCache::should_measure(std::string_view problem, std::string_view choice) const {
  if (mode_ == TuneMode::kUse || mode_ == TuneMode::kStrict) return false;
  return !cached_timing(problem, choice).has_value();
}

std::vector<TimingRecord> TuningCache::timings(std::string_view problem) const {
  if (mode_ != TuneMode::kOff) {
    fetch_remote_timings(problem);
    return store_->timings(problem);
  }
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
  if (mode_ != TuneMode::kOff) {
    if (remote_) {
      // Stamped here, so the remote copy carries the same stamp and toolchain as the local one.
      KILN_RETURN_IF_ERROR(stamp_record(timing, store_->toolchain()));
      remote_->publish_timing(timing);
    }
    return store_->put_timing(std::move(timing));
  }
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
  if (mode_ != TuneMode::kOff) {
    if (remote_) {
      KILN_RETURN_IF_ERROR(stamp_record(decision, store_->toolchain()));
      remote_->publish_decision(decision);
    }
    return store_->put_decision(std::move(decision));
  }
  KILN_RETURN_IF_ERROR(stamp_record(decision, Toolchain::current()));
  std::lock_guard lock(mu_);
  std::string problem = decision.problem;
  own_decisions_[problem] = std::make_shared<const Decision>(std::move(decision));
  return Status();
}

Result<std::shared_ptr<const Binary>> TuningCache::lookup_binary(const KernelKey& key, std::string_view arch) const {
  if (mode_ == TuneMode::kOff) return make_error(ErrorCode::kNotFound, "tune mode 'off' caches no binaries");
  auto local = store_->get_binary(key, arch);
  ++(local.ok() ? local_hits_ : local_misses_);
  if (local.ok() || !remote_ || local.status().code() != ErrorCode::kNotFound) return local;
  auto remote = remote_->fetch_binary(key, arch);
  if (!remote) return local;
  ++remote_hits_;
  if (Status s = store_->put_binary(*remote); !s.ok()) {
    spdlog::warn("kiln cache: could not store binary {} from {}: {}", key.hex(), remote_->describe(), s.to_string());
  }
  return std::shared_ptr<const Binary>(std::make_shared<Binary>(std::move(*remote)));
}

Status TuningCache::record_binary(const Binary& binary) {
  if (mode_ == TuneMode::kOff) return Status();
  if (remote_) remote_->publish_binary(binary);
  return store_->put_binary(binary);
}

}  // namespace kiln::cache
