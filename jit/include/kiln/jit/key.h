// KernelKey: the content hash that names a compiled kernel everywhere (pool single-flight, the cache).
//
// XXH3-128 over everything that changes the binary: the program name, source text, options in canonical
// (sorted) order, name expressions, the name and content of every in-memory header, the include name and
// content of every header found on disk (never its path), the target arch, the NVRTC version and kiln's key
// format version. Nothing host-specific goes in: no absolute paths, timestamps, host names or PTX text, so the
// same kernel has the same key in every process and on every machine with the same NVRTC.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"

namespace kiln {

/// Bump when anything about what goes into a key, or how, changes.
inline constexpr uint32_t kKeyFormatVersion = 1;

struct KernelKey {
  uint64_t high = 0;
  uint64_t low = 0;

  /// 32 lower-case hex characters.
  std::string hex() const;
  static Result<KernelKey> parse(std::string_view hex);

  auto operator<=>(const KernelKey&) const = default;
};

/// The key of compiling `source` for `target` with this process's NVRTC. Headers on disk are found by
/// scanning `#include` directives (conservatively: every directive counts, taken or not) through the
/// in-memory headers, the source's include dirs and the CUDA toolkit's include dir; their contents are
/// hashed once per process and re-read only when a file's size or mtime changes. Thread-safe.
KernelKey make_key(const KernelSource& source, const Target& target);

/// The options that go into the key, in canonical order: sorted, with include-path options (their paths
/// are replaced by the contents they lead to) and PCH controls (they change compile speed, not the binary)
/// removed.
std::vector<std::string> canonical_options(const std::vector<std::string>& options);

}  // namespace kiln

template <>
struct std::hash<kiln::KernelKey> {
  size_t operator()(const kiln::KernelKey& k) const noexcept { return static_cast<size_t>(k.low ^ (k.high * 0x9e3779b97f4a7c15ull)); }
};
