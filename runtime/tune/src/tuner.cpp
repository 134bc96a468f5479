#include "kiln/runtime/tuner.h"

#include <algorithm>
#include <chrono>
#include <list>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kiln/runtime/build_claims.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/perf_model.h"
#include "selection_rule.h"
#include "kiln/cache/store.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/version.h"

namespace kiln::runtime {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

ChoiceResult cached_result(const Choice& c, const cache::TimingRecord& t) {
  ChoiceResult r;
  r.name = c.name();
  r.kind = c.kind();
  r.from_cache = true;
  r.parameters = c.parameters();
  if (!t.ok) {
    r.status = make_error(t.error == ErrorCode::kOk ? ErrorCode::kWrongResult : t.error, "cached failure: " + t.reason);
    return r;
  }
  r.median_us = t.median_us;
  r.min_us = t.min_us;
  r.p90_us = t.p90_us;
  r.reps = static_cast<int>(t.samples);
  return r;
}
}  // namespace

struct Tuner::Impl {
  TuneOptions options;
  TuneServices services;
  std::shared_ptr<cache::TuningCache> cache;
  std::shared_ptr<Executor> executor;
  std::shared_ptr<DeferredExecutor> deferred;  // the executor when it is the default one, started on demand
  void compiles_coming() const {
    if (deferred) deferred->start();
  }
  std::unique_ptr<PrecompileGate> gate;
  ChoiceContext ctx;
  cache::DeviceFingerprint fingerprint;
  cache::VersionStamp versions;
  CUcontext context = nullptr;
  /// Makes the tuner's context current on a thread that has none (PlanAhead's, a serving engine's worker): there
  /// cuBLASLt's heuristics answer nothing and nothing can be measured. A thread with another context keeps it.
  Status use_context() const {
    if (!context) return Status();
    KILN_ASSIGN_OR_RETURN(CUcontext current, current_context());
    if (current) return Status();
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuCtxSetCurrent(context));
    return Status();
  }
  Effort effort = Effort::kDefault;
  EffortPolicy policy;
  DevicePeaks peaks;

  std::mutex bench_mu;  // one benchmark at a time on the device
  std::unique_ptr<BenchRunner> bench;
  // Isolation::kIsolated: where choices are measured (the bench worker process for this tuner's device),
  // made on the first tune that measures anything.
  std::unique_ptr<BenchSandbox> sandbox;

  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<Selection>> selections;  // by cache key
  std::vector<TuneReport> reports;
  // Problems this tuner measured, in order: their timings in the cache refine the model for neighbouring
  // shapes of later problems (a workload's other sizes).
  std::vector<Problem> measured_problems;

  // Choices planned_choices() generated, by cache key, until tune() takes them: a workload plans every problem
  // (to precompile in the background) and then tunes it, which generated each problem's choices twice.
  // Bounded (a GEMM problem's choices hold ~3.5 MB of rendered sources): once this many wait, later plans keep
  // nothing, so the first problems planned (the first tuned) keep theirs and the rest generate again in tune()
  // (cheap: templates memoise).
  static constexpr size_t kMaxGenerated = 32;
  std::map<std::string, std::vector<ChoicePtr>> generated;
  void keep_generated(const std::string& key, const std::vector<ChoicePtr>& choices) {
    std::lock_guard lock(mu);
    if (generated.size() < kMaxGenerated || generated.count(key)) generated[key] = choices;
  }
  std::optional<std::vector<ChoicePtr>> take_generated(const std::string& key) {
    std::lock_guard lock(mu);
    auto it = generated.find(key);
    if (it == generated.end()) return std::nullopt;
    std::vector<ChoicePtr> out = std::move(it->second);
    generated.erase(it);
    return out;
  }

  // Names of the model-ranked choices this tuner planned (planned_choices(), tune()): their kernels compile
  // anyway, so near the model's cut-off another problem prefers them (EffortPolicy::share_margin).
  std::set<std::string> planned;
  std::set<std::string> planned_names() const {
    std::lock_guard lock(mu);
    return planned;
  }
  void note_planned(const detail::TunePlan& plan) {
    std::lock_guard lock(mu);
    for (const auto& c : plan.first) {
      if (plan.model.count(c->name())) planned.insert(c->name());
    }
  }
  detail::TunePlan plan(const Problem& problem, const std::vector<ChoicePtr>& choices,
                        const std::vector<RankedChoice>& order, const std::string& reference) {
    detail::TunePlan p = detail::plan_choices(choices, order, reference, keep_for(policy, problem), planned_names(),
                                              policy.share_margin, policy.diverse, policy.keep_top,
                                              policy.stream_k_pick);
    note_planned(p);
    return p;
  }

  std::string key_of(const Problem& p) const { return p.key(fingerprint, versions).canonical(); }
  void progress(const TuneProgress& p) const {
    if (options.progress) options.progress(p);
  }
  Result<Binaries> compile(const Choice& c, Priority priority) {
    Future<Binaries> f = c.precompile(*gate, priority, QueueOrder::kLongestFirst);
    return f.get();
  }
  Result<std::shared_ptr<Selection>> finish(const Problem& problem, ChoicePtr choice, TuneReport report,
                                            const std::string& key);
  /// The model's order of `choices`, refined by the cache's timings of the same choices on the neighbouring
  /// sizes of the dynamic dimension (half and double).
  /// With `check_cached`, choices whose binaries the cache already holds are marked (RankedChoice::cached) and
  /// go first among equal scores. `neighbour_timings` (when given) gets how many cached timings refined it.
  std::vector<RankedChoice> ranked(const Problem& problem, const std::vector<ChoicePtr>& choices,
                                   bool check_cached = false, int* neighbour_timings = nullptr) const;
  Result<std::shared_ptr<Selection>> run_tune(const Problem& problem, const std::string& key,
                                              std::shared_ptr<const OpDef> def, std::vector<ChoicePtr> choices,
                                              TuneReport report, Clock::time_point start);
};

Tuner::Tuner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tuner::~Tuner() = default;

