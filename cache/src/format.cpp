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

void write_toolchain(Writer& w, const Toolchain& t) {
  w.i32(t.nvrtc_major);
  w.i32(t.nvrtc_minor);
  w.i32(t.driver);
  w.bytes(t.kiln, "toolchain kiln version");
}

Toolchain read_toolchain(Reader& r) {
  Toolchain t;
  t.nvrtc_major = r.i32("toolchain nvrtc major");
  t.nvrtc_minor = r.i32("toolchain nvrtc minor");
  t.driver = r.i32("toolchain driver");
  t.kiln = r.bytes("toolchain kiln version");
  return t;
}

// The envelope of a value that must be of kind `want`.
Result<Envelope> open_as(std::string_view value, ValueKind want, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != want) {
    return corrupt(fmt::format("not a {} value (kind {} where kind {} was expected)", what, static_cast<int>(e.kind),
                               static_cast<int>(want)));
  }
  return e;
}

}  // namespace

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

std::string encode_timing(const TimingRecord& t) {
  Writer w;
  w.bytes(t.problem, "timing problem");
  w.bytes(t.choice, "timing choice");
  w.boolean(t.ok);
  w.f64(t.median_us);
  w.f64(t.min_us);
  w.f64(t.p90_us);
  w.u32(t.samples);
  w.i32(static_cast<int32_t>(t.error));
  w.bytes(t.reason, "timing reason");
  write_toolchain(w, t.toolchain);
  return seal(ValueKind::kTiming, t.measured_at_ns, std::move(w));
}

Result<TimingRecord> decode_timing(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, ValueKind::kTiming, "timing"));
  Reader r(e.payload);
  TimingRecord t;
  t.problem = r.bytes("timing problem");
  t.choice = r.bytes("timing choice");
  t.ok = r.boolean("timing ok");
  t.median_us = r.f64("timing median");
  t.min_us = r.f64("timing min");
  t.p90_us = r.f64("timing p90");
  t.samples = r.u32("timing samples");
  const int32_t code = r.i32("timing error code");
  if (code < 0 || code > static_cast<int32_t>(ErrorCode::kWrongResult)) r.reject("timing error code", "is out of range");
  t.reason = r.bytes("timing reason");
  t.toolchain = read_toolchain(r);
  KILN_RETURN_IF_ERROR(r.finish("stored timing"));
  t.error = static_cast<ErrorCode>(code);
  t.measured_at_ns = e.stamp;
  return t;
}

std::string encode_decision(const Decision& d) {
  Writer w;
  w.bytes(d.problem, "decision problem");
  w.bytes(d.choice, "decision choice");
  w.string_pairs(d.params, "decision params");
  w.boolean(d.kernel.has_value());
  codec::put_key(w, d.kernel.value_or(KernelKey{}));
  w.f64(d.median_us);
  write_toolchain(w, d.toolchain);
  return seal(ValueKind::kDecision, d.decided_at_ns, std::move(w));
}

Result<Decision> decode_decision(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, ValueKind::kDecision, "decision"));
  Reader r(e.payload);
  Decision d;
  d.problem = r.bytes("decision problem");
  d.choice = r.bytes("decision choice");
  d.params = r.string_pairs("decision params");
  const bool has_kernel = r.boolean("decision has kernel");
  const KernelKey key = codec::get_key(r, "decision kernel");
  d.median_us = r.f64("decision median");
  d.toolchain = read_toolchain(r);
  KILN_RETURN_IF_ERROR(r.finish("stored decision"));
  if (has_kernel) d.kernel = key;
  d.decided_at_ns = e.stamp;
  return d;
}

std::string encode_meta(const MetaRecord& m) {
  Writer w;
  w.u32(m.format_version);
  w.bytes(m.kiln_version, "meta kiln version");
  return seal(ValueKind::kMeta, m.created_at_ns, std::move(w));
}

Result<MetaRecord> decode_meta(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_as(value, ValueKind::kMeta, "meta"));
  Reader r(e.payload);
  MetaRecord m;
  m.format_version = r.u32("meta format version");
  m.kiln_version = r.bytes("meta kiln version");
  KILN_RETURN_IF_ERROR(r.finish("stored meta record"));
  m.created_at_ns = e.stamp;
  return m;
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
