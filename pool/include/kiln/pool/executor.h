// Executor: where compiles run. Three implementations behind one interface, each returning futures:
//   inline   compiles on the calling thread (debugging, tests);
//   arena    a capped oneTBB task_arena in this process (default);
//   process  compile workers in separate processes (kiln/pool/process_pool.h), which survive NVRTC crashes
//            and hangs; until its workers are up, compiles run in a host arena.
// Chosen by ExecutorOptions or the environment: KILN_EXECUTOR=inline|arena|process, KILN_COMPILE_WORKERS=N,
// KILN_COMPILE_WORKER=/path/to/kiln-compile-worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/jit/compiler.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/target.h"
#include "kiln/pool/future.h"
#include "kiln/status.h"

namespace kiln {

/// Higher runs first among queued jobs; within a priority, a larger CompileJob::cost_hint first, then
/// submission order. A running job is never preempted.
enum class Priority : int {
  // Compiles that may never be used (what a tune might widen into): run only when nothing else waits, and
  // withdrawn once moot (a workload's plan ahead, PlanAhead).
  kSpeculative = -1,
  kBackground = 0,  // warm-up batches, precompiling a whole tuning space
  kNormal = 1,
  kOnDemand = 2,    // a serving engine waiting for this kernel now
};
std::string_view priority_name(Priority p);

/// Unique among all jobs of this process (every executor draws from one counter).
using JobId = uint64_t;

struct CompileJob {
  KernelSource source;
  Target target;
  /// want_ptx, use_pch and pch_dir are honoured; `stop` is ignored (cancel through the future instead).
  CompileSettings settings;
  Priority priority = Priority::kNormal;
  /// The expected compile time in seconds, or any measure proportional to it; 0 (the default) = unknown.
  /// Among queued jobs of one priority, the longer expected run first (jobs without a hint last, in
  /// submission order), so that a batch's long compiles do not start last and leave the other workers idle
  /// at its end. Only the order changes.
  double cost_hint = 0;
};

struct Submission {
  Future<Binary> future;
  JobId id = 0;
};

/// The compiler an in-process executor calls. Default: kiln::compile. Tests inject counting or blocking fakes.
/// Must honour `settings.stop` to be cancellable while running; must be thread-safe for the arena.
using CompileFn = std::function<Result<Binary>(const KernelSource&, const Target&, const CompileSettings&)>;

struct ExecutorCounters {
  uint64_t submitted = 0;
  uint64_t completed = 0;  // every job whose future was set, whatever its result
  uint64_t failed = 0;     // of those, the errors (compile errors, crashes, timeouts, cancellations, shutdown)
  uint64_t cancelled = 0;
  size_t queued = 0;       // now
  size_t running = 0;      // now
};

class Executor {
 public:
  virtual ~Executor() = default;

  /// Queues `job` at its priority and returns its future and id. Never blocks on compiles (the inline
  /// executor compiles before returning). After shutdown() the future fails with kShutdown. Thread-safe.
  virtual Submission submit(CompileJob job) = 0;
  /// Raises a still-queued job to `priority` (a no-op once it started, finished, or if it is already at
  /// least that high). The gate calls this when an on-demand request joins a queued background compile.
  virtual void raise_priority(JobId id, Priority priority) = 0;
  /// Fails every queued and running job with kShutdown ("pool shut down"), stops the running ones (NVRTC's
  /// flow callback, or killing the worker) and waits until nothing of the executor runs; later submits fail
  /// at once. Idempotent; the destructor calls it. Thread-safe, but not from one of the executor's own tasks.
  virtual void shutdown() = 0;

