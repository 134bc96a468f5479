// The all-reduce benchmark behind `kiln-bench allreduce` (bench/cli/): starts one process per GPU, tunes
// kiln's all-reduce over 4 KiB..256 MiB, and prints latency and bus bandwidth per size for every choice (NCCL
// included, the reference) and for the tuned dispatcher, eager and as CUDA-graph replays; then the fused
// all-reduce + residual + RMSNorm against the unfused pairs at decode sizes. Writes JSON.
// With --heap: the kinds of call side by side instead (staged tensors, symmetric heap tensors out of place and in
// place, each tuned on its own): per size the tuned dispatcher and NCCL on the same tensors, eager and as CUDA-graph
// replays, and the issue-19 columns (kiln_eager_us, nccl_eager_us, kiln_graph_us, nccl_graph_us).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace kiln::allreduce_bench {

struct Options {
  int gpus = 2;
  /// Tune the decisions on CUDA-graph replays (what a graph-captured decode step sees) instead of eager calls.
  bool graph = false;
  /// The input is already in kiln's peer-mapped buffer (no copy-in per call), as symmetric-memory peers measure.
  bool zero_copy = false;
  bool in_place = false;  // input and output in kiln's buffer (AllReduceOptions::in_place)
  /// Heap mode: tune and measure every kind of call in `calls` on symmetric heap tensors (and staged ones).
  bool heap = false;
  std::vector<std::string> calls = {"staged", "symmetric", "in-place"};
  std::string dtype = "bf16";
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{256} << 20;
  int max_configs = 24;
  std::vector<int> hidden = {4096, 8192};
  std::vector<int> tokens = {1, 2, 4, 8, 16, 32, 64};
  std::string json;
  std::string cache_dir;  // empty: no cache (every run tunes)
};

void add_options(CLI::App& app, Options& options);
/// Returns the process exit code.
int run(const Options& options);

}  // namespace kiln::allreduce_bench
