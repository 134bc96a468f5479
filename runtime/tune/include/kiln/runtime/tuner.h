// The autotuner: picks the fastest correct choice for a problem and remembers it.
//
//   auto tuner = kiln::runtime::make_tuner({});                    // kiln/runtime/builtin.h; cache mode from $KILN_TUNE_MODE
//   auto sel = (*tuner)->tune(Problem::gemm({.m = 16, .n = 4096, .k = 4096}));
//   (*sel)->run(args, stream);                                     // the winner, ready to launch
//
// tune() compiles every choice through the pool's precompile gate, benchmarks each one as soon as its binary
// is ready (never waiting for all compiles), checks its output against the op's reference choice, drops
// choices a short first measurement shows to be far slower than the best so far, settles near-ties by
// re-measuring them interleaved and then by a stable rule, and stores timings, failures and the decision in
// the cache as they are made. A failing choice (compile error, launch error, wrong output) is recorded with its
// reason and never stops the tuning; if every choice fails, the reference is used and the report says why.
//
// defer() returns a handle that tunes lazily per size hint of the dynamic dimension (M for GEMM, rows for
// norms) and finalises to one choice or to a Dispatcher that picks per call by size, in O(1) on the host,
// usable inside CUDA-graph capture.
#pragma once

#include <cuda.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cache/remote.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/executor.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/isolation.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/ops.h"
#include "kiln/runtime/perf_model.h"
#include "kiln/runtime/problem.h"
#include "kiln/runtime/sandbox.h"
#include "kiln/status.h"

namespace kiln {
class PrecompileGate;
}

