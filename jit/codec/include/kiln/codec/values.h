// The encodings of kiln values that more than one format carries, so that every process boundary and the
// cache write them identically: kernel keys, Status and Result, KernelSource, Target and Binary (a compile
// job and its result).
// Decoders read into the Reader's latch like its own primitives: a malformed value fails the read and the
// caller's finish() reports it.
#pragma once

#include <string_view>
#include <vector>

#include "kiln/codec/codec.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/key.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"

namespace kiln {

// kiln's plain records, described for the codec (codec.h) beside their namespace so that codec::field finds
// them: a compile job's source and target.
KILN_CODEC_FIELDS(Header, name, content)
KILN_CODEC_FIELDS(KernelSource, name, entry, source, options, headers, include_dirs, name_expressions)
KILN_CODEC_FIELDS(Target, arch)

/// The error codes this build knows: an ErrorCode field's range (codec.h).
constexpr bool known(ErrorCode c) { return c >= ErrorCode::kOk && c <= ErrorCode::kWrongResult; }

}  // namespace kiln

namespace kiln::codec {

/// u64 high, u64 low.
void put_key(Writer& w, const KernelKey& k);
KernelKey get_key(Reader& r, std::string_view field);

/// An error Status: u32 code, message, detail, context list. Not for ok (see put_outcome).
void put_error(Writer& w, const Status& s);
/// An unknown or ok code fails the read.
Status get_error(Reader& r);
/// Ok or an error: a u8 (1: ok), then the error when not ok.
void put_outcome(Writer& w, const Status& s);
Status get_outcome(Reader& r);

/// A Binary: key, name, entry, arch, NVRTC version, compile seconds, lowered names, then the three blobs
/// log, ptx, cubin. The cache's stored binary payload is exactly this (tests/cache/golden/binary.v1.bin).
void put_binary(Writer& w, const Binary& b);
/// A Binary whose blobs stay in the input: to measure a stored binary without copying its cubin.
struct BinaryView {
  Binary meta;  // every field but log, ptx and cubin
  std::string_view log, ptx, cubin;
};
BinaryView get_binary_view(Reader& r);
Binary get_binary(Reader& r);
void put_binaries(Writer& w, const std::vector<Binary>& v);
std::vector<Binary> get_binaries(Reader& r);

// The same values as fields of a record description (codec.h): io(...) for kiln's types. A Status field is an
// outcome (ok or an error).
inline void field(Writer& w, const KernelKey& v, std::string_view) { put_key(w, v); }
inline void field(Reader& r, KernelKey& v, std::string_view name) { v = get_key(r, name); }
inline void field(Writer& w, const Binary& v, std::string_view) { put_binary(w, v); }
inline void field(Reader& r, Binary& v, std::string_view) { v = get_binary(r); }
inline void field(Writer& w, const std::vector<Binary>& v, std::string_view) { put_binaries(w, v); }
inline void field(Reader& r, std::vector<Binary>& v, std::string_view) { v = get_binaries(r); }
inline void field(Writer& w, const Status& v, std::string_view) { put_outcome(w, v); }
inline void field(Reader& r, Status& v, std::string_view) { v = get_outcome(r); }

/// A value or the error in its place: a u8 (1: a value), then the value or the error.
template <class T>
void field(Writer& w, const Result<T>& v, std::string_view name) {
  w.boolean(v.ok());
  if (v.ok()) {
    field(w, *v, name);
  } else {
    put_error(w, v.status());
  }
}

template <class T>
void field(Reader& r, Result<T>& v, std::string_view name) {
  if (r.boolean(name)) {
    T value{};
    field(r, value, name);
    if (r.ok()) v = std::move(value);
  } else {
    Status s = get_error(r);
    if (r.ok()) v = std::move(s);
  }
}

}  // namespace kiln::codec
