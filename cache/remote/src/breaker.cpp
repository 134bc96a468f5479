#include "breaker.h"

#include <algorithm>

namespace kiln::cache {

CircuitBreaker::CircuitBreaker(int threshold, std::chrono::milliseconds cooldown, RemoteClock clock)
    : threshold_(std::max(1, threshold)), cooldown_(cooldown), clock_(std::move(clock)) {}

bool CircuitBreaker::allow() {
  std::lock_guard lock(mu_);
  if (state_ == State::kClosed) return true;
  if (state_ == State::kOpen && now() >= open_until_) {
    state_ = State::kHalfOpen;
    trial_out_ = false;
  }
  if (state_ == State::kHalfOpen && !trial_out_) {
    trial_out_ = true;
    return true;
  }
  return false;
}

bool CircuitBreaker::success() {
  std::lock_guard lock(mu_);
  failures_ = 0;
  const bool closed_now = state_ != State::kClosed;
  state_ = State::kClosed;
  trial_out_ = false;
  reported_ = false;
  return closed_now;
}

CircuitBreaker::Opened CircuitBreaker::failure() {
  std::lock_guard lock(mu_);
  ++failures_;
  if (state_ == State::kClosed && failures_ < threshold_) return Opened::kNo;
  if (state_ == State::kOpen) return Opened::kNo;  // a call that started before it opened
  state_ = State::kOpen;
  trial_out_ = false;
  open_until_ = now() + cooldown_;
  ++opened_;
  if (reported_) return Opened::kAgain;
  reported_ = true;
  return Opened::kFirst;
}

CircuitBreaker::State CircuitBreaker::state() const {
  std::lock_guard lock(mu_);
  if (state_ == State::kOpen && now() >= open_until_) return State::kHalfOpen;
  return state_;
}

std::string_view CircuitBreaker::name(State s) {
  switch (s) {
    case State::kClosed: return "closed";
    case State::kOpen: return "open";
    case State::kHalfOpen: return "half-open";
  }
  return "?";
}

uint64_t CircuitBreaker::times_opened() const {
  std::lock_guard lock(mu_);
  return opened_;
}

}  // namespace kiln::cache
