#include "selection_rule.h"

#include <algorithm>

namespace kiln::runtime::detail {

namespace {
bool usable(const ChoiceResult& r) { return r.status.ok() && !r.partial && r.median_us > 0; }
}  // namespace

double tie_window(const ChoiceResult& best, double tie_fraction) {
  return std::max(tie_fraction * best.median_us, best.p90_us - best.median_us);
}

int pick_winner(const std::vector<ChoiceResult>& results, const std::function<int(const std::string&)>& rank,
                double tie_fraction) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    if (usable(results[i]) && (best < 0 || results[i].median_us < results[best].median_us)) best = i;
  }
  if (best < 0) return -1;
  const double limit = results[best].median_us + tie_window(results[best], tie_fraction);
  int pick = best;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    const ChoiceResult& r = results[i];
    if (!usable(r) || r.median_us > limit) continue;
    const int ri = rank(r.name), rp = rank(results[pick].name);
    if (ri < rp || (ri == rp && r.name < results[pick].name)) pick = i;
  }
  return pick;
}

}  // namespace kiln::runtime::detail
