// bench_allreduce: the all-reduce benchmark as its own program (the same as `kiln bench allreduce`).
#include <CLI/CLI.hpp>

#include "allreduce_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln's all-reduce across GPUs: every choice and the tuned dispatcher against NCCL"};
  kiln::allreduce_bench::Options options;
  kiln::allreduce_bench::add_options(app, options);
  CLI11_PARSE(app, argc, argv);
  return kiln::allreduce_bench::run(options);
}