Result<std::unique_ptr<Tuner>> Tuner::create(TuneOptions options, TuneServices services) {
  if (services.ops == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "Tuner::create needs an op registry (TuneServices::ops)");
  }
  auto impl = std::make_unique<Impl>();
  KILN_ASSIGN_OR_RETURN(impl->context, ensure_context(options.device));
  KILN_ASSIGN_OR_RETURN(impl->ctx, choice_context(options.device));
  if (options.effort) {
    impl->effort = *options.effort;
  } else {
    KILN_ASSIGN_OR_RETURN(impl->effort, effort_from_env());
  }
  impl->policy = effort_policy(impl->effort);
  impl->peaks = impl->ctx.has_device ? DevicePeaks::from_device(impl->ctx.device)
                                     : DevicePeaks::for_arch(impl->ctx.target.arch);
  impl->ctx.max_template_configs =
      options.max_template_configs > 0 ? options.max_template_configs : impl->policy.sample_per_template;
  impl->ctx.max_cublas_algos = options.max_cublas_algos;
  impl->ctx.split_k = options.split_k;
  impl->ctx.families = options.families;
  impl->fingerprint = cache::DeviceFingerprint::from(impl->ctx.device);
  impl->versions = cache::VersionStamp::current(services.library_versions);
  if (options.cache) {
    impl->cache = options.cache;
  } else {
    KILN_ASSIGN_OR_RETURN(cache::TuneMode mode, cache::tune_mode_from_env());
    std::optional<cache::RemoteOptions> remote_options = options.remote;
    if (!remote_options) {
      KILN_ASSIGN_OR_RETURN(remote_options, cache::RemoteOptions::from_env());
    }
    std::shared_ptr<cache::RemoteTier> remote;
    if (remote_options && mode != cache::TuneMode::kOff) {
      KILN_ASSIGN_OR_RETURN(remote, cache::RedisTier::open(*remote_options));
    }
    KILN_ASSIGN_OR_RETURN(auto opened, cache::TuningCache::open(mode, {}, std::move(remote)));
    impl->cache = std::move(opened);
  }
  if (options.executor) {
    impl->executor = options.executor;
  } else {
    // Unless configured, the default pool starts when compiles are coming (a tune without a cached decision, a
    // plan): a warm start that finds everything cached never starts compile workers.
    KILN_ASSIGN_OR_RETURN(impl->executor, make_executor_on_demand());
  }
  impl->deferred = std::dynamic_pointer_cast<DeferredExecutor>(impl->executor);  // started on demand
  KILN_ASSIGN_OR_RETURN(impl->gate, make_cached_gate(impl->cache, impl->executor));
  impl->options = std::move(options);
  // Resolved, so that whoever reads the options (the isolation sandbox regenerating choices in its worker,
  // Tuner::options()) sees the sample and effort this tuner really uses.
  impl->options.effort = impl->effort;
  impl->options.max_template_configs = impl->ctx.max_template_configs;
  impl->services = std::move(services);
  return std::unique_ptr<Tuner>(new Tuner(std::move(impl)));
}

const ChoiceContext& Tuner::context() const { return impl_->ctx; }
std::string Tuner::key(const Problem& problem) const { return impl_->key_of(problem); }
cache::TuningCache& Tuner::cache() const { return *impl_->cache; }
PrecompileGate& Tuner::gate() const { return *impl_->gate; }
const TuneOptions& Tuner::options() const { return impl_->options; }
const OpRegistry& Tuner::ops() const { return *impl_->services.ops; }
Effort Tuner::effort() const { return impl_->effort; }
const DevicePeaks& Tuner::peaks() const { return impl_->peaks; }

std::vector<RankedChoice> Tuner::Impl::ranked(const Problem& problem, const std::vector<ChoicePtr>& choices,
                                              bool check_cached, int* neighbour_timings) const {
  std::vector<NeighbourTiming> neighbours;
  const int64_t size = problem.dynamic_size();
  std::map<std::string, const Choice*> by_name;
  for (const auto& c : choices) by_name[c->name()] = c.get();
  // The neighbours: half and double the dynamic size (a deferred selection's other hints, an earlier
  // workload), and the problems this tuner measured whose sizes are each within a factor of 2 (the nearest 8,
  // nearest first: a deterministic set for a given order of tunes).
  std::vector<Problem> near;
  for (int64_t n : {size / 2, size * 2}) {
    if (n <= 0 || n == size || n > (int64_t{1} << 31) - 1) continue;
    near.push_back(problem.with_dynamic_size(n));
  }
  {
    std::vector<std::pair<double, size_t>> by_distance;
    std::lock_guard lock(mu);
    for (size_t i = 0; i < measured_problems.size(); ++i) {
      if (auto d = neighbour_distance(problem, measured_problems[i])) by_distance.push_back({*d, i});
    }
    std::stable_sort(by_distance.begin(), by_distance.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < std::min<size_t>(8, by_distance.size()); ++i) {
      const Problem& p = measured_problems[by_distance[i].second];
      if (std::find(near.begin(), near.end(), p) == near.end()) near.push_back(p);
    }
  }
  for (const Problem& other : near) {
    for (const auto& t : cache->timings(key_of(other))) {
      auto it = by_name.find(t.choice);
      if (!t.ok || t.median_us <= 0 || it == by_name.end()) continue;
      neighbours.push_back({other, t.choice, it->second->parameters(), it->second->kind(), t.median_us});
    }
  }
  if (neighbour_timings) *neighbour_timings = static_cast<int>(neighbours.size());
  const auto calibration = calibrate(neighbours, peaks);
  std::vector<RankedChoice> order = rank(problem, choices, peaks, calibration);
  if (!check_cached) return order;
  // Cached binaries: a template whose every kernel the cache holds costs nothing to compile. Looked up within
  // the ranks a tune at this effort may reach (the kept ones, every widening, and what `kiln precompile`
  // compiles beyond them: the same horizon), and the ties at its end; choices further down are not asked for
  // their kernels at all.
  const size_t horizon = static_cast<size_t>(keep_for(policy, problem) +
                                             policy.widen * std::max(1, policy.widen_variants) * (policy.max_widenings + 1));
  std::set<std::string> cached;
  double last_score = -1;
  size_t seen = 0;
  for (const auto& r : order) {
    if (!r.estimate.known) continue;
    if (seen >= horizon && r.score_us != last_score) break;
    ++seen;
    last_score = r.score_us;
    const auto kernels = choices[r.index]->kernels();
    bool all = !kernels.empty();
    for (const auto& k : kernels) {
      if (!all) break;
      // A binary only speculated (PlanAhead's widening guesses) is not one: counted, the tune measured every such
      // guess in the window up front (H200 suite, 2 Dec: +13% templates measured, +1 s over 120 problems); left
      // uncounted, it serves a widening that reaches it with no compile to wait for.
      const KernelKey key = make_key(k.source, k.target);
      all = cache->lookup_binary(key, k.target.arch).ok() && !gate->speculative_only(key);
    }
    if (all) cached.insert(choices[r.index]->name());
  }
  if (cached.empty()) return order;
  return rank(problem, choices, peaks, calibration, cached);
}

Result<std::vector<ChoicePtr>> Tuner::planned_choices(const Problem& problem) const {
  KILN_ASSIGN_OR_RETURN(PlannedChoices planned, plan_ahead(problem));
  return std::move(planned.first);
}

Result<PlannedChoices> Tuner::plan_ahead(const Problem& problem) const {
  KILN_RETURN_IF_ERROR(impl_->use_context());
  impl_->compiles_coming();
  KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> choices, impl_->services.ops->choices(problem, impl_->ctx));
  impl_->keep_generated(impl_->key_of(problem), choices);  // tune() takes them instead of generating again
  KILN_ASSIGN_OR_RETURN(auto def, impl_->services.ops->find(problem.op));
  const auto order = impl_->ranked(problem, choices);
  PlannedChoices out;
  if (!impl_->policy.measure) {
    if (ChoicePtr pick = detail::model_pick(choices, order, def->reference(problem))) out.first.push_back(pick);
    return out;
  }
  detail::TunePlan plan = impl_->plan(problem, choices, order, def->reference(problem));
  out.widening = detail::first_widenings(plan, impl_->policy);
  out.first = std::move(plan.first);
  return out;
}

std::vector<TuneReport> Tuner::reports() const {
  std::lock_guard lock(impl_->mu);
  return impl_->reports;
}

