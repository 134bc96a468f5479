#include "kiln/pool/gate.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace kiln {
namespace {

// One compile that one or more requests share.
struct Flight {
  explicit Flight(std::shared_ptr<TaskRunner> runner) : promise(std::move(runner)) {}
  Promise<Binary> promise;
  Future<Binary> future = promise.future();
  Future<Binary> exec;  // the executor's future, once submitted
  JobId job = 0;
  Priority priority = Priority::kNormal;
  double cost_hint = 0;    // the first request's (CompileJob::cost_hint)
  int interest = 0;        // requests that have not withdrawn
  bool withdrawn = false;  // every request withdrew: the compile is being cancelled
  bool done = false;
  bool claimed = false;    // this process holds the key's build claim: released once the result is stored
  bool wanted = false;     // a request above kSpeculative came (a raise() is not one)
};

// A request waiting for another process's build of its key (GateOptions::claims).
struct Waiter {
  std::shared_ptr<Flight> flight;
  KernelKey key;
  KernelSource source;
  Target target;
  std::chrono::steady_clock::time_point due;
  std::chrono::milliseconds delay;
};

// Failures that the same source would meet again, so they are cached. A compile that passed its timeout
// (a macro bomb, say) is one: retried, it would cost the whole timeout again, every time.
bool deterministic_failure(const Status& s) {
  return s.code() == ErrorCode::kCompileError || s.code() == ErrorCode::kInvalidArgument ||
         s.code() == ErrorCode::kTimeout;
}

}  // namespace

struct PrecompileGate::Impl : std::enable_shared_from_this<PrecompileGate::Impl> {
  GateOptions opt;
  std::shared_ptr<TaskRunner> runner;

  std::mutex mu;
  std::condition_variable idle;
  std::unordered_map<KernelKey, std::shared_ptr<Flight>> flights;
  std::unordered_set<KernelKey> compiled_here;  // keys this gate sent to the executor
  std::unordered_set<KernelKey> speculative;    // of those, compiled for speculative requests only, not asked for since
  size_t active = 0;  // flights not yet completed (their hooks included)
  bool closed = false;
  GateCounters counters;
  std::vector<Waiter> waiters;  // under mu
  std::condition_variable waiters_changed;
  std::thread waiter_thread;    // started with the first waiter

  ClaimReply claim(const KernelKey& key) {
    try {
      return opt.claims->claim(key);
    } catch (...) {
      return ClaimReply{};  // claims unusable: build here
    }
  }

  std::optional<Result<Binary>> lookup(const KernelKey& key, std::string_view arch) {
    if (!opt.lookup) return std::nullopt;
    // The hook is someone else's code (the cache); a throw there is a miss, not a dead pool thread.
    try {
      return opt.lookup(key, arch);
    } catch (...) {
      return std::nullopt;
    }
  }

  // Stores (through the hooks) and publishes a flight's result. Runs once per flight.
  void complete(const std::shared_ptr<Flight>& f, const KernelKey& key, Result<Binary> r, bool from_executor) {
    if (from_executor) {
      try {
        if (r.ok() && opt.on_compiled) opt.on_compiled(*r);
        if (!r.ok() && opt.on_failed && deterministic_failure(r.status())) opt.on_failed(key, r.status());
      } catch (...) {
        // A failing store loses a cache entry, never the compile's result.
      }
    }
    // Released after the store, so that a process told "built" finds the binary.
    if (f->claimed) {
      try {
        opt.claims->release(key, r.ok() ? Status() : r.status(), !r.ok() && from_executor && deterministic_failure(r.status()));
      } catch (...) {
      }
    }
    {
      std::lock_guard lock(mu);
      if (auto it = flights.find(key); it != flights.end() && it->second == f) flights.erase(it);
      f->done = true;
      if (from_executor) {
        compiled_here.insert(key);
        if (r.ok() && !f->wanted) speculative.insert(key);
        if (r.ok()) {
          ++counters.compiled;
        } else if (r.status().code() == ErrorCode::kCancelled) {
          ++counters.withdrawn;
        } else {
          ++counters.failed;
        }
      }
    }
    f->promise.set(std::move(r));
    std::lock_guard lock(mu);
    if (--active == 0) idle.notify_all();
  }