namespace kiln::runtime {


/// Where the benchmarks of choices run. kInProcess (the default) runs them in this process, which is fast and
/// safe for kiln's own templates and cuBLAS (tested, bounds-checked). kIsolated runs each benchmark in a worker
/// process per GPU, so that a kernel that faults or hangs cannot poison this process's CUDA context; see
/// docs/runtime.md for the cost and which choices it covers.
enum class Isolation { kInProcess, kIsolated };

/// How hard tune() searches (--effort, $KILN_TUNE_EFFORT; docs/tuning.md):
///   kNone:       the performance model's pick (or the op's reference where the model knows no choice), compiled
///                and prepared, nothing measured and no decision stored (a later tune measures);
///   kQuick:      4 template choices in model order, one per structural variant first, plus the extern library
///                choices, widened once around the best's variant;
///   kDefault:    10 the same way plus the externs, widened (twice at most) around the variant of the best;
///   kExhaustive: every choice of the whole (pruned) parameter space, no model pruning.
enum class Effort { kNone, kQuick, kDefault, kExhaustive };
/// "none", "quick", "default", "exhaustive".
std::string_view effort_name(Effort effort);
/// Parses an effort name. kInvalidArgument naming the value and listing the names.
Result<Effort> parse_effort(std::string_view name);
/// $KILN_TUNE_EFFORT when set (an invalid value is an error naming it), else `fallback`.
Result<Effort> effort_from_env(Effort fallback = Effort::kDefault);

/// What an effort level means in numbers.
struct EffortPolicy {
  bool measure = true;        // false: the model's pick, unmeasured
  int keep = 0;               // template/subgraph choices kept in model order (0: all of them)
  /// The same for a row-wise op (norm, softmax) where above 0: their choices compile in a fraction of a GEMM's
  /// time and run in microseconds, and the model tells a small problem's configurations apart poorly (on the
  /// H200 suite a configuration within 1% of the best of rmsnorm 1-64 x 4096 sat at model ranks 13-47).
  int keep_rows = 0;
  int widen = 0;              // how many more ranks each widening adds
  int max_widenings = 0;
  int sample_per_template = 0;  // configurations generated per template before the model ranks them
  /// Extern-first pruning: the externs (no compile) are measured first, and a template whose calibrated
  /// prediction (RankedChoice::predicted_us) is slower than the best extern's measured time by more than this
  /// fraction is not waited for, measured or widened into. Negative: off (exhaustive).
  double extern_margin = -1;
  /// The margin for a template the model calls compute-bound (ModelEstimate::bound), where its prediction is
  /// close (the fitted calibration, floored at the device's template ceiling): such a template is compiled and
  /// measured only when predicted no slower than the best extern by more than this; negative: predicted that
  /// much faster (default and quick: -2%). A wgmma compile costs ~0.6 s; on the H200 suite no compute-bound
  /// template came within 3% of cuBLAS (4096^3: 0.96x). -1 or below: extern_margin applies to every template.
  double extern_margin_compute = -1;
  /// The model's first extern_protect templates of a problem it calls memory- or latency-bound are never cut by
  /// the extern-first rule: on the H200 suite (26 Nov) the calibration, fitted on H100 timings, put decode
  /// tiles (swap-AB, cluster split-K) that beat cuBLAS by 6-12% more than the margin above it, at model ranks 1-5.
  int extern_protect = 0;
  /// The margin for a template whose kernel is cached already (RankedChoice::cached): measuring it costs no
  /// compile, only a few runs (less where early abandonment drops it), so where the best extern runs within
  /// 100 us it is cut only when predicted slower than that by more than this fraction. Negative: the margins
  /// above apply to it too. Why: on the H200 suite (30 Nov) the swap-AB 64x168 tile chosen for 333x4096x4096
  /// was cut from 333x4096x14336 by its prediction, 67.6 us against cuBLASLt's 56.0, and measured 54.9 there
  /// (the exhaustive effort's choice).
  double extern_margin_cached = -1;
  /// Sharing compiles across a workload's problems: the model's first quarter of `keep` is kept as ranked; the
  /// other slots are filled from the choices scored within this fraction above the keep-th score, those whose
  /// kernels are already cached or planned for another problem first. A cold workload tune at default effort
  /// is compile-bound (29 Nov, H200: the compile pool's work for a suite part was about its whole tune time),
  /// and near the cut-off the model cannot tell such choices apart. 0: off.
  double share_margin = 0;
  /// A varied plan: the kept slots go first to the best-ranked choice of each structural variant
  /// (structure_class(): swap-AB or not, how K is split, persistent, blocks per SM; a norm's loads in flight),
  /// each swapped for a shared choice of its variant scored within share_margin of it, and only then by rank.
  /// Widening then follows the measurements: when a model-ranked choice is the tune's best, the next `widen`
  /// of its variant (by rank) are measured, again while that finds a new best, up to max_widenings. Why: the
  /// model's errors are largest between variants (on the H200 suite decode tiles split over a cluster ran
  /// faster than the stream-K tiles it ranked first, at ranks 13-34), and within one its near-equal scores only
  /// repeat one guess. false: the first `keep` by rank, widened by rank when the best sits at the end.
  bool diverse = false;
  /// With `diverse`: the model's first keep_top choices are kept as ranked, never swapped for a shared twin, before
  /// the other variants' best. Why: on the H200 suite (30 Nov) the exhaustive effort's choice sat at model rank 1-5
  /// and was left out for shared choices 1.2-4.5% slower on 2-5 problems a run (16x28672x4096's 256x16 tile at
  /// rank 1 in every run).
  int keep_top = 0;
  /// Diverse widening around more than the best: each widening takes the next `widen` of each of the
  /// `widen_variants` fastest measured variants, counting only those whose fastest is faster than the best extern
  /// or within `widen_near_extern` of it (a template 2% behind cuBLAS may have a sibling 2% ahead of it).
  int widen_variants = 1;
  double widen_near_extern = 0;
  /// Also keep (and never cut extern-first), where the model's first choice is memory-bound, the best-ranked
  /// swap-AB persistent stream-K tile of one block per SM that it calls memory-bound over more than one wave,
  /// when it is scored within 15% of the first.
  /// Why: the model prices stream-K's piece protocol (~2 us a piece) but not the memory-bound grid's partial last
  /// wave that it removes, so in decode GEMMs such tiles rank 20-50 places behind their plain twins or are cut
  /// against cuBLASLt, and are the exhaustive effort's choice there (1x36864x7168, 1x37888x3584: untimed and 1-3%
  /// ahead of the default's pick in 7 of the 12 H200 suite parts recorded 30 Nov-1 Dec; replayed, the pick is
  /// within 1% of the best in all 7, for ~4 more compiles a part: scripts/replay_stream_k_pick.py). Pricing it in
  /// the model instead reordered the other decode tiles and lost four problems on the device (1 Dec); one extra
  /// choice reorders nothing. On the device (ca380e8) both were chosen right; the compile waits grew ~0.5 s over
  /// the suite's 120 problems.
  bool stream_k_pick = false;
};
EffortPolicy effort_policy(Effort effort);
/// The policy's keep for `problem`: keep_rows for a norm or softmax problem where it is set, else keep.
int keep_for(const EffortPolicy& policy, const Problem& problem);

/// How tune() reports progress on long tunes.
struct TuneProgress {
  std::string problem;
  int compiled = 0, measured = 0, failed = 0, total = 0;
};

struct TuneOptions {
  /// The cache and its mode; null (the default): opened with the mode from $KILN_TUNE_MODE (default tune) and
  /// the default cache folder ($KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or ~/.cache/kiln).
  std::shared_ptr<cache::TuningCache> cache;
  /// The fleet's remote tier behind the cache opened when `cache` is null (a given cache keeps its own).
  /// Default: from $KILN_REMOTE_CACHE (none when unset); see kiln/cache/remote.h.
  std::optional<cache::RemoteOptions> remote;
  /// Where choices compile; null (the default): kiln::make_executor_on_demand(), the process pool (or what
  /// $KILN_EXECUTOR names) started when compiles are coming, so that a warm start starts no compile workers.
  /// A DeferredExecutor given here is started the same way.
  std::shared_ptr<Executor> executor;
  int device = 0;
  BenchmarkOptions bench;
  Isolation isolation = Isolation::kInProcess;
  /// kIsolated: the bench worker, its timeouts and an observer (kiln/runtime/isolation.h).
  IsolationOptions isolation_options;
  /// How hard to search; unset (the default): $KILN_TUNE_EFFORT, else Effort::kDefault.
  std::optional<Effort> effort;
  /// Per template, a deterministic sample covering every parameter value; 0 (the default): the effort's
  /// (64 for none/quick/default, ranked by the performance model; the whole space for exhaustive).
  int max_template_configs = 0;
  int max_cublas_algos = 8;
  bool split_k = true;
  /// Superseded template families to try anyway (ChoiceContext::families), e.g. {"gemm_mma_sm80"} or {"all"}.
  std::vector<std::string> families;
  /// Seed of the random inputs. Default 1.
  uint32_t seed = 1;
  /// A cached decision's kernels are read and kept, and each module is loaded at its first run
  /// (Choice::prepare_deferred): a warm start of many decisions does not wait for the driver's loads, nor load
  /// modules a process never runs. false: loaded by tune(), so that a binary the driver refuses is found there
  /// (and chosen again) instead of at the first run.
  bool defer_loads = true;
  /// Called from tune()'s thread as choices compile and are measured. Optional.
  std::function<void(const TuneProgress&)> progress;
};

/// One choice's outcome in a tune.
struct ChoiceResult {
  std::string name;
  ChoiceKind kind = ChoiceKind::kTemplate;
  Status status;                 // ok, or why the choice failed (compile, launch, wrong result)
  double median_us = 0, min_us = 0, p10_us = 0, p90_us = 0;
  int reps = 0;
  bool partial = false;          // dropped after a short first measurement
  bool from_cache = false;       // the timing was cached, not measured now
  bool graph = false;            // timed as CUDA-graph replays
  double error = 0;              // relative error against the reference
  int model_rank = -1;           // position in the performance model's order (-1: the model cannot judge it)
  double model_us = 0;           // the model's estimate (ordering only)
  /// Seconds the tune sat waiting for this choice's binary with nothing else ready to measure (0: its compile
  /// had finished, in the background or on another problem's behalf, before the tune could use it).
  double wait_s = 0;
  std::map<std::string, std::string> parameters;
};

struct TuneReport {
  std::string problem;           // Problem::describe()
  std::string key;               // the cache key
  std::string chosen;
  std::string reference;
  std::vector<ChoiceResult> choices;  // sorted: successful by median, then failures
  int candidates = 0;
  int failures = 0;
  std::string effort;                 // effort_name() of the tune
  /// Choices the performance model ranked too low to compile and measure, and why, by reason
  /// (e.g. "below the model's top 12": 80); pruned_examples names a few of them.
  int pruned = 0;
  std::map<std::string, int> pruned_reasons;
  std::vector<std::string> pruned_examples;
  /// Extern-first pruning: the choices the model cannot judge (cuBLAS, cuBLASLt, the unfused reference) are
  /// measured first; templates predicted slower than the best of them by more than extern_margin are not
  /// waited for nor measured. pruned_reasons has "extern first: predicted >= X us, <best_extern> measured Y us".
  int pruned_extern_first = 0;
  std::string best_extern;            // the fastest measured choice the model cannot judge ("" if none)
  double best_extern_us = 0;
  double extern_margin = -1;          // the effort's margin (negative: off)
  double extern_margin_compute = -1;  // its margin for templates the model calls compute-bound (<= -1: none)
  /// Template candidates whose binaries the cache held before the tune (no compile): first among equal model
  /// scores, and kept within the margin whatever their rank.
  int cached_candidates = 0;
  /// Timings of the same configurations on neighbouring shapes the cache held, that refined the model.
  int neighbour_timings = 0;
  /// Candidates kept from just past the model's cut-off in place of others because another problem's plan or
  /// the cache has their kernels (EffortPolicy::share_margin).
  int shared_swaps = 0;
  /// Candidates ranked past the model's cut-off but kept as the best-ranked of their structural variant
  /// (EffortPolicy::diverse).
  int variant_picks = 0;
  /// The stream-K tile kept and never cut extern-first (EffortPolicy::stream_k_pick); empty if none.
  std::string stream_k_pick;
  /// Ties went to the externs before the templates: a compute-bound problem whose best run takes 100 us or more,
  /// where runs back to back hold the board at its power cap (detail::kSustainedPowerUs in selection_rule.h).
  bool externs_first_on_ties = false;
  int widenings = 0;                  // times the kept set grew (near the end of the ranks, or around the best's variant)
  /// Choices dropped early as clearly slower, measured in full after all because the best read slower when
  /// re-measured (detail::revoked_partials).
  int revived = 0;
  int chosen_model_rank = -1;         // the winner's position in the model's order (-1: an extern or unknown)
  bool measured = true;               // false for effort none: the pick was not benchmarked
  bool decision_from_cache = false;
  double compile_wait_seconds = 0;    // time spent waiting for binaries (compiles overlap benchmarking)
  double benchmark_seconds = 0;
  /// Where benchmark_seconds goes in this process: preparing choices (module loads), checking them against the
  /// reference, timing them (warm-up, estimate, repetitions), and re-timing near-ties. The rest is bookkeeping
  /// (cache writes, progress). Choices measured in the bench worker (Isolation::kIsolated) count in measure.
  double prepare_seconds = 0;
  double check_seconds = 0;
  double measure_seconds = 0;
  double remeasure_seconds = 0;
  /// Near-tie re-measure rounds past BenchmarkOptions::tie_rounds, taken while the two fastest were undecided.
  int extra_tie_rounds = 0;
  /// measure and remeasure by phase, in this process (BenchRunner::costs() across the tune).
  MeasureCosts measure_costs;
  /// A cached decision: preparing the chosen choice (apart from fetching its binaries, compile_wait_seconds:
  /// a binary-cache hit): keeping the binaries when loads are deferred (TuneOptions::defer_loads), else the
  /// module loads.
  double load_seconds = 0;
  /// Where a measured tune's host time goes before the first choice is timed: generating the choices (rendering,
  /// sampling), ranking them and handing their compiles to the gate (kernel keys, cache lookups), and the
  /// benchmark's setup (its runner, the problem's buffers and workspace, the reference's run).
  double generate_seconds = 0;
  double plan_seconds = 0;
  double setup_seconds = 0;
  double total_seconds = 0;
  std::string note;              // e.g. why the reference was used

