#include "format.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kiln::cache {
namespace {

static_assert(std::endian::native == std::endian::little, "the format is little-endian; add byte swaps here");

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i32(int32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads fields in order; any overrun sets failed() and yields zeros, so decoders check once at the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint8_t u8() { uint8_t v = 0; raw(&v, 1); return v; }
  uint16_t u16() { uint16_t v = 0; raw(&v, 2); return v; }
  uint32_t u32() { uint32_t v = 0; raw(&v, 4); return v; }
  uint64_t u64() { uint64_t v = 0; raw(&v, 8); return v; }
  int32_t i32() { int32_t v = 0; raw(&v, 4); return v; }
  int64_t i64() { int64_t v = 0; raw(&v, 8); return v; }
  double f64() { double v = 0; raw(&v, 8); return v; }
  std::string_view str_view() {
    uint32_t n = u32();
    if (failed_ || n > in_.size() - pos_) {
      failed_ = true;
      return {};
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string str() { return std::string(str_view()); }
  /// A list count, refused when it could not possibly fit in what is left (each item takes >= min_item bytes).
  uint32_t count(size_t min_item) {
    uint32_t n = u32();
    if (failed_ || static_cast<uint64_t>(n) * min_item > in_.size() - pos_) {
      failed_ = true;
      return 0;
    }
    return n;
  }
  bool failed() const { return failed_; }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  void raw(void* p, size_t n) {
    if (failed_ || n > in_.size() - pos_) {
      failed_ = true;
      return;
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool failed_ = false;
};

std::string seal(ValueKind kind, int64_t stamp, std::string_view payload) {
  Writer w;
  w.out().reserve(kEnvelopeBytes + payload.size());
  w.out().append(kMagic);
  w.u16(kFormatVersion);
  w.u8(static_cast<uint8_t>(kind));
  w.u8(0);
  w.i64(stamp);
  w.u32(static_cast<uint32_t>(payload.size()));
  w.out().append(payload);
  w.u64(XXH3_64bits(w.out().data(), w.out().size()));
  return std::move(w.out());
}

Status corrupt(std::string what) { return make_error(ErrorCode::kCorrupt, std::move(what)); }

void write_toolchain(Writer& w, const Toolchain& t) {
  w.i32(t.nvrtc_major);
  w.i32(t.nvrtc_minor);
  w.i32(t.driver);
  w.str(t.kiln);
}

Toolchain read_toolchain(Reader& r) {
  Toolchain t;
  t.nvrtc_major = r.i32();
  t.nvrtc_minor = r.i32();
  t.driver = r.i32();
  t.kiln = r.str();
  return t;
}

Result<Reader> payload_of(std::string_view value, ValueKind want) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != want) {
    return corrupt(fmt::format("value of kind {} where kind {} was expected", static_cast<int>(e.kind),
                               static_cast<int>(want)));
  }
  return Reader(e.payload);
}

Status finish(const Reader& r, std::string_view what) {
  if (r.failed()) return corrupt(fmt::format("{} payload is truncated or has an impossible length", what));
  if (!r.at_end()) return corrupt(fmt::format("{} payload has trailing bytes", what));
  return Status();
}

}  // namespace

Result<Envelope> open_envelope(std::string_view v) {
  if (v.size() < kEnvelopeBytes) return corrupt(fmt::format("value of {} bytes is shorter than its envelope", v.size()));
  if (v.substr(0, 4) != kMagic) return corrupt("bad magic number");
  Reader r(v.substr(4));
  uint16_t version = r.u16();
  if (version != kFormatVersion) {
    return corrupt(fmt::format("format version {} (this kiln reads version {})", version, kFormatVersion));
  }
  Envelope e;
  e.kind = static_cast<ValueKind>(r.u8());
  (void)r.u8();  // flags
  e.stamp = r.i64();
  uint32_t n = r.u32();
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
  Writer w;
  w.out().reserve(b.cubin.size() + b.ptx.size() + b.log.size() + 256);
  w.u64(b.key.high);
  w.u64(b.key.low);
  w.str(b.name);
  w.str(b.entry);
  w.str(b.arch);
  w.i32(b.nvrtc_major);
  w.i32(b.nvrtc_minor);
  w.f64(b.compile_seconds);
  w.u32(static_cast<uint32_t>(b.lowered_names.size()));
  for (const auto& [expr, lowered] : b.lowered_names) {
    w.str(expr);
    w.str(lowered);
  }
  w.str(b.log);
  w.str(b.ptx);
  w.str(b.cubin);
  return seal(ValueKind::kBinary, created_at_ns, w.out());
}

namespace {

// Reads a binary's payload; with `cubin` null only measures the cubin (for BinaryInfo).
Status read_binary(std::string_view value, StoredBinary* out, BinaryInfo* info) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != ValueKind::kBinary) return corrupt("not a binary value");
  Reader r(e.payload);
  Binary b;
  b.key.high = r.u64();
  b.key.low = r.u64();
  b.name = r.str();
  b.entry = r.str();
  b.arch = r.str();
  b.nvrtc_major = r.i32();
  b.nvrtc_minor = r.i32();
  b.compile_seconds = r.f64();
  uint32_t n = r.count(8);
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    std::string expr = r.str();
    b.lowered_names.emplace_back(std::move(expr), r.str());
  }
  std::string_view log = r.str_view(), ptx = r.str_view(), cubin = r.str_view();
  KILN_RETURN_IF_ERROR(finish(r, "binary"));
  if (out) {
    b.log = log;
    b.ptx = ptx;
    b.cubin = cubin;
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
    info->cubin_bytes = cubin.size();
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
  w.str(t.problem);
  w.str(t.choice);
  w.u8(t.ok ? 1 : 0);
  w.f64(t.median_us);
  w.f64(t.min_us);
  w.f64(t.p90_us);
  w.u32(t.samples);
  w.i32(static_cast<int32_t>(t.error));
  w.str(t.reason);
  write_toolchain(w, t.toolchain);
  return seal(ValueKind::kTiming, t.measured_at_ns, w.out());
}

Result<TimingRecord> decode_timing(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != ValueKind::kTiming) return corrupt("not a timing value");
  Reader r(e.payload);
  TimingRecord t;
  t.problem = r.str();
  t.choice = r.str();
  uint8_t ok = r.u8();
  t.median_us = r.f64();
  t.min_us = r.f64();
  t.p90_us = r.f64();
  t.samples = r.u32();
  int32_t code = r.i32();
  t.reason = r.str();
  t.toolchain = read_toolchain(r);
  KILN_RETURN_IF_ERROR(finish(r, "timing"));
  if (ok > 1 || code < 0 || code > static_cast<int32_t>(ErrorCode::kWrongResult)) {
    return corrupt("timing has an out-of-range field");
  }
  t.ok = ok == 1;
  t.error = static_cast<ErrorCode>(code);
  t.measured_at_ns = e.stamp;
  return t;
}

