// The precompile gate's build claims over a cache folder: one builder per kernel key among the processes that
// share the cache (kiln/pool/build_claims.h asks, kiln/cache/build_claims.h keeps the lease files).
#pragma once

#include <atomic>
#include <memory>

#include "kiln/cache/build_claims.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/build_claims.h"

namespace kiln::runtime {

/// BuildClaims over a ClaimDir. When the claims folder refuses a claim (an I/O error), the key is built here
/// and one warning per GateClaims says so: claims only ever save work, they never stop it.
class GateClaims final : public BuildClaims {
 public:
  explicit GateClaims(std::shared_ptr<cache::ClaimDir> dir) : dir_(std::move(dir)) {}
  ClaimReply claim(const KernelKey& key) override;
  void release(const KernelKey& key, const Status& result, bool deterministic) override;
  cache::ClaimDir& dir() const { return *dir_; }
  /// Claims that failed with an I/O error (each answered kBuild).
  uint64_t errors() const { return errors_.load(); }

 private:
  void warn(const Status& s);
  std::shared_ptr<cache::ClaimDir> dir_;
  std::atomic<uint64_t> errors_{0};
};

/// The claims for `cache`'s folder: null when the cache has no store (TuneMode::kOff), when $KILN_BUILD_CLAIMS
/// is off, or when the folder refuses claims (one warning per process says so; everything is then compiled
/// here, as without claims). Lease and skew from $KILN_BUILD_CLAIM_LEASE and $KILN_BUILD_CLAIM_SKEW.
std::shared_ptr<GateClaims> claims_for_cache(const cache::TuningCache& cache);

}  // namespace kiln::runtime
