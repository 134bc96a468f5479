// Offline (no GPU): why the default effort's pick missed the exhaustive effort's, on a recorded suite run (issue 16).
//
// A suite run records, per problem, the two picks re-timed side by side (tuning-speed-…json: default_us,
// exhaustive_us) and, with --reports, each effort's whole tune report (tuning-reports-…-part-N.jsonl.xz). For
// every problem whose default pick re-timed beyond --within of the exhaustive's, this says which of three things
// happened to the exhaustive's pick in the default tune:
//   not timed     the default plan never measured it (cut by the model's rank or by the extern-first cut: the
//                 reason is named where the report's pruned examples name it). Pruning lost it.
//   stopped early the default tune dropped it as clearly slower than the best it had then.
//   read apart    both tunes measured both picks in full, and the default read its own pick faster: the tunes'
//                 noise (or the re-time's).
//   tie rule      the default read the exhaustive's pick faster, and kept its own within the tie window (a kiln
//                 template goes before a library choice, that before a subgraph, when they time within noise).
// and how many of the exhaustive's choices within 1% of its own best the default timed at all. The two causes
// want different fixes (a wider or better-ranked plan, more or longer-interleaved timing, the tie window), so a run's
// misses are sorted before either is tried.
//
//   bench_tuning_misses bench/results/tuning-speed-nvidia-h200-2026-12-01-eaf2b6e.json
//       bench/results/tuning-reports-nvidia-h200-2026-12-01-eaf2b6e-part-*.jsonl.xz [--json OUT]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report_lines.h"

