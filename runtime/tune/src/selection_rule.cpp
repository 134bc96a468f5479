#include "selection_rule.h"

#include <algorithm>
#include <cmath>

namespace kiln::runtime::detail {

namespace {
bool usable(const ChoiceResult& r) { return r.status.ok() && !r.partial && r.median_us > 0; }
}  // namespace

double tie_window(const ChoiceResult& best, double tie_fraction) {
  // The half-width of the median's ~95% interval: for a normal spread (p90 - p10) / sqrt(n) (1.96 x the
  // median's standard error, 1.2533 sigma / sqrt(n), with p90 - p10 = 2.563 sigma). The spread itself
  // (p90 - median) says how noisy one run is, not how well many runs place the median: taken as the window, it
  // handed 3-5% wins to a slower choice with a lower name on the H200 suite (26 Nov).
  const double spread = best.reps > 1 && best.p10_us > 0
                            ? (best.p90_us - best.p10_us) / std::sqrt(static_cast<double>(best.reps))
                            : best.p90_us - best.median_us;  // no sample count: the spread, conservatively
  return std::max(tie_fraction * best.median_us, spread);
}

double remeasure_window(const ChoiceResult& best, double tie_fraction) {
  // Twice the tie fraction: on the H200 suite (27 Nov) two cuBLASLt algorithms 2.3% apart in one tune came out
  // 2.9% apart the other way in another (1000x28672x4096 f16: 318.2 vs 325.5 us, then 322.9 vs 313.7), each
  // timed in its own stretch; timed interleaved they meet the same drift.
  return std::max(2 * tie_fraction * best.median_us, best.p90_us - best.median_us);
}

int best_complete(const std::vector<ChoiceResult>& results) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    if (usable(results[i]) && (best < 0 || results[i].median_us < results[best].median_us)) best = i;
  }
  return best;
}

std::vector<size_t> near_ties(const std::vector<ChoiceResult>& results, double tie_fraction) {
  const int best = best_complete(results);
  if (best < 0) return {};
  const double limit = results[best].median_us + remeasure_window(results[best], tie_fraction);
  std::vector<size_t> out = {static_cast<size_t>(best)};
  std::vector<size_t> runners_up;  // complete, outside the window, within kRunnerUpFraction: fastest first
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    if (static_cast<int>(i) == best || !usable(r)) continue;
    if (r.median_us <= limit) out.push_back(i);
    else if (r.median_us <= results[best].median_us * (1 + kRunnerUpFraction)) runners_up.push_back(i);
  }
  std::stable_sort(runners_up.begin(), runners_up.end(),
                   [&](size_t a, size_t b) { return results[a].median_us < results[b].median_us; });
  for (size_t i = 0; i < runners_up.size() && out.size() < kMinNearTies; ++i) out.push_back(runners_up[i]);
  if (out.size() < 2) out.clear();
  return out;
}

std::vector<size_t> revoked_partials(const std::vector<ChoiceResult>& results, double tie_fraction) {
  const int best = best_complete(results);
  std::vector<size_t> out;
  if (best < 0) return out;
  const double limit = results[best].median_us * (1 + tie_fraction);
  const double runner_up_limit = results[best].median_us * (1 + kRunnerUpFraction);
  std::vector<size_t> runners_up;
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    if (!r.partial || !r.status.ok() || r.median_us <= 0) continue;
    if (r.median_us <= limit) out.push_back(i);
    else if (r.median_us <= runner_up_limit) runners_up.push_back(i);
  }
  std::stable_sort(runners_up.begin(), runners_up.end(),
                   [&](size_t a, size_t b) { return results[a].median_us < results[b].median_us; });
  const size_t beside = std::max<size_t>(1, near_ties(results, tie_fraction).size());
  for (size_t i = 0; i < runners_up.size() && beside + out.size() < kMinNearTies; ++i) out.push_back(runners_up[i]);
  return out;
}

std::vector<size_t> round_order(size_t n, int round) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = round % 2 == 0 ? i : n - 1 - i;
  return order;
}

namespace {
// The mean of the per-round differences (b - a) over the rounds both were timed in, and its standard error.
struct PairedDifference {
  size_t rounds = 0;
  double mean = 0;
  double se = 0;
};
PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  PairedDifference d;
  d.rounds = std::min(a.size(), b.size());
  if (d.rounds < 2) return d;
  const double n = static_cast<double>(d.rounds);
  for (size_t i = 0; i < d.rounds; ++i) d.mean += b[i] - a[i];
  d.mean /= n;
  double var = 0;
  for (size_t i = 0; i < d.rounds; ++i) var += (b[i] - a[i] - d.mean) * (b[i] - a[i] - d.mean);
  d.se = std::sqrt(var / (n - 1) / n);
  return d;
}
}  // namespace

bool tie_unresolved(const std::vector<double>& leader, const std::vector<double>& runner_up, double leader_us,
                    double runner_up_us) {
  const PairedDifference d = paired_difference(leader, runner_up);
  if (d.rounds < 2 || !(leader_us > 0) || runner_up_us > leader_us * (1 + kCloseTie)) return false;
  return std::abs(d.mean) < 2 * d.se && std::abs(d.mean) + 2 * d.se > kTieDoesNotMatter * leader_us;
}

bool told_apart_slower(const std::vector<double>& best, const std::vector<double>& other, double best_us,
                       double other_us) {
  const PairedDifference d = paired_difference(best, other);
  if (d.rounds < 2 || !(best_us > 0)) return false;
  return other_us > best_us * (1 + kCloseTie) || d.mean > 2 * d.se;
}

int pick_winner(const std::vector<ChoiceResult>& results, const std::function<int(const std::string&)>& rank,
                double tie_fraction, const ToldApart& told_apart) {
  const int best = best_complete(results);
  if (best < 0) return -1;
  const double limit = results[best].median_us + tie_window(results[best], tie_fraction);
  const double flat = results[best].median_us * (1 + tie_fraction);
  int pick = best;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    const ChoiceResult& r = results[i];
    if (!usable(r) || r.median_us > limit) continue;
    if (i != best && r.median_us > flat && told_apart && told_apart(results[best].name, r.name)) continue;
    const int ri = rank(r.name), rp = rank(results[pick].name);
    const double mi = r.median_us, mp = results[pick].median_us;
    if (ri < rp || (ri == rp && (mi < mp || (mi == mp && r.name < results[pick].name)))) pick = i;
  }
  return pick;
}

int problem_tie_rank(int choice_tie_rank, bool externs_first) {
  if (!externs_first) return choice_tie_rank;
  // By value, not by kind: a choice that overrides Choice::tie_rank() keeps the place of the rank it chose.
  if (choice_tie_rank == Choice::kTemplateTieRank) return Choice::kExternTieRank;
  if (choice_tie_rank == Choice::kExternTieRank) return Choice::kTemplateTieRank;
  return choice_tie_rank;
}

bool externs_first_on_ties(double best_us, const std::string& model_bound) {
  return model_bound == "compute" && best_us >= kSustainedPowerUs;
}

}  // namespace kiln::runtime::detail
