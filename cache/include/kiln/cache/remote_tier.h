// RemoteTier: what the tuning cache asks of a tier behind the local store (a Redis shared by a fleet; see
// kiln/cache/remote.h), and reports to it. The local store stays the cache of record: a remote answer is
// verified, stored locally and served from there, and nothing on the hot path (size dispatch, a tuner's warm
// selections) reaches a remote tier.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/records.h"
#include "kiln/jit/compiler.h"

namespace kiln::cache {

/// Counters of one process's use of a remote tier.
struct RemoteCounters {
  uint64_t hits = 0;            // lookups the remote answered with a value that passed every check
  uint64_t misses = 0;          // lookups the remote had nothing for
  uint64_t refused = 0;         // values read and refused (never loaded): the sum of the three below
  uint64_t refused_unsigned = 0;
  uint64_t refused_signature = 0;
  uint64_t refused_malformed = 0;
  uint64_t errors = 0;          // lookups that failed: unreachable, timed out, an error reply
  uint64_t skipped = 0;         // lookups not tried because the circuit breaker was open
  uint64_t queued = 0;          // entries put on the write-behind queue
  uint64_t published = 0;       // entries the remote stored
  uint64_t queue_drops = 0;     // entries dropped because the queue was full
  uint64_t write_errors = 0;    // entries the remote did not store (unreachable, breaker open, full)
  uint64_t withheld = 0;        // binaries not published because no signing key is configured
  uint64_t breaker_opened = 0;  // times the breaker opened
  std::string breaker = "closed";  // "closed", "open" (local only until the cool-down ends), "half-open"
  std::string last_error;       // the last failure's message (never a password or a key)
};

class RemoteTier {
 public:
  virtual ~RemoteTier() = default;

  // Read-through. Each returns nothing on a miss, a failure or a refusal (counted); never blocks longer than
  // the tier's timeouts; thread-safe.
  virtual std::optional<Binary> fetch_binary(const KernelKey& key, std::string_view arch) = 0;
  virtual std::optional<Decision> fetch_decision(std::string_view problem) = 0;
  /// Every timing and failure the remote holds for `problem`.
  virtual std::vector<TimingRecord> fetch_timings(std::string_view problem) = 0;

  // Write-behind. Each queues the entry and returns at once; a full queue drops it (counted). Thread-safe.
  virtual void publish_binary(const Binary& binary) = 0;
  virtual void publish_timing(const TimingRecord& timing) = 0;
  virtual void publish_decision(const Decision& decision) = 0;

  virtual RemoteCounters counters() const = 0;
  /// A name for messages ("redis://cache-1:6379/0"), never with a password.
  virtual std::string describe() const = 0;
};

}  // namespace kiln::cache
