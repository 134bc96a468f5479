// Cache bundles: a portable JSON file of decisions and timings (keyed by canonical problem and choice
// names) and, optionally, binaries (cubins in base64), each with its arch and toolchain, that a build machine
// exports and a fleet imports. Every entry carries the XXH3-64 of its stored form; import rebuilds each
// entry, checks that hash and the entry's own invariants, and stores only what passes.
//
//   {"format": "kiln-cache-bundle", "version": 1, "kiln": "0.1.0", "created_at_ns": ...,
//    "exported_with": {"nvrtc": "13.0", "driver": 13000, "kiln": "0.1.0"},
//    "decisions": [{"problem", "choice", "params": [[name, value], ...], "kernel": hex|null, "median_us",
//                   "decided_at_ns", "toolchain": {...}, "xxh3": hex}],
//    "timings":   [{"problem", "choice", "ok", "median_us", "min_us", "p90_us", "samples", "measured_at_ns",
//                   "error", "reason", "toolchain", "xxh3"}],
//    "binaries":  [{"key", "name", "entry", "arch", "nvrtc", "compile_seconds", "created_at_ns",
//                   "lowered_names", "log", "cubin_base64", "xxh3"}]}
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kiln/cache/store.h"
#include "kiln/input.h"
#include "kiln/status.h"

namespace kiln::cache {

inline constexpr int kBundleVersion = 1;
/// The largest bundle import reads: 1 GiB unless $KILN_MAX_BUNDLE_BYTES says otherwise.
inline constexpr InputLimit kBundleBytesLimit{"bundle file", "KILN_MAX_BUNDLE_BYTES", 1ull << 30};

struct ExportOptions {
  /// Include binaries (base64). Default false: decisions and timings only (small; the fleet compiles).
  bool binaries = false;
  /// Only problems whose canonical key starts with this (e.g. environment_prefix() of one device), and only
  /// binaries the exported decisions name. Default empty: everything.
  std::string prefix;
};

struct BundleCounts {
  size_t decisions = 0;
  size_t timings = 0;
  size_t binaries = 0;
};

struct ImportReport {
  BundleCounts imported;
  size_t rejected = 0;          // entries that failed verification (reasons in errors)
  size_t other_toolchain = 0;   // imported entries made with another toolchain: stored, but misses here
  std::vector<std::string> errors;  // the first 20 reasons
};

/// Writes the current (same-toolchain) content of `store` selected by `options` to `path` (replaced
/// atomically). Errors: kIoError.
Result<BundleCounts> export_bundle(Store& store, const std::string& path, const ExportOptions& options = {});

/// Verifies every entry of the bundle at `path` and stores those that pass (in batches). Errors: kNotFound /
/// kIoError reading the file, kCorrupt for a file that is not a kiln bundle (entries that fail are counted,
/// not errors).
Result<ImportReport> import_bundle(Store& store, const std::string& path);

}  // namespace kiln::cache
