// The fleet tier: a Redis shared by build machines and GPU machines, behind each machine's local store.
//
// Build machines compile (`kiln precompile --shard i/N --remote URL`) and publish binaries; GPU machines read
// through on a local miss (binaries, a problem's timings, decisions), verify, store locally, and publish
// what they measure and decide from a bounded background queue. Values are the local store's records,
// sealed (kiln/cache/sealed.h) and signed with the fleet key from $KILN_CACHE_KEY_FILE; without a key,
// binaries are neither published nor accepted unless explicitly allowed. Connect and read timeouts bound
// every call, and a circuit breaker keeps kiln local-only for a while after repeated failures. Nothing on the
// hot path (size dispatch, warm selections) reaches Redis. Design: docs/fleet.md.
//
// Remote keys (the value format version, the kind, the arch, then the content key or the canonical problem):
//   kiln:f<V>:bin:<arch>:<kernel key hex>   a binary (string)
//   kiln:f<V>:dec:<arch>:<problem>          a decision (string)
//   kiln:f<V>:tim:<arch>:<problem>          a problem's timings (hash: choice -> value)
//   kiln:f<V>:stats                         fleet-wide counters (hash), added to by every process at close
// where a problem's arch is its device's ("sm_90"; "any" for a key that names no device).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/remote_tier.h"
#include "kiln/cache/signing.h"
#include "kiln/cache/store.h"
#include "kiln/status.h"

namespace kiln::cache {

/// A parsed remote URL: `redis://[user:password@]host:port[/db]` or `unix:///path/to/socket[?db=N]`.
struct RemoteUrl {
  std::string host;      // empty for a unix socket
  int port = 6379;
  std::string socket;    // the unix socket's path
  std::string user;      // empty: none (or the default user with a password)
  std::string password;  // never printed: display() and every message leave it out
  int db = 0;

  /// Errors: kInvalidArgument saying what is wrong with it (the message never repeats a password).
  static Result<RemoteUrl> parse(std::string_view url);
  /// "redis://user:***@host:6379/0" or "unix:///run/redis.sock?db=0": safe to log.
  std::string display() const;
};

/// Test hook: the clock the circuit breaker reads. Default: std::chrono::steady_clock::now.
using RemoteClock = std::function<std::chrono::steady_clock::time_point()>;

struct RemoteOptions {
  /// The remote's URL (see RemoteUrl). Required.
  std::string url;
  /// The fleet key that signs what this process publishes and verifies what it reads. Default none (the
  /// key file in key_file, if any).
  std::optional<SigningKey> key;
  /// A file holding the fleet key (see signing.h), read by open_remote when `key` is unset. Default empty.
  std::string key_file;
  /// Without a key, publish and accept unsigned binaries (a trusted, private network only). Default false:
  /// without a key only decisions and timings travel.
  bool allow_unsigned_binaries = false;
  /// Default 50 ms.
  std::chrono::milliseconds connect_timeout{50};
  /// Each command's reply, read and write. Default 200 ms.
  std::chrono::milliseconds read_timeout{200};
  /// Consecutive failures (unreachable, timed out) after which the breaker opens. Default 3.
  int breaker_failures = 3;
  /// How long an open breaker keeps kiln local-only before one call tries the remote again. Default 30 s.
  std::chrono::milliseconds breaker_cooldown{30000};
  /// Publish from the write-behind queue. Default true; false makes the tier read-only (push publishes).
  bool write_behind = true;
  /// The write-behind queue's bound, in entries and in bytes; past either, new entries are dropped (and
  /// counted), never waited for. Defaults 4096 entries, 256 MiB.
  size_t queue_entries = 4096;
  size_t queue_bytes = 256u << 20;
  /// How long closing the tier waits for the queue to drain. Default 2 s.
  std::chrono::milliseconds drain_timeout{2000};
  /// Default: steady_clock.
  RemoteClock clock;

