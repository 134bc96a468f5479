// The in-process executors: inline (compiles inside submit) and the capped oneTBB arena.
#include <oneapi/tbb/task_arena.h>

#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "job_queue.h"
#include "tbb_budget.h"

namespace kiln {
namespace pool_detail {

JobId next_job_id() {
  static std::atomic<JobId> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Status shutdown_error(const std::string& name) {
  return make_error(ErrorCode::kShutdown, fmt::format("pool shut down before compiling '{}'", name));
}

Status cancelled_in_queue_error(const std::string& name) {
  return make_error(ErrorCode::kCancelled, fmt::format("compile of '{}' cancelled before it started", name));
}

}  // namespace pool_detail

namespace {

using pool_detail::Job;
using pool_detail::JobQueue;
using pool_detail::complete;

CompileFn or_default(CompileFn fn) {
  if (fn) return fn;
  return [](const KernelSource& s, const Target& t, const CompileSettings& c) { return compile(s, t, c); };
}

// A compiler that throws must fail its job, not terminate a pool thread.
Result<Binary> guarded_compile(const CompileFn& fn, const KernelSource& s, const Target& t, const CompileSettings& c) {
  try {
    return fn(s, t, c);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("the compiler threw while compiling '{}': {}", s.name, e.what()));
  } catch (...) {
    return make_error(ErrorCode::kInternal, fmt::format("the compiler threw while compiling '{}'", s.name));
  }
}

class InlineExecutor final : public Executor {
 public:
  explicit InlineExecutor(CompileFn compile) : compile_(or_default(std::move(compile))) {}

  Submission submit(CompileJob job) override {
    Promise<Binary> promise;
    Submission out{promise.future(), pool_detail::next_job_id()};
    std::lock_guard lock(mu_);
    ++counters_.submitted;
    ++counters_.completed;
    Result<Binary> r = shut_down_ ? Result<Binary>(pool_detail::shutdown_error(job.source.name))
                                  : guarded_compile(compile_, job.source, job.target, job.settings);
    if (!r.ok()) ++counters_.failed;
    promise.set(std::move(r));
    return out;
  }
  void raise_priority(JobId, Priority) override {}
  void shutdown() override {
    std::lock_guard lock(mu_);
    shut_down_ = true;
  }
  std::string_view kind() const override { return "inline"; }
  int concurrency() const override { return 1; }
  ExecutorCounters counters() const override {
    std::lock_guard lock(mu_);
    return counters_;
  }

 private:
  CompileFn compile_;
  // Inline compiles are serialised: "inline" means one compile at a time, whichever thread asks.
  mutable std::mutex mu_;
  ExecutorCounters counters_;
  bool shut_down_ = false;
};

// Shared with the cancel hooks of its futures, which may outlive the executor: they hold a weak_ptr.
struct ArenaCore : std::enable_shared_from_this<ArenaCore> {
  ArenaCore(int threads, CompileFn fn, std::shared_ptr<TaskRunner> runner)
      : reservation(threads),
        arena(threads, 0),
        concurrency(threads),
        compile(std::move(fn)),
        callbacks(std::move(runner)) {}

  pool_detail::ThreadReservation reservation;
  tbb::task_arena arena;
  const int concurrency;
  const CompileFn compile;
  const std::shared_ptr<TaskRunner> callbacks;

  std::mutex mu;
  std::condition_variable idle;
  JobQueue queue;
  std::unordered_map<JobId, std::stop_source> running;
  size_t tasks_in_flight = 0;  // enqueued arena tasks not yet finished
  bool shut_down = false;
  ExecutorCounters counters;

  void finish(Job& job, Result<Binary> r) { complete(mu, counters, job, std::move(r)); }