Result<std::shared_ptr<Selection>> Tuner::Impl::finish(const Problem& problem, ChoicePtr choice, TuneReport report,
                                                        const std::string& key) {
  auto sel = std::make_shared<Selection>(problem, std::move(choice), std::move(report));
  KILN_RETURN_IF_ERROR(sel->reserve_workspace(sel->choice()->workspace_bytes()));
  std::lock_guard lock(mu);
  auto [it, inserted] = selections.emplace(key, sel);
  reports.push_back(it->second->report());
  return it->second;
}

Result<std::shared_ptr<Selection>> Tuner::tune(const Problem& problem) {
  Impl& s = *impl_;
  const Clock::time_point start = Clock::now();
  KILN_RETURN_IF_ERROR(problem.validate());
  const std::string key = s.key_of(problem);
  {
    std::lock_guard lock(s.mu);
    if (auto it = s.selections.find(key); it != s.selections.end()) return it->second;
  }
  KILN_RETURN_IF_ERROR(s.use_context());  // (after the lookup: a selection this tuner holds needs no driver call)
  KILN_ASSIGN_OR_RETURN(auto def, s.services.ops->find(problem.op));
  TuneReport report;
  report.problem = problem.describe();
  report.key = key;
  report.reference = def->reference(problem);

  // A cached decision: rebuild (or find) the chosen choice, compile it (normally a binary-cache hit) and
  // prepare it; measure nothing.
  KILN_ASSIGN_OR_RETURN(auto decision, s.cache->lookup_decision(key));
  std::vector<ChoicePtr> choices;
  bool generated = false;
  auto generate = [&]() -> Status {
    if (generated) return Status();
    const Clock::time_point t = Clock::now();
    if (auto planned = s.take_generated(key)) {
      choices = std::move(*planned);
    } else {
      KILN_ASSIGN_OR_RETURN(choices, s.services.ops->choices(problem, s.ctx));
    }
    report.candidates = static_cast<int>(choices.size());
    report.generate_seconds = seconds_since(t);
    generated = true;
    return Status();
  };
  auto by_name = [&](const std::string& name) -> ChoicePtr {
    for (const auto& c : choices) {
      if (c->name() == name) return c;
    }
    return nullptr;
  };
  if (decision) {
    ChoicePtr c;
    if (def->rebuild) {
      auto rebuilt = def->rebuild(problem, decision->choice, decision->params, s.ctx);
      if (rebuilt.ok()) c = std::move(rebuilt).value();
    }
    if (!c) {
      KILN_RETURN_IF_ERROR(generate());
      c = by_name(decision->choice);
    }
    if (c) {
      const Clock::time_point fetch = Clock::now();
      auto binaries = s.compile(*c, Priority::kOnDemand);
      report.compile_wait_seconds = seconds_since(fetch);
      const Clock::time_point load = Clock::now();
      Status ready = !binaries.ok()          ? binaries.status()
                     : s.options.defer_loads ? c->prepare_deferred(*binaries)
                                             : c->prepare(*binaries);
      report.load_seconds = seconds_since(load);
      if (ready.ok()) {
        report.chosen = c->name();
        report.decision_from_cache = true;
        report.total_seconds = seconds_since(start);
        return s.finish(problem, c, std::move(report), key);
      }
      spdlog::warn("kiln: cached decision '{}' for {} cannot be used ({}); choosing again", decision->choice,
                   report.problem, ready.to_string());
    } else {
      spdlog::warn("kiln: cached decision '{}' for {} is not among its choices now; choosing again",
                   decision->choice, report.problem);
    }
    if (s.cache->mode() == cache::TuneMode::kStrict) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("strict mode: the cached decision for {} cannot be used", report.problem));
    }
  }
  s.compiles_coming();  // before generating, so that the pool is up when the first compiles come
  KILN_RETURN_IF_ERROR(generate());
  report.effort = std::string(effort_name(s.effort));
  if (!s.policy.measure && s.cache->mode() != cache::TuneMode::kStrict) {
    // Effort none: the model's pick, compiled and prepared, nothing measured. No decision is stored, so
    // that a later tune at a higher effort measures instead of trusting an unmeasured pick.
    const auto order = s.ranked(problem, choices);
    ChoicePtr pick = detail::model_pick(choices, order, report.reference);
    if (!pick) return make_error(ErrorCode::kInternal, fmt::format("{} has no reference choice", report.problem));
    auto binaries = s.compile(*pick, Priority::kOnDemand);
    Status ready = binaries.ok() ? pick->prepare(*binaries) : binaries.status();
    if (!ready.ok() && pick->name() != report.reference) {
      spdlog::warn("kiln: the model's pick {} for {} cannot be used ({}); using the reference", pick->name(),
                   report.problem, ready.to_string());
      pick = by_name(report.reference);
      if (!pick) return make_error(ErrorCode::kInternal, fmt::format("{} has no reference choice", report.problem));
      KILN_ASSIGN_OR_RETURN(Binaries b, s.compile(*pick, Priority::kOnDemand));
      KILN_RETURN_IF_ERROR(pick->prepare(b));
    } else if (!ready.ok()) {
      return ready;
    }
    int rank = 0;
    for (const auto& r : order) {
      if (!r.estimate.known) continue;
      if (choices[r.index] == pick) report.chosen_model_rank = rank;
      ++rank;
    }
    report.measured = false;
    report.pruned = static_cast<int>(choices.size()) - 1;
    if (report.pruned > 0) report.pruned_reasons["effort none: not measured"] = report.pruned;
    report.chosen = pick->name();
    report.note = "effort none: the performance model's pick, not measured (no decision stored)";
    report.total_seconds = seconds_since(start);
    return s.finish(problem, pick, std::move(report), key);
  }
  if (s.cache->mode() == cache::TuneMode::kUse || s.cache->mode() == cache::TuneMode::kStrict) {
    ChoicePtr ref = by_name(report.reference);
    if (!ref) return make_error(ErrorCode::kInternal, fmt::format("{} has no reference choice", report.problem));
    KILN_ASSIGN_OR_RETURN(Binaries b, s.compile(*ref, Priority::kOnDemand));
    KILN_RETURN_IF_ERROR(ref->prepare(b));
    report.chosen = ref->name();
    report.note = "no cached decision and this mode never measures: using the reference choice";
    report.total_seconds = seconds_since(start);
    return s.finish(problem, ref, std::move(report), key);
  }
  return s.run_tune(problem, key, def, std::move(choices), std::move(report), start);
}

