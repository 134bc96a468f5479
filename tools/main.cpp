// kiln: JIT-compile and autotune CUDA kernels from the command line.
#include <CLI/CLI.hpp>

#include "commands.h"

namespace kiln::cli {

std::vector<AddCommand>& command_registry() {
  static std::vector<AddCommand> registry;
  return registry;
}

CLI::App& group(CLI::App& root, const std::string& name, const std::string& description) {
  for (CLI::App* sub : root.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return *sub;
  }
  CLI::App* sub = root.add_subcommand(name, description);
  sub->require_subcommand(1);
  return *sub;
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  CLI::App app{"kiln: JIT-compile and autotune CUDA kernels at run time"};
  app.require_subcommand(1);
  for (auto add : kiln::cli::command_registry()) add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