  // One arena task: runs the best queued job, which need not be the one whose submit enqueued it.
  void run_one() {
    std::unique_ptr<Job> job;
    {
      std::lock_guard lock(mu);
      job = queue.pop();
      if (job) running.emplace(job->id, job->stop);
    }
    if (job) {
      CompileSettings settings = job->job.settings;
      settings.stop = job->stop.get_token();
      Result<Binary> r = guarded_compile(compile, job->job.source, job->job.target, settings);
      bool stopped_by_shutdown;
      {
        std::lock_guard lock(mu);
        running.erase(job->id);
        stopped_by_shutdown = shut_down;
      }
      if (!r.ok() && r.status().code() == ErrorCode::kCancelled && stopped_by_shutdown &&
          !job->promise.cancel_requested()) {
        r = pool_detail::shutdown_error(job->name());
      }
      finish(*job, std::move(r));
    }
    std::lock_guard lock(mu);
    if (--tasks_in_flight == 0) idle.notify_all();
  }

  void cancel(JobId id) {
    std::unique_ptr<Job> job;
    {
      std::lock_guard lock(mu);
      job = queue.remove(id);
      if (!job) {
        if (auto it = running.find(id); it != running.end()) it->second.request_stop();
        return;
      }
    }
    Status s = pool_detail::cancelled_in_queue_error(job->name());
    finish(*job, std::move(s));
  }
};

class ArenaExecutor final : public Executor {
 public:
  explicit ArenaExecutor(ArenaOptions o)
      : core_(std::make_shared<ArenaCore>(o.threads > 0 ? o.threads : available_cores(), or_default(std::move(o.compile)),
                                          o.callbacks ? o.callbacks : default_task_runner())) {}
  ~ArenaExecutor() override { shutdown(); }

  Submission submit(CompileJob job) override {
    auto owned = std::make_unique<Job>(pool_detail::next_job_id(), std::move(job), core_->callbacks);
    Job& j = *owned;
    Submission out{j.promise.future(), j.id};
    std::weak_ptr<ArenaCore> weak = core_;
    // Set before the job is queued (after that another thread may run and free it). No one holds the
    // future yet, so the hook cannot run before the job is in the queue.
    j.promise.on_cancel([weak, id = j.id] {
      if (auto core = weak.lock()) core->cancel(id);
    });
    {
      std::unique_lock lock(core_->mu);
      ++core_->counters.submitted;
      if (core_->shut_down) {
        lock.unlock();
        core_->finish(j, pool_detail::shutdown_error(j.name()));
        return out;
      }
      ++core_->tasks_in_flight;
      core_->queue.push(std::move(owned));
    }
    // `j` may already be running or done here. A raw pointer: shutdown() (run by the destructor) waits for
    // every task, and the core must never be destroyed on one of its own arena's threads.
    core_->arena.enqueue([core = core_.get()] { core->run_one(); });
    return out;
  }

  void raise_priority(JobId id, Priority priority) override {
    std::lock_guard lock(core_->mu);
    core_->queue.raise(id, priority);
  }

  void shutdown() override {
    std::vector<std::unique_ptr<Job>> queued;
    {
      std::lock_guard lock(core_->mu);
      core_->shut_down = true;
      queued = core_->queue.take_all();
      for (auto& [id, stop] : core_->running) stop.request_stop();
    }
    for (auto& job : queued) core_->finish(*job, pool_detail::shutdown_error(job->name()));
    // The tasks of the jobs just failed find the queue empty and return at once.
    std::unique_lock lock(core_->mu);
    core_->idle.wait(lock, [&] { return core_->tasks_in_flight == 0; });
  }

  std::string_view kind() const override { return "arena"; }
  int concurrency() const override { return core_->concurrency; }
  ExecutorCounters counters() const override {
    std::lock_guard lock(core_->mu);
    ExecutorCounters c = core_->counters;
    c.queued = core_->queue.size();
    c.running = core_->running.size();
    return c;
  }

 private:
  std::shared_ptr<ArenaCore> core_;
};

}  // namespace

std::unique_ptr<Executor> make_inline_executor(CompileFn compile) {
  return std::make_unique<InlineExecutor>(std::move(compile));
}

std::unique_ptr<Executor> make_arena_executor(ArenaOptions options) {
  return std::make_unique<ArenaExecutor>(std::move(options));
}

}  // namespace kiln
