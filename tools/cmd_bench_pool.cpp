// kiln bench pool: the compile pool's throughput and overhead (bench/pool/pool_bench.h).
#include <fmt/format.h>

#include "commands.h"

#ifdef KILN_HAVE_POOL_BENCH
#include "pool_bench.h"
#endif

namespace kiln::cli {
namespace {

void add_bench_pool_command(CLI::App& root) {
  CLI::App& bench = group(root, "bench", "Benchmarks of kiln's parts");
  auto* cmd = bench.add_subcommand(
      "pool", "Compile throughput (kernels/s) per executor and worker count, with and without NVRTC PCH; pool "
              "overhead and worker start-up; JSON with one row per (executor, workers, pch)");
#ifdef KILN_HAVE_POOL_BENCH
  auto options = std::make_shared<pool_bench::Options>();
  pool_bench::add_options(*cmd, *options);
  cmd->callback([options] {
    int rc = pool_bench::run(*options);
    if (rc != 0) throw ExitCode(rc);
  });
#else
  cmd->callback([] {
    fmt::print(stderr, "kiln bench pool: this kiln was built without benchmarks (KILN_BUILD_BENCH=OFF)\n");
    throw ExitCode(2);
  });
#endif
}

}  // namespace

KILN_REGISTER_COMMAND(add_bench_pool_command);

}  // namespace kiln::cli
