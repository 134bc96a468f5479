// Future<T> and Promise<T>: the values every compile in kiln returns. A future holds a Result<T> (errors are
// values), can be waited on, continued with `then` (run as a task on a TaskRunner, never on the thread that
// completed it while it holds a lock), combined with `when_all`, iterated in completion order, and cancelled.
//
// Futures are cheap shared handles: copies see the same result, so several requesters of one compile (the
// gate's single flight) can each hold one. Cancellation is a request: the producer decides what it means
// (dequeue the job, stop NVRTC through its flow callback, kill the worker process).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/pool/task_runner.h"
#include "kiln/status.h"

namespace kiln {

template <class T>
class Future;
template <class T>
class Promise;

namespace detail {

// The shared state of one future: the result once set, waiters, and callbacks to run when it is set.
template <class T>
class FutureState {
 public:
  explicit FutureState(std::shared_ptr<TaskRunner> runner) : runner_(std::move(runner)) {}

  // Stores `r` and runs the callbacks (outside the lock). The first call wins; returns whether it was this one.
  bool set(Result<T> r) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard lock(mu_);
      if (result_) return false;
      result_.emplace(std::move(r));
      callbacks.swap(callbacks_);
      cancel_hook_ = nullptr;  // nothing left to cancel; drops whatever the hook kept alive
    }
    cv_.notify_all();
    for (auto& cb : callbacks) cb();
    return true;
  }

  // Runs `cb` once the result is set: at once on this thread if it already is, otherwise on the thread that
  // sets it, after the state's lock is released.
  void notify(std::function<void()> cb) {
    {
      std::lock_guard lock(mu_);
      if (!result_) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    cb();
  }

  bool ready() const {
    std::lock_guard lock(mu_);
    return result_.has_value();
  }
  void wait() const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return result_.has_value(); });
  }
  template <class Clock, class Duration>
  bool wait_until(const std::chrono::time_point<Clock, Duration>& deadline) const {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return result_.has_value(); });
  }
  // Valid once ready(): the result never changes after it is set.
  const Result<T>& result() const { return *result_; }

  // The producer's reaction to cancellation; runs at once if cancellation was already requested.
  void set_cancel_hook(std::function<void()> hook) {
    {
      std::lock_guard lock(mu_);
      if (result_) return;
      if (!cancel_requested_) {
        cancel_hook_ = std::move(hook);
        return;
      }
    }
    hook();
  }
  void request_cancel() {
    std::function<void()> hook;
    {
      std::lock_guard lock(mu_);
      if (result_ || cancel_requested_) return;
      cancel_requested_ = true;
      hook.swap(cancel_hook_);
    }
    if (hook) hook();
  }
  bool cancel_requested() const {
    std::lock_guard lock(mu_);
    return cancel_requested_;
  }

  const std::shared_ptr<TaskRunner>& runner() const { return runner_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<Result<T>> result_;
  std::vector<std::function<void()>> callbacks_;
  std::function<void()> cancel_hook_;
  bool cancel_requested_ = false;
  const std::shared_ptr<TaskRunner> runner_;
};

// What Future::cancel() does. Shared by the copies of one future; runs its action at most once.
class Canceller {
 public:
  explicit Canceller(std::function<void()> action) : action_(std::move(action)) {}
  void cancel() {
    if (done_.exchange(true)) return;
    std::function<void()> a = std::move(action_);
    if (a) a();
  }

 private:
  std::atomic<bool> done_{false};
  std::function<void()> action_;
};

template <class R>
struct ResultTraits {
  using value_type = R;
  static Result<R> wrap(R&& r) { return Result<R>(std::move(r)); }
};
template <class U>
struct ResultTraits<Result<U>> {
  using value_type = U;
  static Result<U> wrap(Result<U>&& r) { return std::move(r); }
};

// Runs `task`, turning an escaping exception into an error: continuations are user code, and one that throws
// must not take a pool thread (or the process) down with it.
template <class T, class F>
Result<T> call_guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, std::string("a future's continuation threw: ") + e.what());
  } catch (...) {
    return make_error(ErrorCode::kInternal, "a future's continuation threw a non-standard exception");
  }
}

}  // namespace detail

/// The value type of `Future<void>`-like results (a continuation that returns nothing).
using Unit = std::monostate;

/// A handle to a Result<T> that will exist. Copyable; copies share the result and the cancellation handle.
/// A default-constructed Future is invalid (valid() == false) and must not be used otherwise.
/// All members are thread-safe.
template <class T>
class Future {
 public:
  using value_type = T;

  Future() = default;

