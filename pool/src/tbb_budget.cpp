#include "tbb_budget.h"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <memory>
#include <mutex>

namespace kiln::pool_detail {
namespace {

struct Budget {
  std::mutex mu;
  int reserved = 0;
  std::unique_ptr<tbb::global_control> control;

  void update() {
    // +1: oneTBB counts the application's own thread in max_allowed_parallelism.
    const int wanted = std::max(tbb::info::default_concurrency(), reserved + 1);
    if (control && static_cast<int>(tbb::global_control::active_value(
                       tbb::global_control::max_allowed_parallelism)) == wanted) {
      return;
    }
    // The new control exists before the old one goes, so the limit never drops to the default in between.
    auto next = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, wanted);
    control = std::move(next);
  }
};

Budget& budget() {
  // Never destroyed: arenas may be torn down during static destruction.
  static Budget* b = new Budget;
  return *b;
}

}  // namespace

ThreadReservation::ThreadReservation(int threads) : threads_(threads) {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  b.reserved += threads_;
  b.update();
}

ThreadReservation::~ThreadReservation() {
  if (threads_ == 0) return;
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  b.reserved -= threads_;
  b.update();
}

}  // namespace kiln::pool_detail
