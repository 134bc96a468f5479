// Cache bundles: a portable JSON file of decisions and timings (keyed by canonical problem and choice
// names) and, optionally, binaries (cubins in base64), each with its arch and toolchain, that a build machine
// exports and a fleet imports. Every entry carries the XXH3-64 of its stored form; import rebuilds each
// entry, checks that hash and the entry's own invariants, and stores only what passes.
//
// Those hashes catch damage, not an attacker: anyone can recompute them. Binaries are code that runs on the
// GPU, so import stores them only from a bundle signed with a key the importer trusts (HMAC-SHA256 over the
// whole file after its first line, which holds the signature; see signing.h) or when told to trust unsigned
// bundles. Decisions and timings name choices kiln compiles from its own sources, and are always imported.
//
//   {
//    "signature": {"algorithm": "hmac-sha256", "key_id": "...", "hmac": "..."},   (only when signed)
//    "binaries": ..., (the rest in key order)
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
#include <optional>
#include <string>
#include <vector>

#include "kiln/cache/signing.h"
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
  /// Sign the bundle with this key. Default none (unsigned: an importer stores its binaries only when told to
  /// trust unsigned bundles).
  std::optional<SigningKey> sign_with;
};

struct ImportOptions {
  /// Keys whose signature makes the bundle's binaries trusted. Default none.
  std::vector<SigningKey> trusted_keys;
  /// Store the binaries of a bundle that has no signature. A bundle whose signature does not verify never
  /// has its binaries stored. Default false.
  bool trust_unsigned = false;
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
  /// What the signature check found: "signed with trusted key <id>", "unsigned", "unsigned, trusted as told",
  /// "signed with key <id>, which is not a trusted key", "its signature does not match its content".
  std::string signature;
  bool binaries_trusted = false;
  /// False when the bundle is signed and its signature does not match its content with the key it names
  /// (edited after signing): a failed check, not only an untrusted source.
  bool signature_valid = true;
  size_t binaries_skipped = 0;  // binaries not imported because the bundle is not trusted
};

/// Writes the current (same-toolchain) content of `store` selected by `options` to `path` (replaced
/// atomically). Errors: kInvalidArgument for a path inside the cache folder (after resolving links and ".."),
/// kIoError.
Result<BundleCounts> export_bundle(Store& store, const std::string& path, const ExportOptions& options = {});

/// Checks the bundle's signature, verifies every entry of the bundle at `path` and stores those that pass (in
/// batches); binaries only when the bundle is trusted (see ImportOptions). Errors: kNotFound / kIoError
/// reading the file, kCorrupt for a file that is not a kiln bundle (entries that fail are counted, not errors).
Result<ImportReport> import_bundle(Store& store, const std::string& path, const ImportOptions& options = {});

}  // namespace kiln::cache
