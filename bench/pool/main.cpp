// bench_pool: the compile-pool benchmark as its own program (the same as `kiln bench pool`).
#include <CLI/CLI.hpp>

#include "pool_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln's compile pool: kernels per second per executor and worker count, pool overhead"};
  kiln::pool_bench::Options options;
  kiln::pool_bench::add_options(app, options);
  CLI11_PARSE(app, argc, argv);
  return kiln::pool_bench::run(options);
}
