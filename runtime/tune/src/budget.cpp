#include "kiln/runtime/budget.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "kiln/templates/template.h"

namespace kiln::runtime {

double roofline_us(const Problem& problem, const DevicePeaks& d) {
  double flops = 0, bytes = 0;
  if (const auto* g = std::get_if<GemmProblem>(&problem.desc)) {
    flops = 2.0 * g->m * g->n * g->k;
    bytes = (double(g->m) * g->k + double(g->k) * g->n) * templates::dtype_bytes(g->a) +
            double(g->m) * g->n * templates::dtype_bytes(g->epilogue.out);
  } else if (const auto* n = std::get_if<NormProblem>(&problem.desc)) {
    bytes = double(n->rows) * n->cols * templates::dtype_bytes(n->dtype) * (n->residual ? 4 : 2);
  } else if (const auto* s = std::get_if<SoftmaxProblem>(&problem.desc)) {
    bytes = double(s->rows) * s->cols * templates::dtype_bytes(s->dtype) * 2;
  }
  return std::max(flops / (d.tensor_tflops * 1e6), bytes / (d.hbm_gbps * 1e3));
}

TuneBudget::TuneBudget(double seconds, std::function<double()> now_s) : seconds_(seconds), now_(std::move(now_s)) {
  if (!now_) {
    now_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  start_ = now_();
}

std::vector<size_t> TuneBudget::order(const std::vector<BudgetItem>& items) {
  std::vector<size_t> idx(items.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  auto value = [&](size_t i) {
    return items[i].expected_gain_us / std::max(items[i].expected_cost_s, 1e-6);
  };
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return value(a) > value(b); });
  std::vector<size_t> out;
  for (size_t i : idx) out.push_back(items[i].index);
  return out;
}

double TuneBudget::elapsed_s() const { return now_() - start_; }
double TuneBudget::left_s() const { return limited() ? seconds_ - elapsed_s() : 1e300; }
bool TuneBudget::fits(double cost_s) const { return !limited() || cost_s <= left_s(); }
void TuneBudget::spent(double cost_s) {
  spent_ += cost_s;
  ++tunes_;
}
double TuneBudget::expected_cost(double prior_s) const { return tunes_ > 0 ? spent_ / tunes_ : prior_s; }

}  // namespace kiln::runtime
