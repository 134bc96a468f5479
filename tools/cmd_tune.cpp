// kiln tune: tune every problem of a workload and store the results (the main job).
// kiln precompile: compile every choice of a workload into the cache, with no GPU (a build machine).
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kiln/templates/registry.h"
#include "kiln/cache/remote.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/gate.h"
#include "kiln/pool/progress.h"
#include "kiln/runtime.h"
#include "kiln/runtime/budget.h"
#include "kiln/runtime/workload.h"
#include "remote_cli.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

// --configs: a sample per template; past this it is no longer a sample but the whole (pruned) grid.
constexpr int kMaxConfigs = 100000;

struct TuneArgs {
  std::string workload;
  std::string cache_dir;
  std::string mode;
  std::string report;
  std::string arch;
  int device = 0;
  int top = 5;
  int configs = 0;           // 0: the effort's sample (runtime::effort_policy)
  std::string effort;        // empty: $KILN_TUNE_EFFORT, else default
  double budget = 0;         // seconds for the whole workload; 0: unlimited
  bool quiet = false;
  std::vector<std::string> families;  // superseded template families to try anyway
  RemoteArgs remote;
  std::string shard;  // precompile: "i/N"
  std::string compiled_keys;  // precompile: write the keys this process compiled itself to this file
  std::string build_claims;   // precompile: "on" / "off" (KILN_BUILD_CLAIMS)
};

// Records the key of every job this process sends to a compiler (`kiln precompile --compiled-keys`): with
// build claims, what it compiled itself rather than took from another process (bench/compile counts these).
class RecordingExecutor final : public Executor {
 public:
  explicit RecordingExecutor(std::shared_ptr<Executor> inner) : inner_(std::move(inner)) {}
  Submission submit(CompileJob job) override {
    {
      std::lock_guard lock(mu_);
      keys_.push_back(make_key(job.source, job.target).hex());
    }
    return inner_->submit(std::move(job));
  }
  void raise_priority(JobId id, Priority p) override { inner_->raise_priority(id, p); }
  void shutdown() override { inner_->shutdown(); }
  std::string_view kind() const override { return inner_->kind(); }
  int concurrency() const override { return inner_->concurrency(); }
  ExecutorCounters counters() const override { return inner_->counters(); }
  std::vector<std::string> keys() const {
    std::lock_guard lock(mu_);
    return keys_;
  }

 private:
  std::shared_ptr<Executor> inner_;
  mutable std::mutex mu_;
  std::vector<std::string> keys_;
};

// --effort names an effort level.
CLI::Validator known_effort() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        auto e = runtime::parse_effort(name);
        return e.ok() ? "" : e.status().message();
      },
      "EFFORT");
}

// A number that is one: CLI::Range lets "nan" through (every comparison with it is false).
CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        return end != text.c_str() && *end == '\0' && std::isfinite(v) ? "" : "'" + text + "' is not a finite number";
      },
      "NUMBER");
}

// The effort of a run: --effort, else $KILN_TUNE_EFFORT, else default.
Result<runtime::Effort> effort_of(const TuneArgs& a) {
  if (!a.effort.empty()) return runtime::parse_effort(a.effort);
  return runtime::effort_from_env();
}

runtime::TuneOptions sample_options(const TuneArgs& a) {
  runtime::TuneOptions o;
  o.max_template_configs = a.configs;
  return o;
}

// --family names a template family kiln has, or 'all'.
CLI::Validator known_family() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        if (name == "all" || templates::find_template(name).ok()) return "";
        return "unknown template family '" + name + "' (see `kiln templates list`, or give 'all')";
      },
      "FAMILY");
}

// "i/N": this machine's part of a precompile split N ways (0 <= i < N).
Result<std::pair<uint64_t, uint64_t>> parse_shard(const std::string& s) {
  auto bad = [&] {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("--shard '{}': give i/N with 0 <= i < N (e.g. 0/3)", s));
  };
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return bad();
  char* end = nullptr;
  const std::string i_text = s.substr(0, slash), n_text = s.substr(slash + 1);
  const unsigned long long i = std::strtoull(i_text.c_str(), &end, 10);
  if (i_text.empty() || *end != '\0' || i_text[0] == '-') return bad();
  const unsigned long long n = std::strtoull(n_text.c_str(), &end, 10);
  if (n_text.empty() || *end != '\0' || n_text[0] == '-' || n == 0 || n > 100000 || i >= n) return bad();
  return std::pair<uint64_t, uint64_t>{i, n};
}

