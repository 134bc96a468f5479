#include "kiln/pool/executor.h"

#include <sched.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "kiln/enum_names.h"
#include "kiln/pool/process_pool.h"
#include "kiln/pool/subprocess.h"

namespace kiln {

std::string_view priority_name(Priority p) {
  static constexpr std::array<EnumName<Priority>, 4> kNames{{{Priority::kSpeculative, "speculative"},
                                                               {Priority::kBackground, "background"},
                                                               {Priority::kNormal, "normal"},
                                                               {Priority::kOnDemand, "on-demand"}}};
  return name_in(kNames, p, "unknown");
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

namespace {
constexpr std::array<EnumName<ExecutorKind>, 3> kExecutorKindNames{
    {{ExecutorKind::kInline, "inline"}, {ExecutorKind::kArena, "arena"}, {ExecutorKind::kProcess, "process"}}};
}  // namespace

std::string_view executor_kind_name(ExecutorKind kind) { return name_in(kExecutorKindNames, kind, "unknown"); }

Result<ExecutorKind> parse_executor_kind(std::string_view name) {
  if (auto kind = value_in(kExecutorKindNames, name)) return *kind;
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown executor '{}' (expected inline, arena or process)", name));
}

Result<std::shared_ptr<Executor>> make_executor(const ExecutorOptions& options) {
  // By default the process pool: NVRTC holds a process-wide lock for about half of every compile, so threads
  // in one process reach 1.8x on 16 cores where worker processes reach 12.5x (bench/results/pool-*). Where no
  // worker executable can be found, the arena.
  ExecutorKind kind = ExecutorKind::kProcess;
  bool chosen = false;
  if (options.kind) {
    kind = *options.kind;
    chosen = true;
  } else if (const char* env = std::getenv("KILN_EXECUTOR"); env && *env) {
    auto parsed = parse_executor_kind(env);
    if (!parsed.ok()) return std::move(parsed).status().with_context("reading $KILN_EXECUTOR");
    kind = *parsed;
    chosen = true;
  }
  const std::string explicit_path = options.process ? options.process->worker_path : std::string();
  const char* env_worker = std::getenv("KILN_COMPILE_WORKER");
  const bool named = !explicit_path.empty() || (env_worker && *env_worker);
  if (!chosen && !named) {
    if (auto found = find_worker_executable(explicit_path); !found.ok()) {
      kind = ExecutorKind::kArena;
      report_fallback_once("compile worker", fmt::format("{}; compiling in this process (a TBB arena) instead of the "
                                                         "process pool (KILN_EXECUTOR=arena says so and silences this)",
                                                         found.status().message()));
    }
  }
  if (kind == ExecutorKind::kProcess && named) {
    // A worker someone named is checked now, loudly: a typo or a wrong program must not quietly cost the
    // speed of the pool (jobs would run in the host arena) or hang the first compile.
    // Named, it must be that one: no falling back to another worker found elsewhere.
    auto path = find_worker_executable(!explicit_path.empty() ? explicit_path : std::string(env_worker));
    if (!path.ok()) return std::move(path).status().with_context("finding the compile worker named by $KILN_COMPILE_WORKER or worker_path");
    KILN_RETURN_IF_ERROR(check_compile_worker(*path, std::chrono::seconds(10)));
  }
  int workers = options.workers;
  if (workers <= 0) {
    if (const char* env = std::getenv("KILN_COMPILE_WORKERS"); env && *env) {
      char* end = nullptr;
      long n = std::strtol(env, &end, 10);
      if (*end != '\0' || n < 1 || n > 4096) {
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("$KILN_COMPILE_WORKERS='{}' is not a count from 1 to 4096", env));
      }
      workers = static_cast<int>(n);
    }
  }
  switch (kind) {
    case ExecutorKind::kInline:
      return std::shared_ptr<Executor>(make_inline_executor(options.compile));
    case ExecutorKind::kArena: {
      ArenaOptions a;
      a.threads = workers;
      a.compile = options.compile;
      a.callbacks = options.callbacks;
      return std::shared_ptr<Executor>(make_arena_executor(std::move(a)));
    }
    case ExecutorKind::kProcess: {
      ProcessPoolOptions p = options.process ? *options.process : ProcessPoolOptions{};
      if (!options.process) {
        KILN_ASSIGN_OR_RETURN(p.job_timeout, compile_timeout());
      }
      if (workers > 0) p.workers = workers;
      if (options.compile && !p.host_compile) p.host_compile = options.compile;
      if (options.callbacks && !p.callbacks) p.callbacks = options.callbacks;
      KILN_ASSIGN_OR_RETURN(auto pool, ProcessPool::start(std::move(p)));
      return std::shared_ptr<Executor>(std::move(pool));
    }
  }
  return make_error(ErrorCode::kInvalidArgument, "unknown executor kind");
}

DeferredExecutor::DeferredExecutor(std::function<Result<std::shared_ptr<Executor>>()> make, std::string kind,
                                   int concurrency)
    : make_(std::move(make)), kind_(std::move(kind)), concurrency_(concurrency) {}

DeferredExecutor::~DeferredExecutor() { shutdown(); }

void DeferredExecutor::start() { (void)get(); }

bool DeferredExecutor::started() const {
  std::lock_guard lock(mu_);
  return started_;
}

Executor* DeferredExecutor::get() {
  std::lock_guard lock(mu_);
  if (!started_ && !shut_down_) {
    started_ = true;
    auto made = make_();
    if (made.ok()) {
      made_ = std::move(made).value();
    } else {
      error_ = made.status().with_context("starting the compile executor");
      report_fallback_once("deferred executor", error_.to_string());
    }
  }
  return made_.get();
}

Submission DeferredExecutor::submit(CompileJob job) {
  if (Executor* e = get()) {
    // A process pool sends what comes before all its workers have said hello to its host arena (threads in
    // this process, where NVRTC's lock caps them). The first jobs come right after the start: they wait for
    // the workers once (~10 ms; bounded, a pool that cannot start gives up on its own), and so does any job
    // submitted meanwhile.
    std::call_once(first_submit_, [&] {
      if (auto* pool = dynamic_cast<ProcessPool*>(e)) (void)pool->wait_ready(std::chrono::seconds(2));
    });
    return e->submit(std::move(job));
  }
  std::lock_guard lock(mu_);
  Status why = shut_down_ && error_.ok()
                   ? make_error(ErrorCode::kShutdown, fmt::format("pool shut down before compiling '{}'", job.source.name))
                   : error_;
  return Submission{make_ready_future<Binary>(why), 0};
}

void DeferredExecutor::raise_priority(JobId id, Priority priority) {
  std::shared_ptr<Executor> e;
  {
    std::lock_guard lock(mu_);
    e = made_;
  }
  if (e) e->raise_priority(id, priority);
}

void DeferredExecutor::shutdown() {
  std::shared_ptr<Executor> e;
  {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    e = made_;
  }
  // Outside the lock: a job's continuation may submit while the executor winds down.
  if (e) e->shutdown();
}

std::string_view DeferredExecutor::kind() const {
  std::lock_guard lock(mu_);
  return made_ ? made_->kind() : std::string_view(kind_);
}

int DeferredExecutor::concurrency() const {
  std::lock_guard lock(mu_);
  return made_ ? made_->concurrency() : concurrency_;
}

ExecutorCounters DeferredExecutor::counters() const {
  std::lock_guard lock(mu_);
  return made_ ? made_->counters() : ExecutorCounters{};
}

Result<std::shared_ptr<Executor>> make_executor_on_demand(const ExecutorOptions& options) {
  auto env_set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  const bool configured = options.kind || options.workers > 0 || options.process || env_set("KILN_EXECUTOR") ||
                          env_set("KILN_COMPILE_WORKER") || env_set("KILN_COMPILE_WORKERS");
  if (configured) return make_executor(options);
  return std::shared_ptr<Executor>(
      std::make_shared<DeferredExecutor>([options] { return make_executor(options); }, "process", available_cores()));
}

}  // namespace kiln