Result<std::shared_ptr<Selection>> Tuner::Impl::run_tune(const Problem& problem, const std::string& key,
                                                          std::shared_ptr<const OpDef> def,
                                                          std::vector<ChoicePtr> choices, TuneReport report,
                                                          Clock::time_point start) {
  // The model's plan: the choices ranked near the top (and every choice it cannot judge: the extern libraries,
  // the reference) start compiling now; benchmarking takes them as they arrive. The rest wait in model order
  // for a widening, and are reported as pruned if none comes.
  const Clock::time_point plan_start = Clock::now();
  const std::vector<RankedChoice> order = ranked(problem, choices, policy.keep > 0, &report.neighbour_timings);
  detail::TunePlan plan = this->plan(problem, choices, order, report.reference);
  report.shared_swaps = plan.shared_swaps;
  report.variant_picks = plan.variant_picks;
  report.stream_k_pick = plan.stream_k_pick;
  std::set<const Choice*> first;
  for (const auto& c : plan.first) first.insert(c.get());
  std::map<const Choice*, const RankedChoice*> model_of;  // the model-ranked choices
  for (const auto& r : order) {
    if (r.estimate.known) model_of[choices[r.index].get()] = &r;
  }
  // Extern-first: what the model cannot judge (the extern libraries, the reference) is measured first, while
  // the templates compile; then the templates predicted slower than the best of those by more than the
  // effort's margin are cut before their compiles are waited for.
  std::vector<ChoicePtr> to_measure, templates_to_measure;
  std::vector<Future<Binaries>> futures, template_futures;
  std::vector<ChoiceResult> results;
  std::vector<ChoicePtr> reserve;
  ChoicePtr reference;
  for (const auto& c : choices) {
    if (c->name() == report.reference) reference = c;
    if (!cache->should_measure(key, c->name())) {
      if (auto t = cache->cached_timing(key, c->name())) results.push_back(cached_result(*c, *t));
    } else if (first.count(c.get())) {
      const bool modelled = model_of.count(c.get()) > 0;
      if (modelled && model_of[c.get()]->cached) ++report.cached_candidates;
      (modelled ? templates_to_measure : to_measure).push_back(c);
      (modelled ? template_futures : futures).push_back(c->precompile(*gate, Priority::kNormal, QueueOrder::kLongestFirst));
    }
  }
  report.extern_margin = policy.extern_margin;
  report.extern_margin_compute = policy.extern_margin_compute;
  for (const auto& c : plan.reserve) {
    if (cache->should_measure(key, c->name())) reserve.push_back(c);
  }
  if (!reference) return make_error(ErrorCode::kInternal, fmt::format("{} has no reference choice", report.problem));

  report.plan_seconds = seconds_since(plan_start);
  const Clock::time_point setup_start = Clock::now();
  std::lock_guard bench_lock(bench_mu);
  // Created on the first measurement: a warm start that only loads decisions never pays for it.
  if (!bench) {
    KILN_ASSIGN_OR_RETURN(bench, BenchRunner::create(options.bench, ctx.device));
  }
  // Isolation: the worker starts now, so its start-up overlaps the compiles and the reference run below
  // (never for a tune with nothing to measure).
  if (options.isolation == Isolation::kIsolated && !sandbox && !(to_measure.empty() && templates_to_measure.empty())) {
    if (!services.sandbox) {
      return make_error(ErrorCode::kFailedPrecondition, "isolated benchmarks asked for, but this tuner has no sandbox");
    }
    KILN_ASSIGN_OR_RETURN(sandbox, services.sandbox(options.isolation_options, options.device));
  }
  double compile_wait = 0;
  // Choices are checked on the first set and timed over all of them (BenchmarkOptions::placements).
  KILN_ASSIGN_OR_RETURN(OperandSets operands, make_operand_sets(*def, problem, options.seed, options.bench.placements,
                                                                options.bench.placement_bytes));
  const OpBuffers& buffers = operands.sets.front();
  const std::vector<const OpArgs*> operand_args = operands.args();
  {
    // An op fills its buffers on any stream (the built-ins use the legacy one); the benchmark stream is
    // non-blocking, so the inputs must be complete before anything runs on it.
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuCtxSynchronize());
  }
  size_t workspace_bytes = 0;
  for (const auto& c : choices) workspace_bytes = std::max(workspace_bytes, c->workspace_bytes());
  KILN_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::allocate(workspace_bytes));

  // Outputs the choices also read keep their starting content for every checked run, the reference's included.
  KILN_RETURN_IF_ERROR(bench->capture_initial(buffers.outputs));
  // The reference first: every other choice is checked against its output.
  {
    auto t = Clock::now();
    KILN_ASSIGN_OR_RETURN(Binaries b, compile(*reference, Priority::kOnDemand));
    compile_wait += seconds_since(t);
    Status ready = reference->prepare(b);
    if (ready.ok()) ready = reference->run(buffers.args, workspace.ptr(), bench->stream());
    if (ready.ok()) ready = bench->capture_reference(buffers.outputs);
    if (!ready.ok()) return ready.with_context(fmt::format("running the reference {} of {}", reference->name(), report.problem));
  }
  report.setup_seconds = seconds_since(setup_start) - compile_wait;
  const Clock::time_point bench_start = Clock::now();
  const MeasureCosts costs_before = bench->costs();
  const double setup_compile_wait = compile_wait;
  // (An op whose own verify() does the checking may have no output regions.)
  const double tolerance = def->tolerance(std::get_if<GemmProblem>(&problem.desc)
                                              ? std::get<GemmProblem>(problem.desc).epilogue.out
                                              : buffers.outputs.empty() ? DType::kF32 : buffers.outputs.front().dtype);

  // Isolation: the choices the bench worker can rebuild are checked and measured there, so that a fault or a
  // hang costs a worker, not this context; the rest are measured in this process as below.
  std::unique_ptr<BenchSession> isolated;
  if (options.isolation == Isolation::kIsolated && !(to_measure.empty() && templates_to_measure.empty())) {
    KILN_ASSIGN_OR_RETURN(Binaries reference_binaries, compile(*reference, Priority::kOnDemand));
    // The reserve too: a widening's choices are measured in the worker like the first ones.
    std::vector<ChoicePtr> session_choices = to_measure;
    session_choices.insert(session_choices.end(), templates_to_measure.begin(), templates_to_measure.end());
    session_choices.insert(session_choices.end(), reserve.begin(), reserve.end());
    KILN_ASSIGN_OR_RETURN(isolated, sandbox->begin(options, problem, *reference, reference_binaries, session_choices));
  }

  TuneProgress progress_state{report.problem, 0, 0, 0, static_cast<int>(to_measure.size() + templates_to_measure.size())};
  double best_us = 0;
  for (const auto& r : results) {
    if (r.status.ok() && !r.partial && (best_us == 0 || r.median_us < best_us)) best_us = r.median_us;
  }
  // Stores a choice's timing as it stands; a second timing of it replaces the first.
  auto store_timing = [&](const ChoiceResult& r) {
    cache::TimingRecord rec;
    rec.problem = key;
    rec.choice = r.name;
    rec.median_us = r.median_us;
    rec.min_us = r.min_us;
    rec.p90_us = r.p90_us;
    rec.samples = static_cast<uint32_t>(r.reps);
    if (Status st = cache->record_timing(std::move(rec)); !st.ok()) spdlog::warn("kiln: {}", st.to_string());
  };
  // Checks a prepared choice's output against the reference's (and the op's own verify()); its relative error
  // goes to `error`.
  auto check_choice = [&](const Choice& c, double& error) -> Status {
    const auto t_check = Clock::now();
    auto checked = bench->check(c, buffers.args, workspace.ptr(), buffers.outputs, tolerance);
    if (checked.ok()) error = *checked;
    Status st = checked.status();
    if (st.ok() && def->verify) st = def->verify(problem, buffers.args, bench->stream());
    report.check_seconds += seconds_since(t_check);
    return st;
  };
  std::vector<ChoicePtr> measured_choices;  // prepared, measured successfully, in results order
  std::vector<ChoicePtr> timed_choices;     // prepared and timed, stopped early (partial) or not
  bool stopped = false;
  // Measures `batch` (its `batch_futures` already started) in the order its compiles complete.
  auto measure_batch = [&](const std::vector<ChoicePtr>& batch, std::vector<Future<Binaries>>& batch_futures) -> Status {
  auto completion = in_completion_order(batch_futures);
  for (;;) {
    auto t = Clock::now();
    std::optional<size_t> next = completion.next();
    const double waited = seconds_since(t);
    compile_wait += waited;
    if (!next) break;
    const ChoicePtr& c = batch[*next];
    ChoiceResult r;
    r.wait_s = waited;
    r.name = c->name();
    r.kind = c->kind();
    r.parameters = c->parameters();
    ++progress_state.compiled;
    const Result<Binaries>& binaries = batch_futures[*next].get();
    Status status = binaries.status();
    const bool in_worker = status.ok() && isolated && isolated->covers(*c);  // Isolation
    Result<Samples> samples = make_error(ErrorCode::kInternal, "not measured");
    if (in_worker) {
      const auto t_measure = Clock::now();
      KILN_ASSIGN_OR_RETURN(samples, isolated->check_and_measure(*c, *binaries, best_us, &r.error));
      report.measure_seconds += seconds_since(t_measure);
    } else {
      const auto t_prepare = Clock::now();
      if (status.ok() && c.get() != reference.get()) status = c->prepare(*binaries);
      // Built-in choices (library algorithms, kiln's templates and subgraphs) are timed first and checked after:
      // one its short estimate drops (2,375 of 3,004 in the 29 Nov H200 suite) cannot be chosen, so its check (a
      // run, a compare and two waits, ~0.9 ms) is skipped. A user's own kernel is always checked, first, so
      // that its author hears it is wrong even when it is also slow. check() restores or poisons the outputs
      // the timed runs wrote, so the order changes nothing it compares.
      const bool check_first = c->kind() == ChoiceKind::kUser;
      auto run_check = [&]() { status = check_choice(*c, r.error); };
      const auto t_prepared = Clock::now();
      report.prepare_seconds += std::chrono::duration<double>(t_prepared - t_prepare).count();
      if (status.ok() && check_first) run_check();
      const auto t_measure = Clock::now();
      samples = status.ok() ? bench->measure(*c, operand_args, workspace.ptr(), best_us) : Result<Samples>(status);
      report.measure_seconds += seconds_since(t_measure);
      if (samples.ok() && !samples->partial && !check_first) {
        run_check();
        if (!status.ok()) samples = status;
      }
    }
    if (samples.ok()) {
      Summary sum = summarize(*samples);
      r.median_us = sum.median;
      r.min_us = sum.min;
      r.p10_us = sum.p10;
      r.p90_us = sum.p90;
      r.reps = static_cast<int>(samples->us.size());
      r.partial = samples->partial;
      r.graph = samples->graph;
      if (!r.partial && (best_us == 0 || r.median_us < best_us)) best_us = r.median_us;
      // A partial (early-dropped) timing is stored too: it proves the choice far slower, so it is not
      // measured again on the next start.
      store_timing(r);
      if (!r.partial) measured_choices.push_back(c);
      timed_choices.push_back(c);
      ++progress_state.measured;
    } else {
      r.status = samples.status().with_context(fmt::format("choice {}", r.name));
      if (Status st = cache->record_failure(key, r.name, r.status); !st.ok()) spdlog::warn("kiln: {}", st.to_string());
      ++progress_state.failed;
      // (A choice that failed in the bench worker cost that worker only: this context is fine.)
      if (!in_worker && bench->context_lost()) {
        // Nothing more can run in this context: stop here, with what was measured.
        results.push_back(std::move(r));
        report.note = "stopped early: a choice left the CUDA context unusable";
        for (auto& f : batch_futures) f.cancel();
        stopped = true;
        break;
      }
    }
    results.push_back(std::move(r));
    progress(progress_state);
  }
  return Status();
  };
  KILN_RETURN_IF_ERROR(measure_batch(to_measure, futures));
  // The best measured (or cached) choice the model cannot judge: what a template must be predicted to beat.
  for (const auto& r : results) {
    if (!r.status.ok() || r.partial || plan.model.count(r.name)) continue;
    if (report.best_extern.empty() || r.median_us < report.best_extern_us) report.best_extern = r.name, report.best_extern_us = r.median_us;
  }
  // The model's first extern_protect templates, where it calls them memory- or latency-bound, are never cut.
  std::set<const Choice*> protected_from_cut;
  {
    std::vector<const Choice*> ranked;
    std::vector<std::string> bounds;
    for (const auto& r : order) {
      const Choice* c = choices[r.index].get();
      if (!r.estimate.known || c == reference.get()) continue;
      ranked.push_back(c);
      bounds.push_back(r.estimate.bound);
    }
    const std::vector<bool> keep = detail::extern_protected(bounds, policy.extern_protect);
    for (size_t i = 0; i < keep.size(); ++i) {
      if (keep[i]) protected_from_cut.insert(ranked[i]);
    }
    // The stream-K pick is there because the model misprices it: its prediction cannot cut it either.
    if (plan.stream_k_choice) protected_from_cut.insert(plan.stream_k_choice.get());
  }
  // Cuts `list` (and its futures, when given: cancelled, so a queued compile nobody else wants never runs).
  double least_cut_us = 0;
  std::vector<std::string> cut_names;
  auto extern_first = [&](std::vector<ChoicePtr>& list, std::vector<Future<Binaries>>* list_futures) {
    std::vector<double> predicted;
    std::vector<std::string> bounds;
    std::vector<bool> cached;
    for (const auto& c : list) {  // (the reference is never cut: every other choice is checked against it)
      const bool judged = model_of.count(c.get()) && c != reference;
      predicted.push_back(judged ? model_of[c.get()]->predicted_us : 0.0);
      bounds.push_back(judged ? model_of[c.get()]->estimate.bound : std::string());
      cached.push_back(judged && model_of[c.get()]->cached);
    }
    std::vector<bool> cut = detail::extern_cut(predicted, bounds, report.best_extern_us, policy.extern_margin,
                                               policy.extern_margin_compute);
    detail::keep_cached(cut, predicted, cached, report.best_extern_us, policy.extern_margin_cached);
    for (size_t i = 0; i < list.size(); ++i) {
      if (protected_from_cut.count(list[i].get())) cut[i] = false;
    }
    std::vector<ChoicePtr> kept;
    std::vector<Future<Binaries>> kept_futures;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!cut[i]) {
        kept.push_back(list[i]);
        if (list_futures) kept_futures.push_back((*list_futures)[i]);
        continue;
      }
      if (list_futures) (*list_futures)[i].cancel();
      ++report.pruned_extern_first;
      least_cut_us = least_cut_us == 0 ? predicted[i] : std::min(least_cut_us, predicted[i]);
      if (cut_names.size() < 3) cut_names.push_back(fmt::format("{} (predicted {:.1f} us)", list[i]->name(), predicted[i]));
    }
    list = std::move(kept);
    if (list_futures) *list_futures = std::move(kept_futures);
  };
  extern_first(templates_to_measure, &template_futures);
  progress_state.total -= report.pruned_extern_first;  // those were counted in the total
  extern_first(reserve, nullptr);
  if (!stopped) {
    KILN_RETURN_IF_ERROR(measure_batch(templates_to_measure, template_futures));
  } else {
    for (auto& f : template_futures) f.cancel();
  }
  // Widening. By rank: where the measured best of the model's choices sits at the end of what was kept, the
  // model disagrees with the device here: measure the next ranks too. Diverse: where a model-ranked choice is
  // the tune's best, measure the next of its variant, and again while that finds a new best.
  int kept = plan.kept_ranked;
  std::list<std::vector<Future<Binaries>>> widened_futures;
  std::set<std::string> widened_around;  // diverse: the choices widenings were around
  std::vector<ChoicePtr> cached_pool = plan.cached_extras;  // diverse: measured already, next ranks of their variant
  while (!stopped && report.widenings < policy.max_widenings && !reserve.empty()) {
    std::vector<ChoicePtr> batch;
    if (policy.diverse) {
      std::vector<std::pair<std::string, double>> measured;
      for (const auto& r : results) {
        if (r.status.ok() && !r.partial) measured.push_back({r.name, r.median_us});
      }
      for (const auto& [variant, around] :
           detail::variants_to_widen(measured, plan, report.best_extern_us, policy.widen_variants,
                                     policy.widen_near_extern, widened_around)) {
        widened_around.insert(around);
        auto more = detail::widen_variant(reserve, cached_pool, plan, variant,
                                          static_cast<size_t>(std::max(1, policy.widen)));
        batch.insert(batch.end(), more.begin(), more.end());
      }
      if (batch.empty()) break;
    } else {
      int best_rank = -1;
      double best_median = 0;
      for (const auto& r : results) {
        auto m = plan.model.find(r.name);
        if (!r.status.ok() || r.partial || m == plan.model.end()) continue;
        if (best_rank < 0 || r.median_us < best_median) best_rank = m->second.first, best_median = r.median_us;
      }
      if (!detail::should_widen(best_rank, kept)) break;
      const size_t n = std::min<size_t>(reserve.size(), static_cast<size_t>(std::max(1, policy.widen)));
      batch.assign(reserve.begin(), reserve.begin() + static_cast<std::ptrdiff_t>(n));
      reserve.erase(reserve.begin(), reserve.begin() + static_cast<std::ptrdiff_t>(n));
    }
    const size_t n = batch.size();
    // Kept to the end of the tune: an isolated session may send a widened choice's binaries again.
    std::vector<Future<Binaries>>& batch_futures = widened_futures.emplace_back();
    for (const auto& c : batch) batch_futures.push_back(c->precompile(*gate, Priority::kOnDemand, QueueOrder::kLongestFirst));
    progress_state.total += static_cast<int>(n);
    kept += static_cast<int>(n);
    ++report.widenings;
    KILN_RETURN_IF_ERROR(measure_batch(batch, batch_futures));
  }
  report.pruned = static_cast<int>(reserve.size()) + report.pruned_extern_first;
  if (!reserve.empty()) {
    report.pruned_reasons[fmt::format("below the model's top {} ({} effort)", kept, effort_name(effort))] =
        static_cast<int>(reserve.size());
    for (size_t i = 0; i < std::min<size_t>(3, reserve.size()); ++i) {
      const auto& m = plan.model[reserve[i]->name()];
      report.pruned_examples.push_back(fmt::format("{} (rank {}, model {:.1f} us)", reserve[i]->name(), m.first, m.second));
    }
  }
  if (report.pruned_extern_first > 0) {
    report.pruned_reasons[detail::extern_cut_reason(least_cut_us, report.best_extern, report.best_extern_us,
                                                    policy.extern_margin, policy.extern_margin_compute,
                                                    policy.extern_margin_cached)] =
        report.pruned_extern_first;
    report.pruned_examples.insert(report.pruned_examples.end(), cut_names.begin(), cut_names.end());
  }

  // Near-ties: re-measure the choices within noise of the best, interleaved, so drift hits them alike.
  auto is_ok = [](const ChoiceResult& r) { return r.status.ok() && !r.partial; };
  using Tied = std::vector<std::pair<ChoicePtr, ChoiceResult*>>;
  // Each re-measured choice's round medians, and which re-measure took them (rounds pair within one only).
  std::map<std::string, std::pair<int, std::vector<double>>> tie_rounds;
  int remeasures = 0;
  auto remeasure = [&](const Tied& tied) -> Status {
    const auto t_remeasure = Clock::now();
    std::map<std::string, Samples> again;
    std::map<std::string, std::vector<double>> round_medians;  // each round's median, by choice
    ReplayGraphs graphs;  // one capture per tied choice for all rounds
    const int per_round = std::max(3, options.bench.min_reps);
    const int most_rounds = std::max(options.bench.tie_rounds, options.bench.tie_rounds_max);
    std::set<std::string> two;  // past tie_rounds only the two fastest go on: they are what is undecided
    for (int round = 0; round < most_rounds; ++round) {
      if (round >= options.bench.tie_rounds) {  // more only while the two fastest are still undecided
        std::vector<std::pair<double, std::string>> by_time;
        for (const auto& [name, samples] : again) {
          if (!samples.us.empty()) by_time.push_back({summarize(samples).median, name});
        }
        std::sort(by_time.begin(), by_time.end());
        if (by_time.size() < 2 ||
            !detail::tie_unresolved(round_medians[by_time[0].second], round_medians[by_time[1].second],
                                    by_time[0].first, by_time[1].first)) {
          break;
        }
        two = {by_time[0].second, by_time[1].second};
        ++report.extra_tie_rounds;
      }
      for (size_t k : detail::round_order(tied.size(), round)) {
        const auto& [c, r] = tied[k];
        if (!two.empty() && two.count(r->name) == 0) continue;
        Result<Samples> samples = make_error(ErrorCode::kInternal, "not measured");
        if (isolated && isolated->covers(*c)) {  // Isolation: re-measured where it was measured
          KILN_ASSIGN_OR_RETURN(samples, isolated->time_runs(*c, per_round, r->graph));
        } else {
          samples = bench->time_runs(*c, operand_args, workspace.ptr(), per_round, r->graph, &graphs,
                                     again[r->name].us.size());
        }
        if (samples.ok()) {
          again[r->name].append(*samples);
          round_medians[r->name].push_back(summarize(samples->us).median);
        }
      }
    }
    for (const auto& [c, r] : tied) {
      if (again[r->name].us.empty()) continue;
      Summary sum = summarize(again[r->name]);
      r->median_us = sum.median;
      r->min_us = sum.min;
      r->p10_us = sum.p10;
      r->p90_us = sum.p90;
      r->reps += static_cast<int>(again[r->name].us.size());
      if (r->partial) {  // measured in full now, beside the best
        r->partial = false;
        measured_choices.push_back(c);
      }
      store_timing(*r);  // the reading that decides is the one kept
      tie_rounds[r->name] = {remeasures, round_medians[r->name]};
    }
    ++remeasures;
    report.remeasure_seconds += seconds_since(t_remeasure);
    return Status();
  };
  // The choices at `indices` of results, as measured here.
  auto tied_at = [&](const std::vector<size_t>& indices) {
    Tied tied;
    for (size_t i : indices) {
      for (const auto& c : measured_choices) {
        if (c->name() == results[i].name) tied.push_back({c, &results[i]});
      }
    }
    return tied;
  };
  if (Tied tied = tied_at(detail::near_ties(results, options.bench.tie_fraction)); tied.size() > 1) {
    KILN_RETURN_IF_ERROR(remeasure(tied));
  }
  // A choice stopped early as clearly slower was judged against the best as it read then. Where the best reads
  // slower now, the verdict may no longer hold: on the H200 suite (30 Nov, f0f0019) 4096x3584x18944's cuBLAS read
  // 722 us first and 814 re-measured, after cuBLASLt's algorithm 20 had been dropped at 759 (the exhaustive
  // effort's choice, 717 us there), and the tune kept cuBLAS. Such a choice is checked (a dropped choice skips its
  // check) and re-measured beside the near-ties; one measured in the bench worker stays as it is.
  if (!bench->context_lost()) {
    Tied revived;
    for (size_t i : detail::revoked_partials(results, options.bench.tie_fraction)) {
      ChoiceResult& r = results[i];
      auto c = std::find_if(timed_choices.begin(), timed_choices.end(), [&](const ChoicePtr& t) { return t->name() == r.name; });
      if (c == timed_choices.end() || (isolated && isolated->covers(**c))) continue;
      // A user's kernel was checked before it was timed (check_first); the rest are checked now, once.
      const bool checked = (*c)->kind() == ChoiceKind::kUser;
      if (Status st = checked ? Status() : check_choice(**c, r.error); !st.ok()) {
        r.status = st.with_context(fmt::format("choice {}", r.name));
        if (Status rec = cache->record_failure(key, r.name, r.status); !rec.ok()) spdlog::warn("kiln: {}", rec.to_string());
        if (bench->context_lost()) break;
        continue;
      }
      revived.push_back({*c, &r});
    }
    if (!revived.empty() && !bench->context_lost()) {
      std::vector<size_t> beside = detail::near_ties(results, options.bench.tie_fraction);
      if (const int best = detail::best_complete(results); beside.empty() && best >= 0) {
        beside = {static_cast<size_t>(best)};  // the best alone: it is measured again beside them
      }
      Tied tied = tied_at(beside);
      tied.insert(tied.end(), revived.begin(), revived.end());
      KILN_RETURN_IF_ERROR(remeasure(tied));
      report.revived = static_cast<int>(revived.size());
    }
  }
  report.benchmark_seconds = seconds_since(bench_start) - (compile_wait - setup_compile_wait);
  report.measure_costs = bench->costs();
  report.measure_costs -= costs_before;
  report.compile_wait_seconds = compile_wait;

  // The winner: the fastest; what stays within the tie window of it goes to the lower tie rank, then name.
  std::map<std::string, ChoicePtr> choice_by_name;
  for (const auto& c : choices) choice_by_name[c->name()] = c;
  std::stable_sort(results.begin(), results.end(), [&](const ChoiceResult& a, const ChoiceResult& b) {
    if (is_ok(a) != is_ok(b)) return is_ok(a);
    if (!is_ok(a)) return a.name < b.name;
    return a.median_us < b.median_us;
  });
  ChoicePtr winner;
  auto median_of = [&](const std::string& name) {
    for (const auto& r : results) {
      if (r.name == name) return r.median_us;
    }
    return 0.0;
  };
  std::string model_bound;  // the model's first choice's: what bounds the problem
  for (const auto& r : order) {
    if (r.estimate.known) {
      model_bound = r.estimate.bound;
      break;
    }
  }
  const int best_index = detail::best_complete(results);
  report.externs_first_on_ties =
      best_index >= 0 && detail::externs_first_on_ties(results[best_index].median_us, model_bound);
  const int pick = detail::pick_winner(
      results,
      [&](const std::string& name) {
        const ChoicePtr& c = choice_by_name[name];
        return detail::problem_tie_rank(c->tie_rank(), report.externs_first_on_ties);
      },
      options.bench.rank_tie_fraction,
      [&](const std::string& best, const std::string& other) {
        auto b = tie_rounds.find(best), o = tie_rounds.find(other);
        return b != tie_rounds.end() && o != tie_rounds.end() && b->second.first == o->second.first &&
               detail::told_apart_slower(b->second.second, o->second.second, median_of(best), median_of(other));
      });
  if (pick >= 0) winner = choice_by_name[results[pick].name];
  for (auto& r : results) {
    if (auto m = plan.model.find(r.name); m != plan.model.end()) r.model_rank = m->second.first, r.model_us = m->second.second;
  }
  report.failures = static_cast<int>(std::count_if(results.begin(), results.end(), [](const ChoiceResult& r) { return !r.status.ok(); }));
  report.choices = std::move(results);
  if (!winner) {
    winner = reference;
    report.note = report.note.empty() ? "every choice failed: using the reference choice" : report.note;
  }
  // A winner known only from a cached timing was not prepared in this process yet.
  // (Isolation: a winner measured in the bench worker is not prepared here either.)
  const bool prepared_here = std::find(measured_choices.begin(), measured_choices.end(), winner) !=
                                 measured_choices.end() && !(isolated && isolated->covers(*winner));
  if (!prepared_here && winner != reference) {
    KILN_ASSIGN_OR_RETURN(Binaries b, compile(*winner, Priority::kOnDemand));
    KILN_RETURN_IF_ERROR(winner->prepare(b));
  }
  report.chosen = winner->name();
  if (auto m = plan.model.find(winner->name()); m != plan.model.end()) report.chosen_model_rank = m->second.first;
  cache::Decision decision;
  decision.problem = key;
  decision.choice = winner->name();
  for (const auto& [k, v] : winner->parameters()) decision.params.emplace_back(k, v);
  if (auto kernels = winner->kernels(); kernels.size() == 1) decision.kernel = make_key(kernels[0].source, kernels[0].target);
  for (const auto& r : report.choices) {
    if (r.name == winner->name()) decision.median_us = r.median_us;
  }
  if (Status st = cache->record_decision(std::move(decision)); !st.ok()) spdlog::warn("kiln: {}", st.to_string());
  {
    std::lock_guard lock(mu);
    measured_problems.push_back(problem);
  }
  report.total_seconds = seconds_since(start);
  return finish(problem, winner, std::move(report), key);
}

