// Measuring choices on the GPU, as the tuner does it: L2 flushed before each timed run, events around the run
// only, warm-up, repetitions from a time budget, CUDA-graph replays for launch-bound choices, early drop, and
// correctness against the reference's outputs with poisoned outputs. The tuner uses it in this process and the
// bench worker (runtime/isolation) in its own.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/ops.h"

namespace kiln::runtime {

struct BenchmarkOptions {
  /// Time to spend on a choice's timed runs; repetitions = budget / estimated run time, within [min_reps,
  /// max_reps]. Default 10 ms.
  double budget_ms = 10;
  int min_reps = 5;    // default 5
  int max_reps = 100;  // default 100
  /// >0: exactly this many timed runs for every choice, whatever its speed (where several processes or ranks
  /// must measure alike). Default 0.
  int fixed_reps = 0;
  /// A choice whose first short measurement is over drop_factor x the best median so far stops there: its
  /// partial timing is recorded and it cannot win. Default 1.5.
  double drop_factor = 1.5;
  /// Choices whose medians are within twice this fraction of the best (or within its measured spread, if
  /// wider) are re-measured interleaved `tie_rounds` times, the order reversed every other round; a choice
  /// whose first measurement lies clearly (this fraction) above the best stops early. Default 2% and 3 rounds.
  double tie_fraction = 0.02;
  int tie_rounds = 3;
  /// Near-ties still undecided after tie_rounds (detail::tie_unresolved: the leader and the runner-up within
  /// kCloseTie of each other and their per-round difference inside its noise) get more rounds, up to this many in
  /// all. Why: a round is 5 runs per choice, and on the H200 suite (1 Dec, db69ba1) a kernel's runs spread
  /// 6-10% between p10 and p90 during a tune, so three rounds put the difference of two medians at ~1% of
  /// noise; a second exhaustive tune agreed with the first within 1% on 110 problems of 120, the misses near-ties
  /// read the wrong way round. Equal to tie_rounds: no more rounds. Default 8.
  int tie_rounds_max = 8;
  /// After the re-measure, what stays within this fraction of the best (or the best median's confidence
  /// interval, if wider) goes to the lower tie_rank() (templates first), and among equal ranks to the fastest.
  /// Default 0.5%: at 2% (the tie fraction, before 27 Nov) six of the H200 suite's ten misses were a template
  /// measured 0.1-1.8% faster than an extern and not chosen, which the side-by-side re-time put 1.2-3.4% ahead.
  double rank_tie_fraction = 0.005;
  /// Flush L2 before every timed run, outside the timed region: a kernel reads a buffer of twice its size, which
  /// leaves it holding clean lines. Default true.
  bool flush_l2 = true;
  /// Flush by writing that buffer instead (a memset: kiln's flush before 29 Nov 2026, as Triton's do_bench and
  /// nvbench do it). It leaves L2 full of dirty lines, which a memory-bound choice then writes back inside its
  /// timed run: on an H200 a 1x4096x14336 decode GEMM tile timed 41.3 us instead of 32.5, and choices were ranked
  /// under that load. Kept to compare the two. Default false.
  bool flush_l2_by_writing = false;
  /// Choices estimated under this many microseconds are timed as CUDA-graph replays (launch-bound). Default 20.
  double graph_below_us = 20;
  /// Adaptive repetitions: timed runs come in rounds of min_reps and stop (judge()) once the median's 95%
  /// confidence interval is within `precision` of it, or lies clearly (tie_fraction) above or below the best
  /// so far; at the latest at the budget's count. false: the budget's count, as before. Default true, 0.5%.
  bool adaptive = true;
  double precision = 0.005;
  /// Early abandonment: a choice whose fastest short-estimate run is over abandon_factor x the best median
  /// so far stops there (partial), besides the drop_factor rule on the estimate's median. Default 1.15.
  double abandon_factor = 1.15;
  /// Operand placements: the tuner times every choice over this many sets of the problem's buffers, each
  /// allocated apart (elsewhere in device memory; the same values), run i on set i mod n. cuBLAS's kernels
  /// time differently by where their operands lie: on an H200, 256x7168x8192 bf16 read 43.0-50.0 us over eight
  /// allocations (steady within each), kiln's 128x112 tile 46.1-46.3 (`bench_tuning_speed probe
  /// --allocations`), so a tune on one set took a draw for the externs, and picked them on lucky ones. The
  /// sets past the first are made only while they stay within placement_bytes in all (and a quarter of the
  /// device's free memory). Every round of timed runs covers every set. Default 3 and 1 GiB; 1: one set, as
  /// before. Six (H200 suite, 1 Dec, 8934bf3/7ed3d8b/10203ad) cost ~10 ms more per problem's tune and did not
  /// move "within 1% of the exhaustive effort's choice" out of its run-to-run spread (90.0-95.8%).
  int placements = 3;
  size_t placement_bytes = size_t{1} << 30;
  /// Hold each batch of timed runs with a host function (cuLaunchHostFunc) instead of a kernel waiting on a word of
  /// pinned memory (kiln_hold). The host function was the hold until 1 Dec 2026 (bd19b73); kept to compare.
  /// Default false.
  bool hold_on_host = false;
};

/// The nonparametric 95% confidence interval of the median of `us` (order statistics n/2 -+ 0.98 sqrt(n)).
struct MedianInterval {
  double low = 0, median = 0, high = 0;
};
MedianInterval median_interval(std::vector<double> us);

/// Adaptive repetitions' stopping rule on the timed runs so far. kMore: measure another round; kEnough: the
/// median is known well enough (precise, or clearly ahead of `best_us`) or the count reached `max_reps`;
/// kSlower: clearly slower than `best_us` (> 0): the interval's low end is over (1 + tie_fraction) x best.
enum class Verdict { kMore, kEnough, kSlower };
Verdict judge(const std::vector<double>& us, double best_us, int max_reps, const BenchmarkOptions& options);


struct Samples {
  std::vector<double> us;  // one per timed run
  /// The operand set (BenchmarkOptions::placements) each run used, one per entry of `us`; empty: all one set
  /// (runs from the bench worker of an isolated tune carry none).
  std::vector<uint32_t> placement;
  bool graph = false;
  bool partial = false;
  /// Adds `more`'s runs (a later round of the same choice on the same sets).
  void append(const Samples& more);
};

/// The median, min and percentiles of samples (microseconds).
struct Summary {
  double median = 0, min = 0, p10 = 0, p90 = 0;
};
Summary summarize(std::vector<double> us);
/// The same, with `median` the placement-balanced median (placed_median); min and percentiles over all runs.
Summary summarize(const Samples& samples);
/// A choice's time over its operand placements: the mean of each placement's median. Where a choice's time
/// depends on where its operands lie (cuBLAS's kernels: 43-50 us for one GEMM over eight allocations on an
/// H200), the runs form one cluster per placement, and the median of all runs together lands where two
/// clusters meet whenever the runs split evenly (12 runs over 4 sets: between the 72nd and 73rd of 144), read
/// off the tails of both. Each placement's median is steady; their mean is what a caller's buffers, wherever
/// they land, take on average. In one H200 suite run (1 Dec, ffad048) the same kernel re-timed against itself
/// read beyond 1% apart on 3 of 120 problems this way and on 7 as the median of all runs (on 8 at bee96bc, 5 of
/// them cuBLAS/cuBLASLt). Without placements (or with one), the median.
double placed_median(const std::vector<double>& us, const std::vector<uint32_t>& placement);

namespace detail {
struct Graph;
}

/// Where a BenchRunner's host time goes, summed over its life (a tune reports the difference across it). Why:
/// on the H200 suite (1 Dec, 55374c3) the default effort spent 10.5 s measuring 120 problems, of which the timed
/// kernels were 3.9 s; these say what the rest is.
struct MeasureCosts {
  double warmup_s = 0;   // queuing the warm-up runs (a lazily loaded kernel loads on its first launch)
  double capture_s = 0;  // capturing and instantiating CUDA graphs
  double queue_s = 0;    // queuing timed runs behind a hold (the GPU waits meanwhile)
  double wait_s = 0;     // from a hold's release until the stream is idle
  double gpu_span_s = 0; // the GPU's time from a batch's first flush to its last run's end
  double timed_s = 0;    // the timed runs themselves (between their events)
  long runs = 0;         // timed runs
  long batches = 0;      // holds released (each one waited for)
  MeasureCosts& operator-=(const MeasureCosts& o);
};

/// Several sets of one problem's operands, each allocated apart (BenchmarkOptions::placements); the first is
/// the one choices are checked on.
struct OperandSets {
  std::vector<OpBuffers> sets;
  /// Each set's arguments, in order: what measure() and time_runs() rotate over.
  std::vector<const OpArgs*> args() const;
};
/// `def`'s buffers for `problem` with `seed`, `count` times while the sets past the first stay within `max_bytes`
/// in all and within a quarter of the device's free memory (the first always). Errors: the op's buffers().
Result<OperandSets> make_operand_sets(const OpDef& def, const Problem& problem, uint32_t seed, int count,
                                      size_t max_bytes);

/// CUDA graphs captured by BenchRunner::time_runs, kept for later calls with the same choices, arguments and
/// workspace (the near-tie rounds re-time the same few choices): capture and instantiation once per choice and
/// operand set instead of once per round. Valid while those arguments' buffers are; a choice that could not be
/// captured is remembered too, and timed eagerly.
class ReplayGraphs {
 public:
  ReplayGraphs();
  ~ReplayGraphs();
  ReplayGraphs(const ReplayGraphs&) = delete;
  ReplayGraphs& operator=(const ReplayGraphs&) = delete;