  /// A table of the top `top` choices (time, % of best, spread) and every failure with its reason.
  std::string table(int top = 10) const;
  std::string json() const;
};

/// A problem's chosen choice, prepared in the tuner's context with its workspace: ready to launch.
class Selection {
 public:
  Selection(Problem problem, ChoicePtr choice, TuneReport report);
  const Problem& problem() const { return problem_; }
  const std::string& choice_name() const { return choice_->name(); }
  const ChoicePtr& choice() const { return choice_; }
  const TuneReport& report() const { return report_; }
  /// Runs the chosen choice on `args` on `stream`. Capture-safe (no allocation, no synchronisation) when the
  /// workspace already fits; it grows outside capture only. Thread-safe, but a choice with a workspace (stream-K
  /// slots, split-K partials) uses the same one for every call, so calls on concurrent streams must not overlap
  /// (one stream at a time, or a Selection per stream). A stream-K template choice also lowers 4 KB of flags of
  /// its own at a stream's first run outside a capture, after which its launches queue no memset.
  Status run(const OpArgs& args, CUstream stream) const;
  /// Makes the workspace hold at least `bytes` (call before capturing a graph that needs more).
  Status reserve_workspace(size_t bytes) const;

 private:
  Problem problem_;
  ChoicePtr choice_;
  TuneReport report_;
  mutable std::mutex mu_;
  mutable DeviceBuffer workspace_;
};

/// Picks a Selection per call from the size of the dynamic dimension (M for GEMM, rows for norms), in O(1).
class Dispatcher {
 public:
  /// `bounds` ascending; selections[i] serves sizes in (bounds[i-1], bounds[i]]; sizes above the last bound
  /// use the last. kInvalidArgument for empty or unsorted bounds or a count mismatch.
  static Result<std::shared_ptr<Dispatcher>> create(std::vector<int64_t> bounds,
                                                    std::vector<std::shared_ptr<Selection>> selections);
  /// The selection for `size`.
  const Selection& select(int64_t size) const;
  /// Runs the selection for the size in `args`. Capture-safe; thread-safe.
  Status run(const OpArgs& args, CUstream stream) const;
  const std::vector<int64_t>& bounds() const { return bounds_; }
  const std::vector<std::shared_ptr<Selection>>& selections() const { return selections_; }

