// Build claims for the gate over the cache folder (see kiln/runtime/build_claims.h).
#include "kiln/runtime/build_claims.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace kiln::runtime {

void GateClaims::warn(const Status& s) {
  if (errors_.fetch_add(1) == 0) {
    spdlog::warn("kiln: build claims in '{}' failed ({}); compiling here without them (other processes may "
                 "compile the same kernels)", dir_->dir(), s.to_string());
  }
}

ClaimReply GateClaims::claim(const KernelKey& key) {
  auto a = dir_->claim(key);
  if (!a.ok()) {
    warn(a.status());
    return ClaimReply{};
  }
  ClaimReply r;
  switch (a->state) {
    case cache::ClaimState::kMine:
      r.verdict = ClaimVerdict::kBuild;
      r.took_over = a->took_over;
      break;
    case cache::ClaimState::kHeld:
    case cache::ClaimState::kBuilt:
      r.verdict = ClaimVerdict::kWait;
      r.holder = a->holder;
      r.built = a->state == cache::ClaimState::kBuilt;
      break;
    case cache::ClaimState::kFailed:
      r.verdict = ClaimVerdict::kFailed;
      r.failure = a->failure;
      break;
  }
  return r;
}

void GateClaims::release(const KernelKey& key, const Status& result, bool deterministic) {
  using Outcome = cache::ClaimDir::Outcome;
  const Outcome o = result.ok() ? Outcome::kBuilt : deterministic ? Outcome::kFailed : Outcome::kAbandoned;
  if (Status s = dir_->release(key, o, result); !s.ok()) warn(s);
}

std::shared_ptr<GateClaims> claims_for_cache(const cache::TuningCache& cache) {
  const cache::Store* store = cache.store();
  if (store == nullptr) return nullptr;
  static std::once_flag warned;
  auto enabled = cache::build_claims_from_env();
  if (!enabled.ok() || !*enabled) {
    if (!enabled.ok()) std::call_once(warned, [&] { spdlog::warn("kiln: {}; build claims off", enabled.status().to_string()); });
    return nullptr;
  }
  auto options = cache::claim_options_from_env(store->dir());
  if (!options.ok()) {
    std::call_once(warned, [&] { spdlog::warn("kiln: {}; build claims off", options.status().to_string()); });
    return nullptr;
  }
  auto dir = cache::ClaimDir::open(std::move(*options));
  if (!dir.ok()) {
    std::call_once(warned, [&] {
      spdlog::warn("kiln: {}; compiling without build claims (other processes may compile the same kernels)",
                   dir.status().to_string());
    });
    return nullptr;
  }
  return std::make_shared<GateClaims>(std::shared_ptr<cache::ClaimDir>(std::move(*dir)));
}

}  // namespace kiln::runtime