  void withdraw(const std::shared_ptr<Flight>& f) {
    Future<Binary> exec;
    {
      std::lock_guard lock(mu);
      if (f->done || --f->interest > 0) return;
      f->withdrawn = true;
      exec = f->exec;
    }
    waiters_changed.notify_all();  // a request waiting for another process's build ends now
    // Not yet submitted: the requester that is looking it up sees `withdrawn` before submitting.
    if (exec.valid()) exec.cancel();
  }

  Future<Binary> precompile(const KernelSource& source, const Target& target, Priority priority, double cost_hint) {
    const KernelKey key = make_key(source, target);
    std::shared_ptr<Flight> f;
    bool leader = false;
    JobId raise_job = 0;
    {
      std::lock_guard lock(mu);
      ++counters.requests;
      if (priority > Priority::kSpeculative) speculative.erase(key);
      if (closed) {
        return make_ready_future<Binary>(
            make_error(ErrorCode::kShutdown, fmt::format("pool shut down before compiling '{}'", source.name)));
      }
      auto it = flights.find(key);
      if (it != flights.end() && !it->second->withdrawn) {
        f = it->second;
        ++f->interest;
        ++counters.joined;
        f->wanted = f->wanted || priority > Priority::kSpeculative;
        if (priority > f->priority) {
          f->priority = priority;
          raise_job = f->job;  // 0 while the leader is still looking it up; it reads f->priority before submitting
        }
      } else {
        f = std::make_shared<Flight>(runner);
        f->priority = priority;
        f->cost_hint = cost_hint;
        f->interest = 1;
        f->wanted = priority > Priority::kSpeculative;
        flights[key] = f;
        ++active;
        leader = true;
      }
    }
    std::weak_ptr<Impl> weak = weak_from_this();
    Future<Binary> mine = f->future.with_canceller([weak, f] {
      if (auto self = weak.lock()) self->withdraw(f);
    });
    if (!leader) {
      if (raise_job != 0) opt.executor->raise_priority(raise_job, priority);
      return mine;
    }

    if (auto hit = lookup(key, target.arch)) {
      {
        std::lock_guard lock(mu);
        // What this gate compiled itself and then found in the cache was not "already cached".
        if (compiled_here.count(key)) ++counters.repeats;
        else ++(hit->ok() ? counters.cache_hits : counters.cached_failures);
      }
      complete(f, key, std::move(*hit), false);
      return mine;
    }

    if (opt.claims) {
      ClaimReply reply = claim(key);
      if (reply.verdict == ClaimVerdict::kFailed) {
        {
          std::lock_guard lock(mu);
          ++counters.claim_failures;
        }
        complete(f, key, std::move(reply.failure), false);
        return mine;
      }
      if (reply.verdict == ClaimVerdict::kWait) {
        wait_for_peer(f, key, source, target);
        return mine;
      }
      std::lock_guard lock(mu);
      f->claimed = true;
      if (reply.took_over) ++counters.took_over;
    }
    submit(f, key, source, target);
    return mine;
  }

  void raise(const KernelKey& key, Priority priority) {
    JobId job = 0;
    {
      std::lock_guard lock(mu);
      auto it = flights.find(key);
      if (it == flights.end() || it->second->withdrawn || it->second->done || priority <= it->second->priority) return;
      it->second->priority = priority;
      job = it->second->job;  // 0 while its leader is still looking it up: the submit reads the priority
    }
    if (job != 0) opt.executor->raise_priority(job, priority);
  }

  bool speculative_only(const KernelKey& key) {
    std::lock_guard lock(mu);
    return speculative.count(key) > 0;
  }