// Which shard builds a kernel: a function of its content key only, so every build machine agrees without
// talking to the others, and the shards are disjoint and together cover the workload.
uint64_t shard_of(const KernelKey& key, uint64_t shards) { return (key.high ^ (key.low * 0x9e3779b97f4a7c15ull)) % shards; }

Result<std::shared_ptr<cache::TuningCache>> open_cache(const TuneArgs& a, cache::TuneMode fallback,
                                                       std::shared_ptr<cache::RemoteTier> remote = nullptr) {
  cache::TuneMode mode = fallback;
  if (!a.mode.empty()) {
    KILN_ASSIGN_OR_RETURN(mode, cache::parse_tune_mode(a.mode));
  } else {
    KILN_ASSIGN_OR_RETURN(mode, cache::tune_mode_from_env(fallback));
  }
  cache::StoreOptions store;
  store.dir = a.cache_dir;
  KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(mode, store, std::move(remote)));
  return std::shared_ptr<cache::TuningCache>(std::move(c));
}

// The remote tier (null where none is named) and the cache in front of it. On failure `exit_code` is what the
// command returns, and why has been printed: 2 for remote flags that name nothing usable, 1 for a cache that
// does not open.
struct TuneStores {
  std::shared_ptr<cache::RedisTier> tier;
  std::shared_ptr<cache::TuningCache> cache;
  int exit_code = 0;
};

TuneStores open_stores(const TuneArgs& a, std::string_view command, bool write_behind) {
  TuneStores s;
  auto tier = open_remote(a.remote, write_behind);
  if (!tier.ok()) {
    fmt::print(stderr, "{}: {}\n", command, tier.status().to_string());
    s.exit_code = 2;
    return s;
  }
  s.tier = *tier;
  auto cache = open_cache(a, cache::TuneMode::kTune, s.tier);
  if (!cache.ok()) {
    fmt::print(stderr, "{}: {}\n", command, cache.status().to_string());
    s.exit_code = 1;
    return s;
  }
  s.cache = *cache;
  return s;
}

// One kernel to build, with the problems that need it (for their failure lines).
struct PlannedKernel {
  runtime::CompileRequest request;
  KernelKey key;
  std::vector<size_t> problems;
};

// Every distinct kernel of the workload's choices, so that progress and its ETA count compiles, not problems:
// problems share most kernels (a GEMM's configurations do not depend on M), so after the first problem of
// an entry the others are nearly free, and an ETA per problem was off twenty-fold.
Result<std::vector<PlannedKernel>> plan_kernels(const runtime::Workload& w, const Target& target, const TuneArgs& a,
                                                size_t& requests, std::vector<std::string>& failures) {
  KILN_ASSIGN_OR_RETURN(runtime::ChoiceContext ctx, runtime::choice_context_for_arch(target));
  KILN_ASSIGN_OR_RETURN(runtime::Effort effort, effort_of(a));
  ctx.max_template_configs = runtime::template_sample(sample_options(a), effort);
  ctx.families = a.families;
  const std::vector<runtime::DevicePeaks> parts = runtime::DevicePeaks::parts_of(target.arch);
  std::vector<PlannedKernel> out;
  std::unordered_map<KernelKey, size_t> index;
  for (size_t i = 0; i < w.problems.size(); ++i) {
    auto all = runtime::default_ops().choices(w.problems[i], ctx);
    // The effort's share of the choices: those a tune at this effort compiles, every widening included, on every
    // part of the arch.
    auto choices = all.ok() ? runtime::precompile_plan(runtime::default_ops(), w.problems[i], std::move(all).value(),
                                                       effort, parts)
                            : Result<std::vector<runtime::ChoicePtr>>(all.status());
    if (!choices.ok()) {
      failures.push_back(fmt::format("{}: {}", w.problems[i].describe(), choices.status().to_string()));
      continue;
    }
    for (const auto& c : *choices) {
      for (auto& k : c->kernels()) {
        ++requests;
        const KernelKey key = make_key(k.source, k.target);
        auto [it, fresh] = index.emplace(key, out.size());
        if (fresh) out.push_back({std::move(k), key, {}});
        auto& users = out[it->second].problems;
        if (users.empty() || users.back() != i) users.push_back(i);
      }
    }
  }
  return out;
}

