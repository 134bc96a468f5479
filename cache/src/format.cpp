#include "format.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>

#include "kiln/codec/codec.h"
#include "kiln/codec/values.h"

namespace kiln::cache {
namespace {

using codec::Reader;
using codec::Writer;

std::string seal(ValueKind kind, int64_t stamp, Writer&& payload) {
  Writer w(kEnvelopeBytes + payload.size());
  w.append(kMagic);
  w.u16(kFormatVersion);
  w.u8(static_cast<uint8_t>(kind));
  w.u8(0);  // flags
  w.i64(stamp);
  w.u32(static_cast<uint32_t>(payload.size()));
  w.append(payload.buffer());
  w.u64(XXH3_64bits(w.buffer().data(), w.size()));
  return std::move(w).take();
}

Status corrupt(std::string what) { return make_error(ErrorCode::kCorrupt, std::move(what)); }

// The envelope of a value that must be of kind `want`.
Result<Envelope> open_as(std::string_view value, ValueKind want, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != want) {
    return corrupt(fmt::format("not a {} value (kind {} where kind {} was expected)", what, static_cast<int>(e.kind),
                               static_cast<int>(want)));
  }
  return e;
}

// A decision's kernel: a has-kernel flag, then a key (zero without one).
void kernel_field(Writer& w, const std::optional<KernelKey>& k) {
  w.boolean(k.has_value());
  codec::put_key(w, k.value_or(KernelKey{}));
}

void kernel_field(Reader& r, std::optional<KernelKey>& k) {
  const bool has = r.boolean("has_kernel");
  const KernelKey key = codec::get_key(r, "kernel");
  k = has ? std::optional<KernelKey>(key) : std::nullopt;
}

}  // namespace

// Each payload's fields in order (kiln/codec/codec.h): the layout. The stamps are the envelope's.
KILN_CODEC_FIELDS(Toolchain, nvrtc_major, nvrtc_minor, driver, kiln)
KILN_CODEC_FIELDS(TimingRecord, problem, choice, ok, median_us, min_us, p90_us, samples, error, reason, toolchain)
KILN_CODEC_FIELDS(MetaRecord, format_version, kiln_version)

// A decision is its members in order but for its kernel, which keeps a key's room even when it has none.
template <class IO, class M>
  requires codec::RecordOf<M, Decision>
static void describe(IO& io, M& d) {
  using codec::field;
  field(io, d.problem, "problem");
  field(io, d.choice, "choice");
  field(io, d.params, "params");
  kernel_field(io, d.kernel);
  field(io, d.median_us, "median_us");
  field(io, d.toolchain, "toolchain");
}

Result<Envelope> open_envelope(std::string_view v) {
  if (v.size() < kEnvelopeBytes) return corrupt(fmt::format("value of {} bytes is shorter than its envelope", v.size()));
  if (v.substr(0, kMagic.size()) != kMagic) return corrupt("bad magic number");
  Reader r(v.substr(kMagic.size(), kEnvelopeHeaderBytes - kMagic.size()));
  const uint16_t version = r.u16("format version");
  if (version != kFormatVersion) {
    // Older and newer layouts alike: never read as this one. The store counts it a miss and rebuilds it.
    return corrupt(fmt::format("value in cache format version {} (this kiln reads version {})", version,
                               kFormatVersion));
  }
  Envelope e;
  e.kind = static_cast<ValueKind>(r.u8("kind"));
  (void)r.u8("flags");
  e.stamp = r.i64("stamp");
  const uint32_t n = r.u32("payload length");
  KILN_RETURN_IF_ERROR(r.finish("value envelope"));
  if (static_cast<uint64_t>(n) + kEnvelopeBytes != v.size()) {
    return corrupt(fmt::format("payload length {} does not match the value's {} bytes", n, v.size()));
  }
  uint64_t stored = 0;
  std::memcpy(&stored, v.data() + kEnvelopeHeaderBytes + n, 8);
  if (XXH3_64bits(v.data(), kEnvelopeHeaderBytes + n) != stored) return corrupt("checksum mismatch");
  e.payload = v.substr(kEnvelopeHeaderBytes, n);
  return e;
}

std::string encode_binary(const Binary& b, int64_t created_at_ns) {
  Writer w(b.cubin.size() + b.ptx.size() + b.log.size() + 256);
  codec::put_binary(w, b);
  return seal(ValueKind::kBinary, created_at_ns, std::move(w));
}

