// kiln tune: tune every problem of a workload and store the results (the main job).
// kiln precompile: compile every choice of a workload into the cache, with no GPU (a build machine).
#include <chrono>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/gate.h"
#include "kiln/pool/progress.h"
#include "kiln/runtime.h"
#include "kiln/runtime/workload.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct TuneArgs {
  std::string workload;
  std::string cache_dir;
  std::string mode;
  std::string report;
  std::string arch;
  int device = 0;
  int top = 5;
  int configs = 24;
  bool quiet = false;
};

Result<std::shared_ptr<cache::TuningCache>> open_cache(const TuneArgs& a, cache::TuneMode fallback) {
  cache::TuneMode mode = fallback;
  if (!a.mode.empty()) {
    KILN_ASSIGN_OR_RETURN(mode, cache::parse_tune_mode(a.mode));
  } else {
    KILN_ASSIGN_OR_RETURN(mode, cache::tune_mode_from_env(fallback));
  }
  cache::StoreOptions store;
  store.dir = a.cache_dir;
  KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(mode, store));
  return std::shared_ptr<cache::TuningCache>(std::move(c));
}

int run_precompile(const TuneArgs& a, const runtime::Workload& w) {
  auto target = Target::parse(a.arch.empty() ? "sm_90a" : a.arch);
  if (!target.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", target.status().to_string());
    return 2;
  }
  auto cache = open_cache(a, cache::TuneMode::kTune);
  if (!cache.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", cache.status().to_string());
    return 1;
  }
  auto executor = make_executor();
  if (!executor.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", executor.status().to_string());
    return 1;
  }
  auto gate = runtime::make_cached_gate(*cache, *executor);
  if (!gate.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", gate.status().to_string());
    return 1;
  }
  fmt::print("precompiling {} problems of '{}' for {} into {} ({} compile workers, {})\n", w.problems.size(), w.name,
             target->arch, (*cache)->store() ? (*cache)->store()->dir() : "(no cache)", (*executor)->concurrency(),
             (*executor)->kind());
  runtime::TuneOptions options;
  options.max_template_configs = a.configs;
  const auto start = Clock::now();
  ProgressTracker tracker(w.problems.size());
  ProgressPrinter printer(stderr, ProgressPrinter::Options{.label = "precompile"});
  tracker.listen([&](const ProgressSnapshot& s) { printer.update(s); });
  int kernels = 0, cached = 0, failed = 0;
  std::vector<std::string> failures;
  for (const auto& p : w.problems) {
    auto r = runtime::precompile_problem(runtime::default_ops(), p, *target, **gate, options);
    if (!r.ok()) {
      failures.push_back(fmt::format("{}: {}", p.describe(), r.status().to_string()));
      tracker.record(false);
      continue;
    }
    kernels += r->kernels;
    cached += r->cached;
    failed += r->failed;
    for (auto& f : r->failures) failures.push_back(std::move(f));
    tracker.record(r->failed == 0);
  }
  printer.finish(tracker.snapshot());
  if (auto* store = (*cache)->store()) (void)store->flush();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  auto counters = (*gate)->counters();
  fmt::print("{} kernel requests: {} distinct compiles, {} already cached, {} shared in flight, {} failed, {:.1f} s\n",
             kernels, counters.compiles, cached, counters.joined, failed, secs);
  for (const auto& f : failures) fmt::print("  FAILED {}\n", f);
  return failures.empty() ? 0 : 1;
}

