// The isolation tests' record of what the benchmark host reports (IsolationOptions::observer): thread-safe,
// with a bounded wait for a kind of event to arrive.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::runtime {

class EventLog {
 public:
  using Kind = IsolationEvent::Kind;

  std::function<void(const IsolationEvent&)> observer() {
    return [this](const IsolationEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
  }
  int count(Kind k) const {
    std::lock_guard lock(mu_);
    return count_locked(k);
  }
  std::vector<IsolationEvent> of(Kind k) const {
    std::lock_guard lock(mu_);
    std::vector<IsolationEvent> out;
    for (const auto& e : events_) {
      if (e.kind == k) out.push_back(e);
    }
    return out;
  }
  /// Waits up to 30 s for at least `n` events of kind `k`; false if they did not come.
  bool wait_count(Kind k, int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return count_locked(k) >= n; });
  }

 private:
  int count_locked(Kind k) const {
    return static_cast<int>(std::count_if(events_.begin(), events_.end(), [&](const auto& e) { return e.kind == k; }));
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<IsolationEvent> events_;
};

}  // namespace kiln::runtime
