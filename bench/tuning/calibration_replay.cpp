// Offline replay of the tuner's neighbour calibration over recorded suite runs (issue 16), no GPU needed.
//
// A suite run (bench_tuning_speed suite, parts 0..N-1) records each problem's default-effort tune and its
// exhaustive tune: the exhaustive one measured every template, the default one what it kept. For each GEMM of a
// part, in tuning order, this rebuilds what the default tune's cache knew (the timings its earlier neighbours
// measured), ranks the problem's every template with the real model (estimate()) under several ways of carrying
// the neighbours' timings over, and asks of each: is the fastest template within the first K, and how far is the
// best of the first K from the fastest? Only the calibration differs between the schemes; the plan's variant
// picks, shares, widenings and extern-first pruning are not replayed, so the figures compare schemes with each
// other and do not predict a run.
//
// Two rows come nearer the default effort: its plan (the first --keep-top by rank, one per structural variant,
// --keep in all) cut extern-first against the best extern the exhaustive tune measured, by the model alone and
// with the neighbours' calibration. Still not a run: shared swaps, cached extras and widenings are left out, the
// plan is judged by the exhaustive tune's readings, and the model's ties break as this program sorts them (on
// 1 Dec it read a stream-K pricing change as neutral that lost four decode GEMMs on the device). --dump writes
// every exhaustive timing beside the model's estimate, for fitting the model.
//
//   bench_calibration_replay --keep 10 bench/results/tuning-reports-nvidia-h200-2026-11-29-9456867-part-*.jsonl.xz
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <regex>
#include <string>
#include <vector>

#include "kiln/runtime/perf_model.h"
#include "kiln/runtime/problem.h"
#include "report_lines.h"

namespace {

using namespace kiln;
using namespace kiln::runtime;
using Params = std::map<std::string, std::string>;

struct Timing {
  std::string name;
  Params parameters;
  ChoiceKind kind = ChoiceKind::kTemplate;
  double median_us = 0;
};

struct Tune {
  std::string id;
  Problem problem;
  std::vector<Timing> templates;  // measured, ok
  double best_extern_us = 0;      // the fastest choice the model cannot judge (cuBLAS, cuBLASLt), 0 if none
};

std::optional<Problem> gemm_from_id(const std::string& id) {
  static const std::regex re(R"(m(\d+)_n(\d+)_k(\d+)_(bf16|f16)_([cr]))");
  std::smatch m;
  if (!std::regex_match(id, m, re)) return std::nullopt;
  GemmProblem g;
  g.m = std::stoll(m[1]), g.n = std::stoll(m[2]), g.k = std::stoll(m[3]);
  g.a = g.b = g.epilogue.out = m[4] == "bf16" ? DType::kBF16 : DType::kF16;
  g.b_layout = m[5] == "c" ? Layout::kColMajor : Layout::kRowMajor;
  return Problem::gemm(g);
}

// One part's tunes of one effort, in the order they ran.
using Part = std::map<std::string, std::vector<Tune>>;

bool read_part(const std::string& path, Part& part, std::string& err) {
  std::vector<nlohmann::json> lines;
  if (!bench::read_report_lines(path, lines, err)) return false;
  for (const auto& j : lines) {
    try {
      auto problem = gemm_from_id(j.value("problem", ""));
      if (!problem) continue;
      Tune t{j.at("problem"), *problem, {}};
      for (const auto& c : j["report"]["choices"]) {
        if (!c.value("ok", false)) continue;
        const double us = c.value("median_us", 0.0);
        if (!(us > 0)) continue;
        if (c.value("kind", "") != "template") {
          if (!c.value("partial", false) && (t.best_extern_us == 0 || us < t.best_extern_us)) t.best_extern_us = us;
          continue;
        }
        t.templates.push_back({c.at("name"), c.at("parameters").get<Params>(), ChoiceKind::kTemplate, us});
      }
      part[j.value("effort", "")].push_back(std::move(t));
    } catch (const std::exception& e) {  // a field of the wrong type, a size past int64
      err = path + ": a report kiln cannot read (" + e.what() + ")";
      return false;
    }
  }
  return true;
}

// How the neighbours' timings become a score. A choice measured nearby is scaled by its own measured / modelled
// there (the library's rule) in every scheme but "no per-choice"; the schemes differ in what a choice nobody
// measured nearby is scaled by.
enum class Scheme { kMain, kNoPerChoice, kFamilyLocal, kFamilyLocalOrFit, kMedian, kQuartile };
const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kMain: return "overall x fit (main)";
    case Scheme::kNoPerChoice: return "no per-choice";
    case Scheme::kFamilyLocal: return "family's nearby";
    case Scheme::kFamilyLocalOrFit: return "min(family's, fit)";
    case Scheme::kMedian: return "median ratio";
    case Scheme::kQuartile: return "lower quartile ratio";
  }
  return "?";
}

