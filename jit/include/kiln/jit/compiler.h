// The NVRTC front of kiln: KernelSource + Target -> Binary (cubin, optional PTX, lowered names, log, time).
//
// No GPU or driver is needed. Compile errors come back as kCompileError with NVRTC's full log in
// Status::detail(). Thread-safe: NVRTC compiles run in parallel on separate programs.
#pragma once

#include <chrono>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/jit/key.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"

namespace kiln {

/// A compiled kernel: what the cache stores and what a Module loads.
struct Binary {
  KernelKey key;
  std::string name;      // the KernelSource's name
  std::string entry;     // the KernelSource's entry
  std::string arch;      // "sm_90a"
  std::string cubin;     // the ELF image, bytes
  std::string ptx;       // only when CompileSettings::want_ptx
  /// (name expression, lowered/mangled symbol) for every name expression of the source.
  std::vector<std::pair<std::string, std::string>> lowered_names;
  std::string log;       // NVRTC's log (warnings; PCH messages)
  double compile_seconds = 0;
  int nvrtc_major = 0;
  int nvrtc_minor = 0;

  /// The symbol to look up in the module for `entry` (its lowered name when it is a name expression).
  std::string symbol_for(const std::string& entry) const;
  std::string entry_symbol() const { return symbol_for(entry); }
};

struct CompileSettings {
  /// Also return PTX text. Default false: the cubin is all that runs.
  bool want_ptx = false;
  /// NVRTC automatic precompiled headers (-pch): reuses the parse of a program's headers across compiles
  /// with the same preamble. Default false. Does not change the binary or the key.
  bool use_pch = false;
  /// Where automatic PCH files go; empty (the default) lets NVRTC choose a per-process temporary folder.
  std::string pch_dir;
  /// Requests cancellation; checked by NVRTC's flow callback during the compile. Default: never.
  std::stop_token stop;
  /// Let the source #include files outside its include folders (its include_dirs, its -I options and the
  /// CUDA toolkit's). Default false: such a compile fails with kInvalidArgument before NVRTC runs, so a
  /// hostile source can neither read nor echo other files; $KILN_ALLOW_OUTSIDE_INCLUDES=1 also allows it.
  bool allow_outside_includes = false;
  /// In this process, the compile is cancelled at NVRTC's next flow-callback check after this long and fails
  /// with kTimeout. NVRTC checks only between its phases, so a source stuck inside one (a macro bomb in the
  /// preprocessor) runs on until that phase ends: the process pool's timeout, which kills the worker, is
  /// the one that always holds. Zero (the default): compile_timeout().
  std::chrono::milliseconds timeout{0};
};

/// How long a compile may take: $KILN_COMPILE_TIMEOUT seconds when set (a positive number), else 300 s.
/// kInvalidArgument naming the variable when it is set to anything else.
Result<std::chrono::milliseconds> compile_timeout();

/// Compiles `source` for `target`. Errors: kInvalidArgument (empty entry or source, an arch given as an
/// option), kCompileError (log in detail()), kCancelled, kInternal (other NVRTC failures).
Result<Binary> compile(const KernelSource& source, const Target& target, const CompileSettings& settings = {});

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};
NvrtcVersion nvrtc_version();

/// The CUDA toolkit include directories NVRTC searches last: $KILN_CUDA_INCLUDE if set, else the toolkit kiln
/// was built against ($CUDA_HOME/include is tried when that one is missing), followed by its `cccl/`
/// subfolder when present (CUDA 13 keeps libcu++, CUB and Thrust there).
const std::vector<std::string>& cuda_include_dirs();

}  // namespace kiln
