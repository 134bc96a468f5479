// The rule that turns measured choices into one winner, kept apart from the GPU so it can be tested alone.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/runtime/choice.h"
#include "kiln/runtime/tuner.h"

namespace kiln::runtime::detail {

/// The noise window around the best median: choices within it are not told apart by their timings.
/// max(tie_fraction x best median, the half-width of the best median's ~95% interval, (p90 - p10) / sqrt(reps));
/// without a sample count (reps <= 1 or no p10), the best's p90 - median.
double tie_window(const ChoiceResult& best, double tie_fraction);

/// Which choices are re-measured, interleaved, as near-ties before the winner is picked: those within
/// max(2 x tie_fraction x best median, the best's p90 - median), wider than tie_window(), since a re-measure is
/// cheap and separate stretches of timing drift apart by 2-3%.
double remeasure_window(const ChoiceResult& best, double tie_fraction);

/// The index of the fastest successful, complete (not partial) measurement in `results`; -1 when there is none.
int best_complete(const std::vector<ChoiceResult>& results);

/// The indices of `results` to re-measure as near-ties: the complete measurements within remeasure_window() of
/// the fastest one (that one first), then, while they are fewer than kMinNearTies, the fastest other complete
/// ones within kRunnerUpFraction of it. Empty when fewer than two. Not those stopped early as clearly slower
/// (partial): on the H200 suite (30 Nov, 8592b6a) re-measuring those within the window too, with a fourth round,
/// doubled the re-measure's time (0.011 -> 0.021 s per problem) and held the same 90.8% within 1% of the
/// exhaustive effort's choice.
std::vector<size_t> near_ties(const std::vector<ChoiceResult>& results, double tie_fraction);
/// Runners-up: a complete measurement taken in its own stretch can read several percent off. On the H200 suite
/// (1 Dec, 8934bf3) one tune of 333x8192x3696 read cuBLASLt's algorithm 408 and cuBLAS at 35.3-35.6 us and chose
/// algorithm 409 at 32.5, while the other effort's tune read them at 31.2-31.4 and 409 at 32.8; the side-by-side
/// re-time put 408 3.4% ahead. A re-measure round costs a few runs per choice, so the best few are always
/// compared interleaved.
inline constexpr size_t kMinNearTies = 4;
inline constexpr double kRunnerUpFraction = 0.10;

/// The choices stopped early as clearly slower (partial, successful) whose reading is no longer clearly slower
/// than the fastest complete measurement as it reads now: at most tie_fraction above it, or below it. The
/// verdict was passed against the best as it read then; where a re-measure finds the best slower (the GPU's
/// power state drifts over a heavy GEMM's tune), it no longer holds. Then, while they and the near-ties are
/// fewer than kMinNearTies, the fastest other partials within kRunnerUpFraction: the verdict was passed against
/// a best that read low in its own stretch (H200 suite, 1 Dec, 7ed3d8b: 128x2560x8192's cuBLASLt algorithm 27
/// read 19.7 us and every other choice stopped early against it, kiln's 64x128 tile at 20.2; the exhaustive
/// effort's tune read them 20.5 and 19.9, the side-by-side re-time put the tile 5.8% ahead).
std::vector<size_t> revoked_partials(const std::vector<ChoiceResult>& results, double tie_fraction);

/// The order in which a re-measure's round times `n` choices: forward in even rounds, backward in odd ones, so
/// that no choice always runs right after another and a drift over the rounds does not favour the first
/// (ABBA, as the side-by-side re-time of bench_tuning_speed does it).
std::vector<size_t> round_order(size_t n, int round);

/// Whether a near-tie re-measure should go on after its rounds so far: `leader` and `runner_up` are each round's
/// median of the two choices fastest over all rounds (in round order, one per round). Undecided: at least two
/// rounds, their medians over all rounds (`leader_us`, `runner_up_us`) within kCloseTie of the leader's, the mean
/// of their per-round differences under twice its standard error (the order not known), and that interval (mean
/// +- 2 standard errors) reaching beyond kTieDoesNotMatter of the leader (either pick could still cost that
/// much). A gap beyond kCloseTie is decided whatever the noise. Without the last condition (1cd8d1c, H200 suite)
/// half the problems' re-measures ran to tie_rounds_max on choices a few tenths of a percent apart: 0.034 s a
/// problem against 0.019.
inline constexpr double kCloseTie = 0.015;
inline constexpr double kTieDoesNotMatter = 0.005;
bool tie_unresolved(const std::vector<double>& leader, const std::vector<double>& runner_up, double leader_us,
                    double runner_up_us);

/// Whether a near-tie re-measure told `other` apart as slower than `best`: both timed in at least two of its
/// rounds (each round's median, in round order) and `other`'s median over them beyond kCloseTie of `best_us`, or
/// the mean of their per-round differences above twice its standard error.
bool told_apart_slower(const std::vector<double>& best, const std::vector<double>& other, double best_us,
                       double other_us);

/// Says whether the re-measure told the second choice (by name) apart as slower than the first.
using ToldApart = std::function<bool(const std::string& best, const std::string& other)>;

/// The winner among `results` (any order): the fastest successful, complete measurement; among the choices
/// within tie_window() of it, the lowest `rank`; among those, the fastest, then the lowest name. -1 when none
/// succeeded. A choice beyond tie_fraction of the fastest that `told_apart` (when given) says the interleaved
/// re-measure told apart as slower is out of the window: the best's own spread says how well its median is
/// placed, while the paired rounds say how well the difference is. Why: on the H200 suite (29 Nov-2 Dec, nine
/// runs) the spread-widened window gave a template 0.8-2.0% slower than cuBLASLt the pick three times, and the
/// side-by-side re-time put all three 1.2-5.9% behind the exhaustive effort's pick (333x4096x4096 at 1.059).
int pick_winner(const std::vector<ChoiceResult>& results, const std::function<int(const std::string&)>& rank,
                double tie_fraction, const ToldApart& told_apart = {});

/// From how long a run of a compute-bound problem's best choice is, ties go to the externs: such runs back to
/// back hold the board at its power cap, where a serving engine runs them, and there the vendor's kernels keep
/// more of their speed. Why: on the H200 (2 Dec, `bench_tuning_speed probe`, 512x14336x8192) two wgmma templates
/// and cuBLASLt timed 162-165 us each in the short bursts a tune measures (after idle, or warmed up to 50 ms),
/// and 188-193 against 180-183 us in interleaved rounds after 2 s of load (clocks down to 1485 MHz under the 700 W
/// cap); the suite's side-by-side re-time runs there, and over 76 recorded suite runs the default effort's pick of
/// a template there was 1.000-1.049x the exhaustive's choice (21 runs), of cuBLASLt 0.964-1.030x (55).
/// Over every recorded run, on problems of 80 us or more where the two efforts picked a template and an extern,
/// the extern was the faster in the re-time by 1.3% on average (100 picks one way, 13 the other).
inline constexpr double kSustainedPowerUs = 100;
/// A choice's Choice::tie_rank() in a problem: with `externs_first` (a compute-bound problem whose best run
/// takes kSustainedPowerUs or more: externs_first_on_ties()) the extern rank and the template rank trade places;
/// the other ranks keep theirs.
int problem_tie_rank(int choice_tie_rank, bool externs_first);
bool externs_first_on_ties(double best_us, const std::string& model_bound);

}  // namespace kiln::runtime::detail

