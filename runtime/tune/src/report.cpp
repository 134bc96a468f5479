// TuneReport's table and JSON.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "kiln/runtime/tuner.h"

namespace kiln::runtime {

std::string TuneReport::table(int top) const {
  std::string out = fmt::format("{}\n  chosen {}{}; {} choices, {} failed; compile wait {:.3f} s, benchmark {:.3f} s, total {:.3f} s\n",
                                problem, chosen, decision_from_cache ? " (cached decision)" : "", candidates, failures,
                                compile_wait_seconds, benchmark_seconds, total_seconds);
  if (generate_seconds + plan_seconds + setup_seconds > 0) {
    out += fmt::format("  host: generate {:.3f} s, plan {:.3f} s, benchmark setup {:.3f} s\n", generate_seconds, plan_seconds,
                       setup_seconds);
  }
  if (benchmark_seconds > 0) {
    out += fmt::format("  benchmark: prepare {:.3f} s, check {:.3f} s, measure {:.3f} s, near-tie re-measure {:.3f} s\n",
                       prepare_seconds, check_seconds, measure_seconds, remeasure_seconds);
    if (revived > 0) out += fmt::format("  {} dropped as slower measured again: the best read slower re-measured\n", revived);
  }
  if (!note.empty()) out += "  note: " + note + "\n";
  if (!effort.empty()) {
    out += fmt::format("  effort {}: {} pruned by the performance model, {} widenings, chosen at model rank {}{}\n",
                       effort, pruned, widenings, chosen_model_rank, measured ? "" : " (not measured)");
    for (const auto& [why, n] : pruned_reasons) out += fmt::format("    pruned {}: {}\n", n, why);
    if (cached_candidates > 0 || neighbour_timings > 0) {
      out += fmt::format("    {} candidates cached before the tune (no compile), model refined by {} neighbouring timings\n",
                         cached_candidates, neighbour_timings);
    }
    if (shared_swaps > 0) {
      out += fmt::format("    {} candidates from just past the model's cut-off kept instead: another problem compiles them\n",
                         shared_swaps);
    }
    if (variant_picks > 0) {
      out += fmt::format("    {} candidates past the model's cut-off kept as the best-ranked of their structural variant\n",
                         variant_picks);
    }
    if (!stream_k_pick.empty()) {
      out += fmt::format("    {} kept as the best-ranked stream-K tile of a memory-bound grid (never cut extern-first)\n",
                         stream_k_pick);
    }
  }
  if (externs_first_on_ties) {
    out += "    ties went to the externs first (a long compute-bound problem: runs back to back hold the power cap)\n";
  }
  double best = 0;
  for (const auto& c : choices) {
    if (c.status.ok() && !c.partial) {
      best = c.median_us;
      break;
    }
  }
  int shown = 0;
  out += fmt::format("  {:<64} {:>10} {:>7} {:>16} {:>5} {:>5}  {}\n", "choice", "median us", "% best", "p10-p90 us", "runs",
                     "model", "");
  for (const auto& c : choices) {
    if (!c.status.ok() || shown >= top) continue;
    ++shown;
    std::string flags;
    if (c.name == chosen) flags += "chosen ";
    if (c.partial) flags += "dropped-early ";
    if (c.from_cache) flags += "cached ";
    if (c.graph) flags += "graph ";
    out += fmt::format("  {:<64} {:>10.2f} {:>6.1f}% {:>7.2f}-{:<8.2f} {:>5} {:>5}  {}\n", c.name.substr(0, 64), c.median_us,
                       best > 0 ? 100.0 * best / c.median_us : 0.0, c.p10_us, c.p90_us, c.reps,
                       c.model_rank >= 0 ? std::to_string(c.model_rank) : std::string("-"), flags);
  }
  for (const auto& c : choices) {
    if (c.status.ok()) continue;
    out += fmt::format("  FAILED {}: {}\n", c.name, c.status.to_string());
  }
  return out;
}

std::string TuneReport::json() const {
  nlohmann::json j;
  j["problem"] = problem;
  j["key"] = key;
  j["chosen"] = chosen;
  j["reference"] = reference;
  j["candidates"] = candidates;
  j["failures"] = failures;
  j["decision_from_cache"] = decision_from_cache;
  j["compile_wait_seconds"] = compile_wait_seconds;
  j["benchmark_seconds"] = benchmark_seconds;
  j["prepare_seconds"] = prepare_seconds;
  j["check_seconds"] = check_seconds;
  j["measure_seconds"] = measure_seconds;
  j["remeasure_seconds"] = remeasure_seconds;
  j["extra_tie_rounds"] = extra_tie_rounds;
  if (measure_costs.runs > 0) {
    const MeasureCosts& m = measure_costs;
    j["measure_costs"] = {{"warmup_s", m.warmup_s}, {"capture_s", m.capture_s}, {"queue_s", m.queue_s},
                          {"wait_s", m.wait_s},     {"gpu_span_s", m.gpu_span_s}, {"timed_s", m.timed_s},
                          {"runs", m.runs},         {"batches", m.batches}};
  }
  j["load_seconds"] = load_seconds;
  j["generate_seconds"] = generate_seconds;
  j["plan_seconds"] = plan_seconds;
  j["setup_seconds"] = setup_seconds;
  j["total_seconds"] = total_seconds;
  if (!note.empty()) j["note"] = note;
  j["effort"] = effort;
  j["measured"] = measured;
  j["pruned"] = pruned;
  j["pruned_reasons"] = pruned_reasons;
  j["pruned_examples"] = pruned_examples;
  j["pruned_extern_first"] = pruned_extern_first;
  j["best_extern"] = best_extern;
  j["best_extern_us"] = best_extern_us;
  j["extern_margin"] = extern_margin;
  j["extern_margin_compute"] = extern_margin_compute;
  j["cached_candidates"] = cached_candidates;
  j["shared_swaps"] = shared_swaps;
  j["variant_picks"] = variant_picks;
  j["stream_k_pick"] = stream_k_pick;
  j["externs_first_on_ties"] = externs_first_on_ties;
  j["neighbour_timings"] = neighbour_timings;
  j["widenings"] = widenings;
  j["revived"] = revived;
  j["chosen_model_rank"] = chosen_model_rank;
  j["choices"] = nlohmann::json::array();
  for (const auto& c : choices) {
    nlohmann::json cj{{"name", c.name}, {"kind", choice_kind_name(c.kind)}, {"ok", c.status.ok()}};
    if (c.status.ok()) {
      cj["median_us"] = c.median_us;
      cj["min_us"] = c.min_us;
      cj["p10_us"] = c.p10_us;
      cj["p90_us"] = c.p90_us;
      cj["runs"] = c.reps;
      cj["partial"] = c.partial;
      cj["from_cache"] = c.from_cache;
      if (c.wait_s > 0) cj["wait_s"] = c.wait_s;
      cj["graph"] = c.graph;
      cj["relative_error"] = c.error;
      if (c.model_rank >= 0) {
        cj["model_rank"] = c.model_rank;
        cj["model_us"] = c.model_us;
      }
    } else {
      cj["error"] = c.status.to_string();
    }
    if (!c.parameters.empty()) cj["parameters"] = c.parameters;
    j["choices"].push_back(std::move(cj));
  }
  return j.dump();
}

}  // namespace kiln::runtime
