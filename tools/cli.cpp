// The kiln command line, as a function main() calls and the CLI fuzz target drives (fuzz/).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>

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

CLI::Option* add_cache_dir_option(CLI::App* cmd, std::string& dir) {
  return cmd
      ->add_option("--cache-dir", dir,
                   "The cache folder (default: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("is empty (leave the option out for the default)") : ""; },
          "DIR"));
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// CLI11 answers `kiln cahce stats` with "A subcommand is required". Walks the words that name subcommands
// and, at the first that names none, says so with the nearest names; 0 when every word is known.
int check_command_words(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "kiln";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    auto every = at->get_subcommands([](CLI::App*) { return true; });
    if (every.empty() || word.empty() || word[0] == '-') return 0;
    CLI::App* next = nullptr;
    for (CLI::App* s : every) next = s->check_name(word) ? s : next;
    if (!next) {
      auto subs = at->get_subcommands([](CLI::App* s) { return !s->get_group().empty(); });  // not the hidden
      std::vector<std::pair<size_t, std::string>> near;
      for (CLI::App* s : subs) near.emplace_back(edit_distance(word, s->get_name()), s->get_name());
      std::sort(near.begin(), near.end());
      std::string hint;
      for (const auto& [d, name] : near) {
        if (d <= std::max<size_t>(2, word.size() / 3)) hint += fmt::format("{}'{} {}'", hint.empty() ? "" : " or ", path, name);
      }
      std::string all;
      for (CLI::App* s : subs) all += (all.empty() ? "" : ", ") + s->get_name();
      fmt::print(stderr, "{}: unknown command '{}'{}{}{} (commands: {})\n", path, word,
                 hint.empty() ? "" : "; did you mean ", hint, hint.empty() ? "" : "?", all);
      return 2;
    }
    at = next;
    path += " " + next->get_name();
  }
  return 0;
}

// Thrown by the root's parse-complete hook to end a parse-only run before any command's callback.
struct ParsedOnly {};

}  // namespace

int run(int argc, char** argv, bool run_commands) {
  CLI::App app{"kiln: JIT-compile and autotune CUDA kernels at run time"};
  app.require_subcommand(1);
  for (auto add : command_registry()) add(app);
  if (!run_commands) {
    // Parsing only: every option and validator runs, no command does. A command's callback is often the only
    // owner of the arguments its options write into (see on_run), so the callbacks must stay in place:
    // replacing them freed those arguments before the parse wrote to them. The root's parse-complete hook runs
    // after every option, validator and requirement and before any subcommand's callback (CLI11's
    // run_callback), so it ends the run there.
    app.parse_complete_callback([] { throw ParsedOnly{}; });
  }
  if (int rc = check_command_words(app, argc, argv)) return rc;
  try {
    app.parse(argc, argv);
  } catch (const ParsedOnly&) {
    return 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    // Whatever the input, kiln ends with a message and a status, never by a signal.
    std::fprintf(stderr, "kiln: out of memory\n");
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error (a bug; please report it): %s\n", e.what());
    return 70;
  }
  return 0;
}

}  // namespace kiln::cli

