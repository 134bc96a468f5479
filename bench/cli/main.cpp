// kiln-bench: the benchmarks of kiln's parts that share one command line, each a subcommand whose options,
// measurement and output live in its own bench/ library (bench/pool/pool_bench.h,
// bench/collective/allreduce_bench.h). Each prints a table and writes JSON with --json FILE.
#include <CLI/CLI.hpp>

#include "allreduce_bench.h"
#include "pool_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench: benchmarks of kiln's parts (recorded results and method: bench/results/)"};
  app.require_subcommand(1);

  kiln::pool_bench::Options pool;
  CLI::App* pool_cmd = app.add_subcommand(
      "pool", "Compile throughput (kernels/s) per executor and worker count, with and without NVRTC PCH; pool "
              "overhead and worker start-up; JSON with one row per (executor, workers, pch)");
  kiln::pool_bench::add_options(*pool_cmd, pool);

  kiln::allreduce_bench::Options allreduce;
  CLI::App* allreduce_cmd = app.add_subcommand(
      "allreduce", "All-reduce across N GPUs (one process each): latency and bus bandwidth per size for NCCL, "
                   "kiln's one-shot/two-shot templates and the tuned dispatcher, eager and in CUDA graphs; the "
                   "fused all-reduce + residual + RMSNorm against the unfused pairs");
  kiln::allreduce_bench::add_options(*allreduce_cmd, allreduce);

  CLI11_PARSE(app, argc, argv);
  if (pool_cmd->parsed()) return kiln::pool_bench::run(pool);
  return kiln::allreduce_bench::run(allreduce);
}
