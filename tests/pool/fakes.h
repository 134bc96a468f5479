// Fakes for the pool tests: counting and blocking compilers, a hand-stepped task runner, an event log.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit/key.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/process_pool.h"

namespace kiln::pool_test {

inline KernelSource named(const std::string& name, std::vector<std::string> options = {}) {
  KernelSource s;
  s.name = name;
  s.entry = "k";
  s.source = "extern \"C\" __global__ void k(float* p) { if (p) p[0] = 1.0f; } // " + name + "\n";
  s.options = std::move(options);
  return s;
}

/// A compiler that records each call and returns a fake binary named after the source. A kernel whose
/// name is in `blocked` waits inside the compile until release(name) or until its stop token fires (then it
/// returns kCancelled, as kiln::compile does); names in `failing` return kCompileError.
class FakeCompiler {
 public:
  CompileFn fn() {
    return [this](const KernelSource& s, const Target& t, const CompileSettings& c) { return compile(s, t, c); };
  }

  Result<Binary> compile(const KernelSource& s, const Target& t, const CompileSettings& c) {
    std::unique_lock lock(mu_);
    order_.push_back(s.name);
    ++calls_;
    ++running_;
    peak_ = std::max(peak_, running_);
    started_.insert(s.name);
    cv_.notify_all();
    if (blocked_.count(s.name)) {
      std::condition_variable_any& cv = cv_;
      bool released = cv.wait(lock, c.stop, [&] { return released_.count(s.name) > 0; });
      if (!released) {
        --running_;
        return make_error(ErrorCode::kCancelled, "fake compile of '" + s.name + "' cancelled");
      }
    }
    --running_;
    if (failing_.count(s.name)) return make_error(ErrorCode::kCompileError, "fake error in '" + s.name + "'", "log");
    Binary b;
    b.key = make_key(s, t);
    b.name = s.name;
    b.entry = s.entry;
    b.arch = t.arch;
    b.cubin = "cubin:" + s.name;
    return b;
  }

  void block(const std::string& name) {
    std::lock_guard lock(mu_);
    blocked_.insert(name);
  }
  void fail(const std::string& name) {
    std::lock_guard lock(mu_);
    failing_.insert(name);
  }
  void release(const std::string& name) {
    std::lock_guard lock(mu_);
    released_.insert(name);
    cv_.notify_all();
  }
  /// Waits until `name`'s compile has started; false after 30 s (a test failure, never a pass).
  bool wait_started(const std::string& name) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return started_.count(name) > 0; });
  }
  int calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  int peak() const {
    std::lock_guard lock(mu_);
    return peak_;
  }
  std::vector<std::string> order() const {
    std::lock_guard lock(mu_);
    return order_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::set<std::string> blocked_, released_, failing_, started_;
  std::vector<std::string> order_;
  int calls_ = 0;
  int running_ = 0;
  int peak_ = 0;
};

/// A TaskRunner that only queues; the test runs the tasks when it chooses.
class ManualRunner : public TaskRunner {
 public:
  void post(std::function<void()> task) override {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
    cv_.notify_all();
  }
  /// Waits until at least `n` tasks are queued; false after 30 s.
  bool wait_pending(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return tasks_.size() >= n; });
  }
  size_t pending() const {
    std::lock_guard lock(mu_);
    return tasks_.size();
  }
  /// Runs queued tasks (and the ones they post) until none is left; returns how many ran.
  size_t run_all() {
    size_t n = 0;
    while (true) {
      std::function<void()> t;
      {
        std::lock_guard lock(mu_);
        if (tasks_.empty()) return n;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      t();
      ++n;
    }
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
};

/// Collects a process pool's events so tests can wait for a state instead of sleeping. The observer shares
/// the log's state rather than pointing at the log: a pool can outlive the test body (a gate's pending
/// bookkeeping task may hold the last reference), and its I/O thread may still report events then.
class EventLog {
 public:
  std::function<void(const PoolEvent&)> observer() {
    return [s = state_](const PoolEvent& e) {
      std::lock_guard lock(s->mu);
      s->events.push_back(e);
      s->cv.notify_all();
    };
  }
  /// Waits until `pred(events)` holds; false after `timeout` (a failure, never a pass).
  bool wait(const std::function<bool(const std::vector<PoolEvent>&)>& pred,
            std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return pred(state_->events); });
  }
  bool wait_count(PoolEvent::Kind kind, size_t n, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    return wait([&](const std::vector<PoolEvent>& ev) { return count_in(ev, kind) >= n; }, timeout);
  }
  /// Waits until job `id` was handed to a worker; returns that worker's pid (0 on timeout).
  int wait_sent(JobId id) {
    int pid = 0;
    wait([&](const std::vector<PoolEvent>& ev) {
      for (const auto& e : ev) {
        if (e.kind == PoolEvent::Kind::kJobSent && e.job == id) pid = e.pid;
      }
      return pid != 0;
    });
    return pid;
  }
  size_t count(PoolEvent::Kind kind) const {
    std::lock_guard lock(state_->mu);
    return count_in(state_->events, kind);
  }
  std::vector<PoolEvent> events() const {
    std::lock_guard lock(state_->mu);
    return state_->events;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<PoolEvent> events;
  };
  static size_t count_in(const std::vector<PoolEvent>& ev, PoolEvent::Kind kind) {
    size_t n = 0;
    for (const auto& e : ev) n += e.kind == kind;
    return n;
  }
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

/// Fixture: a one-thread arena executor over a FakeCompiler, its thread held by the job "blocker" that the
/// derived fixture's SetUp starts with hold(): whatever a test submits queues behind it until
/// fake.release("blocker").
class HeldThreadTest : public ::testing::Test {
 protected:
  /// Starts the blocker with `start()` (returning its future) and waits until it runs.
  template <class Start>
  void hold(Start start) {
    fake.block("blocker");
    blocker = start();
    ASSERT_TRUE(fake.wait_started("blocker"));
  }

  FakeCompiler fake;
  std::shared_ptr<Executor> exec = make_arena_executor({.threads = 1, .compile = fake.fn()});
  Future<Binary> blocker;
};

}  // namespace kiln::pool_test
