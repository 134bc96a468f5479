// Build claims: one builder per kernel key among the processes that share a cache folder.
//
// A claim is a small lease file `<cache>/claims/<32-hex key>` naming its owner (host, boot, pid and the pid's
// start time, a nonce) and when it expires. It is created atomically (written aside, then link(2)ed into place,
// which fails when the name exists: the NFS-safe form of O_CREAT|O_EXCL), renewed while the compile runs, and
// on release turned into a short-lived "built" marker (waiters keep polling the store for the binary) or a
// "failed" record holding the compile error (waiters return it instead of compiling). A claim is taken over
// when it has expired, or, on the same host, when its owner is dead (no such pid, another start time, another
// boot). Takeovers and the owner's own updates run under `claims/.lock` (flock'ed, never waited on for long),
// so two processes never take over one claim together. Design, NFS notes and tests: docs/cache.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit/key.h"
#include "kiln/status.h"

namespace kiln::cache {

/// Who holds a claim. Two owners on one host share host_id and boot_id.
struct ClaimOwner {
  std::string host_id;      // /etc/machine-id (else the host name) and the pid namespace
  std::string boot_id;      // /proc/sys/kernel/random/boot_id
  int64_t pid = 0;
  uint64_t start_time = 0;  // the pid's start time (/proc/<pid>/stat), so a reused pid is not taken as alive
  std::string describe() const;  // "pid 1234 on host-a"
  /// This process.
  static ClaimOwner current();
};

struct ClaimOptions {
  /// The claims folder, created if missing. Required (claims_dir(cache dir) for a cache).
  std::string dir;
  /// How long a claim lives without renewal. The owner renews every lease/3. Default 30 s: a crashed builder on
  /// another host delays its key by at most this (on this host a dead owner is seen at once).
  std::chrono::milliseconds lease{30000};
  /// Extra time a claim of another host is given past its expiry, for clocks that disagree (NFS). Default 0.
  std::chrono::milliseconds clock_skew{0};
  /// How long a "built" marker asks others to wait for the binary to become visible in the store (a reader's
  /// write reaches the database once the writer applies it, normally within 100 ms). After it, a process that
  /// still misses the binary builds it. Default 10 s.
  std::chrono::milliseconds built_grace{10000};
  /// How long a recorded compile failure answers for its key. Default 5 min.
  std::chrono::milliseconds failure_ttl{300000};
  /// A background thread renews this process's claims. Tests turn it off and call renew_due(). Default true.
  bool renew_thread = true;
  /// Test hooks. Wall-clock milliseconds since the epoch (default: the system clock); this process's identity
  /// (default: ClaimOwner::current()); whether an owner on this host is alive (default: /proc/<pid>/stat holds
  /// its start time).
  std::function<int64_t()> now_ms;
  std::optional<ClaimOwner> self;
  std::function<bool(const ClaimOwner&)> is_alive;
};

/// `<cache dir>/claims`.
std::string claims_dir(const std::string& cache_dir);

enum class ClaimState {
  kMine,    // this process holds the claim now: build the key, then release()
  kHeld,    // another live process builds it
  kBuilt,   // a process built it and stored the binary moments ago: look in the store again shortly
  kFailed,  // its builder recorded a compile failure: `failure`
};

struct ClaimAnswer {
  ClaimState state = ClaimState::kMine;
  std::string holder;  // kHeld/kBuilt/kFailed: who
  Status failure;      // kFailed: the recorded error
  bool took_over = false;  // kMine: from an expired claim or a dead owner
};

struct ClaimCounters {
  uint64_t claimed = 0;     // kMine answers, takeovers included
  uint64_t took_over = 0;   // of those, from expired claims or dead owners
  uint64_t held = 0;        // kHeld and kBuilt answers
  uint64_t failures_read = 0;
  uint64_t renewed = 0;
  uint64_t cleaned = 0;     // stale claims and temporary files removed
};

class ClaimDir {
 public:
  /// Creates the folder if needed and checks that a claim can be written there (kIoError naming the folder
  /// otherwise: callers then build without claims). Removes what crashed processes left (clean_stale()).
  static Result<std::unique_ptr<ClaimDir>> open(ClaimOptions options);
  ~ClaimDir();  // stops the renewal thread; claims still held are released as abandoned
  ClaimDir(const ClaimDir&) = delete;
  ClaimDir& operator=(const ClaimDir&) = delete;

  const std::string& dir() const;

  /// Takes the claim on `key` when nobody holds it, its claim expired, or its owner is dead; otherwise says
  /// who holds it, or what failure its builder recorded. Asking again for a key this process holds is kMine.
  /// Errors (kIoError) only when the file system refuses. Thread-safe.
  Result<ClaimAnswer> claim(const KernelKey& key);

  enum class Outcome { kBuilt, kFailed, kAbandoned };
  /// Ends this process's claim on `key`: kBuilt leaves a "built" marker for built_grace, kFailed records
  /// `failure` for failure_ttl, kAbandoned (cancelled, crashed worker, shutdown) removes the claim so another
  /// process builds the key. A claim that is no longer this process's (taken over after it expired) is left
  /// alone. Thread-safe.
  Status release(const KernelKey& key, Outcome outcome, const Status& failure = {});

  /// Renews every claim of this process whose renewal is due (lease/3 since the last). The renewal thread
  /// calls it; tests with a fake clock call it themselves. Returns how many were renewed.
  size_t renew_due();
  /// Removes claims whose owner is dead or whose lease (or built/failed record) expired, and temporary files
  /// of dead writers. Returns how many files went. open() calls it.
  size_t clean_stale();

  /// Keys this process holds.
  std::vector<KernelKey> held() const;
  ClaimCounters counters() const;

  struct Impl;

 private:
  explicit ClaimDir(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// $KILN_BUILD_CLAIMS: "on" (the default, also when unset), "off"; kInvalidArgument for anything else.
Result<bool> build_claims_from_env();
/// ClaimOptions for a cache folder with $KILN_BUILD_CLAIM_LEASE and $KILN_BUILD_CLAIM_SKEW (seconds) applied.
Result<ClaimOptions> claim_options_from_env(const std::string& cache_dir);

}  // namespace kiln::cache
