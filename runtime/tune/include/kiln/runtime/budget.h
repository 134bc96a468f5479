// A time budget for tuning a whole workload (`kiln tune --budget SECONDS`): the problems where tuning is
// expected to gain the most per second of tuning go first; once the budget cannot cover the next one, the rest
// get the performance model's pick unmeasured (effort none) and are reported as not tuned.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "kiln/runtime/perf_model.h"
#include "kiln/runtime/problem.h"

namespace kiln::runtime {

/// The least time the problem's FLOPs and bytes can take on the device (microseconds): what a kernel for it
/// runs in at best, so what a better kernel can save per call scales with it.
double roofline_us(const Problem& problem, const DevicePeaks& peaks);

struct BudgetItem {
  size_t index = 0;             // the problem's position in the workload
  double expected_gain_us = 0;  // per call: roofline_us() (the model's scale of what tuning can win)
  double expected_cost_s = 0;   // seconds to tune it
};

/// Spends a budget of seconds on a clock (steady_clock by default; tests give a fake one). Not thread-safe.
class TuneBudget {
 public:
  /// `seconds` <= 0: unlimited. The clock counts from construction.
  explicit TuneBudget(double seconds, std::function<double()> now_s = {});
  /// Indices of `items` by expected gain per second of tuning, largest first (ties: workload order).
  static std::vector<size_t> order(const std::vector<BudgetItem>& items);
  /// Whether a tune expected to take `cost_s` fits what is left. Always true when unlimited.
  bool fits(double cost_s) const;
  /// Records that a tune took `cost_s` (measured by the caller's clock): expected_cost() follows the mean.
  void spent(double cost_s);
  /// The expected cost of the next tune: the mean of those spent so far, else `prior_s`.
  double expected_cost(double prior_s) const;
  double elapsed_s() const;
  double left_s() const;
  bool limited() const { return seconds_ > 0; }

 private:
  double seconds_;
  std::function<double()> now_;
  double start_ = 0;
  double spent_ = 0;
  int tunes_ = 0;
};

}  // namespace kiln::runtime
