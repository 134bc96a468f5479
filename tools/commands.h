// The kiln command line's subcommands. Each cmd_*.cpp file registers itself with KILN_REGISTER_COMMAND and
// adds its subcommand(s) to the app; main.cpp only runs the registry, so commands never touch each other.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cli {

using AddCommand = void (*)(CLI::App& root);

/// Parses argv and runs the command it names; the process's exit status. With run_commands false, only
/// parses (options, validators, command names), for the fuzz target.
int run(int argc, char** argv, bool run_commands);

/// Every registered command adder, in registration order.
std::vector<AddCommand>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(AddCommand add) { command_registry().push_back(add); }
};

/// The `kiln NAME` group subcommand (e.g. "cache"), created on first use, so that several files can add
/// subcommands to one group (`kiln cache stats`, `kiln cache export`, ...).
CLI::App& group(CLI::App& root, const std::string& name, const std::string& description);

/// Throw from a callback to exit with `code` after printing the error yourself.
struct ExitCode : CLI::RuntimeError {
  explicit ExitCode(int code) : CLI::RuntimeError(code) {}
};

/// Runs `run(args)` as `cmd`'s callback; a non-zero result is the process's exit status.
template <class Args, class Run>
void on_run(CLI::App* cmd, std::shared_ptr<Args> args, Run run) {
  cmd->callback([args, run] {
    if (int rc = run(*args); rc != 0) throw ExitCode(rc);
  });
}

/// `--cache-dir DIR`, the same on every command that opens the cache; an empty DIR is refused (it would
/// silently mean the default folder).
CLI::Option* add_cache_dir_option(CLI::App* cmd, std::string& dir);

}  // namespace kiln::cli

#define KILN_REGISTER_COMMAND(fn) \
  static ::kiln::cli::CommandRegistrar KILN_CLI_CONCAT(kiln_registrar_, __LINE__)(fn)
#define KILN_CLI_CONCAT_INNER(a, b) a##b
#define KILN_CLI_CONCAT(a, b) KILN_CLI_CONCAT_INNER(a, b)