  /// "inline", "arena" or "process".
  virtual std::string_view kind() const = 0;
  /// How many compiles can run at once.
  virtual int concurrency() const = 0;
  virtual ExecutorCounters counters() const = 0;
};

/// The CPUs this process may run on (sched_getaffinity), at least 1.
int available_cores();

/// An executor that compiles on the calling thread inside submit(); its futures are ready when submit
/// returns. `compile` defaults to kiln::compile.
std::unique_ptr<Executor> make_inline_executor(CompileFn compile = {});

struct ArenaOptions {
  /// Compiles at once; 0 (the default) means available_cores(). The arena is a tbb::task_arena of this
  /// concurrency with no slot reserved for outside threads; if oneTBB's global thread limit is lower, the
  /// executor raises it (a tbb::global_control held while it lives) so the cap is reachable.
  int threads = 0;
  /// Default: kiln::compile.
  CompileFn compile;
  /// Where then() continuations of its futures run. Default: default_task_runner().
  std::shared_ptr<TaskRunner> callbacks;
};

/// A capped oneTBB task arena: jobs wait in a priority queue; each enqueued arena task runs the best queued
/// job. Cancelling a running job stops NVRTC through its flow callback.
std::unique_ptr<Executor> make_arena_executor(ArenaOptions options = {});

enum class ExecutorKind { kInline, kArena, kProcess };
std::string_view executor_kind_name(ExecutorKind kind);
/// "inline", "arena", "process" (kInvalidArgument otherwise).
Result<ExecutorKind> parse_executor_kind(std::string_view name);

struct ProcessPoolOptions;  // kiln/pool/process_pool.h

struct ExecutorOptions {
  /// Unset (the default): $KILN_EXECUTOR, else kProcess when the compile worker executable is found (NVRTC
  /// serialises much of a compile inside one process), else kArena.
  std::optional<ExecutorKind> kind;
  /// Compiles at once (threads or worker processes); 0 (the default): $KILN_COMPILE_WORKERS, else
  /// available_cores().
  int workers = 0;
  /// The in-process compiler (inline, arena, and the process pool's host arena). Default: kiln::compile.
  CompileFn compile;
  /// Where then() continuations run. Default: default_task_runner().
  std::shared_ptr<TaskRunner> callbacks;
  /// Options of the process pool (its `workers` is overridden by the field above when that is set).
  /// Null: defaults.
  std::shared_ptr<const ProcessPoolOptions> process;
};

/// The executor the options (then the environment) ask for. Errors: kInvalidArgument for an unknown
/// $KILN_EXECUTOR or a bad $KILN_COMPILE_WORKERS; the process pool's own errors (kNotFound: no worker
/// executable).
Result<std::shared_ptr<Executor>> make_executor(const ExecutorOptions& options = {});

/// An executor made by `make` when start() is called or a job first comes, whichever is first. A process
/// that finds everything it needs in the cache compiles nothing, and starting a pool of compile workers
/// would only slow its start (16 workers starting took 20-30 ms of a warm start on an H200's 16 cores);
/// its owner calls start() as soon as it knows compiles are coming, so that the pool is up before the
/// first burst of them (a process pool's first jobs wait for its workers' hello, once, rather than run in
/// its host arena). A failed make is logged once and fails every job with its error.
class DeferredExecutor final : public Executor {
 public:
  /// `kind` and `concurrency` are what kind() and concurrency() answer before the executor is made.
  DeferredExecutor(std::function<Result<std::shared_ptr<Executor>>()> make, std::string kind, int concurrency);
  ~DeferredExecutor() override;
  /// Makes the executor now (once; later calls return at once).
  void start();
  /// Whether it has been made (or failed to be).
  bool started() const;

  Submission submit(CompileJob job) override;
  void raise_priority(JobId id, Priority priority) override;
  void shutdown() override;
  std::string_view kind() const override;
  int concurrency() const override;
  ExecutorCounters counters() const override;

 private:
  Executor* get();
  std::function<Result<std::shared_ptr<Executor>>()> make_;
  std::string kind_;
  int concurrency_;
  mutable std::mutex mu_;
  bool started_ = false;
  bool shut_down_ = false;
  std::once_flag first_submit_;
  std::shared_ptr<Executor> made_;
  Status error_;
};

/// make_executor(options), deferred (a DeferredExecutor) when nothing configures it: no kind, worker count
/// or pool options in `options`, and none of $KILN_EXECUTOR, $KILN_COMPILE_WORKER, $KILN_COMPILE_WORKERS. A
/// configured executor is made (and checked) now, so that a mistake in it is reported at once.
Result<std::shared_ptr<Executor>> make_executor_on_demand(const ExecutorOptions& options = {});

}  // namespace kiln
