// Internal: the remote tier's circuit breaker. After `threshold` consecutive failures it opens: calls are
// not tried (kiln stays local-only) until `cooldown` has passed on the injected clock; then one call at a
// time tries (half-open), and a success closes it. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "kiln/cache/remote.h"

namespace kiln::cache {

class CircuitBreaker {
 public:
  enum class State { kClosed, kOpen, kHalfOpen };
  /// What a recorded failure did: nothing to say, or opened the breaker (first time since it last closed:
  /// the caller logs it once), or re-opened it after a failed trial (not logged again).
  enum class Opened { kNo, kFirst, kAgain };

  CircuitBreaker(int threshold, std::chrono::milliseconds cooldown, RemoteClock clock);

  /// Whether to try a call now. In the open state, false until the cool-down ends; then true for one
  /// caller (the trial) while the others keep getting false until it reports.
  bool allow();
  /// Returns true when this success closed an open (half-open) breaker.
  bool success();
  Opened failure();
  State state() const;
  static std::string_view name(State s);
  uint64_t times_opened() const;

 private:
  std::chrono::steady_clock::time_point now() const { return clock_ ? clock_() : std::chrono::steady_clock::now(); }

  const int threshold_;
  const std::chrono::milliseconds cooldown_;
  const RemoteClock clock_;
  mutable std::mutex mu_;
  State state_ = State::kClosed;
  int failures_ = 0;
  bool trial_out_ = false;
  bool reported_ = false;  // the current outage was logged
  uint64_t opened_ = 0;
  std::chrono::steady_clock::time_point open_until_{};
};

}  // namespace kiln::cache