Result<std::shared_ptr<DeferredSelection>> Tuner::defer(const Problem& problem) {
  KILN_RETURN_IF_ERROR(problem.validate());
  // The effort's share of the choices (the model's kept set for the problem's own size, and the externs).
  KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> choices, planned_choices(problem));
  // Sizes are run-time arguments of the templates, so these binaries serve every hint: start them now.
  for (const auto& c : choices) (void)c->precompile(*impl_->gate, Priority::kBackground);
  (void)impl_->take_generated(impl_->key_of(problem));  // its selections tune other sizes: keep nothing
  return std::make_shared<DeferredSelection>(this, problem);
}

// ---- DeferredSelection

Result<TuneReport> DeferredSelection::choice_timings(int64_t hint) {
  KILN_ASSIGN_OR_RETURN(auto sel, select(hint));
  return sel->report();
}

Result<std::shared_ptr<Selection>> DeferredSelection::select(int64_t hint) {
  if (hint <= 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("size hint {} is not positive", hint));
  return tuner_->tune(problem_.with_dynamic_size(hint));
}

Result<std::shared_ptr<Dispatcher>> DeferredSelection::finalize(std::vector<int64_t> hints) {
  if (hints.empty()) {
    for (int64_t h = 1; h < problem_.dynamic_size(); h *= 2) hints.push_back(h);
    hints.push_back(problem_.dynamic_size());
  }
  std::sort(hints.begin(), hints.end());
  hints.erase(std::unique(hints.begin(), hints.end()), hints.end());
  std::vector<std::shared_ptr<Selection>> selections;
  for (int64_t h : hints) {
    KILN_ASSIGN_OR_RETURN(auto sel, select(h));
    selections.push_back(std::move(sel));
  }
  return Dispatcher::create(std::move(hints), std::move(selections));
}

