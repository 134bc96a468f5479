// What the cache stores besides binaries: per-choice timings (and failures) and decisions, each stamped
// with the toolchain that produced it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/jit/key.h"
#include "kiln/status.h"

namespace kiln::cache {

/// The tools whose change invalidates a stored result: a timing, a decision or a cached failure made with
/// another toolchain is a miss (a kernel that failed to compile may compile with the next NVRTC).
struct Toolchain {
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  int driver = 0;      // cuDriverGetVersion; 0 where no driver loads
  std::string kiln;    // kiln's version

  /// This process's NVRTC, driver (0 when none loads) and kiln versions. Thread-safe; computed once.
  static const Toolchain& current();
  /// "NVRTC 13.0, driver 13000, kiln 0.1.0"
  std::string str() const;

  bool operator==(const Toolchain&) const = default;
};

/// Nanoseconds since the Unix epoch, the stamp every record carries (newest wins when two processes write
/// the same entry).
int64_t now_ns();

/// The measurement of one choice for one problem, or the reason it failed.
struct TimingRecord {
  std::string problem;     // canonical ProblemKey
  std::string choice;      // the choice's stable name, e.g. "gemm_mma_128x128x32_w8_s3" or "cublaslt/algo17"
  bool ok = true;          // false: the choice failed (did not compile, faulted, gave a wrong result)
  double median_us = 0;
  double min_us = 0;
  double p90_us = 0;
  uint32_t samples = 0;
  int64_t measured_at_ns = 0;  // set by the cache when 0
  ErrorCode error = ErrorCode::kOk;  // when !ok
  std::string reason;                // when !ok: the failure's text
  Toolchain toolchain;               // set to Toolchain::current() by the cache when its kiln field is empty

  bool operator==(const TimingRecord&) const = default;
};

/// The chosen choice for one problem.
struct Decision {
  std::string problem;  // canonical ProblemKey
  std::string choice;   // the winner's stable name
  /// The winner's parameters by name (tile sizes, stages, the cuBLASLt algorithm), so that the runtime can
  /// rebuild it even when the set of choices has changed since.
  std::vector<std::pair<std::string, std::string>> params;
  /// The winner's compiled kernel, when it is one (extern library choices have none).
  std::optional<KernelKey> kernel;
  double median_us = 0;       // the winner's median time
  int64_t decided_at_ns = 0;  // set by the cache when 0
  Toolchain toolchain;        // set to Toolchain::current() by the cache when its kiln field is empty

  bool operator==(const Decision&) const = default;
};

/// A stored binary's metadata, read without its cubin (for listing, stats and pruning).
struct BinaryInfo {
  KernelKey key;
  std::string name;
  std::string entry;
  std::string arch;
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  double compile_seconds = 0;
  uint64_t cubin_bytes = 0;
  uint64_t value_bytes = 0;   // the whole stored value
  int64_t created_at_ns = 0;
  int64_t used_at_ns = 0;     // last time a process loaded it (coarse: updated at most once an hour); 0 if never
};

}  // namespace kiln::cache
