// Sealed values: the cache's own records (the stored value format of cache/src/format.h) wrapped for a place
// kiln does not control (a remote tier shared by a fleet), optionally signed with a SigningKey.
//
// A cubin is code that runs on the GPU, so a value read from a shared place is checked before anything of it
// is used: the frame, the record's own checks (magic, version, checksum), that the record is the one the slot
// names (a valid value copied under another key is refused), and, where a key is configured, the signature.
//
//   offset  size  field
//   0       4     magic "KLNR"
//   4       1     sealed-format version (kSealedVersion)
//   5       1     flags: bit 0 signed
//   6       2     zero
//   8       4     record length n
//   12      16    (signed only) the key's public id (SigningKey::id()), for messages
//   ..      n     the record: exactly the bytes the local store keeps
//   ..      64    (signed only) HMAC-SHA256, hex, over the slot's name, a zero byte, and every byte before it
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/cache/records.h"
#include "kiln/cache/signing.h"
#include "kiln/jit/compiler.h"
#include "kiln/status.h"

namespace kiln::cache {

inline constexpr uint8_t kSealedVersion = 1;
/// The local store's value format version, which remote keys carry so that kilns with another format never
/// read each other's values.
uint16_t value_format_version();

/// Why a sealed value was refused.
enum class Refusal : uint8_t {
  kNone = 0,
  kMalformed,     // truncated, a bad frame, a record that fails its checks, or a record for another slot
  kUnsigned,      // no signature where one is required
  kBadSignature,  // signed, but not by the reader's key, or edited after signing
};
std::string_view refusal_name(Refusal r);

/// What a reader requires of a value. `key` null: signatures are not checked; unsigned (and signed)
/// decisions and timings are accepted, binaries only with `allow_unsigned_binaries`. With a key, every value
/// must carry a signature that verifies with it.
struct SealPolicy {
  const SigningKey* key = nullptr;
  bool allow_unsigned_binaries = false;
};

/// Seals a record for `slot` (where it will be stored, e.g. the remote key), signed when `key` is given.
std::string seal_binary(std::string_view slot, const Binary& binary, const SigningKey* key);
std::string seal_timing(std::string_view slot, const TimingRecord& timing, const SigningKey* key);
std::string seal_decision(std::string_view slot, const Decision& decision, const SigningKey* key);

/// Opens a sealed value read from `slot`. On a refusal the error says why (never a key's secret) and
/// `*why` (when given) says which kind of refusal it was. Errors: kCorrupt (kMalformed, kBadSignature),
/// kFailedPrecondition (kUnsigned).
/// unseal_binary also checks that the binary is the one `key` names.
Result<Binary> unseal_binary(std::string_view slot, std::string_view value, const KernelKey& key,
                             const SealPolicy& policy, Refusal* why = nullptr);
/// The timing must be for `problem` and `choice`.
Result<TimingRecord> unseal_timing(std::string_view slot, std::string_view value, std::string_view problem,
                                   std::string_view choice, const SealPolicy& policy, Refusal* why = nullptr);
/// The decision must be for `problem`.
Result<Decision> unseal_decision(std::string_view slot, std::string_view value, std::string_view problem,
                                 const SealPolicy& policy, Refusal* why = nullptr);

}  // namespace kiln::cache