 private:
  friend class BenchRunner;
  // (choice, operand set) -> graph; null: the choice cannot be captured
  std::map<std::pair<const Choice*, size_t>, std::unique_ptr<detail::Graph>> graphs_;
};

class BenchRunner {
 public:
  /// Needs a current context; allocates the L2 flush buffer and events on `stream`.
  static Result<std::unique_ptr<BenchRunner>> create(const BenchmarkOptions& options, const DeviceInfo& device);
  ~BenchRunner();

  CUstream stream() const { return stream_.get(); }

  /// Copies of the outputs that choices also read (OutputRegion::restore), as they are before the reference
  /// runs: check() puts them back before each run. Nothing to do (and no synchronisation) without such outputs.
  Status capture_initial(const std::vector<OutputRegion>& outputs);
  /// Copies of the outputs the reference choice wrote, to check other choices against.
  Status capture_reference(const std::vector<OutputRegion>& outputs);
  /// Poisons the outputs (restores those captured by capture_initial), runs `choice` once, synchronises, and compares every output with the reference.
  /// kWrongResult naming the output and its error (or how many elements were not written); launch and
  /// fault errors as run() and the driver report them; kTimeout for a run that does not finish.
  Result<double> check(const Choice& choice, const OpArgs& args, CUdeviceptr workspace,
                       const std::vector<OutputRegion>& outputs, double tolerance);
  /// Times `choice`: a short estimate first; if it is over drop_factor x `best_us` (> 0) the estimate is
  /// returned as partial; otherwise repetitions from the budget (or fixed_reps), as graph replays when short.
  Result<Samples> measure(const Choice& choice, const OpArgs& args, CUdeviceptr workspace, double best_us);
  /// The same over several operand sets (OperandSets::args()): timed run i runs on sets[i mod n]. Every set
  /// must hold the same problem's buffers.
  Result<Samples> measure(const Choice& choice, const std::vector<const OpArgs*>& sets, CUdeviceptr workspace,
                          double best_us);
  /// True once a run hit a sticky error or a timeout: nothing may run in this context any more.
  bool context_lost() const { return context_lost_; }
  /// Host time by phase since this runner was created.
  const MeasureCosts& costs() const { return costs_; }
  /// `n` timed runs of `choice` as measure() does them, with no estimate (near-tie re-measurement). With
  /// `graph` and `keep`, the choice's graph is taken from `keep` or captured into it.
  Result<Samples> time_runs(const Choice& choice, const OpArgs& args, CUdeviceptr workspace, int n, bool graph,
                            ReplayGraphs* keep = nullptr);
  /// The same over several operand sets, as measure() rotates over them.
  /// `first` is the index of the first run in the rotation (runs added to earlier ones keep the sets even).
  Result<Samples> time_runs(const Choice& choice, const std::vector<const OpArgs*>& sets, CUdeviceptr workspace,
                            int n, bool graph, ReplayGraphs* keep = nullptr, size_t first = 0);

 private:
  BenchRunner() = default;
  Status synchronize();
  Status flush();

  BenchmarkOptions options_;
  Stream stream_;
  DeviceBuffer flush_buffer_;
  std::vector<Event> events_;
  Event batch_start_;  // recorded before a batch's first flush: the batch's GPU span
  MeasureCosts costs_;
  // The GPU hold's release word (pinned host memory; null: holds are host functions) and the last ticket given.
  uint64_t* released_ = nullptr;
  CUdeviceptr released_device_ = 0;
  uint64_t tickets_ = 0;
  std::vector<DeviceBuffer> reference_;
  std::vector<DeviceBuffer> initial_;  // per output; empty where the output is not restored
  bool context_lost_ = false;
};

}  // namespace kiln::runtime