std::string encode_decision(const Decision& d) {
  Writer w;
  w.str(d.problem);
  w.str(d.choice);
  w.u32(static_cast<uint32_t>(d.params.size()));
  for (const auto& [k, v] : d.params) {
    w.str(k);
    w.str(v);
  }
  w.u8(d.kernel ? 1 : 0);
  w.u64(d.kernel ? d.kernel->high : 0);
  w.u64(d.kernel ? d.kernel->low : 0);
  w.f64(d.median_us);
  write_toolchain(w, d.toolchain);
  return seal(ValueKind::kDecision, d.decided_at_ns, w.out());
}

Result<Decision> decode_decision(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != ValueKind::kDecision) return corrupt("not a decision value");
  Reader r(e.payload);
  Decision d;
  d.problem = r.str();
  d.choice = r.str();
  uint32_t n = r.count(8);
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    std::string k = r.str();
    d.params.emplace_back(std::move(k), r.str());
  }
  uint8_t has_kernel = r.u8();
  KernelKey key;
  key.high = r.u64();
  key.low = r.u64();
  d.median_us = r.f64();
  d.toolchain = read_toolchain(r);
  KILN_RETURN_IF_ERROR(finish(r, "decision"));
  if (has_kernel > 1) return corrupt("decision has an out-of-range field");
  if (has_kernel) d.kernel = key;
  d.decided_at_ns = e.stamp;
  return d;
}

std::string encode_meta(const MetaRecord& m) {
  Writer w;
  w.u32(m.format_version);
  w.str(m.kiln_version);
  return seal(ValueKind::kMeta, m.created_at_ns, w.out());
}

Result<MetaRecord> decode_meta(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Reader r, payload_of(value, ValueKind::kMeta));
  MetaRecord m;
  m.format_version = r.u32();
  m.kiln_version = r.str();
  KILN_RETURN_IF_ERROR(finish(r, "meta"));
  m.created_at_ns = open_envelope(value)->stamp;
  return m;
}

std::string encode_used(int64_t used_at_ns) { return seal(ValueKind::kUsed, used_at_ns, {}); }

Result<int64_t> decode_used(std::string_view value) {
  KILN_ASSIGN_OR_RETURN(Envelope e, open_envelope(value));
  if (e.kind != ValueKind::kUsed || !e.payload.empty()) return corrupt("not a last-use value");
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
