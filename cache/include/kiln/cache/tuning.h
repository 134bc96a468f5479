// Tune modes and the policy the autotuner asks before and after measuring.
//
//   mode    measures?                     a cached decision    no cached decision     writes
//   tune    choices with no current       is used, nothing     measure what is        timings, failures,
//           timing or cached failure      is measured          missing, then decide   decisions, binaries
//   use     never                         is used              the default choice     binaries only
//   strict  never                         is used              an error (kNotFound)   binaries only
//   off     what this process has not     (only this process's (measure, decide,      nothing on disk
//           measured yet                  decisions)           keep in memory)
//
// `off` is "no cache": nothing is read from or written to disk, but the process still tunes and remembers
// its own results while it lives (FlashInfer's autotune(True) without a cache file). Results are written as
// they are measured, so a tune killed half-way keeps everything it finished, and runs accumulate.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/records.h"
#include "kiln/cache/remote_tier.h"
#include "kiln/cache/store.h"
#include "kiln/status.h"

namespace kiln::cache {

enum class TuneMode { kTune, kUse, kStrict, kOff };

/// "tune", "use", "strict", "off".
std::string_view tune_mode_name(TuneMode mode);
/// Parses a mode name (as tune_mode_name writes it). Errors: kInvalidArgument listing the names.
Result<TuneMode> parse_tune_mode(std::string_view name);
/// $KILN_TUNE_MODE when set (an invalid value is an error), else `fallback`.
Result<TuneMode> tune_mode_from_env(TuneMode fallback = TuneMode::kTune);

/// Lookups the tuning cache answered from the local store, and those it did not (binaries and decisions).
struct LookupCounters {
  uint64_t local_hits = 0;
  uint64_t local_misses = 0;
  uint64_t remote_hits = 0;  // local misses a remote tier answered (then stored locally)
};

/// The autotuner's view of the cache: a Store seen through a TuneMode, with an optional remote tier behind it.
/// Thread-safe.
///
/// With a remote tier, a local miss of a binary, a decision or a problem's timings asks the remote (read-
/// through), and what passes its checks is stored locally first; everything recorded here is also queued for
/// the remote (write-behind). In off mode the remote is never used.
class TuningCache {
 public:
  /// Opens the store in `options` for tune/use/strict; `off` opens nothing. Errors: those of Store::open.
  static Result<std::unique_ptr<TuningCache>> open(TuneMode mode, StoreOptions options = {},
                                                   std::shared_ptr<RemoteTier> remote = nullptr);
  /// Uses an already open store (null only with kOff) and, when given, a remote tier behind it.
  TuningCache(TuneMode mode, std::shared_ptr<Store> store, std::shared_ptr<RemoteTier> remote = nullptr);

  TuneMode mode() const { return mode_; }
  /// The store; null in off mode.
  Store* store() const { return store_.get(); }
  /// The remote tier; null when none (and always in off mode).
  RemoteTier* remote() const { return remote_.get(); }
  LookupCounters counters() const;

  /// The decision for `problem`: the cached one, else null (tune: measure; use: take the default choice).
  /// strict: a missing decision is kNotFound naming the problem. Costs well under a microsecond on a hit.
  Result<std::shared_ptr<const Decision>> lookup_decision(std::string_view problem) const;

  /// Whether to measure `choice` for `problem` now: in tune and off, true when there is neither a current
  /// timing nor a cached failure for it (one new choice means one new measurement); in use and strict,
  /// never.
  bool should_measure(std::string_view problem, std::string_view choice) const;
  /// The cached record (successful or failed) for the pair, if current.
  std::optional<TimingRecord> cached_timing(std::string_view problem, std::string_view choice) const;
  /// Every current record for `problem`, by choice name: what select() compares, old and new alike.
  std::vector<TimingRecord> timings(std::string_view problem) const;

  /// Stores a measurement as soon as it is made. Errors: kFailedPrecondition in use/strict (they never
  /// measure), kInvalidArgument for an empty problem or choice, store errors.
  Status record_timing(TimingRecord timing);
  /// Caches that `choice` failed for `problem` (did not compile, faulted, gave a wrong result), with the
  /// reason, so it is not retried on every start; retried once the toolchain changes. Errors as record_timing.
  Status record_failure(std::string_view problem, std::string_view choice, const Status& why);
  /// Stores the decision. Errors as record_timing.
  Status record_decision(Decision decision);

  /// A compiled binary from the cache (kNotFound on a miss, always in off mode).
  Result<std::shared_ptr<const Binary>> lookup_binary(const KernelKey& key, std::string_view arch = {}) const;
  /// Stores a compiled binary (tune, use and strict; a no-op in off mode).
  Status record_binary(const Binary& binary);

 private:
  Status check_may_record() const;
  // Read-through of a problem's timings: asks the remote once per problem per process.
  void fetch_remote_timings(std::string_view problem) const;

  TuneMode mode_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<RemoteTier> remote_;
  mutable std::atomic<uint64_t> local_hits_{0}, local_misses_{0}, remote_hits_{0};
  mutable std::mutex fetched_mu_;
  mutable std::set<std::string, std::less<>> fetched_timings_;
  // off mode: this process's own results.
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, TimingRecord, std::less<>>, std::less<>> own_timings_;
  std::map<std::string, std::shared_ptr<const Decision>, std::less<>> own_decisions_;
};

}  // namespace kiln::cache
