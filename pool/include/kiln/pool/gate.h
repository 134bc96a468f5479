// The precompile gate: the one entry point through which every choice's kernels are compiled.
//
//   KernelSource + Target (+ Priority) -> Future<Binary>   (a Result<Binary> inside: errors are values)
//
// - Single flight: concurrent requests for one KernelKey share one future and one compile.
// - Cache hooks: a key the cache knows (a binary or a remembered compile failure) never reaches a compiler;
//   fresh results are handed back to be stored. The cache is not a dependency of the pool: it plugs in here.
// - Priorities: an on-demand request overtakes queued background work, and raises a queued compile of the
//   same key that a background request started.
// - Subgraphs: a future of all of several kernels; choices with nothing to compile get a ready future.
// - Batches report progress (done/total, failures, rate, ETA).
// - Across processes (optional `claims`): a key another process is building is not compiled here; the
//   request waits for that binary to appear through `lookup`, and builds it itself if the other gives up.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/jit/key.h"
#include "kiln/pool/build_claims.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/future.h"
#include "kiln/pool/progress.h"

namespace kiln {

struct GateOptions {
  /// Where compiles run. Required.
  std::shared_ptr<Executor> executor;
  /// Asked before compiling a key nobody is compiling now: a cached binary, or a cached failure (a compile
  /// error remembered so a broken configuration is not recompiled every run), or nullopt (compile it).
  /// Called on the requesting thread, outside the gate's lock; must be thread-safe. Given the key and the
  /// target's arch (a remote cache files binaries by arch).
  std::function<std::optional<Result<Binary>>(const KernelKey&, std::string_view arch)> lookup;
  /// Called once per successful compile, to store the binary. Runs as a task on `callbacks`, before the
  /// future completes (so whoever sees the future ready will also find the binary in the cache).
  std::function<void(const Binary&)> on_compiled;
  /// Called once per deterministic failure (kCompileError, kInvalidArgument), to remember it. Crashes,
  /// timeouts, cancellations and shutdown are not reported: they say nothing about the kernel.
  std::function<void(const KernelKey&, const Status&)> on_failed;
  /// Applied to every compile (want_ptx, use_pch, pch_dir; `stop` is ignored). Default: CompileSettings{}.
  CompileSettings settings;
  /// Where the hooks and the gate's bookkeeping run. Default: default_task_runner().
  std::shared_ptr<TaskRunner> callbacks;
  /// One builder per key across the processes that share a cache. Asked after a `lookup` miss: kBuild
  /// compiles (and releases the claim once on_compiled/on_failed ran), kFailed completes with the recorded
  /// failure, kWait keeps the request waiting without compiling: a gate thread calls `lookup` again after
  /// `claim_poll_min`, doubling up to `claim_poll_max`, and asks `claims` again each time, so a build that is
  /// given up, or whose builder died, is taken over here. Null (the default): every miss is compiled here.
  std::shared_ptr<BuildClaims> claims;
  std::chrono::milliseconds claim_poll_min{10};
  std::chrono::milliseconds claim_poll_max{250};
};

struct GateCounters {
  uint64_t requests = 0;
  uint64_t joined = 0;           // requests that joined a compile already in flight (single flight)
  uint64_t cache_hits = 0;       // binaries from lookup that were there before this gate compiled them
  uint64_t cached_failures = 0;  // failures from lookup, likewise
  uint64_t repeats = 0;          // lookups answered with what this gate itself compiled earlier
  uint64_t compiles = 0;         // jobs submitted to the executor
  uint64_t compiled = 0;         // of those, successes
  uint64_t failed = 0;           // of those, errors of any kind but a withdrawal
  uint64_t withdrawn = 0;        // of those, stopped because every requester withdrew (kCancelled)
  uint64_t claim_waits = 0;      // keys another process was building when asked (claims only)
  uint64_t claim_hits = 0;       // of those, binaries that then appeared in the cache
  uint64_t claim_failures = 0;   // failures another process's build recorded
  uint64_t took_over = 0;        // compiles of keys whose claim expired or whose builder died
};

/// A batch of compiles with its progress. `futures[i]` belongs to the i-th source given.
struct Batch {
  std::vector<Future<Binary>> futures;
  std::shared_ptr<ProgressTracker> progress;
  /// Completes when every compile of the batch has; fails with the first failure (see when_all).
  Future<std::vector<Binary>> all;
};

class PrecompileGate {
 public:
  /// kInvalidArgument without an executor.
  static Result<std::unique_ptr<PrecompileGate>> create(GateOptions options);
  ~PrecompileGate();
  PrecompileGate(const PrecompileGate&) = delete;
  PrecompileGate& operator=(const PrecompileGate&) = delete;

  /// The binary of `source` for `target`: from a compile already in flight for the same key, from the
  /// cache hook, or from a new compile at `priority` (default kNormal). Never blocks on a compile.
  /// Cancelling the returned future withdraws this request; the compile stops once every request sharing it
  /// has withdrawn. `cost_hint`: the expected compile time (CompileJob::cost_hint; 0 unknown), which orders the
  /// executor's queue longest first within a priority. Thread-safe.
  Future<Binary> precompile(const KernelSource& source, const Target& target, Priority priority = Priority::kNormal,
                            double cost_hint = 0);

  /// A subgraph's kernels: completes once all are compiled, with their binaries in order, or with the first
  /// failure (see when_all). Thread-safe.
  Future<std::vector<Binary>> precompile_all(const std::vector<KernelSource>& sources, const Target& target,
                                             Priority priority = Priority::kNormal);

  /// For a choice with nothing to compile (a cuBLAS algorithm): a ready future of no binaries.
  static Future<std::vector<Binary>> nothing_to_compile();

  /// Many kernels at once (a warm-up, a tuning space), with progress; default priority kBackground.
  /// `on_progress`, if given, runs after each completion (on a callback thread).
  Batch precompile_batch(const std::vector<KernelSource>& sources, const Target& target,
                         Priority priority = Priority::kBackground,
                         std::function<void(const ProgressSnapshot&)> on_progress = {});

  /// Moves the compile of `key` that is in flight here up to `priority`, as a request at that priority would,
  /// without being one: nothing to withdraw, and a speculative compile stays speculative. No effect on a key not
  /// in flight or already at least that high. Thread-safe.
  void raise(const KernelKey& key, Priority priority);

  /// Whether this gate compiled `key` for kSpeculative requests only, and nothing has asked for it since: a
  /// binary in the cache that no plan wanted (a tune counts it as a cached candidate only once something did).
  bool speculative_only(const KernelKey& key) const;

  GateCounters counters() const;
  Executor& executor() const;

  struct Impl;

 private:
  explicit PrecompileGate(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln
