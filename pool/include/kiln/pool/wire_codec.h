// The field encoding under kiln/pool/wire.h, for other protocols framed the same way (the runtime's bench
// workers): a frame writer and a bounds-checked reader, and the encodings of KernelSource, Status and Binary,
// so that every process boundary in kiln writes these values identically. Header-only classes; the value
// encodings live in wire.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/pool/wire.h"
#include "kiln/status.h"

namespace kiln::wire {

/// Appends little-endian fields to a frame under construction; finish() writes the 12-byte header in front.
class Writer {
 public:
  /// A frame of the pool's protocol (kMagic, kVersion).
  explicit Writer(MessageType type) : Writer(kMagic, kVersion, static_cast<uint16_t>(type)) {}
  /// A frame of another protocol with the same header layout and its own magic and version.
  Writer(uint32_t magic, uint16_t version, uint16_t type) : magic_(magic), version_(version), type_(type) {
    buf_.resize(kHeaderSize);
  }

  void u8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void i32(int32_t v) { le(static_cast<uint32_t>(v), 4); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    le(bits, 8);
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s.data(), s.size());
  }
  void strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
  }

  std::string finish() && {
    const uint32_t length = static_cast<uint32_t>(buf_.size() - kHeaderSize);
    std::string header;
    put(header, magic_, 4);
    put(header, version_, 2);
    put(header, type_, 2);
    put(header, length, 4);
    std::memcpy(buf_.data(), header.data(), kHeaderSize);
    return std::move(buf_);
  }

 private:
  static void put(std::string& out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void le(uint64_t v, int bytes) { put(buf_, v, bytes); }

  uint32_t magic_;
  uint16_t version_;
  uint16_t type_;
  std::string buf_;
};

/// Reads fields back, bounds-checked: the first short read latches an error and every later read yields zero.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(le(4))); }
  double f64() {
    uint64_t bits = le(8);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (!take(n)) return {};
    std::string s(data_.substr(pos_ - n, n));
    return s;
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    std::vector<std::string> v;
    // Each string needs at least its 4-byte length: a count larger than that is corrupt, not a huge alloc.
    if (n > remaining() / 4) {
      fail();
      return v;
    }
    v.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) v.push_back(str());
    return v;
  }
  size_t remaining() const { return data_.size() - pos_; }
  bool ok() const { return ok_; }
  void fail() { ok_ = false; }

  /// The error for a payload that did not parse, or that has bytes left over.
  Status finish(std::string_view what) const;

 private:
  bool take(size_t n) {
    if (!ok_ || n > remaining()) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t le(int bytes) {
    if (!take(bytes)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ - bytes + i])) << (8 * i);
    }
    return v;
  }

  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void put_source(Writer& w, const KernelSource& s);
/// A KernelSource written by put_source; a short or malformed payload latches r's error.
KernelSource get_source(Reader& r);
/// An error Status (code, message, detail, context); not for ok.
void put_status(Writer& w, const Status& s);
/// A Status written by put_status; an unknown code latches r's error.
Status get_status(Reader& r);
void put_binary(Writer& w, const Binary& b);
Binary get_binary(Reader& r);

}  // namespace kiln::wire