  /// True for futures obtained from a Promise, an executor, the gate or make_ready_future.
  bool valid() const { return state_ != nullptr; }
  /// True once the result is set; never blocks.
  bool ready() const { return state_->ready(); }
  /// Blocks until the result is set. Do not call from a task of the arena that will produce it. Waiters
  /// wake before the completing thread runs the notify() callbacks and posts the then() continuations.
  void wait() const { state_->wait(); }
  /// Blocks up to `timeout`; returns ready().
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return state_->wait_until(std::chrono::steady_clock::now() + timeout);
  }
  template <class Clock, class Duration>
  bool wait_until(const std::chrono::time_point<Clock, Duration>& deadline) const {
    return state_->wait_until(deadline);
  }
  /// Waits, then returns the result (a value or the error saying why there is none). The reference stays
  /// valid as long as any copy of this future, or its promise, exists.
  const Result<T>& get() const {
    state_->wait();
    return state_->result();
  }

  /// Requests cancellation. What it does is the producer's: a queued compile fails at once with kCancelled,
  /// a running one is stopped (NVRTC's flow callback in the host, the worker process killed in the process
  /// pool). A future already ready is unaffected. For a future shared through the gate's single flight, the
  /// compile stops only once every requester has cancelled. Idempotent.
  void cancel() const {
    if (canceller_) canceller_->cancel();
  }

  /// Runs `f(const Result<T>&)` as a task once this future is ready and returns a future of what it returns
  /// (a Result<U> or a plain U; `void` gives Future<Unit>). The task runs on `runner`, or, by default, on the
  /// runner the producer chose (the process-wide callback arena unless it said otherwise); never on the
  /// completing thread and never under a lock of a pool. Cancelling the returned future cancels this one.
  template <class F>
  auto then(F f) const {
    return then(state_->runner(), std::move(f));
  }
  template <class F>
  auto then(std::shared_ptr<TaskRunner> runner, F f) const;

  /// Runs `cb()` once this future is ready, at once on this thread if it is, otherwise on the thread that
  /// completes it (an executor's worker or I/O thread) after the future's lock is released. For short,
  /// non-blocking signalling only (waking a thread, counting); use then() for real work.
  void notify(std::function<void()> cb) const { state_->notify(std::move(cb)); }

  /// The same result with a different cancellation handle: `on_cancel` runs (once) when this copy, or a copy
  /// of it, is cancelled. Used by the gate so each requester of a shared compile has its own say.
  Future with_canceller(std::function<void()> on_cancel) const {
    return Future(state_, std::make_shared<detail::Canceller>(std::move(on_cancel)));
  }

 private:
  friend class Promise<T>;
  template <class U>
  friend class Future;
  Future(std::shared_ptr<detail::FutureState<T>> state, std::shared_ptr<detail::Canceller> canceller)
      : state_(std::move(state)), canceller_(std::move(canceller)) {}

  std::shared_ptr<detail::FutureState<T>> state_;
  std::shared_ptr<detail::Canceller> canceller_;
};

/// The producing side of a Future. Move-only. A promise destroyed before it was set completes its future
/// with kInternal ("abandoned"), so no waiter can hang on a producer that forgot it.
template <class T>
class Promise {
 public:
  /// `runner`: where then() continuations of its futures run by default (null: the process-wide callback
  /// runner, default_task_runner()).
  explicit Promise(std::shared_ptr<TaskRunner> runner = nullptr)
      : state_(std::make_shared<detail::FutureState<T>>(runner ? std::move(runner) : default_task_runner())) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { abandon(); }

  /// A future of this promise; cancelling it calls the hook given to on_cancel().
  Future<T> future() const {
    std::weak_ptr<detail::FutureState<T>> weak = state_;
    return Future<T>(state_, std::make_shared<detail::Canceller>([weak] {
                       if (auto s = weak.lock()) s->request_cancel();
                     }));
  }
  /// Completes the future. The first call wins; returns whether it was this one. Callbacks registered with
  /// notify() run on this thread before it returns; then() continuations are posted to their runners.
  bool set(Result<T> result) { return state_ && state_->set(std::move(result)); }
  /// `hook` runs once when cancellation of a future of this promise is first requested (at once if it
  /// already was), unless the promise is set by then. It runs on the cancelling thread: keep it short.
  void on_cancel(std::function<void()> hook) { state_->set_cancel_hook(std::move(hook)); }
  bool cancel_requested() const { return state_->cancel_requested(); }
  bool is_set() const { return state_->ready(); }

