// oneTBB runs every arena's tasks on one process-wide pool of worker threads, sized by default to the
// machine's cores minus one. A capped arena can only reach its cap if that pool is large enough, so each
// arena kiln creates reserves its threads here, and the pool is kept at least as large as all reservations
// together (through one tbb::global_control, replaced when the sum changes). A limit the application set
// lower with its own global_control still wins: oneTBB applies the smallest active value.
#pragma once

namespace kiln::pool_detail {

/// Holds `threads` of oneTBB's worker pool for its lifetime. Move-only.
class ThreadReservation {
 public:
  explicit ThreadReservation(int threads);
  ThreadReservation(ThreadReservation&& other) noexcept : threads_(other.threads_) { other.threads_ = 0; }
  ThreadReservation& operator=(ThreadReservation&&) = delete;
  ThreadReservation(const ThreadReservation&) = delete;
  ThreadReservation& operator=(const ThreadReservation&) = delete;
  ~ThreadReservation();

 private:
  int threads_;
};

}  // namespace kiln::pool_detail
