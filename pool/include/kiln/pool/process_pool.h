// The process pool: compile workers in separate processes, so that a compiler crash, hang or leak costs one
// job and one worker, never the host.
//
// Workers are the small executable kiln-compile-worker, started with posix_spawn by one pool thread (never a
// fork() of the host, which may hold threads and a CUDA context). Requests and results cross a socket pair in
// versioned, length-prefixed kiln::codec frames (pool/src/wire.h). A worker that crashes, is killed or passes its job's
// timeout fails that job only (the error names the kernel, the signal or exit status and the tail of the
// worker's stderr) and is replaced. Workers exit when the host dies (PR_SET_PDEATHSIG, plus a thread that
// exits on EOF of the request socket), are recycled after max_jobs_per_worker jobs, and shutdown never
// waits for a compile: pending futures fail with kShutdown ("pool shut down") and every worker is reaped.
// Until every first worker has said hello, jobs run in a host arena, so start-up never delays a compile.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/pool/executor.h"

namespace kiln {

/// What the pool tells its observer (tests use these as sync points; a CLI may log them).
struct PoolEvent {
  enum class Kind {
    kWorkerSpawned,  // pid known, not yet ready
    kWorkerReady,    // said hello; detail: start-up time
    kPoolReady,      // every first worker is ready; jobs now go to workers
    kJobSent,        // job handed to worker `pid`
    kJobDone,        // its result arrived (ok or a compile error)
    kJobFailed,      // crash, timeout, cancel or shutdown; detail: the error
    kWorkerExited,   // reaped; detail: "exit status 0", "killed by signal 9 (Killed)"
  };
  Kind kind;
  int pid = 0;
  JobId job = 0;
  std::string kernel;
  std::string detail;
};

struct ProcessPoolOptions {
  /// Worker processes; 0 (the default): available_cores().
  int workers = 0;
  /// The worker executable. Empty (the default): $KILN_COMPILE_WORKER, else kiln-compile-worker next to the
  /// running executable, else the one installed in kiln's install prefix (bin/).
  std::string worker_path;
  /// A job running longer than this is killed with its worker and fails with kTimeout. Default 10 minutes.
  std::chrono::milliseconds job_timeout = std::chrono::minutes(10);
  /// A worker that has not said hello by then is killed and replaced. Default 60 s.
  std::chrono::milliseconds startup_timeout = std::chrono::seconds(60);
  /// A worker is replaced by a fresh one after this many jobs (bounds leaks in the compiler); 0: never.
  /// Default 256.
  int max_jobs_per_worker = 256;
  /// How much of each worker's stderr is kept for error messages. Default 4 KiB.
  size_t stderr_tail_bytes = 4096;
  /// Threads of the host arena that runs compiles until the workers are ready; 0 (the default): `workers`.
  int host_threads = 0;
  /// The host arena's compiler. Default: kiln::compile.
  CompileFn host_compile;
  /// Where then() continuations run. Default: default_task_runner().
  std::shared_ptr<TaskRunner> callbacks;
  /// Called on the pool's I/O thread for each event; must be quick and must not call into the pool.
  std::function<void(const PoolEvent&)> observer;
  /// Test only: lets a job's source inject a fault into its worker, through the option
  /// "-DKILN_WORKER_TEST=<what>": segv, abort, exit3 (exit status 3) and hang after reading the request,
  /// or echo (no compile: an empty binary whose log holds the worker's receive/reply times, for overhead
  /// measurements). Without this flag the define is an ordinary macro and the kernel compiles normally.
  bool enable_test_faults = false;
  /// Extra "NAME=value" environment entries for the workers (they inherit the host's environment).
  std::vector<std::string> worker_env;
  /// Pins each worker to one CPU of the host's affinity set (the least used by live workers), so that a compile
  /// keeps its core's caches. Unset: $KILN_POOL_PIN ("1" pins), else off. Best effort: a CPU the kernel
  /// refuses leaves the worker unpinned.
  std::optional<bool> pin_workers;
  /// The workers' CPU priority: each worker sets this nice value (0-19) on itself before anything else, so that
  /// the process that started the pool (a tune measuring on the GPU while the pool compiles on every core) gets
  /// a CPU as soon as it wakes. Unset: $KILN_POOL_NICE, else kDefaultWorkerNice. 0 leaves the host's.
  std::optional<int> worker_nice;
  /// Each worker moves NVRTC's code (~72 MB) onto transparent huge pages when it starts
  /// (pool/src/huge_text.h), where the machine's THP setting allows it (`madvise` or `always`). Unset:
  /// $KILN_POOL_HUGE_TEXT ("0" or "1"), else kDefaultHugeText. A worker that cannot move it compiles as before.
  std::optional<bool> huge_text;
};
/// 19: on the H200 machine (16 cores, Linux 6.18; 1 Dec 2026, bench/tuning/nice_ab.sh, two passes of the
/// suite's default tunes) the first half of the suite tuned in 0.125 s a problem against 0.138-0.157 with the
/// workers at the host's priority, and its measuring took 0.6-0.8 s less; the compile-bound second half was
/// unchanged (0.163-0.166 s). The workers still take every CPU nobody else wants.
inline constexpr int kDefaultWorkerNice = 19;
/// On: on the H200 machine (16 cores, THP `madvise`; 2 Dec 2026, bench/pool/huge_text_ab.sh, three passes) a
/// worker compiled kiln's wgmma configurations in a median 0.32-0.37 s against 0.45-0.50 s with NVRTC's code on
/// 4 KiB pages, and 16 workers compiled 7-23 % more kernels a second in 5 of 6 paired batches. Each worker
/// copies for ~35 ms after its hello, before its first compile, and holds ~72 MB of private memory more.
inline constexpr bool kDefaultHugeText = true;

struct ProcessPoolStats {
  int workers_alive = 0;
  int workers_ready = 0;
  uint64_t workers_spawned = 0;
  uint64_t crashes = 0;        // workers that died on their own (busy or idle)
  uint64_t timeouts = 0;       // jobs killed for passing their timeout
  uint64_t recycled = 0;       // workers retired after max_jobs_per_worker
  uint64_t jobs_in_workers = 0;
  uint64_t jobs_in_host = 0;   // run in the host arena before the pool was ready
  std::vector<double> startup_seconds;  // spawn to hello, for each worker that said hello (oldest first)
  /// Why the pool stopped starting workers (three in a row died or failed to say hello) and sends every job
  /// to the host arena; empty while it has not.
  std::string gave_up;
};

class ProcessPool final : public Executor {
 public:
  /// Finds the worker executable and starts `workers` workers; returns at once, without waiting for them.
  /// Errors: kNotFound (no worker executable), kInvalidArgument (bad options), kIoError (no pipes).
  static Result<std::unique_ptr<ProcessPool>> start(ProcessPoolOptions options = {});
  ~ProcessPool() override;
  ProcessPool(const ProcessPool&) = delete;
  ProcessPool& operator=(const ProcessPool&) = delete;