 private:
  void abandon() {
    if (state_ && !state_->ready()) {
      state_->set(make_error(ErrorCode::kInternal, "a promise was abandoned before it produced a result"));
    }
  }
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// A future that is already ready with `result`.
template <class T>
Future<T> make_ready_future(Result<T> result) {
  Promise<T> p;
  p.set(std::move(result));
  return p.future();
}

template <class T>
template <class F>
auto Future<T>::then(std::shared_ptr<TaskRunner> runner, F f) const {
  using R = std::invoke_result_t<F&, const Result<T>&>;
  if constexpr (std::is_void_v<R>) {
    return then(std::move(runner), [f = std::move(f)](const Result<T>& r) mutable -> Unit {
      f(r);
      return Unit{};
    });
  } else {
    using U = typename detail::ResultTraits<R>::value_type;
    if (!runner) runner = default_task_runner();
    auto promise = std::make_shared<Promise<U>>(runner);
    Future<U> out = promise->future();
    std::shared_ptr<detail::Canceller> upstream = canceller_;
    promise->on_cancel([upstream] {
      if (upstream) upstream->cancel();
    });
    std::shared_ptr<detail::FutureState<T>> state = state_;
    state_->notify([state, promise, runner, f = std::move(f)]() mutable {
      runner->post([state, promise, f = std::move(f)]() mutable {
        promise->set(detail::call_guarded<U>([&] { return detail::ResultTraits<R>::wrap(f(state->result())); }));
      });
    });
    return out;
  }
}

/// A future of every input's value, in input order; it completes once all inputs have completed. If any
/// failed, it fails with the first failing input's error (by index), with context naming that input.
/// Cancelling it cancels every input. An empty input gives a ready future of an empty vector.
template <class T>
Future<std::vector<T>> when_all(std::vector<Future<T>> inputs) {
  if (inputs.empty()) return make_ready_future<std::vector<T>>(std::vector<T>{});
  struct Shared {
    std::vector<Future<T>> inputs;
    std::atomic<size_t> remaining;
    Promise<std::vector<T>> promise;
  };
  auto shared = std::make_shared<Shared>();
  shared->remaining = inputs.size();
  shared->inputs = inputs;
  Future<std::vector<T>> out = shared->promise.future();
  shared->promise.on_cancel([inputs] {
    for (const auto& in : inputs) in.cancel();
  });
  for (const auto& in : inputs) {
    in.notify([shared] {
      if (shared->remaining.fetch_sub(1) != 1) return;
      const size_t n = shared->inputs.size();
      for (size_t i = 0; i < n; ++i) {
        const Result<T>& r = shared->inputs[i].get();
        if (!r.ok()) {
          shared->promise.set(
              Status(r.status()).with_context("input " + std::to_string(i) + " of " + std::to_string(n)));
          return;
        }
      }
      std::vector<T> values;
      values.reserve(n);
      for (size_t i = 0; i < n; ++i) values.push_back(shared->inputs[i].get().value());
      shared->promise.set(std::move(values));
    });
  }
  return out;
}

/// Visits futures in the order they complete: `next()` blocks until one more is ready and returns its index.
/// The autotuner benchmarks each choice as its binary arrives. Thread-compatible (one consumer); the
/// futures may complete on any thread. Also a range: `for (size_t i : in_completion_order(fs))`.
template <class T>
class CompletionOrder {
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<size_t> ready;
  };

 public:
  explicit CompletionOrder(const std::vector<Future<T>>& futures)
      : queue_(std::make_shared<Queue>()), remaining_(futures.size()) {
    for (size_t i = 0; i < futures.size(); ++i) {
      futures[i].notify([q = queue_, i] {
        {
          std::lock_guard lock(q->mu);
          q->ready.push_back(i);
        }
        q->cv.notify_one();
      });
    }
  }

  /// The index of the next future to complete (blocking), or nullopt once every index was returned.
  std::optional<size_t> next() {
    if (remaining_ == 0) return std::nullopt;
    std::unique_lock lock(queue_->mu);
    queue_->cv.wait(lock, [&] { return !queue_->ready.empty(); });
    return pop_locked();
  }
  /// Like next(), but gives up after `timeout` (returns nullopt; remaining() tells the two cases apart).
  template <class Rep, class Period>
  std::optional<size_t> next_for(std::chrono::duration<Rep, Period> timeout) {
    if (remaining_ == 0) return std::nullopt;
    std::unique_lock lock(queue_->mu);
    if (!queue_->cv.wait_for(lock, timeout, [&] { return !queue_->ready.empty(); })) return std::nullopt;
    return pop_locked();
  }
  /// How many indices next() has still to return.
  size_t remaining() const { return remaining_; }

  class iterator {
   public:
    using value_type = size_t;
    using difference_type = std::ptrdiff_t;
    size_t operator*() const { return *current_; }
    iterator& operator++() {
      current_ = owner_->next();
      return *this;
    }
    bool operator==(std::default_sentinel_t) const { return !current_.has_value(); }

   private:
    friend class CompletionOrder;
    explicit iterator(CompletionOrder* owner) : owner_(owner), current_(owner->next()) {}
    CompletionOrder* owner_;
    std::optional<size_t> current_;
  };
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() { return {}; }

 private:
  size_t pop_locked() {
    size_t i = queue_->ready.front();
    queue_->ready.pop_front();
    --remaining_;
    return i;
  }
  std::shared_ptr<Queue> queue_;
  size_t remaining_;
};

/// `for (size_t i : in_completion_order(futures)) use(futures[i].get());`
template <class T>
CompletionOrder<T> in_completion_order(const std::vector<Future<T>>& futures) {
  return CompletionOrder<T>(futures);
}

}  // namespace kiln
