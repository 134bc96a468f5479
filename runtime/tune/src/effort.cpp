// Effort levels and what they mean in numbers; the model's plan of what a tune measures first.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kiln/runtime/tuner.h"
#include "selection_rule.h"

namespace kiln::runtime {

std::string_view effort_name(Effort effort) {
  switch (effort) {
    case Effort::kNone: return "none";
    case Effort::kQuick: return "quick";
    case Effort::kDefault: return "default";
    case Effort::kExhaustive: return "exhaustive";
  }
  return "?";
}

Result<Effort> parse_effort(std::string_view name) {
  for (Effort e : {Effort::kNone, Effort::kQuick, Effort::kDefault, Effort::kExhaustive}) {
    if (name == effort_name(e)) return e;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown effort '{}' (give none, quick, default or exhaustive)", name));
}

Result<Effort> effort_from_env(Effort fallback) {
  const char* v = std::getenv("KILN_TUNE_EFFORT");
  if (v == nullptr || *v == '\0') return fallback;
  return parse_effort(v).with_context("reading KILN_TUNE_EFFORT");
}

// Extern-first pruning's margin, chosen on the recorded GEMM suite (tests/runtime/test_tuning_effort_prune.cpp
// prints the sweep; docs/tuning.md has the figures).
constexpr double kExternMargin = 0.15;
// For templates the model calls compute-bound: predicted at least 2% faster than the best extern, a gain the
// model can resolve there and worth a ~0.6 s wgmma compile. At 4096^3 on an H200 the device's ceiling puts every
// template at >= 173.7 us and cuBLAS measures 171.3-174.1 us from run to run: at margin 0 a swap-AB tile was
// compiled on one run in three (measured 190.3 us). The sweep on the H200 suite (test_tuning_effort_prune.cpp)
// shows no shape's choice moves between -2% and +10%.
constexpr double kExternMarginCompute = -0.02;

// A cached template costs no compile, only a few runs (early abandonment drops the slow ones): cut only when
// predicted 30% slower than the best extern, where the problem's runs are short (detail::kCheapRunUs). The
// model's prediction was 23% high for the exhaustive choice of 333x4096x14336 on the H200 (30 Nov: the swap-AB
// 64x168 tile, cached from 333x4096x4096, 67.6 us predicted, 54.9 measured, cuBLASLt 56.0).
constexpr double kExternMarginCached = 0.30;

// Chosen offline on the H200 suite's exhaustive reports (29 Nov, three runs: every sampled template measured,
// with its model rank and estimate), replaying the plan before variants over the 120 problems in order: with
// the first quarter of the 12 kept by rank and the rest filled from within 8% of the 12th score, shared first,
// the distinct templates planned fell 344-345 -> 252-256 and the best kept choice was within 1% of the best
// measured on as many problems or more (83-85% -> 83-88%; the replay has no widening or neighbour calibration).
// At half of the 12 fixed and 5%: 293-297.
constexpr double kShareMargin = 0.08;

// The sample of 64 per template gives the model every value of every axis to rank (the seeds come first).
// Norms and softmax keep 32 (keep_rows): in four H200 suite runs (30 Nov) the exhaustive effort's configuration
// within 1% of the best of rmsnorm 1-64 x 4096 sat at model ranks 13-47 (32 holds 32 of the 36 problem-runs of
// the nine row problems), and a row problem's default tune measured its ~14 choices in 16-36 ms.
// Default: the model's first 3 and then one per structural variant, 8 kept in all, widened by 2 of the winning
// variant. Replayed over four H200 suite runs' exhaustive reports (30 Nov: c8588dc, 0b34485, f9d9479, a93818a;
// scripts/replay_plan.py), the best kept was within 1% of the best measured on 108-110 of 120 problems with
// 384-399 distinct templates planned per run, against 105-109 with 367-385 for 10 kept with one per variant
// first (the default of 29 Nov): there the exhaustive effort's choice sat at model rank 1-5 and was left out for
// shared choices 1.2-4.5% slower on 2-5 problems a run. On the device (6878bdf, three calls): 0.129-0.147 s per
// problem, 91.7-94.2% within 1%, 99.2-100% within 3% (c8588dc and 0b34485, four calls: 0.139-0.141 s, 89.2-93.3%,
// 98.3-100%). Keeping only the first unswapped (29 Nov, 10 kept, 15 more templates) had read no better on the
// device (eb3415d, 9456867: 83.3-86.7% within 1%) and took 0.148-0.162 s per problem against 0.126-0.143.
// Widening around the two fastest variants (widen_variants 2, those within 3% of the best extern, 8 kept)
// replayed at 105-108 of 120 on the read-flush reports (against 97-105), but on the device (a8fffcd) it held 102
// of 120 within 1% and took 0.180 s per problem against 0.129-0.143: 53 widenings against 28-34, each a wait
// for wgmma compiles. Not the default.
EffortPolicy effort_policy(Effort effort) {
  switch (effort) {
    case Effort::kNone: return {.measure = false, .keep = 1, .widen = 0, .max_widenings = 0, .sample_per_template = 64};
    case Effort::kQuick: return {.measure = true, .keep = 4, .widen = 2, .max_widenings = 1, .sample_per_template = 64,
                                 .extern_margin = kExternMargin, .extern_margin_compute = kExternMarginCompute,
                                 .extern_protect = 1, .share_margin = kShareMargin, .diverse = true};
    case Effort::kDefault: return {.measure = true, .keep = 8, .keep_rows = 32, .widen = 2, .max_widenings = 2, .sample_per_template = 64,
                                   .extern_margin = kExternMargin, .extern_margin_compute = kExternMarginCompute,
                                   .extern_protect = 5, .extern_margin_cached = kExternMarginCached,
                                   .share_margin = kShareMargin, .diverse = true, .keep_top = 3, .stream_k_pick = true};
    case Effort::kExhaustive: return {.measure = true, .keep = 0, .widen = 0, .max_widenings = 0, .sample_per_template = 100000};
  }
  return {};
}

int keep_for(const EffortPolicy& policy, const Problem& problem) {
  const bool rows =
      std::holds_alternative<NormProblem>(problem.desc) || std::holds_alternative<SoftmaxProblem>(problem.desc);
  return rows && policy.keep_rows > 0 ? policy.keep_rows : policy.keep;
}

namespace detail {

// How far behind the model's first choice the stream-K pick may be scored. Replayed over the six H200 suite runs'
// reports in bench/results (scripts/replay_stream_k_pick.py, the model alone): at 10-15% every pick that was the
// exhaustive effort's choice stays (7) and 0-1 of 120-126 picks measured beyond 1.5x the fastest template; at 25%,
// 13 of 138; with no margin, 73 of 198 (a 128x8 tile in 77x4096x14336, scored 3x the first).
constexpr double kStreamKPickMargin = 0.15;

const RankedChoice* stream_k_candidate(const std::vector<RankedChoice>& ranked) {
  // Where the model's first choice is compute-bound the problem is: narrow tiles that are memory-bound there
  // (4096^3 has such, measured at 2.8x cuBLAS) are no reason to measure anything. Swap-AB only: the unswapped
  // stream-K tiles of decode GEMMs pad M to 64 rows; replayed with them (and no margin) 270 of 378 picks measured
  // beyond 1.5x the fastest template, and none was within 1% where the swap-AB one was not. A grid of one wave or
  // less has no partial wave for stream-K to remove: the next tile of the order is taken.
  const RankedChoice* top = nullptr;
  for (const RankedChoice& r : ranked) {
    if (!r.estimate.known) continue;
    if (top == nullptr) {
      top = &r;
      if (r.estimate.bound != "memory") return nullptr;
    }
    if (r.structure == "wgmma/swab/sk/p/b1" && r.estimate.bound == "memory" && r.estimate.waves > 1) {
      return r.score_us <= top->score_us * (1 + kStreamKPickMargin) ? &r : nullptr;
    }
  }
  return nullptr;
}

TunePlan plan_choices(const std::vector<ChoicePtr>& choices, const std::vector<RankedChoice>& ranked,
                      const std::string& reference, int keep, const std::set<std::string>& planned,
                      double share_margin, bool diverse, int keep_top, bool stream_k_pick) {
  // Which model-ranked choices are kept: the first `keep` by rank, except that with a share margin only the
  // first quarter of those slots (at least one) is fixed by rank, and with `diverse` the first `keep_top` by rank
  // and then the best-ranked of each other structural variant instead; the others go first to shared choices
  // (cached, or planned for another problem) scored within the margin of the keep-th score, then to the rest of
  // that window by rank.
  std::vector<const RankedChoice*> modelled;
  for (const RankedChoice& r : ranked) {
    if (r.estimate.known) modelled.push_back(&r);
  }
  auto shared = [&](const RankedChoice* r) { return r->cached || planned.count(choices[r->index]->name()) > 0; };
  std::set<const RankedChoice*> kept, variant_best;
  const size_t k = keep > 0 ? static_cast<size_t>(keep) : modelled.size();
  if (keep <= 0 || modelled.size() <= k || (share_margin <= 0 && !diverse)) {
    for (size_t i = 0; i < std::min(k, modelled.size()); ++i) kept.insert(modelled[i]);
  } else {
    if (diverse) {
      // Each variant's best-ranked choice, or a shared one of that variant scored within the margin of it.
      std::set<std::string> seen;
      for (size_t i = 0; i < modelled.size() && kept.size() < k && i < static_cast<size_t>(std::max(0, keep_top)); ++i) {
        kept.insert(modelled[i]);
        seen.insert(modelled[i]->structure);
      }
      for (size_t i = 0; i < modelled.size() && kept.size() < k; ++i) {
        const RankedChoice* best = modelled[i];
        if (!seen.insert(best->structure).second) continue;
        const RankedChoice* pick = best;
        // (Past the first keep_top, even a variant's best-ranked choice may be swapped for a shared twin.)
        for (size_t j = i; share_margin > 0 && !shared(pick) && j < modelled.size(); ++j) {
          const RankedChoice* r = modelled[j];
          if (r->score_us > best->score_us * (1 + share_margin)) break;
          if (r->structure == best->structure && shared(r)) pick = r;
        }
        kept.insert(pick);
        variant_best.insert(pick);
      }
    } else {
      const size_t fixed = std::max<size_t>(1, (k + 2) / 4);
      for (size_t i = 0; i < fixed; ++i) kept.insert(modelled[i]);
    }
    const double window = modelled[k - 1]->score_us * (1 + std::max(0.0, share_margin));
    std::vector<const RankedChoice*> first, rest;
    for (size_t i = 0; i < modelled.size() && (i < k || modelled[i]->score_us <= window); ++i) {
      const RankedChoice* r = modelled[i];
      if (kept.count(r)) continue;
      (share_margin > 0 && shared(r) ? first : rest).push_back(r);
    }
    for (const auto* list : {&first, &rest}) {
      for (const RankedChoice* r : *list) {
        if (kept.size() < k) kept.insert(r);
      }
    }
  }
  TunePlan plan;
  // (Named even when the plan kept it already: the tune must not cut it extern-first either.)
  bool stream_k_added = false;
  if (stream_k_pick && keep > 0) {
    if (const RankedChoice* sk = stream_k_candidate(ranked); sk != nullptr) {
      stream_k_added = kept.insert(sk).second;
      plan.stream_k_choice = choices[sk->index];
      plan.stream_k_pick = plan.stream_k_choice->name();
    }
  }
  int rank = 0;
  for (const RankedChoice& r : ranked) {
    const ChoicePtr& c = choices[r.index];
    if (!r.estimate.known) {
      plan.first.push_back(c);
      continue;
    }
    plan.model[c->name()] = {rank, r.score_us};
    plan.structure[c->name()] = r.structure;
    if (kept.count(&r) || c->name() == reference) {
      plan.first.push_back(c);
      ++plan.kept_ranked;
      if (kept.count(&r) && rank >= static_cast<int>(k) && !(stream_k_added && c->name() == plan.stream_k_pick)) {
        ++(variant_best.count(&r) ? plan.variant_picks : plan.shared_swaps);
      }
    } else if (r.cached) {
      // No compile to wait for: measured whatever its rank, unless extern-first pruning cuts it.
      plan.first.push_back(c);
      plan.cached_extras.push_back(c);
      ++plan.cached_extra;
    } else {
      plan.reserve.push_back(c);
    }
    ++rank;
  }
  return plan;
}

std::vector<ChoicePtr> widen_variant(std::vector<ChoicePtr>& reserve, std::vector<ChoicePtr>& cached,
                                     const TunePlan& plan, const std::string& variant, size_t n) {
  auto rank_of = [&](const ChoicePtr& c) {
    auto it = plan.model.find(c->name());
    return it == plan.model.end() ? std::numeric_limits<int>::max() : it->second.first;
  };
  auto of_variant = [&](const ChoicePtr& c) {
    auto it = plan.structure.find(c->name());
    return it != plan.structure.end() && it->second == variant;
  };
  std::vector<ChoicePtr> out;
  size_t taken = 0, r = 0, c = 0;
  std::vector<ChoicePtr> reserve_left, cached_left;
  // Both lists are in model order: merge them, taking the first n of the variant.
  while (r < reserve.size() || c < cached.size()) {
    const bool from_reserve = c >= cached.size() || (r < reserve.size() && rank_of(reserve[r]) < rank_of(cached[c]));
    ChoicePtr& next = from_reserve ? reserve[r++] : cached[c++];
    if (taken < n && of_variant(next)) {
      ++taken;
      if (from_reserve) out.push_back(std::move(next));
      continue;
    }
    (from_reserve ? reserve_left : cached_left).push_back(std::move(next));
  }
  reserve = std::move(reserve_left);
  cached = std::move(cached_left);
  return out;
}

std::vector<ChoicePtr> first_widenings(const TunePlan& plan, const EffortPolicy& policy) {
  std::vector<ChoicePtr> out;
  const size_t widen = static_cast<size_t>(std::max(0, policy.widen));
  if (widen == 0 || policy.max_widenings <= 0) return out;
  std::vector<ChoicePtr> reserve = plan.reserve;
  if (!policy.diverse) {
    out.assign(reserve.begin(), reserve.begin() + static_cast<std::ptrdiff_t>(std::min(widen, reserve.size())));
    return out;
  }
  // A widening takes the next ranks of the variant of the tune's fastest model-ranked choice, which only the
  // measurements name: each variant among the first choices stands for one.
  std::vector<ChoicePtr> cached = plan.cached_extras;
  std::set<std::string> variants;
  for (const auto& c : plan.first) {
    auto it = plan.structure.find(c->name());
    if (it == plan.structure.end() || !variants.insert(it->second).second) continue;
    for (auto& w : widen_variant(reserve, cached, plan, it->second, widen)) out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> variants_to_widen(
    const std::vector<std::pair<std::string, double>>& measured, const TunePlan& plan, double best_extern_us,
    int variants, double near_extern, const std::set<std::string>& widened_around) {
  std::map<std::string, std::pair<double, std::string>> fastest;  // variant -> (median, name)
  for (const auto& [name, us] : measured) {
    auto s = plan.structure.find(name);
    if (s == plan.structure.end()) continue;
    auto [it, fresh] = fastest.try_emplace(s->second, us, name);
    if (!fresh && us < it->second.first) it->second = {us, name};
  }
  std::vector<std::pair<double, std::pair<std::string, std::string>>> order;
  for (const auto& [variant, best] : fastest) order.push_back({best.first, {variant, best.second}});
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < order.size() && static_cast<int>(i) < variants; ++i) {
    const auto& [us, pick] = order[i];
    if (best_extern_us > 0 && !(us < best_extern_us * (1 + near_extern))) continue;
    if (widened_around.count(pick.second)) continue;
    out.push_back(pick);
  }
  return out;
}

ChoicePtr model_pick(const std::vector<ChoicePtr>& choices, const std::vector<RankedChoice>& ranked,
                     const std::string& reference) {
  for (const RankedChoice& r : ranked) {
    if (r.estimate.known) return choices[r.index];
  }
  for (const auto& c : choices) {
    if (c->name() == reference) return c;
  }
  return nullptr;
}

std::vector<bool> extern_cut(const std::vector<double>& predicted_us, double best_extern_us, double margin) {
  return extern_cut(predicted_us, std::vector<std::string>(predicted_us.size()), best_extern_us, margin, margin);
}

std::vector<bool> extern_cut(const std::vector<double>& predicted_us, const std::vector<std::string>& bounds,
                             double best_extern_us, double margin, double compute_margin) {
  std::vector<bool> cut(predicted_us.size(), false);
  if (margin < 0 || best_extern_us <= 0) return cut;
  for (size_t i = 0; i < predicted_us.size(); ++i) {
    const bool compute = i < bounds.size() && bounds[i] == "compute" && compute_margin > -1;
    cut[i] = predicted_us[i] > best_extern_us * (1 + (compute ? compute_margin : margin));
  }
  return cut;
}

void keep_cached(std::vector<bool>& cut, const std::vector<double>& predicted_us, const std::vector<bool>& cached,
                 double best_extern_us, double cached_margin) {
  if (cached_margin < 0 || best_extern_us <= 0 || best_extern_us > kCheapRunUs) return;
  for (size_t i = 0; i < cut.size() && i < predicted_us.size() && i < cached.size(); ++i) {
    if (cut[i] && cached[i] && predicted_us[i] <= best_extern_us * (1 + cached_margin)) cut[i] = false;
  }
}

std::vector<bool> extern_protected(const std::vector<std::string>& bounds_in_model_order, int protect) {
  std::vector<bool> out(bounds_in_model_order.size(), false);
  for (size_t i = 0; i < out.size() && static_cast<int>(i) < protect; ++i) out[i] = bounds_in_model_order[i] != "compute";
  return out;
}

std::string extern_cut_reason(double least_pruned_us, const std::string& extern_name, double extern_us, double margin,
                              double compute_margin, double cached_margin) {
  std::string margins = fmt::format("margin {:.0f}%", 100 * margin);
  if (compute_margin > -1 && compute_margin < 0) {
    margins += fmt::format("; compute-bound: predicted {:.0f}% faster", -100 * compute_margin);
  } else if (compute_margin >= 0 && compute_margin != margin) {
    margins += fmt::format(", {:.0f}% if compute-bound", 100 * compute_margin);
  }
  if (cached_margin >= 0) margins += fmt::format("; cached: {:.0f}%", 100 * cached_margin);
  return fmt::format("extern first: predicted >= {:.1f} us, {} measured {:.1f} us ({})", least_pruned_us, extern_name,
                     extern_us, margins);
}

bool should_widen(int best_model_rank, int kept) {
  if (best_model_rank < 0 || kept <= 0) return false;
  return best_model_rank >= kept - std::max(1, kept / 4);
}

}  // namespace detail
}  // namespace kiln::runtime