  // Sends a flight's compile to the executor.
  void submit(const std::shared_ptr<Flight>& f, const KernelKey& key, const KernelSource& source, const Target& target) {
    CompileJob job;
    job.source = source;
    job.target = target;
    job.settings = opt.settings;
    job.settings.stop = {};
    bool withdrawn_early;
    {
      std::lock_guard lock(mu);
      withdrawn_early = f->withdrawn;
      job.priority = f->priority;
      job.cost_hint = f->cost_hint;
    }
    if (withdrawn_early) {
      complete(f, key, make_error(ErrorCode::kCancelled, fmt::format("compile of '{}' cancelled before it started", source.name)),
               false);
      return;
    }
    Submission sub = opt.executor->submit(std::move(job));
    bool withdrawn;
    Priority now;
    {
      std::lock_guard lock(mu);
      f->exec = sub.future;
      f->job = sub.id;
      ++counters.compiles;
      withdrawn = f->withdrawn;
      now = f->priority;
    }
    // Withdrawals and raises that raced with the submit above.
    if (withdrawn) sub.future.cancel();
    if (now > job.priority) opt.executor->raise_priority(sub.id, now);

    // The hooks may be slow (a database write): run them as a task, not on the executor's thread.
    auto self = shared_from_this();
    Future<Binary> exec = sub.future;
    exec.notify([self, f, key, exec] {
      self->runner->post([self, f, key, exec] { self->complete(f, key, exec.get(), true); });
    });
  }

  // Another process builds `key`: park the flight until its binary shows up, its failure is recorded, or the
  // claim comes free (then it is built here).
  void wait_for_peer(const std::shared_ptr<Flight>& f, const KernelKey& key, const KernelSource& source,
                     const Target& target) {
    {
      std::lock_guard lock(mu);
      ++counters.claim_waits;
      if (!closed) {
        waiters.push_back({f, key, source, target, std::chrono::steady_clock::now() + opt.claim_poll_min, opt.claim_poll_min});
        if (!waiter_thread.joinable()) waiter_thread = std::thread([this] { watch_waiters(); });
        waiters_changed.notify_all();
        return;
      }
    }
    complete(f, key, make_error(ErrorCode::kShutdown, fmt::format("pool shut down before compiling '{}'", source.name)), false);
  }

  // The waiter thread: looks each waiting key up again when it is due, with a growing delay.
  void watch_waiters() {
    std::unique_lock lock(mu);
    while (!closed) {
      auto now = std::chrono::steady_clock::now();
      auto next = std::chrono::steady_clock::time_point::max();
      std::vector<Waiter> due;
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->due <= now || it->flight->withdrawn) {
          due.push_back(std::move(*it));
          it = waiters.erase(it);
        } else {
          next = std::min(next, it->due);
          ++it;
        }
      }
      if (due.empty()) {
        if (next == std::chrono::steady_clock::time_point::max()) waiters_changed.wait(lock);
        else waiters_changed.wait_until(lock, next);
        continue;
      }
      lock.unlock();
      for (auto& w : due) poll(std::move(w));
      lock.lock();
    }
  }

  void poll(Waiter w) {
    const std::shared_ptr<Flight>& f = w.flight;
    bool withdrawn, shut;
    {
      std::lock_guard lock(mu);
      withdrawn = f->withdrawn;
      shut = closed;
    }
    if (shut) {
      return complete(f, w.key, make_error(ErrorCode::kShutdown, fmt::format("pool shut down while '{}' was built by another process", w.source.name)), false);
    }
    if (withdrawn) {
      return complete(f, w.key, make_error(ErrorCode::kCancelled, fmt::format("wait for '{}' cancelled", w.source.name)), false);
    }
    // The claim first: while a live builder holds it the binary cannot be there yet, and reading a claim costs
    // less than a cache lookup.
    ClaimReply reply = claim(w.key);
    if (reply.verdict == ClaimVerdict::kFailed) {
      {
        std::lock_guard lock(mu);
        ++counters.claim_failures;
      }
      return complete(f, w.key, std::move(reply.failure), false);
    }
    if (reply.verdict == ClaimVerdict::kBuild || reply.built) {
      if (auto hit = lookup(w.key, w.target.arch)) {
        // Built by the other process (a claim that came back to us with the binary stored says "built" again).
        if (reply.verdict == ClaimVerdict::kBuild) opt.claims->release(w.key, Status(), false);
        {
          std::lock_guard lock(mu);
          ++(hit->ok() ? counters.claim_hits : counters.claim_failures);
        }
        return complete(f, w.key, std::move(*hit), false);
      }
    }
    if (reply.verdict == ClaimVerdict::kBuild) {
      {
        std::lock_guard lock(mu);
        f->claimed = true;
        if (reply.took_over) ++counters.took_over;
      }
      return submit(f, w.key, w.source, w.target);
    }
    std::lock_guard lock(mu);
    w.delay = std::min(w.delay * 2, opt.claim_poll_max);
    w.due = std::chrono::steady_clock::now() + w.delay;
    waiters.push_back(std::move(w));
  }

  void close() {
    std::vector<Future<Binary>> running;
    {
      std::lock_guard lock(mu);
      closed = true;
      for (auto& [key, f] : flights) {
        f->withdrawn = true;
        if (f->exec.valid()) running.push_back(f->exec);
      }
    }
    for (auto& e : running) e.cancel();
    waiters_changed.notify_all();
    if (waiter_thread.joinable()) waiter_thread.join();
    std::vector<Waiter> left;
    {
      std::lock_guard lock(mu);
      left.swap(waiters);
    }
    for (auto& w : left) {
      complete(w.flight, w.key,
               make_error(ErrorCode::kShutdown, fmt::format("pool shut down while '{}' was built by another process", w.source.name)),
               false);
    }
    std::unique_lock lock(mu);
    idle.wait(lock, [&] { return active == 0; });
  }
};