Result<std::unique_ptr<PrecompileGate>> make_cached_gate(std::shared_ptr<cache::TuningCache> cache,
                                                         std::shared_ptr<Executor> executor) {
  GateOptions gate;
  gate.executor = std::move(executor);
  std::weak_ptr<cache::TuningCache> weak = cache;
  gate.lookup = [weak](const KernelKey& key, std::string_view arch) -> std::optional<Result<Binary>> {
    auto c = weak.lock();
    if (!c) return std::nullopt;
    auto hit = c->lookup_binary(key, arch);
    if (!hit.ok()) return std::nullopt;
    return Result<Binary>(**hit);
  };
  gate.on_compiled = [weak](const Binary& b) {
    if (auto c = weak.lock()) {
      if (Status s = c->record_binary(b); !s.ok()) spdlog::warn("kiln: could not cache {}: {}", b.name, s.to_string());
    }
  };
  if (cache) gate.claims = claims_for_cache(*cache);  // one builder per kernel among processes sharing the cache
  return PrecompileGate::create(std::move(gate));
}

Status finish_cache_writes(cache::TuningCache& cache) {
  cache::Store* store = cache.store();
  if (store == nullptr) return Status();
  Status flushed = store->flush();  // a failed flush is a failed write too, remembered as one
  Status first = store->first_write_error();
  if (first.ok()) first = flushed;
  if (first.ok()) return Status();
  return make_error(first.code(), fmt::format("the cache '{}' could not store all of this run's results; its "
                                              "first failed write: {}", store->dir(), first.to_string()));
}