 private:
  std::vector<int64_t> bounds_;
  std::vector<std::shared_ptr<Selection>> selections_;
  bool powers_of_two_ = false;
  std::vector<uint8_t> by_log2_;  // powers_of_two_: selection index by ceil(log2(size))
};

class Tuner;

/// Deferred selection: choice timings per size hint, computed when first asked for, then finalised.
class DeferredSelection {
 public:
  DeferredSelection(Tuner* tuner, Problem problem) : tuner_(tuner), problem_(std::move(problem)) {}
  const Problem& problem() const { return problem_; }
  /// The timings of every choice for the problem with its dynamic size = `hint` (tuned on first call,
  /// then remembered, also across processes through the cache).
  Result<TuneReport> choice_timings(int64_t hint);
  /// The best choice at `hint`.
  Result<std::shared_ptr<Selection>> select(int64_t hint);
  /// A dispatcher over buckets ending at `hints` (sorted and de-duplicated; default: powers of two from 1 to
  /// the problem's own size).
  Result<std::shared_ptr<Dispatcher>> finalize(std::vector<int64_t> hints = {});

 private:
  Tuner* tuner_;
  Problem problem_;
};

/// What the tuning core is given by the rooms above it: the ops it tunes, where isolated benchmarks run, and
/// the versions of the vendor libraries behind its extern choices. make_tuner() (kiln/runtime/builtin.h) gives
/// kiln's own; a program may give its own registry or sandbox.
struct TuneServices {
  /// The ops to tune; must outlive the tuner. Required.
  OpRegistry* ops = nullptr;
  /// Makes the sandbox for Isolation::kIsolated. Empty: kIsolated tunes fail with kFailedPrecondition.
  BenchSandboxFactory sandbox;
  /// The extern libraries' versions (e.g. cuBLAS's), part of every cache key. Default empty.
  std::string library_versions;
};

/// Tuner::plan_ahead(): a tune's first choices and those its first widening may reach.
struct PlannedChoices {
  std::vector<ChoicePtr> first;
  std::vector<ChoicePtr> widening;
};

class Tuner {
 public:
  /// Opens the cache and executor as the options say and loads the device's context (the caller's current
  /// one, else the device's primary context). Errors: kInvalidArgument without services.ops,
  /// kNoDriver/kNoDevice, the cache's and executor's.
  static Result<std::unique_ptr<Tuner>> create(TuneOptions options, TuneServices services);
  ~Tuner();

