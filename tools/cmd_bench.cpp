// `kiln bench ...` is gone: the benchmarks are their own program, kiln-bench (bench/cli/), so that the user-facing
// binary does not sit on the benchmark harness (tools/ includes nothing from bench/; tests/tools checks it).
// This hidden stub only tells whoever types the old command what to type instead, and fails.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"

namespace kiln::cli {
namespace {

void add_bench_moved_command(CLI::App& root) {
  CLI::App* cmd = root.add_subcommand("bench", "Moved to the kiln-bench program");
  cmd->group("");         // not listed in `kiln --help`
  cmd->prefix_command();  // takes whatever followed (`pool --workers 1,16`) to repeat it in the message
  cmd->callback([cmd] {
    const std::vector<std::string> args = cmd->remaining();
    fmt::print(stderr,
               "kiln: `kiln bench` is no longer part of kiln; the benchmarks are their own program: run "
               "`kiln-bench{}{}` (build/bin/kiln-bench, built with KILN_BUILD_BENCH=ON; `kiln-bench --help` "
               "lists them)\n",
               args.empty() ? "" : " ", fmt::join(args, " "));
    throw ExitCode(2);
  });
}

}  // namespace

KILN_REGISTER_COMMAND(add_bench_moved_command);

}  // namespace kiln::cli
