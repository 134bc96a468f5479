// An analytic performance model of kiln's template choices: ranks the candidates of a problem before anything is
// compiled, so that a tune compiles and times only those ranked near the top (plus the extern library choices,
// which the model does not try to predict).
//
// GEMM (gemm_wgmma_sm90, gemm_mma_sm80 and the split-K / unfused subgraphs over them): output tiles over the
// SMs in waves (with the occupancy the tile's shared memory, registers and threads allow), the tile's FLOPs at
// the device's tensor peak scaled by how well the tile reuses what it loads, the bytes the problem must move at
// the bandwidth its resident blocks can pull (Little's law: bytes in flight over memory latency), swap-AB (the
// tile's M side covers N), split-K over a cluster or as a partials + reduce subgraph (more blocks, more bytes).
// Norms and softmax: the bytes of a pass over the rows against the bandwidth the blocks in flight can pull, and
// the waves of blocks over rows.
//
// The model only orders; its microseconds are not a promise. A tune refines it with what the cache measured on
// neighbouring shapes (calibrate()) and widens its kept set when the measurements disagree with it (tuner.cpp).
// Pure functions of parameter maps: no GPU needed, and tested as such (tests/runtime/test_perf_model.cpp).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/problem.h"

namespace kiln::runtime {

/// What the model needs of a device. from_device() reads the attributes of a present device (SMs, shared
/// memory, clocks, memory bus); for_arch() gives the flagship part of an arch when there is none.
struct DevicePeaks {
  std::string arch;                // "sm_90"
  int sms = 132;
  double tensor_tflops = 989;      // dense bf16/fp16 with fp32 accumulation (wgmma on sm_90)
  double hbm_gbps = 3350;          // DRAM bandwidth, GB/s
  double l2_gbps = 16000;          // L2 to SMs, GB/s (~120 GB/s per SM sustained, measured on 4096-deep tiles)
  int smem_per_sm = 233472;        // bytes
  int regs_per_sm = 65536;
  int max_threads_per_sm = 2048;
  double memory_latency_us = 0.8;  // a DRAM round trip under load (Little's law)
  /// A GEMM pipeline stage's round trip: the TMA load of a stage issued to its barrier's completion, while every
  /// SM streams (Little's law over the ring's bytes). Longer than one load's: the ring refills behind the MMAs.
  double stage_latency_us = 1.6;
  double launch_us = 2.0;          // one more kernel in a subgraph
  bool measured = false;           // from a device's attributes, not the table
  /// The fraction of tensor_tflops the best kiln GEMM template reached on any recorded suite shape of this device
  /// class: a template's prediction is never below the FLOPs at this rate. Measured: H100 782 TFLOP/s (0.79),
  /// H200 793 (0.80) (bench/results/gemm-suite-nvidia-h{100,200}-*.json; cuBLAS itself peaked at 0.83-0.84).
  double template_ceiling = 0.80;

