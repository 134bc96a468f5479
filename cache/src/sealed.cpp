#include "kiln/cache/sealed.h"

#include <fmt/format.h>

#include "format.h"
#include "kiln/codec/codec.h"

namespace kiln::cache {
namespace {

using codec::Reader;
using codec::Writer;

constexpr std::string_view kSealMagic = "KLNR";
constexpr uint8_t kSignedFlag = 1;
constexpr size_t kMaxKeyIdBytes = 64;

// What the MAC covers: the slot (length-prefixed, so no slot/value split is ambiguous), then every byte of
// the value before the signature. Binding the slot is what refuses a valid value copied under another key.
std::string mac_input(std::string_view slot, std::string_view signed_bytes) {
  Writer w(4 + slot.size() + signed_bytes.size());
  w.bytes(slot, "slot");
  w.append(signed_bytes);
  return std::move(w).take();
}

std::string seal(std::string_view slot, std::string record, const SigningKey* key) {
  Writer w(record.size() + 128);  // the frame, the key id and the signature fit in the rest
  w.append(kSealMagic);
  w.u8(kSealedVersion);
  w.u8(key ? kSignedFlag : 0);
  w.u16(0);
  if (key) w.bytes(key->id(), "key id");
  w.bytes(record, "record");
  if (key) w.bytes(key->sign(mac_input(slot, w.buffer())), "signature");
  return std::move(w).take();
}

Status refuse(Refusal r, Refusal* why, ErrorCode code, std::string message) {
  if (why) *why = r;
  return make_error(code, std::move(message));
}

// Checks the frame and the signature as `policy` asks; the record's bytes on success.
Result<std::string_view> open(std::string_view slot, std::string_view value, const SealPolicy& policy,
                              bool is_binary, Refusal* why) {
  if (value.substr(0, kSealMagic.size()) != kSealMagic) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, "not a sealed kiln value (bad magic or too short)");
  }
  Reader r(value.substr(kSealMagic.size()));
  const uint8_t version = r.u8("version");
  if (r.ok() && version != kSealedVersion) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt,
                  fmt::format("sealed-format version {}, this kiln reads {}", version, kSealedVersion));
  }
  const uint8_t flags = r.u8("flags");
  const bool is_signed = flags & kSignedFlag;
  r.expect((flags & ~kSignedFlag) == 0 && r.u16("reserved") == 0, "flags", "has unknown bits");
  const std::string_view signer = is_signed ? r.bytes_view("key id") : std::string_view();
  r.expect(signer.size() <= kMaxKeyIdBytes, "key id", "is too long");  // it is quoted in errors
  const std::string_view record = r.bytes_view("record");
  const size_t signed_end = kSealMagic.size() + r.position();
  const std::string_view mac = is_signed ? r.bytes_view("signature") : std::string_view();
  if (Status frame = r.finish("sealed value"); !frame.ok()) {
    return refuse(Refusal::kMalformed, why, ErrorCode::kCorrupt, frame.message());
  }
  if (policy.key) {
    if (!is_signed) {
      return refuse(Refusal::kUnsigned, why, ErrorCode::kFailedPrecondition,
                    "unsigned value, and this kiln requires values signed with its fleet key");
    }
    if (!policy.key->verify(mac_input(slot, value.substr(0, signed_end)), mac)) {
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