int run_tune(const TuneArgs& a) {
  auto w = runtime::load_workload(a.workload);
  if (!w.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", w.status().to_string());
    return 2;
  }
  auto ctx = ensure_context(a.device);
  if (!ctx.ok()) {
    fmt::print("kiln tune: {}\nno GPU here: precompiling the workload's kernels instead (kiln precompile)\n",
               ctx.status().to_string());
    return run_precompile(a, *w);
  }
  auto cache = open_cache(a, cache::TuneMode::kTune);
  if (!cache.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", cache.status().to_string());
    return 1;
  }
  runtime::TuneOptions options;
  options.cache = *cache;
  options.device = a.device;
  options.max_template_configs = a.configs;
  auto tuner = runtime::make_tuner(options);
  if (!tuner.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", tuner.status().to_string());
    return 1;
  }
  const auto start = Clock::now();
  // Every problem's choices start compiling now, in the background: while one problem is benchmarked the
  // next ones' kernels are being built (tune() raises what it waits for to normal priority).
  for (const auto& p : w->problems) {
    auto decided = (*cache)->lookup_decision((*tuner)->key(p));
    if (decided.ok() && *decided) continue;  // a warm start loads only the decided kernel
    auto choices = runtime::default_ops().choices(p, (*tuner)->context());
    if (!choices.ok()) continue;
    for (const auto& c : *choices) (void)c->precompile((*tuner)->gate(), Priority::kBackground);
  }
  fmt::print("tuning {} problems of '{}' on {} (cache {} in {} mode)\n", w->problems.size(), w->name,
             (*tuner)->context().device.name,
             (*cache)->store() ? (*cache)->store()->dir() : std::string("off"), cache::tune_mode_name((*cache)->mode()));
  ProgressTracker tracker(w->problems.size());
  ProgressPrinter printer(stderr, ProgressPrinter::Options{.label = "tune"});
  tracker.listen([&](const ProgressSnapshot& s) { printer.update(s); });
  nlohmann::json reports = nlohmann::json::array();
  int errors = 0, cached_decisions = 0;
  std::vector<std::string> lines;
  for (size_t i = 0; i < w->problems.size(); ++i) {
    auto sel = (*tuner)->tune(w->problems[i]);
    tracker.record(sel.ok());
    if (!sel.ok()) {
      ++errors;
      lines.push_back(fmt::format("ERROR {} ({}): {}", w->problems[i].describe(), w->labels[i], sel.status().to_string()));
      continue;
    }
    const auto& r = (*sel)->report();
    cached_decisions += r.decision_from_cache;
    reports.push_back(nlohmann::json::parse(r.json()));
    reports.back()["label"] = w->labels[i];
    if (!a.quiet && !r.decision_from_cache) lines.push_back(r.table(a.top));
    else lines.push_back(fmt::format("{} ({}): {}{}", r.problem, w->labels[i], r.chosen,
                                     r.decision_from_cache ? " (cached decision)" : ""));
  }
  printer.finish(tracker.snapshot());
  if (auto* store = (*cache)->store()) (void)store->flush();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& l : lines) fmt::print("{}\n", l);
  fmt::print("tuned {} problems in {:.3f} s: {} from cached decisions, {} errors\n", w->problems.size(), secs,
             cached_decisions, errors);
  if (!a.report.empty()) {
    nlohmann::json out{{"workload", w->name}, {"device", (*tuner)->context().device.name}, {"seconds", secs},
                       {"cached_decisions", cached_decisions}, {"errors", errors}, {"problems", reports}};
    std::ofstream(a.report) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", a.report);
  }
  return errors == 0 ? 0 : 1;
}

void add_tune_commands(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  auto* tune = app.add_subcommand("tune", "Tune every problem of a workload on the GPU and store the results");
  tune->add_option("--workload", args->workload, "Workload JSON (see examples/llama3-8b.json)")->required();
  tune->add_option("--cache-dir", args->cache_dir, "Cache folder (default $KILN_CACHE_DIR or ~/.cache/kiln)");
  tune->add_option("--mode", args->mode, "tune | use | strict | off (default $KILN_TUNE_MODE, else tune)");
  tune->add_option("--report", args->report, "Write a JSON report of every problem here");
  tune->add_option("--device", args->device, "CUDA device ordinal (default 0)");
  tune->add_option("--top", args->top, "Choices shown per problem (default 5)");
  tune->add_option("--configs", args->configs, "Template configurations per template (default 24)");
  tune->add_option("--arch", args->arch, "Without a GPU: the arch to precompile for (default sm_90a)");
  tune->add_flag("--quiet", args->quiet, "One line per problem");
  tune->callback([args] {
    int rc = run_tune(*args);
    if (rc != 0) throw ExitCode(rc);
  });

  auto pargs = std::make_shared<TuneArgs>();
  auto* pre = app.add_subcommand("precompile", "Compile every choice of a workload into the cache (no GPU needed)");
  pre->add_option("--workload", pargs->workload, "Workload JSON")->required();
  pre->add_option("--arch", pargs->arch, "Target arch, e.g. sm_90 or sm_90a (default sm_90a)");
  pre->add_option("--cache-dir", pargs->cache_dir, "Cache folder (default $KILN_CACHE_DIR or ~/.cache/kiln)");
  pre->add_option("--configs", pargs->configs, "Template configurations per template (default 24)");
  pre->callback([pargs] {
    auto w = runtime::load_workload(pargs->workload);
    if (!w.ok()) {
      fmt::print(stderr, "kiln precompile: {}\n", w.status().to_string());
      throw ExitCode(2);
    }
    int rc = run_precompile(*pargs, *w);
    if (rc != 0) throw ExitCode(rc);
  });
}

}  // namespace

KILN_REGISTER_COMMAND(add_tune_commands);

}  // namespace kiln::cli