  /// The table: sm_90 (H100 SXM: 132 SMs, 989 TFLOP/s, 3.35 TB/s), sm_80 (A100: 108, 312, 2.0), sm_86
  /// (84, 142, 0.94), sm_89 (128, 330, 1.0); an unknown arch gets sm_90's figures scaled by nothing.
  static DevicePeaks for_arch(const std::string& arch);
  /// The table's entry for the device's arch, with the SM count, shared memory and DRAM bandwidth (memory
  /// clock x bus width x 2, DDR) read from the device and the tensor peak scaled by its SM count and clock.
  /// H200 (HBM3e) reads ~4.8 TB/s this way.
  static DevicePeaks from_device(const DeviceInfo& device);
  /// The parts of an arch whose figures rank differently, as from_device() reads them: sm_90 the H100 (the table)
  /// and the H200 (HBM3e: 4.9 TB/s, and its own fitted_calibration()); every other arch its table entry. What a
  /// machine without the GPU compiles ahead covers each (precompile_plan()).
  static std::vector<DevicePeaks> parts_of(const std::string& arch);
};

/// The model's view of one choice on one problem.
struct ModelEstimate {
  bool known = false;     // false: the model cannot judge this choice (externs, user kernels, unknown families)
  double us = 0;          // predicted time, microseconds (ordering only)
  double compute_us = 0;  // tensor or ALU time including wave quantisation
  double memory_us = 0;   // DRAM time at the bandwidth the resident blocks can pull
  double waves = 0;       // blocks / (SMs x blocks per SM)
  int64_t blocks = 0;
  int occupancy = 0;      // resident blocks per SM
  std::string bound;      // "compute", "memory" or "latency"
};

/// The model's estimate of a choice with these parameters (Choice::parameters()) and kind on `problem`.
ModelEstimate estimate(const Problem& problem, ChoiceKind kind, const std::map<std::string, std::string>& parameters,
                       const DevicePeaks& peaks);
inline ModelEstimate estimate(const Problem& problem, const Choice& choice, const DevicePeaks& peaks) {
  return estimate(problem, choice.kind(), choice.parameters(), peaks);
}

/// The group a choice's model error is fitted per: "wgmma/tile", "wgmma/persistent", "wgmma/swap_ab",
/// "wgmma/cluster_k" (gemm_wgmma_sm90 by its structural variant; swap_ab and cluster_k win over persistent),
/// followed by "/compute" or "/memory" when `bound` (ModelEstimate::bound) is given,
/// "mma_sm80", "splitk" (a split-K or unfused subgraph), "rows" (norms and softmax); empty when the model does
/// not know the choice.
std::string calibration_family(ChoiceKind kind, const std::map<std::string, std::string>& parameters,
                               const std::string& bound = {});
/// measured / modelled for a family on the device `peaks` describes, fitted on a recorded GEMM suite (the geometric
/// mean over its measured wgmma candidates per variant; tests/runtime/test_tuning_effort_prune.cpp refits them and
/// checks these figures): an HBM3e sm_90 part (H200) has its own fit, any other device the H100's
/// (bench/results/gemm-suite-nvidia-h100-2026-11-25-24c0899.json). Families without recorded timings get the
/// device's mean over every wgmma candidate.
double fitted_calibration(const std::string& family, const DevicePeaks& peaks);

/// The structural variant of a choice, for planning a varied set (EffortPolicy::diverse): the model's errors
/// differ most between these, not within them. gemm_wgmma_sm90: "wgmma/<swab|tile>/<none|ck2|ck4|sk|ske>/<p|np>/b<N>"
/// (swap-AB, how K is split: cluster, stream-K, free-running stream-K; persistent; blocks per SM); norms and
/// softmax: "<template>/i<items>" (the loads a thread has in flight); "mma_sm80"; "subgraph:<name>"; other
/// templates: their template name. Empty when the choice has no template parameters (externs, user kernels).
std::string structure_class(ChoiceKind kind, const std::map<std::string, std::string>& parameters);

/// One candidate in model order.
struct RankedChoice {
  size_t index = 0;         // into the choices given to rank()
  ModelEstimate estimate;
  double calibration = 1;   // measured / modelled on neighbouring shapes (1: nothing known)
  double score_us = 0;      // estimate.us x calibration (x the family's fitted_calibration() unless the cache
                            // measured this choice nearby); what the order is by
  /// The model's best guess of the measured time: estimate.us x (this choice's own measured / modelled on
  /// neighbouring shapes where the cache has it, else the lower of its family's from the cache's neighbours and
  /// the family's fitted_calibration()), and for a GEMM never below its FLOPs at DevicePeaks::template_ceiling.
  /// Extern-first pruning compares it with the externs' measured times.
  double predicted_us = 0;
  std::string family;       // calibration_family()
  std::string structure;    // structure_class()
  bool cached = false;      // its binaries are in the cache already (no compile): first among equal scores
};

/// The choices' estimates in model order: known ones by score (equal scores: a cached one first, then by
/// index, so the order is deterministic), then the unknown ones in their given order. `calibration` (by choice
/// name, from calibrate(); "family:F" keys refine the family's prediction) scales scores. `cached` names the
/// choices whose binaries the cache holds.
std::vector<RankedChoice> rank(const Problem& problem, const std::vector<ChoicePtr>& choices, const DevicePeaks& peaks,
                               const std::map<std::string, double>& calibration = {},
                               const std::set<std::string>& cached = {});

/// A measured time of a choice on another problem, for calibrate().
struct NeighbourTiming {
  Problem problem;
  std::string choice;
  std::map<std::string, std::string> parameters;
  ChoiceKind kind = ChoiceKind::kTemplate;
  double median_us = 0;
};

/// How far `other` is from `problem` when it is a neighbouring shape: the same op, dtypes, layouts and epilogue
/// (norms: residual, bias; softmax: scale) with every size within a factor of 2; the distance is the sum of
/// |log2| of the size ratios. Nothing when it is not a neighbour or is the same problem.
std::optional<double> neighbour_distance(const Problem& problem, const Problem& other);

/// Per choice name: the geometric mean of measured / modelled over the neighbouring timings of that choice,
/// clamped to [0.25, 4] so that one odd measurement cannot throw a choice out of the kept set on its own; and
/// under the key "*" the same over all of them (the model's bias on this kind of problem), and under
/// "family:F" the same over the timings of calibration_family() F. Choices without neighbours are scaled by
/// "*" in rank() only relative to each other, which changes nothing.
std::map<std::string, double> calibrate(const std::vector<NeighbourTiming>& timings, const DevicePeaks& peaks);

}  // namespace kiln::runtime