  /// True once every first worker has said hello; from then on jobs go to workers.
  bool ready() const;
  /// Waits until ready() (true) or `timeout` passes (false).
  bool wait_ready(std::chrono::milliseconds timeout) const;
  /// The pids of the live workers.
  std::vector<int> worker_pids() const;
  ProcessPoolStats stats() const;
  /// The worker executable in use.
  const std::string& worker_path() const;

  Submission submit(CompileJob job) override;
  void raise_priority(JobId id, Priority priority) override;
  void shutdown() override;
  std::string_view kind() const override { return "process"; }
  int concurrency() const override;
  ExecutorCounters counters() const override;

  struct Impl;

 private:
  explicit ProcessPool(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// The worker executable `explicit_path` names, or the one found by the search order of
/// ProcessPoolOptions::worker_path. kNotFound (listing the places tried) when none is executable.
Result<std::string> find_worker_executable(const std::string& explicit_path = {});

/// The handshake: starts `path` as a compile worker and waits up to `timeout` for its hello, whose frame
/// carries the wire version. kFailedPrecondition naming the path when it is not a kiln compile worker of this
/// version: it exits or dies first, sends something else, or stays silent until the timeout (then it is
/// killed). Never leaves a process behind.
Status check_compile_worker(const std::string& path, std::chrono::milliseconds timeout);

}  // namespace kiln
