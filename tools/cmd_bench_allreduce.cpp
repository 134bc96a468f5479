// kiln bench allreduce: tuned all-reduce across GPUs against NCCL (bench/collective/allreduce_bench.h).
#include <fmt/format.h>

#include "commands.h"

#ifdef KILN_HAVE_ALLREDUCE_BENCH
#include "allreduce_bench.h"
#endif

namespace kiln::cli {
namespace {

void add_bench_allreduce_command(CLI::App& root) {
  CLI::App& bench = group(root, "bench", "Benchmarks of kiln's parts");
  auto* cmd = bench.add_subcommand(
      "allreduce", "All-reduce across N GPUs (one process each): latency and bus bandwidth per size for NCCL, "
                   "kiln's one-shot/two-shot templates and the tuned dispatcher, eager and in CUDA graphs; the "
                   "fused all-reduce + residual + RMSNorm against the unfused pairs");
#ifdef KILN_HAVE_ALLREDUCE_BENCH
  auto options = std::make_shared<allreduce_bench::Options>();
  allreduce_bench::add_options(*cmd, *options);
  cmd->callback([options] {
    int rc = allreduce_bench::run(*options);
    if (rc != 0) throw ExitCode(rc);
  });
#else
  cmd->callback([] {
    fmt::print(stderr, "kiln bench allreduce: this kiln was built without benchmarks (KILN_BUILD_BENCH=OFF)\n");
    throw ExitCode(2);
  });
#endif
}

}  // namespace

KILN_REGISTER_COMMAND(add_bench_allreduce_command);

}  // namespace kiln::cli
