// The on-disk format of every value the cache stores, and of its keys.
//
// A value is an envelope around a payload (all integers little-endian):
//
//   offset  size  field
//   0       4     magic "KLNC"
//   4       2     format version (kFormatVersion)
//   6       1     kind (ValueKind)
//   7       1     flags (0)
//   8       8     stamp: ns since the Unix epoch; when two processes store the same key, the newer stamp wins
//   16      4     payload length n
//   20      n     payload: fields in a fixed order; strings and lists are a u32 count then the items
//   20+n    8     XXH3-64 of bytes [0, 20+n)
//
// Decoding checks all of it; a value that fails any check is a miss, never a crash or a wrong kernel.
// tests/cache/golden/ pins these bytes: change kFormatVersion when changing anything here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/cache/records.h"
#include "kiln/jit/compiler.h"
#include "kiln/status.h"

namespace kiln::cache {

inline constexpr uint16_t kFormatVersion = 1;
inline constexpr std::string_view kMagic = "KLNC";
inline constexpr size_t kEnvelopeHeaderBytes = 20;
inline constexpr size_t kEnvelopeBytes = kEnvelopeHeaderBytes + 8;

enum class ValueKind : uint8_t {
  kBinary = 1,
  kTiming = 2,
  kDecision = 3,
  kMeta = 4,   // the database's format record
  kUsed = 5,   // when a binary was last loaded (for pruning the least recently used)
};

/// A binary as stored: the kiln::Binary and when it was stored.
struct StoredBinary {
  Binary binary;
  int64_t created_at_ns = 0;
};

struct MetaRecord {
  uint32_t format_version = kFormatVersion;
  std::string kiln_version;
  int64_t created_at_ns = 0;

  bool operator==(const MetaRecord&) const = default;
};

// Encoders. The stamp is the record's own time (created_at / measured_at / decided_at / used_at).
std::string encode_binary(const Binary& binary, int64_t created_at_ns);
std::string encode_timing(const TimingRecord& timing);
std::string encode_decision(const Decision& decision);
std::string encode_meta(const MetaRecord& meta);
std::string encode_used(int64_t used_at_ns);

/// The envelope's fields, after its magic, version, length and checksum were checked.
struct Envelope {
  ValueKind kind{};
  int64_t stamp = 0;
  std::string_view payload;
};

/// Checks magic, format version, length and checksum. Errors: kCorrupt saying which check failed.
/// Cost: one XXH3 pass over the value (about 20 GB/s).
Result<Envelope> open_envelope(std::string_view value);

// Decoders: open_envelope, then the kind and every payload field. Errors: kCorrupt.
Result<StoredBinary> decode_binary(std::string_view value);
Result<TimingRecord> decode_timing(std::string_view value);
Result<Decision> decode_decision(std::string_view value);
Result<MetaRecord> decode_meta(std::string_view value);
Result<int64_t> decode_used(std::string_view value);

/// The metadata of a stored binary (decodes the value; the cubin is only measured).
Result<BinaryInfo> decode_binary_info(std::string_view value);

/// Which of two stored values of the same key wins: a valid value beats an invalid one; then the newer stamp;
/// then the larger bytes. A pure function of the two values, so every order of merging the same writes ends
/// with the same value (this is what makes concurrent processes converge). Returns true when `a` wins.
bool first_wins(std::string_view a, std::string_view b);

// Keys.
/// The binaries column family's key: the 16 bytes of the KernelKey, big-endian high then low.
std::string binary_key(const KernelKey& key);
Result<KernelKey> parse_binary_key(std::string_view key);
/// The timings column family's key: canonical problem, a zero byte, the choice name.
std::string timing_key(std::string_view problem, std::string_view choice);
/// The meta column family's key for a binary's last use.
std::string used_key(const KernelKey& key);
inline constexpr std::string_view kMetaFormatKey = "format";
inline constexpr std::string_view kUsedPrefix = "used/";

}  // namespace kiln::cache
