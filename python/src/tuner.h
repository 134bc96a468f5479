// kiln.Tuner: a kiln::runtime::Tuner per device over one cache, and the selections the ops have resolved,
// looked up in O(1) by a small key on every call (the lean eager path).
//
// A call whose problem has no selection yet (a miss) tunes it through the cache's mode: tune measures what is
// missing, use takes the cached decision or the op's default choice, strict takes the cached decision or
// raises kiln.NotTunedError. Inside CUDA-graph capture nothing is tuned, allocated or synchronised: a miss
// runs the selection of the nearest tuned size of the same problem (its kernels take any size), or, when
// there is none or the mode is strict, raises (kiln.torch then runs its torch fallback, except in strict).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/cache/remote.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/executor.h"
#include "kiln/runtime/tuner.h"

namespace kiln::py {

/// What identifies a selection: everything that changes the problem except the dynamic size (M, rows),
/// which is `size`. Plain bytes, hashed and compared as such.
struct OpKey {
  int64_t size = 0;       // M for gemm, rows for norms and softmax
  int64_t n = 0, k = 0;   // gemm: N, K; norms and softmax: cols, 0
  int32_t device = 0;
  uint16_t epilogue = 0;  // interned epilogue text (gemm)
  uint8_t op = 0;         // kGemm, kRmsNorm, kSoftmax
  uint8_t dtype = 0, dtype_b = 0, dtype_out = 0, layout_a = 0, layout_b = 0, flags = 0, pad = 0;

  OpKey family() const {
    OpKey f = *this;
    f.size = 0;
    return f;
  }
  bool operator==(const OpKey& o) const;
};
struct OpKeyHash {
  size_t operator()(const OpKey& k) const;
};
enum OpCode : uint8_t { kGemm = 1, kRmsNorm = 2, kSoftmax = 3 };

struct TunerOptions {
  std::string cache_dir;  // empty: the default folder
  std::string mode;       // empty: $KILN_TUNE_MODE, else tune
  std::string executor;   // empty: kiln's default
  int configs = 0;  // template configurations per template; 0: the effort's sample (as kiln tune)
  std::optional<std::string> remote;    // the fleet's remote cache; nullopt: $KILN_REMOTE_CACHE; "": none
  std::optional<std::string> key_file;  // the fleet key; nullopt: $KILN_CACHE_KEY_FILE; "": none
  bool allow_unsigned = false;          // true: without a key, unsigned binaries travel (else the environment's)
};

/// The remote options `remote`/`key_file`/`allow_unsigned` name over the environment's (nullopt: as TunerOptions
/// says); nullopt when no remote is named. Errors: kInvalidArgument (a malformed URL or variable).
Result<std::optional<cache::RemoteOptions>> remote_options(const std::optional<std::string>& remote,
                                                           const std::optional<std::string>& key_file,
                                                           bool allow_unsigned);
/// The process's tier for these options (one per URL, key file and policy, shared by every tuner and cache call
/// while one holds it, so that a process has one write-behind queue and one breaker per remote). Connects lazily.
/// Errors: those of RedisTier::open (a bad URL, an unreadable key file: never the key itself).
Result<std::shared_ptr<cache::RedisTier>> shared_remote(const cache::RemoteOptions& options);

struct TunerStats {
  uint64_t hits = 0;       // calls whose selection was ready
  uint64_t misses = 0;     // calls that resolved a selection
  uint64_t tuned = 0;      // misses that measured (no cached decision)
  uint64_t capture_nearest = 0;  // misses in capture served by the nearest tuned size
  uint64_t capture_errors = 0;   // misses in capture with nothing to run
};

struct WarmupReport {
  int problems = 0, ready = 0, from_cached_decision = 0, tuned = 0, skipped = 0, failed = 0;
  uint64_t compiled = 0;  // kernels compiled during the warm-up (0 on a precompiled cache)
  double seconds = 0;
  // Where the time went (seconds): making the device's C++ tuner (opening the cache, the context) and,
  // summed over problems, fetching cached binaries and loading them into the context; the threads used.
  double open_seconds = 0, fetch_seconds = 0, load_seconds = 0;
  int threads = 0;
  /// Background warm-up: problems an op call needed before the warm-up reached them, so the call loaded them
  /// itself (ready + taken_by_calls = problems when nothing failed).
  int taken_by_calls = 0;
  std::vector<std::string> errors;
  /// The problems that took longest to make ready (at most 8, slowest first): what to look at when start-up
  /// is slow. fetch: reading the cached binaries; load: Choice::prepare (module loads, library handles).
  struct Slow {
    std::string problem, chosen;
    double fetch_seconds = 0, load_seconds = 0;
  };
  std::vector<Slow> slowest;
};

class PyTuner {
 public:
  /// Checks the mode and executor names now (kInvalidArgument), opens the cache on first use.
  static Result<std::shared_ptr<PyTuner>> create(TunerOptions options);
  explicit PyTuner(TunerOptions options, cache::TuneMode mode);
  ~PyTuner();