// Writes the --report of a run that measured nothing, so that no one reads an empty report as "all fine".
void write_unmeasured_report(const TuneArgs& a, const std::string& why, const nlohmann::json& precompiled) {
  if (a.report.empty()) return;
  nlohmann::json out{{"workload", a.workload}, {"measured", false}, {"reason", why}, {"problems", nlohmann::json::array()},
                     {"precompiled", precompiled}};
  std::ofstream(a.report) << out.dump(2) << "\n";
  fmt::print("wrote {} (nothing measured: {})\n", a.report, why);
}

int run_precompile(const TuneArgs& a, const runtime::Workload& w, const std::string& no_gpu = {}) {
  auto target = Target::parse(a.arch.empty() ? "sm_90a" : a.arch);
  if (!target.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", target.status().to_string());
    return 2;
  }
  std::pair<uint64_t, uint64_t> shard{0, 1};
  if (!a.shard.empty()) {
    auto parsed = parse_shard(a.shard);
    if (!parsed.ok()) {
      fmt::print(stderr, "kiln precompile: {}\n", parsed.status().to_string());
      return 2;
    }
    shard = *parsed;
  }
  // Read-only here: a kernel another build machine already published is fetched, not compiled; this shard's
  // binaries are published by push() at the end, every one of them, whatever a queue could hold.
  const TuneStores stores = open_stores(a, "kiln precompile", false);
  if (stores.exit_code != 0) return stores.exit_code;
  const std::shared_ptr<cache::RedisTier>& tier = stores.tier;
  const std::shared_ptr<cache::TuningCache>& cache = stores.cache;
  auto executor = make_executor();
  if (!executor.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", executor.status().to_string());
    return 1;
  }
  std::shared_ptr<RecordingExecutor> recorder;
  if (!a.compiled_keys.empty()) *executor = recorder = std::make_shared<RecordingExecutor>(*executor);
  if (!a.build_claims.empty()) ::setenv("KILN_BUILD_CLAIMS", a.build_claims.c_str(), 1);
  auto gate = runtime::make_cached_gate(cache, *executor);
  if (!gate.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", gate.status().to_string());
    return 1;
  }
  std::vector<std::string> failures;
  size_t requests = 0;
  auto plan = plan_kernels(w, *target, a, requests, failures);
  if (!plan.ok()) {
    fmt::print(stderr, "kiln precompile: {}\n", plan.status().to_string());
    return 2;
  }
  if (shard.second > 1) {
    const size_t all = plan->size();
    std::erase_if(*plan, [&](const PlannedKernel& k) { return shard_of(k.key, shard.second) != shard.first; });
    fmt::print("shard {}/{}: {} of the workload's {} distinct kernels\n", shard.first, shard.second, plan->size(), all);
  }
  fmt::print("precompiling {} problems of '{}' for {} into {}: {} kernels, {} distinct ({} compile workers, {})\n",
             w.problems.size(), w.name, target->arch, cache->store() ? cache->store()->dir() : "(no cache)",
             requests, plan->size(), (*executor)->concurrency(), (*executor)->kind());
  const auto start = Clock::now();
  ProgressTracker tracker(plan->size());
  ProgressPrinter printer(stderr, ProgressPrinter::Options{.label = "precompile"});
  tracker.listen([&](const ProgressSnapshot& s) { printer.update(s); });
  std::vector<Future<Binary>> futures;
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = 0;  // completions whose progress has not been recorded yet
  for (const auto& k : *plan) {
    Future<Binary> f = (*gate)->precompile(k.request.source, k.request.target, Priority::kBackground,
                                                k.request.cost);
    futures.push_back(f);
    if (f.ready()) {
      tracker.record_free();  // answered by the cache at once: no work, out of the ETA's rate
      continue;
    }
    {
      std::lock_guard lock(mu);
      ++pending;
    }
    f.notify([&, f] {  // runs at once, on this thread, when f completed meanwhile
      tracker.record(f.get().ok());
      std::lock_guard lock(mu);
      if (--pending == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  size_t failed = 0;
  for (size_t i = 0; i < futures.size(); ++i) {
    const Result<Binary>& r = futures[i].get();
    if (!r.ok()) {
      ++failed;
      std::string users;
      for (size_t p : (*plan)[i].problems) users += (users.empty() ? "" : ", ") + w.problems[p].describe();
      failures.push_back(fmt::format("{} (for {}): {}", (*plan)[i].request.source.name, users, r.status().to_string()));
    }
  }
  printer.finish(tracker.snapshot());
  const Status stored = runtime::finish_cache_writes(*cache);
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  auto counters = (*gate)->counters();
  fmt::print("{} kernels, {} distinct: {} compiled now{}, {} already in the cache, {} built by other processes, {} "
             "failed, {:.1f} s\n", requests, plan->size(), counters.compiles, stored.ok() ? "" : " (not all stored)",
             counters.cache_hits + counters.cached_failures, counters.claim_hits + counters.claim_failures, failed, secs);
  if (recorder) {
    std::ofstream out(a.compiled_keys);
    for (const auto& k : recorder->keys()) out << k << "\n";
  }
  for (const auto& f : failures) fmt::print("  FAILED {}\n", f);
  if (!stored.ok()) fmt::print(stderr, "kiln precompile: {}\n", stored.to_string());
  int remote_rc = 0;
  if (tier && cache->store()) {
    cache::SyncOptions push;
    push.binaries_only = true;
    for (size_t i = 0; i < futures.size(); ++i) {
      if (futures[i].get().ok()) push.binaries.push_back((*plan)[i].key);
    }
    auto pushed = cache::push(*cache->store(), *tier, push);
    if (!pushed.ok()) {
      fmt::print(stderr, "kiln precompile: publishing to the remote cache failed: {} (the binaries are in the local "
                         "cache; `kiln cache push` sends them later)\n", pushed.status().to_string());
      remote_rc = 1;
    } else {
      fmt::print("published {} binaries to {}{}\n", pushed->binaries, tier->describe(),
                 tier->signing() ? " (signed)" : "");
      for (const auto& e : pushed->errors) fmt::print(stderr, "  {}\n", e);
      if (pushed->withheld) {
        fmt::print(stderr, "kiln precompile: {} binaries not published: no fleet key (--key-file or KILN_CACHE_KEY_FILE)"
                           " and unsigned binaries not allowed\n", pushed->withheld);
      }
      if (pushed->failed) fmt::print(stderr, "kiln precompile: the remote did not store {} binaries\n", pushed->failed);
      if (pushed->withheld || pushed->failed) remote_rc = 1;
    }
    fmt::print("{}\n", remote_summary_line(*tier));
  }
  if (!no_gpu.empty()) {
    write_unmeasured_report(a, no_gpu,
                            {{"arch", target->arch}, {"kernels", requests}, {"distinct", plan->size()},
                             {"compiled", counters.compiles}, {"cached", counters.cache_hits + counters.cached_failures},
                             {"failed", failed}, {"stored", stored.ok()}});
  }
  return failures.empty() && stored.ok() ? remote_rc : 1;
}

int run_tune(const TuneArgs& a) {
  auto w = runtime::load_workload(a.workload);
  if (!w.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", w.status().to_string());
    return 2;
  }
  auto ctx = ensure_context(a.device);
  if (!ctx.ok()) {
    const std::string why = fmt::format("no GPU ({})", ctx.status().to_string());
    auto mode = a.mode.empty() ? cache::tune_mode_from_env(cache::TuneMode::kTune) : cache::parse_tune_mode(a.mode);
    if (!mode.ok()) {
      fmt::print(stderr, "kiln tune: {}\n", mode.status().to_string());
      return 2;
    }
    if (*mode == cache::TuneMode::kStrict) {
      // Strict mode promises that every problem has its decision; without a device none can be checked.
      fmt::print(stderr, "kiln tune: strict mode: no decision of '{}' could be checked: {}\n", a.workload, why);
      write_unmeasured_report(a, why, nullptr);
      return 1;
    }
    fmt::print("kiln tune: {}\nno GPU here: precompiling the workload's kernels instead (kiln precompile); nothing "
               "is measured\n", ctx.status().to_string());
    return run_precompile(a, *w, why);
  }
  const TuneStores stores = open_stores(a, "kiln tune", true);
  if (stores.exit_code != 0) return stores.exit_code;
  const std::shared_ptr<cache::RedisTier>& tier = stores.tier;
  const std::shared_ptr<cache::TuningCache>& cache = stores.cache;
  auto effort = effort_of(a);
  if (!effort.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", effort.status().to_string());
    return 2;
  }
  runtime::TuneOptions options;
  options.cache = cache;
  options.device = a.device;
  options.max_template_configs = a.configs;
  options.families = a.families;
  options.effort = *effort;
  auto tuner = runtime::make_tuner(options);
  if (!tuner.ok()) {
    fmt::print(stderr, "kiln tune: {}\n", tuner.status().to_string());
    return 1;
  }
  // --budget: what the budget cannot cover gets the model's pick, unmeasured, from a tuner at effort none
  // sharing the cache and the compile pool.
  std::unique_ptr<runtime::Tuner> fallback;
  if (a.budget > 0) {
    runtime::TuneOptions none = options;
    none.effort = runtime::Effort::kNone;
    none.executor = nullptr;
    auto made = runtime::make_tuner(none);
    if (!made.ok()) {
      fmt::print(stderr, "kiln tune: {}\n", made.status().to_string());
      return 1;
    }
    fallback = std::move(made).value();
  }
  const auto start = Clock::now();
  fmt::print("tuning {} problems of '{}' on {} (cache {} in {} mode)\n", w->problems.size(), w->name,
             (*tuner)->context().device.name,
             cache->store() ? cache->store()->dir() : std::string("off"), cache::tune_mode_name(cache->mode()));
  ProgressTracker tracker(w->problems.size());
  ProgressPrinter printer(stderr, ProgressPrinter::Options{.label = "tune"});
  tracker.listen([&](const ProgressSnapshot& s) { printer.update(s); });
  nlohmann::json reports = nlohmann::json::array();
  int errors = 0, cached_decisions = 0;
  std::vector<std::string> lines;
  // With a budget, the problems where tuning can gain most per second go first.
  runtime::TuneBudget budget(a.budget);
  std::vector<size_t> order(w->problems.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  constexpr double kPriorCostS = 0.15;  // a cold default-effort tune (the target), until measured
  if (budget.limited()) {
    std::vector<runtime::BudgetItem> items;
    for (size_t i = 0; i < w->problems.size(); ++i) {
      items.push_back({i, runtime::roofline_us(w->problems[i], (*tuner)->peaks()), kPriorCostS});
    }
    order = runtime::TuneBudget::order(items);
  }
  // Every undecided problem's choices start compiling in the background, in tuning order, planned on a thread
  // of their own: while one problem is benchmarked the next ones' kernels are being built (tune() raises what it
  // waits for), and each problem is planned again a few tunes before its own (runtime::PlanAhead).
  // (A warm start loads only the decided kernels: nothing planned.)
  const runtime::UndecidedProblems undecided = runtime::undecided_problems(**tuner, w->problems, order);
  const std::vector<std::ptrdiff_t>& ahead_index = undecided.index;
  runtime::PlanAhead ahead(**tuner, undecided.problems, runtime::PlanAhead::Options{});
  std::vector<std::string> not_tuned;
  for (size_t i : order) {
    runtime::Tuner* use = tuner->get();
    if (fallback && !budget.fits(budget.expected_cost(kPriorCostS))) {
      use = fallback.get();
    }
    const auto t0 = Clock::now();
    auto sel = use->tune(w->problems[i]);
    if (ahead_index[i] >= 0) ahead.tuned(static_cast<size_t>(ahead_index[i]));
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    if (use == fallback.get() && sel.ok() && !(*sel)->report().decision_from_cache) {
      not_tuned.push_back(fmt::format("{} ({})", w->problems[i].describe(), w->labels[i]));
    } else if (sel.ok() && !(*sel)->report().decision_from_cache) {
      budget.spent(took);
    }
    // A cached decision costs next to nothing: left out of the ETA's rate.
    if (sel.ok() && (*sel)->report().decision_from_cache) tracker.record_free();
    else tracker.record(sel.ok());
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
  const Status stored = runtime::finish_cache_writes(*cache);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& l : lines) fmt::print("{}\n", l);
  fmt::print("tuned {} problems in {:.3f} s at {} effort: {} from cached decisions, {} errors{}\n", w->problems.size(), secs,
             runtime::effort_name(*effort), cached_decisions, errors, stored.ok() ? "" : "; the results were not all stored");
  if (budget.limited()) {
    fmt::print("budget {:.1f} s: {} problems not tuned (the model's pick, unmeasured; tune them later)\n", a.budget,
               not_tuned.size());
    for (const auto& n : not_tuned) fmt::print("  not tuned: {}\n", n);
  }
  if (tier) {
    // The remote is an accelerator, not a requirement: its failures are said here, and the exit status
    // stays that of the tune, which ran from the local cache.
    if (Status s = tier->drain(std::chrono::seconds(5)); !s.ok()) fmt::print(stderr, "kiln tune: {}\n", s.to_string());
    fmt::print("{}\n", remote_summary_line(*tier));
  }
  if (!a.report.empty()) {
    nlohmann::json out{{"workload", w->name}, {"device", (*tuner)->context().device.name}, {"seconds", secs},
                       {"cached_decisions", cached_decisions}, {"errors", errors}, {"stored", stored.ok()},
                       {"effort", runtime::effort_name(*effort)}, {"budget_seconds", a.budget},
                       {"not_tuned", not_tuned}, {"problems", reports}};
    std::ofstream(a.report) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", a.report);
  }
  if (!stored.ok()) fmt::print(stderr, "kiln tune: {}\n", stored.to_string());
  return errors == 0 && stored.ok() ? 0 : 1;
}

void add_tune_commands(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  auto* tune = app.add_subcommand("tune", "Tune every problem of a workload on the GPU and store the results");
  tune->add_option("--workload", args->workload, "Workload JSON (see examples/llama3-8b.json)")->required();
  add_cache_dir_option(tune, args->cache_dir);
  tune->add_option("--mode", args->mode, "tune | use | strict | off (default $KILN_TUNE_MODE, else tune)");
  tune->add_option("--report", args->report, "Write a JSON report of every problem here");
  tune->add_option("--device", args->device, "CUDA device ordinal (default 0)")->check(CLI::Range(0, 1023));
  tune->add_option("--top", args->top, "Choices shown per problem (default 5)")->check(CLI::Range(1, 100000));
  tune->add_option("--configs", args->configs,
                   "Template configurations per template before the model ranks them (default: the effort's)")
      ->check(CLI::Range(1, kMaxConfigs));
  tune->add_option("--effort", args->effort, "none | quick | default | exhaustive (default $KILN_TUNE_EFFORT, else "
                                             "default; see docs/tuning.md)")
      ->check(known_effort());
  tune->add_option("--budget", args->budget, "Seconds for the whole workload: the problems with the most to gain "
                                             "go first; the rest get the model's pick, reported as not tuned")
      ->check(finite_number())
      ->check(CLI::Range(0.001, 1e9));
  tune->add_option("--arch", args->arch, "Without a GPU: the arch to precompile for (default sm_90a)");
  tune->add_flag("--quiet", args->quiet, "One line per problem");
  tune->add_option("--family", args->families,
                  "Also try this superseded template family (gemm_mma_sm80 on sm_90a), or 'all'; repeatable")
      ->check(known_family());
  add_remote_options(tune, args->remote);
  on_run(tune, args, run_tune);

  auto pargs = std::make_shared<TuneArgs>();
  auto* pre = app.add_subcommand("precompile", "Compile every choice of a workload into the cache (no GPU needed)");
  pre->add_option("--workload", pargs->workload, "Workload JSON")->required();
  pre->add_option("--arch", pargs->arch, "Target arch, e.g. sm_90 or sm_90a (default sm_90a)");
  add_cache_dir_option(pre, pargs->cache_dir);
  add_remote_options(pre, pargs->remote, "Fetch kernels others built from, and publish this run's to, this remote cache");
  pre->add_option("--shard", pargs->shard, "Build only part i of N (i/N, 0-based): N build machines split a workload "
                                           "by content key, disjointly");
  pre->add_option("--configs", pargs->configs,
                  "Template configurations per template before the model ranks them (default: the effort's)")
      ->check(CLI::Range(1, kMaxConfigs));
  pre->add_option("--build-claims", pargs->build_claims,
                  "on (default): processes sharing the cache compile each kernel once; off: every process compiles "
                  "what it misses (as KILN_BUILD_CLAIMS)")
      ->check(CLI::IsMember({"on", "off"}));
  pre->add_option("--compiled-keys", pargs->compiled_keys, "Write the key of every kernel this process compiled itself "
                                                           "to this file, one per line");
  pre->add_option("--effort", pargs->effort, "Compile what a tune at this effort compiles: none | quick | default | "
                                             "exhaustive (default $KILN_TUNE_EFFORT, else default)")
      ->check(known_effort());
  pre->add_option("--family", pargs->families,
                  "Also try this superseded template family (gemm_mma_sm80 on sm_90a), or 'all'; repeatable")
      ->check(known_family());
  on_run(pre, pargs, [](const TuneArgs& a) {
    auto w = runtime::load_workload(a.workload);
    if (!w.ok()) {
      fmt::print(stderr, "kiln precompile: {}\n", w.status().to_string());
      return 2;
    }
    return run_precompile(a, *w);
  });
}

}  // namespace

KILN_REGISTER_COMMAND(add_tune_commands);

}  // namespace kiln::cli