  /// Immediate selection (see the top of this header). Thread-safe: concurrent tunes of different problems
  /// compile concurrently and benchmark one at a time; the same problem twice returns the first Selection.
  Result<std::shared_ptr<Selection>> tune(const Problem& problem);
  /// Deferred selection. The choices of the problem's own size start compiling now in the background.
  Result<std::shared_ptr<DeferredSelection>> defer(const Problem& problem);

  /// The choices a tune of `problem` at this tuner's effort compiles first, in the model's order (the
  /// extern library choices and the reference included): what a workload precompiles in the background.
  Result<std::vector<ChoicePtr>> planned_choices(const Problem& problem) const;
  /// planned_choices() as `first`, and in `widening` what the tune's first widening may compile next: the
  /// next ranks of each variant among `first` (a workload compiles those speculatively, PlanAhead).
  Result<PlannedChoices> plan_ahead(const Problem& problem) const;
  /// The effort this tuner searches with.
  Effort effort() const;
  /// The performance model's device figures.
  const DevicePeaks& peaks() const;

  /// The problem's canonical cache key on this tuner's device, with its versions.
  std::string key(const Problem& problem) const;

  /// The reports of every tune of this tuner, in order.
  std::vector<TuneReport> reports() const;
  const ChoiceContext& context() const;
  cache::TuningCache& cache() const;
  PrecompileGate& gate() const;
  const TuneOptions& options() const;
  const OpRegistry& ops() const;

