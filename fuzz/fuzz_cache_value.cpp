// Any bytes as a value read back from the cache's database (cache/src/format.h): every decoder answers with a
// record or kCorrupt, never a crash; a record that decodes encodes back to bytes that decode the same; the
// merge rule (first_wins) stays a strict order.
//
// The first byte picks how the rest is read. Odd: the envelope's magic, version, payload length and checksum
// are set right here, so that mutations reach the payload decoders (a fuzzer cannot forge an XXH3 checksum).
// Even: the bytes as they are, for the envelope's own checks.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "format.h"
#include "fuzz_util.h"

namespace {

using namespace kiln;
using namespace kiln::cache;

void reseal(std::string& v) {
  if (v.size() < kEnvelopeBytes) return;
  std::memcpy(v.data(), kMagic.data(), kMagic.size());
  const uint16_t version = kFormatVersion;
  std::memcpy(v.data() + 4, &version, 2);
  const uint32_t n = static_cast<uint32_t>(v.size() - kEnvelopeBytes);
  std::memcpy(v.data() + 16, &n, 4);
  const uint64_t sum = XXH3_64bits(v.data(), v.size() - 8);
  std::memcpy(v.data() + v.size() - 8, &sum, 8);
}

template <class T, class Decode, class Encode>
void check(const std::string& v, Decode decode, Encode encode, std::string_view what) {
  Result<T> r = decode(v);
  if (!r.ok()) {
    if (r.status().code() != ErrorCode::kCorrupt) fuzz::fail(std::string(what) + ": not kCorrupt: " + r.status().to_string());
    return;
  }
  fuzz::check_round_trip(*r, [&](const T& x) { return Result<std::string>(encode(x)); },
                         [&](const std::string& bytes) { return decode(bytes); }, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string v(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) reseal(v);

  check<StoredBinary>(v, decode_binary, [](const StoredBinary& b) { return encode_binary(b.binary, b.created_at_ns); },
                      "stored binary");
  check<TimingRecord>(v, decode_timing, encode_timing, "stored timing");
  check<Decision>(v, decode_decision, encode_decision, "stored decision");
  check<MetaRecord>(v, decode_meta, encode_meta, "stored meta");
  check<int64_t>(v, decode_used, encode_used, "stored last use");

  // The metadata read agrees with the full read.
  auto full = decode_binary(v);
  auto info = decode_binary_info(v);
  if (full.ok() != info.ok()) fuzz::fail("decode_binary_info and decode_binary disagree on whether it decodes");
  if (full.ok() && (info->cubin_bytes != full->binary.cubin.size() || info->value_bytes != v.size() ||
                    info->key != full->binary.key || info->name != full->binary.name)) {
    fuzz::fail("decode_binary_info reads other fields than decode_binary");
  }

  // Merging: of two different values exactly one wins, whichever is offered first.
  std::string other = v;
  if (!other.empty()) other.back() = static_cast<char>(other.back() ^ 1);
  else other = "x";
  if (first_wins(v, other) == first_wins(other, v)) fuzz::fail("first_wins is not a strict order");

  // A database key read back as a binary's key.
  auto key = parse_binary_key(std::string_view(v).substr(0, 16));
  if (key.ok() && binary_key(*key) != v.substr(0, 16)) fuzz::fail("parse_binary_key does not round-trip");
  return 0;
}