namespace kiln::runtime::detail {

/// Which choices a tune compiles and measures first, and which it holds back, from the model's order.
struct TunePlan {
  std::vector<ChoicePtr> first;    // the externs and other choices the model cannot judge, the reference, and
                                   // the top `keep` of the model's order
  std::vector<ChoicePtr> reserve;  // the rest of the model's order, best first: what widening takes from
  std::map<std::string, std::pair<int, double>> model;  // by name: model rank and estimate (us)
  int kept_ranked = 0;             // how many of `first` the model ranked within `keep` (or the reference)
  int cached_extra = 0;            // ranked below `keep` but cached (RankedChoice::cached): in `first` too
  std::vector<ChoicePtr> cached_extras;  // those, in model order
  int shared_swaps = 0;            // ranked below `keep` but kept for sharing (share_margin) in place of another
  int variant_picks = 0;           // ranked below `keep` but kept as the best of its structural variant (diverse)
  std::map<std::string, std::string> structure;  // by name, for the model-ranked choices: structure_class()
  std::string stream_k_pick;       // EffortPolicy::stream_k_pick's choice (kept, added past `keep` if need be)
  ChoicePtr stream_k_choice;       // that choice; null when there is none
};
/// `ranked` is rank()'s answer for `choices`. keep <= 0 keeps everything. `planned`: names of choices planned for
/// other problems (their kernels compile anyway); with `share_margin` > 0 see EffortPolicy::share_margin, with
/// `diverse` EffortPolicy::diverse and EffortPolicy::keep_top, with `stream_k_pick` EffortPolicy::stream_k_pick.
TunePlan plan_choices(const std::vector<ChoicePtr>& choices, const std::vector<RankedChoice>& ranked,
                      const std::string& reference, int keep, const std::set<std::string>& planned = {},
                      double share_margin = 0, bool diverse = false, int keep_top = 0, bool stream_k_pick = false);

/// The choice EffortPolicy::stream_k_pick adds: where the model's first choice is memory-bound, the best-ranked
/// swap-AB persistent stream-K tile of one block per SM that it calls memory-bound over more than one wave, if
/// scored within 15% of the first; null if there is none.
const RankedChoice* stream_k_candidate(const std::vector<RankedChoice>& ranked);

/// What a tune's first widening may compile, before any measurement says around which choice it widens:
/// diverse, the next `widen` of each variant among plan.first (widen_variant); by rank, the next `widen` of the
/// reserve. Empty when the policy never widens.
std::vector<ChoicePtr> first_widenings(const TunePlan& plan, const EffortPolicy& policy);

/// A tune's diverse widening: the next `n` choices of `variant` in model order among `reserve` and `cached`
/// (the cached extras, measured already), each taken out of its list; returns those of the reserve, the ones
/// to compile. A cached extra among the next ranks stands for itself, so a cache `kiln precompile` filled
/// (which compiles every widening's next ranks) leaves the tune nothing to compile.
std::vector<ChoicePtr> widen_variant(std::vector<ChoicePtr>& reserve, std::vector<ChoicePtr>& cached,
                                     const TunePlan& plan, const std::string& variant, size_t n);

/// Diverse widening: which structural variants to widen next, each with the measured choice it is widened
/// around (the fastest of that variant), fastest first. Of the `variants` fastest variants among `measured`
/// (name, median; only the model-ranked ones count: `plan.structure` names them), those whose fastest is below
/// the best extern's time x (1 + near_extern) (any, when no extern was measured: best_extern_us <= 0), and not
/// widened around already (`widened_around`).
std::vector<std::pair<std::string, std::string>> variants_to_widen(
    const std::vector<std::pair<std::string, double>>& measured, const TunePlan& plan, double best_extern_us,
    int variants, double near_extern, const std::set<std::string>& widened_around);

/// Effort none: the model's top choice, else (no choice the model can judge) the reference; null if neither.
ChoicePtr model_pick(const std::vector<ChoicePtr>& choices, const std::vector<RankedChoice>& ranked,
                     const std::string& reference);

/// Extern-first pruning: for each template's calibrated prediction, whether it is cut because it is slower
/// than the best extern's measured time by more than `margin` (predicted > best_extern_us x (1 + margin)).
/// Nothing is cut when margin < 0 or no extern was measured (best_extern_us <= 0).
std::vector<bool> extern_cut(const std::vector<double>& predicted_us, double best_extern_us, double margin);
/// The same with the model's bound per template: one it calls "compute" is cut beyond `compute_margin` instead
/// (when that is above -1; negative: it must be predicted that much faster than the extern).
std::vector<bool> extern_cut(const std::vector<double>& predicted_us, const std::vector<std::string>& bounds,
                             double best_extern_us, double margin, double compute_margin);
/// Lifts the cut of each template whose kernel is cached (`cached`: no compile to wait for) and whose prediction is
/// within `cached_margin` of the best extern (EffortPolicy::extern_margin_cached; negative: nothing lifted), where
/// the best extern runs within kCheapRunUs. Beyond it even a cached choice costs: on the H200 suite (30 Nov,
/// 2a73ea6) lifting the cut everywhere measured up to 7 more templates of 0.25-8 ms a run on the heavy GEMMs,
/// 0.1-0.4 s more for each of their tunes.
constexpr double kCheapRunUs = 100;
void keep_cached(std::vector<bool>& cut, const std::vector<double>& predicted_us, const std::vector<bool>& cached,
                 double best_extern_us, double cached_margin);
/// Which of the model-ranked templates (in model order, by the bound the model gives each) extern-first never
/// cuts: the first `protect` of them where that bound is not "compute" (EffortPolicy::extern_protect).
std::vector<bool> extern_protected(const std::vector<std::string>& bounds_in_model_order, int protect);
/// The report's reason for such cuts: "predicted >= X us, <extern> measured Y us (margin M%[, C% if
/// compute-bound | ; compute-bound: predicted C% faster][; cached: K%])".
std::string extern_cut_reason(double least_pruned_us, const std::string& extern_name, double extern_us, double margin,
                              double compute_margin = -1, double cached_margin = -1);

/// Whether the measurements disagree enough with the model to measure more: the best measured model-ranked
/// choice sits among the last quarter (at least the last one) of the `kept` ranks.
bool should_widen(int best_model_rank, int kept);

}  // namespace kiln::runtime::detail