  /// The ready selection for `key`, or null. Cheap; thread-safe.
  const runtime::Selection* find(const OpKey& key) const;
  /// Resolves a miss (see the top of this file). Call without the GIL. `stream` is the caller's, to see
  /// whether it is capturing.
  Result<const runtime::Selection*> resolve(const OpKey& key, const runtime::Problem& problem, CUstream stream);

  /// Tunes (or loads) every problem on `threads` threads (0: a count for the machine) and keeps their
  /// selections: after it, those calls are hits.
  Result<WarmupReport> warmup(const std::vector<runtime::Problem>& problems, int device, int threads = 0);
  /// The same warm-up on background threads; returns at once. A call of one of its problems never loads it
  /// twice and never waits for the rest: a problem the warm-up has not reached yet is taken over by the call
  /// (loaded now, skipped by the warm-up), one it is loading is waited for. Inside a graph capture a call only
  /// waits (nothing loads inside a capture): the loading threads never capture, and they run in relaxed
  /// capture mode, so a capture on another thread neither sees nor forbids their module loads.
  /// kFailedPrecondition while another warm-up runs.
  Status start_warmup(std::vector<runtime::Problem> problems, int device, int threads = 0);
  /// Waits for the background warm-up and returns its report (kNotFound when none was started).
  Result<WarmupReport> wait_warmup();
  /// True when no background warm-up is running.
  bool warmup_done() const;
  /// The problems of every decision the cache holds for `device` (and this kiln, driver and cuBLAS).
  Result<std::vector<runtime::Problem>> cached_problems(int device);

  cache::TuneMode mode() const { return mode_; }
  std::string cache_dir() const;
  TunerStats stats() const;
  std::vector<runtime::TuneReport> reports() const;
  /// The kernels compiled through this tuner's gates (all devices).
  uint64_t compiles() const;
  /// The C++ tuner for `device`, created on first use.
  Result<runtime::Tuner*> tuner(int device);
  /// The fleet's remote tier behind this tuner's cache; null when none (and in off mode).
  const std::shared_ptr<cache::RedisTier>& remote() const { return remote_; }

 private:
  TunerOptions options_;
  cache::TuneMode mode_ = cache::TuneMode::kTune;
  std::shared_ptr<cache::TuningCache> cache_;
  std::shared_ptr<cache::RedisTier> remote_;  // set by create()
  std::shared_ptr<Executor> executor_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<runtime::Tuner>> tuners_;
  std::unordered_map<OpKey, std::shared_ptr<runtime::Selection>, OpKeyHash> selections_;
  // Per problem family, tuned sizes in order: the nearest one serves a miss inside capture.
  std::unordered_map<OpKey, std::map<int64_t, runtime::Selection*>, OpKeyHash> families_;
  mutable TunerStats stats_;
  std::mutex tune_mu_;  // one miss resolves at a time (the tuner benchmarks one problem at a time anyway)
  struct Background;  // a background warm-up (tuner.cpp)
  std::shared_ptr<Background> background_;
  Status keep(const OpKey& key, std::shared_ptr<runtime::Selection> sel);
  Result<WarmupReport> run_warmup(const std::vector<runtime::Problem>& problems, int device, int threads,
                                  Background* bg);
  /// True when the call takes `key` over from a background warm-up that has not reached it (the caller then
  /// loads it and calls background_done); otherwise waits while the warm-up is loading it.
  bool claim_or_wait(const OpKey& key, bool may_claim);
  void background_done(const OpKey& key);
};

/// The key of a built-in problem (gemm, rmsnorm, softmax) on `device`; kUnimplemented for other ops.
Result<OpKey> key_of(const runtime::Problem& problem, int device);
uint16_t intern_epilogue(const std::string& text);

/// The process's Store for `dir` (empty: the default folder), shared by every tuner and cache call.
Result<std::shared_ptr<cache::Store>> shared_store(const std::string& dir);

/// The tuner the ops use: the innermost `with Tuner` / autotune(), else the default one (made on first use
/// from the environment, or set by kiln.warmup).
std::shared_ptr<PyTuner> current_tuner();

}  // namespace kiln::py