namespace {

// Reads a binary's payload into `out`, or with `out` null only measures the blobs (for BinaryInfo).
Status read_binary(std::string_view value, StoredBinary* out, BinaryInfo* info) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, ValueKind::kBinary, "binary"));
  Reader r(e.payload);
  codec::BinaryView v = codec::get_binary_view(r);
  KILN_RETURN_IF_ERROR(r.finish("stored binary"));
  Binary& b = v.meta;
  if (out) {
    b.log = v.log;
    b.ptx = v.ptx;
    b.cubin = v.cubin;
    out->binary = std::move(b);
    out->created_at_ns = e.stamp;
  } else {
    info->key = b.key;
    info->name = std::move(b.name);
    info->entry = std::move(b.entry);
    info->arch = std::move(b.arch);
    info->nvrtc_major = b.nvrtc_major;
    info->nvrtc_minor = b.nvrtc_minor;
    info->compile_seconds = b.compile_seconds;
    info->cubin_bytes = v.cubin.size();
    info->value_bytes = value.size();
    info->created_at_ns = e.stamp;
  }
  return Status();
}

}  // namespace

Result<StoredBinary> decode_binary(std::string_view value) {
  StoredBinary out;
  KILN_RETURN_IF_ERROR(read_binary(value, &out, nullptr));
  return out;
}

Result<BinaryInfo> decode_binary_info(std::string_view value) {
  BinaryInfo info;
  KILN_RETURN_IF_ERROR(read_binary(value, nullptr, &info));
  return info;
}

namespace {

// A stored record: its described payload, its stamp (the record's own time) in the envelope.
template <class M>
std::string seal_record(ValueKind kind, int64_t M::*stamp, const M& m) {
  Writer w;
  codec::field(w, m, "record");
  return seal(kind, m.*stamp, std::move(w));
}

template <class M>
Result<M> open_record(std::string_view value, ValueKind want, std::string_view what, int64_t M::*stamp) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, want, what));
  KILN_ASSIGN_OR_RETURN(M m, codec::read_record<M>(e.payload, fmt::format("stored {}", what)));
  m.*stamp = e.stamp;
  return m;
}

}  // namespace

std::string encode_timing(const TimingRecord& t) {
  return seal_record(ValueKind::kTiming, &TimingRecord::measured_at_ns, t);
}
Result<TimingRecord> decode_timing(std::string_view value) {
  return open_record(value, ValueKind::kTiming, "timing", &TimingRecord::measured_at_ns);
}
std::string encode_decision(const Decision& d) { return seal_record(ValueKind::kDecision, &Decision::decided_at_ns, d); }
Result<Decision> decode_decision(std::string_view value) {
  return open_record(value, ValueKind::kDecision, "decision", &Decision::decided_at_ns);
}
std::string encode_meta(const MetaRecord& m) { return seal_record(ValueKind::kMeta, &MetaRecord::created_at_ns, m); }
Result<MetaRecord> decode_meta(std::string_view value) {
  return open_record(value, ValueKind::kMeta, "meta", &MetaRecord::created_at_ns);
}

std::string encode_used(int64_t used_at_ns) { return seal(ValueKind::kUsed, used_at_ns, Writer()); }

Result<int64_t> decode_used(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, ValueKind::kUsed, "last-use"));
  if (!e.payload.empty()) return corrupt("a last-use value with a payload");
  return e.stamp;
}

bool first_wins(std::string_view a, std::string_view b) {
  auto ea = open_envelope(a);
  auto eb = open_envelope(b);
  if (ea.ok() != eb.ok()) return ea.ok();
  if (ea.ok() && ea->stamp != eb->stamp) return ea->stamp > eb->stamp;
  return a >= b;
}

std::string binary_key(const KernelKey& key) {
  std::string k(16, '\0');
  for (int i = 0; i < 8; ++i) {
    k[i] = static_cast<char>(key.high >> (56 - 8 * i));
    k[8 + i] = static_cast<char>(key.low >> (56 - 8 * i));
  }
  return k;
}

Result<KernelKey> parse_binary_key(std::string_view k) {
  if (k.size() != 16) return corrupt(fmt::format("binary key of {} bytes (16 expected)", k.size()));
  KernelKey key;
  for (int i = 0; i < 8; ++i) {
    key.high = key.high << 8 | static_cast<uint8_t>(k[i]);
    key.low = key.low << 8 | static_cast<uint8_t>(k[8 + i]);
  }
  return key;
}

std::string timing_key(std::string_view problem, std::string_view choice) {
  std::string k;
  k.reserve(problem.size() + 1 + choice.size());
  k.append(problem);
  k.push_back('\0');
  k.append(choice);
  return k;
}

std::string used_key(const KernelKey& key) { return std::string(kUsedPrefix) + binary_key(key); }

}  // namespace kiln::cache
