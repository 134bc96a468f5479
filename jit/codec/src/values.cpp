#include "kiln/codec/values.h"

namespace kiln::codec {

void put_key(Writer& w, const KernelKey& k) {
  w.u64(k.high);
  w.u64(k.low);
}

KernelKey get_key(Reader& r, std::string_view field) {
  KernelKey k;
  k.high = r.u64(field);
  k.low = r.u64(field);
  return k;
}

void put_error(Writer& w, const Status& s) {
  w.u32(static_cast<uint32_t>(s.code()));
  w.bytes(s.message(), "status message");
  w.bytes(s.detail(), "status detail");
  w.strings(s.context(), "status context");
}

Status get_error(Reader& r) {
  const uint32_t code = r.u32("status code");
  std::string message = r.bytes("status message");
  std::string detail = r.bytes("status detail");
  std::vector<std::string> context = r.strings("status context");
  if (!r.ok()) return Status();
  if (code == 0 || !known(static_cast<ErrorCode>(code))) {
    r.reject("status code", "is not an error code this build knows");
    return Status();
  }
  Status s(static_cast<ErrorCode>(code), std::move(message), std::move(detail));
  for (auto& c : context) s.with_context(std::move(c));
  return s;
}

void put_outcome(Writer& w, const Status& s) {
  w.boolean(s.ok());
  if (!s.ok()) put_error(w, s);
}

Status get_outcome(Reader& r) {
  if (r.boolean("outcome")) return Status();
  return get_error(r);
}

void put_binary(Writer& w, const Binary& b) {
  put_key(w, b.key);
  w.bytes(b.name, "binary name");
  w.bytes(b.entry, "binary entry");
  w.bytes(b.arch, "binary arch");
  w.i32(b.nvrtc_major);
  w.i32(b.nvrtc_minor);
  w.f64(b.compile_seconds);
  w.string_pairs(b.lowered_names, "binary lowered names");
  w.bytes(b.log, "binary log");
  w.bytes(b.ptx, "binary ptx");
  w.bytes(b.cubin, "binary cubin");
}

BinaryView get_binary_view(Reader& r) {
  BinaryView v;
  Binary& b = v.meta;
  b.key = get_key(r, "binary key");
  b.name = r.bytes("binary name");
  b.entry = r.bytes("binary entry");
  b.arch = r.bytes("binary arch");
  b.nvrtc_major = r.i32("binary nvrtc major");
  b.nvrtc_minor = r.i32("binary nvrtc minor");
  b.compile_seconds = r.f64("binary compile seconds");
  b.lowered_names = r.string_pairs("binary lowered names");
  v.log = r.bytes_view("binary log");
  v.ptx = r.bytes_view("binary ptx");
  v.cubin = r.bytes_view("binary cubin");
  return v;
}

Binary get_binary(Reader& r) {
  BinaryView v = get_binary_view(r);
  v.meta.log = v.log;
  v.meta.ptx = v.ptx;
  v.meta.cubin = v.cubin;
  return std::move(v.meta);
}

void put_binaries(Writer& w, const std::vector<Binary>& v) {
  w.count(v.size(), "binaries");
  for (const auto& b : v) put_binary(w, b);
}

std::vector<Binary> get_binaries(Reader& r) {
  std::vector<Binary> out;
  // The smallest binary is a key and eight empty lengths, four ints and a double: 60 bytes.
  const uint32_t n = r.count("binaries", 60);
  for (uint32_t i = 0; i < n && r.ok(); ++i) out.push_back(get_binary(r));
  return out;
}

}  // namespace kiln::codec
