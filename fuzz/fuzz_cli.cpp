// Any argument list for the kiln command line, parsed without running a command: options, their ranges and
// the command-name check answer with a status, never a crash. The input is the arguments, NUL-separated.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"kiln"};
  std::string cur;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  (void)kiln::cli::run(static_cast<int>(args.size()), argv.data(), /*run_commands=*/false);
  return 0;
}
