#include "kiln/cache/sealed.h"

#include <fmt/format.h>

#include <cstring>

#include "format.h"

namespace kiln::cache {
namespace {

constexpr std::string_view kSealMagic = "KLNR";
constexpr size_t kHeaderBytes = 12;
constexpr size_t kKeyIdBytes = 16;
constexpr size_t kMacBytes = 64;
constexpr uint8_t kSignedFlag = 1;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(s[at + i])) << (8 * i);
  return v;
}

std::string mac_input(std::string_view slot, std::string_view signed_bytes) {
  std::string in;
  in.reserve(slot.size() + 1 + signed_bytes.size());
  in.append(slot);
  in.push_back('\0');
  in.append(signed_bytes);
  return in;
}

std::string seal(std::string_view slot, std::string record, const SigningKey* key) {
  std::string out;
  out.reserve(kHeaderBytes + kKeyIdBytes + record.size() + kMacBytes);
  out.append(kSealMagic);
  out.push_back(char(kSealedVersion));
  out.push_back(char(key ? kSignedFlag : 0));
  out.append(2, '\0');
  put_u32(out, uint32_t(record.size()));
  if (key) out.append(key->id().substr(0, kKeyIdBytes));
  out.append(record);
  if (key) out.append(key->sign(mac_input(slot, out)));
  return out;
}

Status refuse(Refusal r, Refusal* why, ErrorCode code, std::string message) {
  if (why) *why = r;
  return make_error(code, std::move(message));
}

// Checks the frame and the signature as `policy` asks; the record's bytes on success.
Result<std::string_view> open(std::string_view slot, std::string_view value, const SealPolicy& policy,
                              bool is_binary, Refusal* why) {
  if (value.size() < kHeaderBytes || value.substr(0, 4) != kSealMagic) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, "not a sealed kiln value (bad magic or too short)");
  }
  if (uint8_t(value[4]) != kSealedVersion) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt,
                  fmt::format("sealed-format version {}, this kiln reads {}", uint8_t(value[4]), kSealedVersion));
  }
  const uint8_t flags = uint8_t(value[5]);
  const bool is_signed = flags & kSignedFlag;
  if ((flags & ~kSignedFlag) != 0 || value[6] != 0 || value[7] != 0) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, "unknown flags in a sealed value");
  }
  const uint64_t n = get_u32(value, 8);
  const uint64_t want = kHeaderBytes + n + (is_signed ? kKeyIdBytes + kMacBytes : 0);
  if (value.size() != want) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt,
                  fmt::format("sealed value is {} bytes, its frame says {} (truncated or padded)", value.size(), want));
  }
  const size_t record_at = kHeaderBytes + (is_signed ? kKeyIdBytes : 0);
  std::string_view record = value.substr(record_at, n);
  if (policy.key) {
    if (!is_signed) {
      return refuse(Refusal::kUnsigned, why, ErrorCode::kFailedPrecondition,
                    "unsigned value, and this kiln requires values signed with its fleet key");
    }
    std::string_view signer = value.substr(kHeaderBytes, kKeyIdBytes);
    std::string_view mac = value.substr(record_at + n);
    if (!policy.key->verify(mac_input(slot, value.substr(0, record_at + n)), mac)) {
      std::string who = signer == policy.key->id() ? "by this key, but for another remote key or changed since"
                                                    : fmt::format("by key {}, not by this kiln's key {}", signer,
                                                                  policy.key->id());
      return refuse(Refusal::kBadSignature, why, ErrorCode::kCorrupt, "signature does not verify: signed " + who);
    }
  } else if (is_binary && !policy.allow_unsigned_binaries) {
    return refuse(Refusal::kUnsigned, why, ErrorCode::kFailedPrecondition,
                  "a binary from a remote is used only when signed with the fleet key (KILN_CACHE_KEY_FILE) or "
                  "when unsigned binaries are explicitly allowed");
  }
  return record;
}

template <class T>
Result<T> malformed(Result<T> r, Refusal* why) {
  if (!r.ok() && why) *why = Refusal::kMalformed;
  return r;
}

}  // namespace

uint16_t value_format_version() { return kFormatVersion; }

std::string_view refusal_name(Refusal r) {
  switch (r) {
    case Refusal::kNone: return "none";
    case Refusal::kMalformed: return "malformed";
    case Refusal::kUnsigned: return "unsigned";
    case Refusal::kBadSignature: return "bad signature";
  }
  return "?";
}

std::string seal_binary(std::string_view slot, const Binary& binary, const SigningKey* key) {
  return seal(slot, encode_binary(binary, now_ns()), key);
}
std::string seal_timing(std::string_view slot, const TimingRecord& timing, const SigningKey* key) {
  return seal(slot, encode_timing(timing), key);
}
std::string seal_decision(std::string_view slot, const Decision& decision, const SigningKey* key) {
  return seal(slot, encode_decision(decision), key);
}

Result<Binary> unseal_binary(std::string_view slot, std::string_view value, const KernelKey& key,
                             const SealPolicy& policy, Refusal* why) {
  if (why) *why = Refusal::kNone;
  KILN_ASSIGN_OR_RETURN(std::string_view record, open(slot, value, policy, true, why));
  auto stored = malformed(decode_binary(record), why);
  if (!stored.ok()) return stored.status();
  if (stored->binary.key != key) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt,
                  fmt::format("holds binary {}, not {}", stored->binary.key.hex(), key.hex()));
  }
  return std::move(stored->binary);
}

Result<TimingRecord> unseal_timing(std::string_view slot, std::string_view value, std::string_view problem,
                                   std::string_view choice, const SealPolicy& policy, Refusal* why) {
  if (why) *why = Refusal::kNone;
  KILN_ASSIGN_OR_RETURN(std::string_view record, open(slot, value, policy, false, why));
  auto t = malformed(decode_timing(record), why);
  if (t.ok() && (t->problem != problem || t->choice != choice)) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, "holds the timing of another problem or choice");
  }
  return t;
}

Result<Decision> unseal_decision(std::string_view slot, std::string_view value, std::string_view problem,
                                 const SealPolicy& policy, Refusal* why) {
  if (why) *why = Refusal::kNone;
  KILN_ASSIGN_OR_RETURN(std::string_view record, open(slot, value, policy, false, why));
  auto d = malformed(decode_decision(record), why);
  if (d.ok() && d->problem != problem) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, "holds the decision of another problem");
  }
  return d;
}

}  // namespace kiln::cache