 private:
  struct Impl;
  explicit Tuner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A precompile gate over `executor` whose binaries come from and go to `cache` (a key already cached never
/// reaches a compiler; fresh binaries are stored as they finish).
Result<std::unique_ptr<PrecompileGate>> make_cached_gate(std::shared_ptr<cache::TuningCache> cache,
                                                         std::shared_ptr<Executor> executor);

/// Flushes what this process wrote to `cache` and says whether all of it was stored: OK (also with no store,
/// in tune mode off), else the first failed write's error, naming the cache folder. Writes that fail (a full
/// disk, a read-only folder) are logged and the work goes on, usable in memory; a tool checks this before it
/// reports success, so that a run whose results were lost never exits 0.
Status finish_cache_writes(cache::TuningCache& cache);

/// Compiles every choice of `problem` for `arch` into `cache` without a GPU (a build machine warming a fleet's
/// cache): template configurations and subgraphs; externs need no compile. Returns how many kernels were
/// compiled (or found cached) and the failures.
struct PrecompileReport {
  std::string problem;
  int kernels = 0;
  int cached = 0;    // found in the cache, stored there before this run's gate compiled anything
  int repeated = 0;  // compiled earlier by the same gate (another problem shares the kernel)
  int failed = 0;
  std::vector<std::string> failures;
  double seconds = 0;
};
/// The choices of `problem` worth compiling ahead at `effort` with no GPU at hand: on each of `parts` (the
/// arch's parts, DevicePeaks::parts_of()), the model's kept set plus every widening the tune may make (every
/// choice at exhaustive effort; the model's pick at none); their union. `ops` gives the reference choice. Used
/// by precompile_problem() and `kiln precompile`.
Result<std::vector<ChoicePtr>> precompile_plan(const OpRegistry& ops, const Problem& problem,
                                               std::vector<ChoicePtr> choices, Effort effort,
                                               const std::vector<DevicePeaks>& parts);
/// The template sample per template a context gets from TuneOptions (max_template_configs, else the effort's).
int template_sample(const TuneOptions& options, Effort effort);

Result<PrecompileReport> precompile_problem(const OpRegistry& ops, const Problem& problem, const Target& arch,
                                            PrecompileGate& gate, const TuneOptions& options);

}  // namespace kiln::runtime