// ---- precompile without a GPU

int template_sample(const TuneOptions& options, Effort effort) {
  return options.max_template_configs > 0 ? options.max_template_configs : effort_policy(effort).sample_per_template;
}

Result<std::vector<ChoicePtr>> precompile_plan(const OpRegistry& ops, const Problem& problem,
                                               std::vector<ChoicePtr> choices, Effort effort,
                                               const std::vector<DevicePeaks>& parts) {
  const EffortPolicy policy = effort_policy(effort);
  const int keep = keep_for(policy, problem);
  if (policy.measure && keep <= 0) return choices;
  KILN_ASSIGN_OR_RETURN(auto def, ops.find(problem.op));
  const std::string reference = def->reference(problem);
  // Every part of the arch the tune may run on ranks with its own figures (an H200's bandwidth and family fit
  // order the templates differently from an H100's): the union of their plans, in the first part's order.
  std::vector<ChoicePtr> out;
  std::set<std::string> taken;
  auto take = [&](const ChoicePtr& c) {
    if (c && taken.insert(c->name()).second) out.push_back(c);
  };
  if (!policy.measure) {
    for (const DevicePeaks& peaks : parts) take(detail::model_pick(choices, rank(problem, choices, peaks), reference));
    return out;
  }
  if (!policy.diverse) {
    for (const DevicePeaks& peaks : parts) {
      detail::TunePlan plan = detail::plan_choices(choices, rank(problem, choices, peaks), reference, keep, {}, 0,
                                                   false, 0, policy.stream_k_pick);
      for (const auto& c : plan.first) take(c);
      // What a tune may reach by widening: the next ranks of every widening.
      const size_t extra = std::min<size_t>(
          plan.reserve.size(), static_cast<size_t>(policy.widen) * static_cast<size_t>(policy.max_widenings + 1));
      for (size_t i = 0; i < extra; ++i) take(plan.reserve[i]);
    }
    return out;
  }
  // Diverse: what the tune on each part measures first and every widening round around any variant it
  // measured, as it plans them on a cache that holds what is taken so far (cached choices go first among equal
  // scores and are measured whatever their rank; a widening takes the next ranks of its variant, cached or
  // not); again until the tune would compile nothing more. A cache precompiled on a build machine then serves
  // the tune with nothing left to compile.
  for (int pass = 0; pass < 8; ++pass) {
    const size_t before = out.size();
    for (const DevicePeaks& peaks : parts) {
      std::set<std::string> cached;
      for (const auto& c : out) {
        if (!c->kernels().empty()) cached.insert(c->name());
      }
      const auto order = rank(problem, choices, peaks, {}, cached);
      detail::TunePlan plan =
          detail::plan_choices(choices, order, reference, keep, {}, 0, true, policy.keep_top, policy.stream_k_pick);
      for (const auto& c : plan.first) take(c);
      std::set<std::string> variants;
      for (const auto& c : plan.first) {
        if (auto it = plan.structure.find(c->name()); it != plan.structure.end()) variants.insert(it->second);
      }
      std::vector<ChoicePtr> pool = plan.cached_extras;
      for (const auto& v : variants) {
        for (int round = 0; round < std::max(1, policy.max_widenings); ++round) {
          for (auto& c : detail::widen_variant(plan.reserve, pool, plan, v, static_cast<size_t>(std::max(1, policy.widen)))) {
            take(c);
          }
        }
      }
    }
    if (out.size() == before) break;
  }
  return out;
}

