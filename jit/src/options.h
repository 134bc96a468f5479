// How kiln reads NVRTC option strings: which ones name include paths, PCH controls or the arch.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"

namespace kiln::detail {

inline bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

/// "-I dir", "-Idir", "--include-path=dir".
inline bool is_include_path_option(std::string_view o) {
  return starts_with(o, "-I") || starts_with(o, "--include-path");
}

/// The path of an include-path option.
inline std::string include_path_of(std::string_view o) {
  std::string_view rest = starts_with(o, "-I") ? o.substr(2) : o.substr(std::string_view("--include-path").size());
  while (!rest.empty() && (rest.front() == '=' || rest.front() == ' ')) rest.remove_prefix(1);
  return std::string(rest);
}

/// Options that change how fast NVRTC compiles, not what it produces.
inline bool is_pch_option(std::string_view o) {
  for (std::string_view p : {"-pch", "--pch", "-create-pch", "--create-pch", "-use-pch", "--use-pch",
                             "-instantiate-templates-in-pch", "--instantiate-templates-in-pch"}) {
    if (starts_with(o, p)) return true;
  }
  return false;
}

inline bool is_arch_option(std::string_view o) {
  return starts_with(o, "-arch") || starts_with(o, "--gpu-architecture") || starts_with(o, "--gpu-name") ||
         starts_with(o, "-code");
}

/// The source's include dirs followed by those named in its options, in search order.
inline std::vector<std::string> include_dirs_of(const KernelSource& src) {
  std::vector<std::string> dirs = src.include_dirs;
  for (const auto& o : src.options) {
    if (is_include_path_option(o)) dirs.push_back(include_path_of(o));
  }
  return dirs;
}

}  // namespace kiln::detail