  /// Options from the environment: the URL `url`, else $KILN_REMOTE_CACHE (neither: no remote, nullopt), and
  /// $KILN_CACHE_KEY_FILE, $KILN_REMOTE_ALLOW_UNSIGNED=1, $KILN_REMOTE_CONNECT_TIMEOUT_MS,
  /// $KILN_REMOTE_READ_TIMEOUT_MS. Errors: kInvalidArgument naming a malformed variable.
  static Result<std::optional<RemoteOptions>> from_env(std::string url = {});
};

struct SyncOptions {
  /// Decisions only: no timings, no binaries. Default false.
  bool decisions_only = false;
  /// Binaries only: no decisions, no timings (a build machine's push). Default false.
  bool binaries_only = false;
  /// Only binaries for this arch, and decisions and timings of problems on devices of its compute
  /// capability ("sm_90a" selects sm_90 problems). Default empty: every arch.
  std::string arch;
  /// push: only these binaries (a build machine's shard). Default empty: every binary in the store.
  std::vector<KernelKey> binaries;
};

struct SyncReport {
  uint64_t decisions = 0;
  uint64_t timings = 0;
  uint64_t binaries = 0;
  uint64_t refused = 0;    // pull: values that failed their checks (never stored)
  uint64_t withheld = 0;   // push: binaries not sent because no key is configured
  uint64_t failed = 0;     // entries not written (a full remote, a local write error)
  std::vector<std::string> errors;  // the first 20
};

/// What the remote holds and its fleet-wide counters (for `kiln cache stats --remote`).
struct RemoteSummary {
  std::string url;  // display()
  uint64_t binaries = 0, decisions = 0, timing_problems = 0;
  uint64_t used_memory = 0, max_memory = 0;
  std::string eviction_policy;
  std::vector<std::pair<std::string, uint64_t>> fleet_counters;  // kiln:f<V>:stats, by name
};

class RedisTier;
Result<SyncReport> push(Store& store, RedisTier& remote, const SyncOptions& options);
Result<SyncReport> pull(Store& store, RedisTier& remote, const SyncOptions& options);
Result<RemoteSummary> summarize(RedisTier& remote);

/// The Redis tier. Thread-safe.
class RedisTier : public RemoteTier {
 public:
  /// Checks the URL and loads the key; connects lazily, so an unreachable Redis is not an error here (kiln
  /// works locally and says so). Errors: kInvalidArgument (URL, options), those of SigningKey::load.
  static Result<std::shared_ptr<RedisTier>> open(RemoteOptions options);
  /// Drains the queue (up to drain_timeout), then adds this process's counters to the remote's.
  ~RedisTier() override;

  std::optional<Binary> fetch_binary(const KernelKey& key, std::string_view arch) override;
  std::optional<Decision> fetch_decision(std::string_view problem) override;
  std::vector<TimingRecord> fetch_timings(std::string_view problem) override;
  void publish_binary(const Binary& binary) override;
  void publish_timing(const TimingRecord& timing) override;
  void publish_decision(const Decision& decision) override;
  RemoteCounters counters() const override;
  std::string describe() const override;

  /// Waits until every queued entry was written or failed, at most `timeout`. Errors: kTimeout.
  Status drain(std::chrono::milliseconds timeout);
  /// One PING, bypassing the breaker's cool-down (a command a person runs). Errors: kUnavailable /
  /// kTimeout naming the remote.
  Status ping();
  /// Whether a fleet key is configured.
  bool signing() const;

  struct Impl;

 private:
  friend Result<SyncReport> push(Store&, RedisTier&, const SyncOptions&);
  friend Result<SyncReport> pull(Store&, RedisTier&, const SyncOptions&);
  friend Result<RemoteSummary> summarize(RedisTier&);
  explicit RedisTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The remote key of a binary, a decision and a problem's timings (see the top of this file).
std::string remote_binary_key(const KernelKey& key, std::string_view arch);
std::string remote_decision_key(std::string_view problem);
std::string remote_timings_key(std::string_view problem);
/// A problem's arch for remote keys: "sm_<major><minor>" of the device its key names, else "any".
std::string problem_arch(std::string_view problem);

/// Writes the store's current decisions, timings and binaries selected by `options` to the remote, in
/// pipelined batches. Errors: kUnavailable / kTimeout when the remote cannot be reached (what was written
/// before stays); entries the remote refuses (a full Redis) are counted in `failed`.
Result<SyncReport> push(Store& store, RedisTier& remote, const SyncOptions& options = {});
/// Reads what the remote holds (selected by `options`), verifies each value and stores those that pass.
/// Errors as push.
Result<SyncReport> pull(Store& store, RedisTier& remote, const SyncOptions& options = {});

Result<RemoteSummary> summarize(RedisTier& remote);

}  // namespace kiln::cache