PrecompileGate::PrecompileGate(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrecompileGate::~PrecompileGate() { impl_->close(); }

Result<std::unique_ptr<PrecompileGate>> PrecompileGate::create(GateOptions options) {
  if (!options.executor) return make_error(ErrorCode::kInvalidArgument, "GateOptions::executor is required");
  auto impl = std::make_shared<Impl>();
  impl->runner = options.callbacks ? options.callbacks : default_task_runner();
  impl->opt = std::move(options);
  return std::unique_ptr<PrecompileGate>(new PrecompileGate(std::move(impl)));
}

Future<Binary> PrecompileGate::precompile(const KernelSource& source, const Target& target, Priority priority,
                                          double cost_hint) {
  return impl_->precompile(source, target, priority, cost_hint);
}

Future<std::vector<Binary>> PrecompileGate::precompile_all(const std::vector<KernelSource>& sources,
                                                           const Target& target, Priority priority) {
  std::vector<Future<Binary>> futures;
  futures.reserve(sources.size());
  for (const auto& s : sources) futures.push_back(precompile(s, target, priority, 0));
  return when_all(std::move(futures));
}

Future<std::vector<Binary>> PrecompileGate::nothing_to_compile() {
  return make_ready_future<std::vector<Binary>>(std::vector<Binary>{});
}

Batch PrecompileGate::precompile_batch(const std::vector<KernelSource>& sources, const Target& target,
                                       Priority priority, std::function<void(const ProgressSnapshot&)> on_progress) {
  Batch batch;
  batch.progress = std::make_shared<ProgressTracker>(sources.size());
  if (on_progress) batch.progress->listen(std::move(on_progress));
  batch.futures.reserve(sources.size());
  for (const auto& s : sources) {
    Future<Binary> f = precompile(s, target, priority, 0);
    f.notify([tracker = batch.progress, f] { tracker->record(f.get().ok()); });
    batch.futures.push_back(std::move(f));
  }
  batch.all = when_all(batch.futures);
  return batch;
}

void PrecompileGate::raise(const KernelKey& key, Priority priority) { impl_->raise(key, priority); }

bool PrecompileGate::speculative_only(const KernelKey& key) const { return impl_->speculative_only(key); }

GateCounters PrecompileGate::counters() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counters;
}

Executor& PrecompileGate::executor() const { return *impl_->opt.executor; }

}  // namespace kiln
