// KernelSource: everything NVRTC needs to compile one program, and everything that goes into its key.
#pragma once

#include <string>
#include <vector>

namespace kiln {

/// A header handed to NVRTC from memory: `#include "name"` in the source finds it.
struct Header {
  std::string name;     // the include name, e.g. "kiln/epilogue.cuh"
  std::string content;

  bool operator==(const Header&) const = default;
};

/// One CUDA C++ program to compile. A value: copyable, comparable, serializable.
struct KernelSource {
  /// A stable human-readable name (a template configuration's name, a file's basename); used as NVRTC's
  /// program name, so it appears in compile logs.
  std::string name;
  /// The kernel to launch: an `extern "C"` function name, or a name expression listed in name_expressions
  /// (e.g. "scale<float, 4>"), which is looked up through NVRTC's lowered names.
  std::string entry;
  std::string source;
  /// NVRTC options, one option per string ("-DTILE=128", "--use_fast_math"). Their order does not change the
  /// key. The target arch is not an option: it is given as a Target.
  std::vector<std::string> options;
  std::vector<Header> headers;
  /// Directories searched for `#include`s on disk (after the in-memory headers, before the CUDA toolkit's).
  /// Their paths never reach the key: the contents of the headers found there do.
  std::vector<std::string> include_dirs;
  /// C++ expressions naming template instantiations to compile, e.g. "gemm<128, 64>".
  std::vector<std::string> name_expressions;

  bool operator==(const KernelSource&) const = default;
};

}  // namespace kiln
