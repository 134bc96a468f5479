// The compile-pool benchmark behind `kiln-bench pool` (bench/cli/): kernels per second for each executor
// (inline, arena, process, and raw std::threads as the reference) at several worker counts, with and without
// NVRTC's automatic PCH, on GEMM-like template kernels; the pool's own overhead (submit-to-start and completion
// latency of empty jobs); worker start-up time; and a CPU-bound loop as the machine's own scaling ceiling.
// Prints a table and writes JSON (one row per executor, workers and pch).
#pragma once

#include <string>
#include <vector>

#include "kiln/jit/target.h"
#include "kiln/status.h"
#include "kiln/templates/template.h"

namespace CLI {
class App;
}

namespace kiln::pool_bench {

/// What `--kernel wgmma` compiles: 8 configurations of kiln's gemm_wgmma_sm90 template for `target`, sampled
/// with seed 1 (every parameter value covered as far as 8 allow). Also bench_text_pages' work.
Result<std::vector<templates::Rendered>> wgmma_sample(const Target& target);

struct Options {
  /// inline, arena, process; "threads" (a plain std::thread pool calling kiln::compile) is the reference.
  /// Measured in this order at each worker count (the ones that matter most first).
  std::vector<std::string> executors = {"process", "arena", "threads", "inline"};
  std::vector<int> workers = {1, 2, 4, 8, 16};
  /// Kernels per batch; 0 (the default): per_worker x workers, at least 8.
  int kernels = 0;
  int per_worker = 4;
  /// off, on or both.
  std::string pch = "both";
  /// How the configuration reaches NVRTC: "source" (rendered after the header preamble, as templates do,
  /// so a PCH is reused) or "define" (-D options).
  std::string params = "source";
  /// What is compiled: "standin" (the embedded mma.sync GEMM, 8 tile shapes) or "wgmma" (8 configurations
  /// of kiln's own gemm_wgmma_sm90 template, the kernels a tune compiles most; for sm_90a).
  std::string kernel = "standin";
  /// Passes over the whole grid; each pass visits the executors in a rotated order.
  int rounds = 1;
  std::string arch = "sm_90";
  std::string json;
  bool overhead = true;
  int overhead_samples = 2000;
  bool cpu_reference = true;
  /// Worker counts whose rows are measured first (so a cut-off run keeps the ones that matter most).
  std::vector<int> first = {1, 16};
  /// Start no new measurement after this many seconds (0: no limit); what was measured is reported.
  double deadline = 0;
};

/// Adds the options above to `app` (flags named as in `kiln-bench pool --help`).
void add_options(CLI::App& app, Options& options);

/// Runs the benchmark; returns a process exit code.
int run(const Options& options);

}  // namespace kiln::pool_bench