struct Neighbour {
  const Tune* tune;
  double distance;
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// Scores every template of `truth` (the exhaustive tune of the problem) under a scheme, in score order. With
// `predicted`, also each one's prediction as the tuner makes it for extern-first pruning (perf_model.cpp rank():
// its own ratio nearby, else the lower of its family's nearby and the fit).
std::vector<std::pair<double, const Timing*>> scored(const Tune& truth, const std::vector<Neighbour>& near,
                                                     Scheme scheme, const DevicePeaks& peaks,
                                                     std::map<const Timing*, double>* predicted = nullptr) {
  std::vector<NeighbourTiming> timings;
  std::vector<double> ratios;
  for (const auto& nb : near) {
    for (const auto& t : nb.tune->templates) {
      timings.push_back({nb.tune->problem, t.name, t.parameters, t.kind, t.median_us});
      const ModelEstimate q = estimate(nb.tune->problem, t.kind, t.parameters, peaks);
      if (q.known && q.us > 0) ratios.push_back(std::clamp(t.median_us / q.us, 0.25, 4.0));
    }
  }
  const auto cal = calibrate(timings, peaks);
  const double overall = cal.count("*") ? cal.at("*") : 1.0;
  std::vector<std::pair<double, const Timing*>> out;
  for (const auto& t : truth.templates) {
    const ModelEstimate e = estimate(truth.problem, t.kind, t.parameters, peaks);
    if (!e.known) continue;
    const std::string family = calibration_family(t.kind, t.parameters, e.bound);
    const double fitted = fitted_calibration(family, peaks);
    auto local = cal.find("family:" + family);
    double factor = overall * fitted;
    switch (scheme) {
      case Scheme::kMain:
      case Scheme::kNoPerChoice: break;
      case Scheme::kFamilyLocal:
        if (local != cal.end()) factor = local->second;
        break;
      case Scheme::kFamilyLocalOrFit:
        if (local != cal.end()) factor = std::min(local->second, fitted);
        break;
      case Scheme::kMedian:
        if (!ratios.empty()) factor = quantile(ratios, 0.5);
        break;
      case Scheme::kQuartile:
        if (!ratios.empty()) factor = quantile(ratios, 0.25);
        break;
    }
    auto own = cal.find(t.name);
    if (own != cal.end() && scheme != Scheme::kNoPerChoice) factor = own->second;
    out.push_back({e.us * factor, &t});
    if (predicted != nullptr) {
      double p = local != cal.end() ? std::min(fitted, local->second) : fitted;
      if (own != cal.end()) p = own->second;
      (*predicted)[&t] = e.us * p;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Replay the tuner's neighbour calibration over recorded suite reports (no GPU)"};
  std::vector<std::string> files;
  int keep = 10, keep_top = 0, plain_top = 1;
  bool plain_always = false, plain_kept = false;
  bool verbose = false, show_misses = false;
  std::string show;
  double latency = 0, stage_latency = 0;
  std::string dump;
  app.add_option("reports", files, "tuning-reports-…-part-N.jsonl[.xz], one file per part")->required();
  app.add_option("--keep", keep, "templates a plan keeps")->check(CLI::Range(1, 1000));
  app.add_option("--keep-top", keep_top, "with one per variant first: the first N by rank before the variants (EffortPolicy::keep_top)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--plain-top", plain_top, "the row '+ the model's first N': the plan with neighbours also keeps, uncut, "
                                            "the first N of the model's order without them where they moved them out")
      ->check(CLI::Range(0, 100));
  app.add_flag("--plain-always", plain_always, "the plain order's first also on problems without neighbours, and where "
                                              "the plan kept them (never cut either way)");
  app.add_flag("--plain-kept", plain_kept, "the plain order's first also where the plan kept them (problems with neighbours)");
  app.add_flag("--misses", show_misses, "name each problem the default plan with neighbours, cut extern-first, misses by 1%");
  app.add_flag("--verbose", verbose, "one line per problem where the schemes differ");
  app.add_option("--show", show, "print the first 2K of this problem's order as the tuner ranks it (its plan marked) and "
                                  "under each scheme, and its neighbours");
  app.add_option("--latency", latency, "DevicePeaks::memory_latency_us to replay with (default: the library's)")
      ->check(CLI::Range(0.05, 20.0));
  app.add_option("--stage-latency", stage_latency, "DevicePeaks::stage_latency_us to replay with (default: the library's)")
      ->check(CLI::Range(0.05, 20.0));
  app.add_option("--dump", dump, "write every exhaustive template timing beside the model's estimate (CSV), to fit the model");
  CLI11_PARSE(app, argc, argv);

  DevicePeaks peaks = DevicePeaks::parts_of("sm_90a").back();  // the H200, as from_device() reads it
  if (latency > 0) peaks.memory_latency_us = latency;
  if (stage_latency > 0) peaks.stage_latency_us = stage_latency;

  const std::vector<Scheme> schemes{Scheme::kMain,   Scheme::kNoPerChoice, Scheme::kFamilyLocal,
                                    Scheme::kFamilyLocalOrFit, Scheme::kMedian, Scheme::kQuartile};
  struct Tally {
    int problems = 0, best_kept = 0, within1 = 0, within3 = 0;
    double worst = 1, log_sum = 0;
  };
  std::map<Scheme, Tally> tally;
  Tally alone, alone_diverse, alone_cut, tuner_cut, tuner_cut_plain;
  int plain_extra = 0;  // templates the plain order's first N add to the plans with neighbours
  int plain_timed = 0, plain_timed_by = 0;  // of the plain firsts, those left by the cut (never cut / cut by plain)
  Tally tuner_cut_plain_by;
  int rescued = 0;  // plain firsts timed only because never cut (their prediction would have cut them)
  // A problem's best kept (or left by the cut) over the fastest: 1 when the fastest is kept.
  auto count = [](Tally& t, double ratio) {
    ++t.problems;
    t.best_kept += ratio == 1.0;
    t.within1 += ratio <= 1.01;
    t.within3 += ratio <= 1.03;
    t.worst = std::max(t.worst, ratio);
    t.log_sum += std::log(ratio);
  };
  std::FILE* dump_file = nullptr;
  if (!dump.empty()) {
    dump_file = std::fopen(dump.c_str(), "w");
    if (dump_file == nullptr) {
      fmt::print(stderr, "bench_calibration_replay: cannot write {}\n", dump);
      return 1;
    }
    // fputs, not fmt::print: fmt throws on a failed write (a full disk), and the failure is reported at the close.
    std::fputs("run,problem,name,structure,bound,waves,blocks,occupancy,model_us,compute_us,memory_us,measured_us\n",
               dump_file);
  }
  for (const auto& path : files) {
    Part part;
    std::string err;
    if (!read_part(path, part, err)) {
      fmt::print(stderr, "bench_calibration_replay: {}\n", err);
      return 1;
    }
    const auto& defaults = part["default"];
    std::map<std::string, const Tune*> exhaustive;
    for (const auto& t : part["exhaustive"]) exhaustive[t.id] = &t;
    for (size_t i = 0; i < defaults.size(); ++i) {
      auto ex = exhaustive.find(defaults[i].id);
      if (ex == exhaustive.end() || ex->second->templates.empty()) continue;
      const Tune& truth = *ex->second;
      for (const auto& t : truth.templates) {
        if (dump_file == nullptr) break;
        const ModelEstimate e = estimate(truth.problem, t.kind, t.parameters, peaks);
        if (!e.known) continue;
        std::fputs(fmt::format("{},{},{},{},{},{:.4f},{},{},{:.3f},{:.3f},{:.3f},{:.3f}\n", path, truth.id, t.name,
                               structure_class(t.kind, t.parameters), e.bound, e.waves, e.blocks, e.occupancy, e.us,
                               e.compute_us, e.memory_us, t.median_us)
                       .c_str(),
                   dump_file);
      }
      // The tuner's neighbours: measured earlier in this part, each size within 2x, the nearest 8.
      std::vector<Neighbour> near;
      for (size_t j = 0; j < i; ++j) {
        if (auto d = neighbour_distance(defaults[i].problem, defaults[j].problem)) near.push_back({&defaults[j], *d});
      }
      std::stable_sort(near.begin(), near.end(), [](const auto& a, const auto& b) { return a.distance < b.distance; });
      if (near.size() > 8) near.resize(8);
      double fastest = 1e30;
      for (const auto& t : truth.templates) fastest = std::min(fastest, t.median_us);
      const double ext = truth.best_extern_us, fastest_all = ext > 0 ? std::min(fastest, ext) : fastest;
      // The default effort's plan: the first keep_top by rank, the best-ranked of each other structural variant,
      // then by rank up to `keep`.
      auto plan = [&](const std::vector<std::pair<double, const Timing*>>& order, bool diverse) {
        std::vector<const Timing*> kept;
        std::set<std::string> variants;
        for (size_t r = 0; diverse && r < order.size() && kept.size() < static_cast<size_t>(std::min(keep, keep_top)); ++r) {
          kept.push_back(order[r].second);
          variants.insert(structure_class(order[r].second->kind, order[r].second->parameters));
        }
        for (size_t r = 0; diverse && r < order.size() && kept.size() < static_cast<size_t>(keep); ++r) {
          if (std::find(kept.begin(), kept.end(), order[r].second) != kept.end()) continue;
          if (variants.insert(structure_class(order[r].second->kind, order[r].second->parameters)).second) {
            kept.push_back(order[r].second);
          }
        }
        for (size_t r = 0; r < order.size() && kept.size() < static_cast<size_t>(keep); ++r) {
          if (std::find(kept.begin(), kept.end(), order[r].second) == kept.end()) kept.push_back(order[r].second);
        }
        return kept;
      };
      // That plan as the default effort then cuts it extern-first (EffortPolicy: margin 15%, compute-bound
      // templates 2% faster, the model's first 5 not compute-bound protected) against the best extern measured in
      // full: the best left of it and the externs, over the fastest of all.
      auto plan_cut = [&](const std::vector<std::pair<double, const Timing*>>& order,
                          const std::map<const Timing*, double>& predicted,
                          const std::vector<const Timing*>& also = {},
                          const std::map<const Timing*, double>* also_predicted = nullptr) {
        // `also` is kept too: never cut, or (with also_predicted) cut by those predictions instead.
        std::set<const Timing*> protect;
        if (also_predicted == nullptr) protect.insert(also.begin(), also.end());
        for (size_t r = 0; r < order.size() && r < 5; ++r) {
          if (estimate(truth.problem, order[r].second->kind, order[r].second->parameters, peaks).bound != "compute") {
            protect.insert(order[r].second);
          }
        }
        double best = ext > 0 ? ext : 1e30;
        std::vector<const Timing*> kept = plan(order, true);
        std::set<const Timing*> added;
        for (const Timing* a : also) {
          if (std::find(kept.begin(), kept.end(), a) == kept.end()) kept.push_back(a), added.insert(a);
        }
        if (also_predicted == nullptr) plain_extra += static_cast<int>(added.size());
        for (const Timing* k : kept) {
          const bool compute = estimate(truth.problem, k->kind, k->parameters, peaks).bound == "compute";
          const bool by_plain = also_predicted != nullptr && std::find(also.begin(), also.end(), k) != also.end();
          const double p = by_plain ? std::min(predicted.at(k), also_predicted->at(k)) : predicted.at(k);
          const bool cut = ext > 0 && !protect.count(k) && p > ext * (compute ? 0.98 : 1.15);
          if (ext > 0 && also_predicted == nullptr && !also.empty() && std::find(also.begin(), also.end(), k) != also.end() &&
              predicted.at(k) > ext * (compute ? 0.98 : 1.15)) {
            ++rescued;
          }
          if (!cut && added.count(k)) ++(also_predicted != nullptr ? plain_timed_by : plain_timed);
          if (!cut) best = std::min(best, k->median_us);
        }
        return best / fastest_all;
      };
      {
        // The model alone (its family fits, nothing measured nearby), on every problem: the first `keep` by rank,
        // and as the default effort plans, the best-ranked of each structural variant first.
        std::map<const Timing*, double> predicted;
        const auto order = scored(truth, {}, Scheme::kMain, peaks, &predicted);
        for (bool diverse : {false, true}) {
          double best = 1e30;
          for (const Timing* t : plan(order, diverse)) best = std::min(best, t->median_us);
          count(diverse ? alone_diverse : alone, best / fastest);
        }
        count(alone_cut, plan_cut(order, predicted));
        // As the tuner ranks, with what its earlier neighbours measured.
        std::map<const Timing*, double> predicted_near;
        const auto order_near = scored(truth, near, Scheme::kMain, peaks, &predicted_near);
        if (truth.id == show) {
          const auto kept = plan(order_near, true);
          fmt::print("{} as the tuner ranks it (fastest template {:.1f} us, best extern {:.1f} us; * planned):\n", truth.id,
                     fastest, ext);
          for (size_t r = 0; r < order_near.size() && r < static_cast<size_t>(2 * keep); ++r) {
            const Timing* t = order_near[r].second;
            fmt::print("  {:>3}{} {:<62} score {:7.1f} predicted {:7.1f} measured {:7.1f}\n", r,
                       std::find(kept.begin(), kept.end(), t) != kept.end() ? '*' : ' ', t->name, order_near[r].first,
                       predicted_near.at(t), t->median_us);
          }
        }
        const double ratio = plan_cut(order_near, predicted_near);
        count(tuner_cut, ratio);
        // By default only where the neighbours' timings moved them out of the plan (docs/tuning.md: tried 2 Dec, not
        // adopted).
        std::vector<const Timing*> plain;
        const auto planned_near = plan(order_near, true);
        for (size_t r = 0; (!near.empty() || plain_always) && r < order.size() && r < static_cast<size_t>(plain_top); ++r) {
          if (plain_always || plain_kept ||
              std::find(planned_near.begin(), planned_near.end(), order[r].second) == planned_near.end()) {
            plain.push_back(order[r].second);
          }
        }
        const double ratio_plain = plan_cut(order_near, predicted_near, plain);
        count(tuner_cut_plain, ratio_plain);
        count(tuner_cut_plain_by, plan_cut(order_near, predicted_near, plain, &predicted));
        if (show_misses && ratio_plain != ratio) {
          fmt::print("plain top {} changes {:<28} {:.3f} -> {:.3f}\n", plain_top, truth.id, ratio, ratio_plain);
        }
        if (show_misses && ratio > 1.01) fmt::print("plan+cut miss {:<28} {:.3f}\n", truth.id, ratio);
      }
      if (near.empty()) continue;  // nothing to calibrate with: every scheme ranks alike
      std::string line;
      std::set<double> ratios;
      for (Scheme s : schemes) {
        const auto order = scored(truth, near, s, peaks);
        if (truth.id == show) {
          fmt::print("{} under '{}' (fastest template {:.1f} us):\n", truth.id, scheme_name(s), fastest);
          for (size_t r = 0; r < order.size() && r < static_cast<size_t>(2 * keep); ++r) {
            const auto& t = *order[r].second;
            fmt::print("  {:>3} {:<62} score {:7.1f} model {:7.1f} measured {:7.1f}\n", r, t.name, order[r].first,
                       estimate(truth.problem, t.kind, t.parameters, peaks).us, t.median_us);
          }
          if (s == Scheme::kMain) {
            for (const auto& nb : near) fmt::print("  neighbour {} ({} timings)\n", nb.tune->id, nb.tune->templates.size());
          }
        }
        double best = 1e30;
        for (size_t r = 0; r < order.size() && r < static_cast<size_t>(keep); ++r) {
          best = std::min(best, order[r].second->median_us);
        }
        const double ratio = best / fastest;
        count(tally[s], ratio);
        ratios.insert(std::round(ratio * 1000) / 1000);
        line += fmt::format(" {:.3f}", ratio);
      }
      if (verbose && ratios.size() > 1) fmt::print("{:<28}{}\n", truth.id, line);
    }
  }
  if (dump_file != nullptr) {
    const bool failed = std::ferror(dump_file) != 0;
    if (std::fclose(dump_file) != 0 || failed) {
      fmt::print(stderr, "bench_calibration_replay: writing {} failed\n", dump);
      return 1;
    }
  }
  fmt::print("\n{:<24} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8}\n", "scheme", "problems", "best kept", "within 1%",
             "within 3%", "worst", "geomean");
  auto row = [](const char* name, const Tally& t) {
    fmt::print("{:<24} {:>8} {:>10} {:>10} {:>10} {:>8.3f} {:>8.4f}\n", name, t.problems, t.best_kept, t.within1,
               t.within3, t.worst, std::exp(t.log_sum / std::max(1, t.problems)));
  };
  row("model alone (every GEMM)", alone);
  row("  one per variant first", alone_diverse);
  row("  then extern-first cut", alone_cut);
  row("with neighbours, cut", tuner_cut);
  row(fmt::format("  + model's first {}", plain_top).c_str(), tuner_cut_plain);
  row("  … cut by the plain's", tuner_cut_plain_by);
  fmt::print("(the model's first {} added {} templates to {} plans; timed: {} never cut, {} cut by the lower of the "
             "two predictions)\n",
             plain_top, plain_extra, tuner_cut_plain.problems, plain_timed, plain_timed_by);
  fmt::print("(timed only because never cut: {})\n", rescued);
  for (Scheme s : schemes) row(scheme_name(s), tally[s]);
  return 0;
}