namespace {

using json = nlohmann::json;

struct Reading {
  bool timed = false, ok = false, partial = false;
  double median_us = 0;
};

// How a tune report read the choice `name`.
Reading reading(const json& report, const std::string& name) {
  Reading r;
  for (const auto& c : report["choices"]) {
    if (c.value("name", "") != name) continue;
    r.timed = true;
    r.ok = c.value("ok", false);
    r.partial = c.value("partial", false);
    r.median_us = c.value("median_us", 0.0);
  }
  return r;
}

// The pruned example that names `name`, if the report lists it among its examples.
std::optional<std::string> pruned_example(const json& report, const std::string& name) {
  if (!report.contains("pruned_examples") || !report["pruned_examples"].is_array()) return std::nullopt;
  for (const auto& e : report["pruned_examples"]) {
    if (!e.is_string()) continue;
    const std::string s = e.get<std::string>();
    if (s.rfind(name + " (", 0) == 0) return s;
  }
  return std::nullopt;
}

std::string us(const Reading& r) {
  if (!r.timed) return "-";
  if (!r.ok) return "failed";
  return fmt::format("{:.2f}{}", r.median_us, r.partial ? " (stopped)" : "");
}

int explain(const std::string& run_path, const std::vector<std::string>& report_paths, double within,
            const std::string& json_out) {
  json run;
  {
    std::error_code ec;
    std::ifstream in(run_path);
    if (!std::filesystem::is_regular_file(run_path, ec) || !in) {
      fmt::print(stderr, "bench_tuning_misses: cannot read {} (not a readable file)\n", run_path);
      return 1;
    }
    run = json::parse(in, nullptr, false);
  }
  if (run.is_discarded() || !run.is_object() || !run.contains("problems") || !run["problems"].is_array()) {
    fmt::print(stderr, "bench_tuning_misses: '{}' is not a merged suite run (no \"problems\")\n", run_path);
    return 1;
  }
  std::map<std::pair<std::string, std::string>, json> reports;  // (problem, effort) -> report
  for (const auto& path : report_paths) {
    std::vector<json> lines;
    std::string err;
    if (!kiln::bench::read_report_lines(path, lines, err)) {
      fmt::print(stderr, "bench_tuning_misses: {}\n", err);
      return 1;
    }
    for (auto& j : lines) reports[{j.value("problem", ""), j.value("effort", "")}] = std::move(j["report"]);
  }

  json misses = json::array();
  std::map<std::string, int> causes;
  int without_reports = 0;
  fmt::print("{:<48} {:>6}  {:<13} {:>20} {:>20}  {}\n", "problem", "ratio", "cause", "default read X / Y",
             "exhaustive read X / Y", "within 1% timed");
  for (const auto& p : run["problems"]) {
    const double d = p.value("default_us", 0.0), e = p.value("exhaustive_us", 0.0);
    if (!(d > 0) || !(e > 0) || d / e <= 1.0 + within) continue;
    const std::string id = p.value("problem", ""), x = p.value("default_choice", ""), y = p.value("exhaustive_choice", "");
    auto dr = reports.find({id, "default"});
    auto er = reports.find({id, "exhaustive"});
    if (dr == reports.end() || er == reports.end()) {
      ++without_reports;
      fmt::print("{:<48} {:>6.4f}  no report of {}\n", id, d / e, dr == reports.end() ? "the default tune" : "the exhaustive tune");
      continue;
    }
    const json& def = dr->second;
    const json& exh = er->second;
    const Reading dx = reading(def, x), dy = reading(def, y), ex = reading(exh, x), ey = reading(exh, y);
    std::string cause, reason;
    if (!dy.timed) {
      cause = "not timed";
      if (auto why = pruned_example(def, y)) reason = *why;
    } else if (!dy.ok) {
      cause = "failed";
    } else if (dy.partial) {
      cause = "stopped early";
    } else {
      cause = dy.median_us < dx.median_us ? "tie rule" : "read apart";
    }
    ++causes[cause];
    // The exhaustive's own near-best: what the default could have picked among and did not time.
    double best = 0;
    for (const auto& c : exh["choices"]) {
      if (!c.value("ok", false) || c.value("partial", false)) continue;
      const double m = c.value("median_us", 0.0);
      if (m > 0 && (best == 0 || m < best)) best = m;
    }
    int near = 0, near_timed = 0;
    for (const auto& c : exh["choices"]) {
      if (!c.value("ok", false) || c.value("partial", false) || c.value("median_us", 0.0) > best * 1.01) continue;
      ++near;
      const Reading r = reading(def, c.value("name", ""));
      if (r.timed && r.ok && !r.partial) ++near_timed;
    }
    fmt::print("{:<48} {:>6.4f}  {:<13} {:>20} {:>20}  {} of {}\n", id.substr(0, 48), d / e, cause,
               us(dx) + " / " + us(dy), us(ex) + " / " + us(ey), near_timed, near);
    if (!reason.empty()) fmt::print("    {}\n", reason);
    auto read = [](const Reading& r) -> json { return r.timed && r.ok ? json(r.median_us) : json(nullptr); };
    misses.push_back({{"problem", id},
                      {"ratio", d / e},
                      {"default_choice", x},
                      {"exhaustive_choice", y},
                      {"cause", cause},
                      {"reason", reason},
                      {"default_read_us", {{"default_choice", read(dx)}, {"exhaustive_choice", read(dy)}}},
                      {"exhaustive_read_us", {{"default_choice", read(ex)}, {"exhaustive_choice", read(ey)}}},
                      {"near_best", near},
                      {"near_best_timed_by_default", near_timed}});
  }
  const int total = static_cast<int>(misses.size());
  fmt::print("\n{} problems, {} misses beyond {:.1f}%: {} not timed by the default tune, {} stopped early, {} read "
             "apart, {} kept by the tie rule, {} failed{}\n",
             run["problems"].size(), total, within * 100, causes["not timed"], causes["stopped early"],
             causes["read apart"], causes["tie rule"], causes["failed"],
             without_reports ? fmt::format(" ({} more without a report)", without_reports) : std::string());
  if (!json_out.empty()) {
    json out{{"run", run_path},
             {"environment", run.value("environment", json::object())},
             {"within", within},
             {"misses", misses},
             {"summary",
              {{"problems", run["problems"].size()},
               {"misses", total},
               {"not_timed", causes["not timed"]},
               {"stopped_early", causes["stopped early"]},
               {"read_apart", causes["read apart"]},
               {"tie_rule", causes["tie rule"]},
               {"failed", causes["failed"]},
               {"without_reports", without_reports}}}};
    std::ofstream f(json_out);
    f << out.dump(1) << "\n";
    f.close();  // a full disk shows at the flush
    if (!f) {
      fmt::print(stderr, "bench_tuning_misses: cannot write {}\n", json_out);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Why the default effort's picks missed the exhaustive's on a recorded suite run (no GPU)"};
  std::string run_path, json_out;
  std::vector<std::string> report_paths;
  double within = 0.01;
  app.add_option("run", run_path, "tuning-speed-…json (bench_tuning_speed merge)")->required();
  app.add_option("reports", report_paths, "tuning-reports-…-part-N.jsonl[.xz] of the same run")->required();
  app.add_option("--within", within, "a miss: the default's pick re-timed beyond this fraction of the exhaustive's")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--json", json_out, "write the misses and their causes here");
  CLI11_PARSE(app, argc, argv);
  try {
    return explain(run_path, report_paths, within, json_out);
  } catch (const json::exception& e) {  // a field of the wrong type in the run or a report
    fmt::print(stderr, "bench_tuning_misses: a run or report it cannot read: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // a read the stream library refuses
    fmt::print(stderr, "bench_tuning_misses: {}\n", e.what());
    return 1;
  }
}