Result<PrecompileReport> precompile_problem(const OpRegistry& ops, const Problem& problem, const Target& arch,
                                            PrecompileGate& gate, const TuneOptions& options) {
  const Clock::time_point start = Clock::now();
  KILN_ASSIGN_OR_RETURN(ChoiceContext ctx, choice_context_for_arch(arch));
  Effort effort = Effort::kDefault;
  if (options.effort) {
    effort = *options.effort;
  } else {
    KILN_ASSIGN_OR_RETURN(effort, effort_from_env());
  }
  ctx.max_template_configs = template_sample(options, effort);
  ctx.split_k = options.split_k;
  ctx.families = options.families;
  KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> all, ops.choices(problem, ctx));
  KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> choices,
                        precompile_plan(ops, problem, std::move(all), effort, DevicePeaks::parts_of(arch.arch)));
  PrecompileReport report;
  report.problem = problem.describe();
  std::vector<Future<Binary>> futures;
  std::vector<std::string> names;
  const GateCounters before = gate.counters();
  for (const auto& c : choices) {
    for (auto& k : c->kernels()) {
      names.push_back(k.source.name);
      futures.push_back(gate.precompile(k.source, k.target, Priority::kBackground, k.cost));
    }
  }
  for (size_t i = 0; i < futures.size(); ++i) {
    const Result<Binary>& r = futures[i].get();
    ++report.kernels;
    if (!r.ok()) {
      ++report.failed;
      report.failures.push_back(fmt::format("{}: {}", names[i], r.status().to_string()));
    }
  }
  const GateCounters after = gate.counters();
  report.cached = static_cast<int>(after.cache_hits + after.cached_failures - before.cache_hits - before.cached_failures);
  report.repeated = static_cast<int>(after.repeats - before.repeats);
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace kiln::runtime
