// kiln's serialization primitives: a Writer that appends fixed-width little-endian fields and length-prefixed
// bytes, and a Reader that takes them back with every read bounds-checked.
//
// Why kiln's own and not FlatBuffers, Cap'n Proto, protobuf or msgpack: kiln has a dozen record types, all
// written and read by the same build except the cache's values, and needs no schema evolution beyond an
// explicit version per format (a mismatch is refused, never guessed at). The cache's on-disk bytes must stay
// exactly as kiln has always written them (tests/cache/golden), which no generated encoding reproduces. A
// hand-sized reader keeps every bound check in one place, where the fuzzers and the corrupt-input tests hit
// it, and the build gains no code generator or schema compiler. The cost is that a new field means an edit
// in both the encoder and the decoder and a version bump: the golden tests catch a forgotten one.
//
// Layout rules: integers and floats little-endian, fixed width; bytes and strings a u32 length then the
// bytes; lists a u32 count then the items. A Reader latches its first failure (a field that runs past the
// end, a length or count over its cap) and yields zeros after it, so a decoder reads every field and checks
// once: finish() names the record and the field that failed.
//
// One description serves both directions: a record's fields are named once, in order,
//
//   struct Hello { int32_t pid = 0; std::string device_name; };
//   KILN_CODEC_FIELDS(Hello, pid, device_name)
//
// which defines describe(io, m) beside the record: codec::field(io, m.pid, "pid"), ... With a Writer (and a
// const record) that encodes it, with a Reader it decodes it, so the two can never disagree, and a new field
// is one name in one list. codec::field() knows the primitives, lists of what it knows, described records
// (so records nest) and kiln's values (values.h); a record's own types add field() overloads in their
// namespace. A record whose layout is more than its members in order writes describe by hand:
// `template <class IO, class M> requires codec::RecordOf<M, Record> void describe(IO& io, M& m)`.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln::codec {

static_assert(std::endian::native == std::endian::little, "the codec writes little-endian; add byte swaps here");

/// The largest length or count a u32 prefix can carry.
inline constexpr uint64_t kMaxLength = UINT32_MAX;

class Writer {
 public:
  Writer() = default;
  /// Appends to `reserve` bytes' worth of capacity up front (large payloads: one allocation).
  explicit Writer(size_t reserve) { out_.reserve(reserve); }

  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i32(int32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void f64(double v) { raw(&v, 8); }
  /// A u32 length, then the bytes.
  void bytes(std::string_view s, std::string_view field) {
    length(s.size(), field);
    out_.append(s);
  }
  /// A list's u32 count.
  void count(size_t n, std::string_view field) { length(n, field); }
  void strings(const std::vector<std::string>& v, std::string_view field) {
    count(v.size(), field);
    for (const auto& s : v) bytes(s, field);
  }
  void f64s(const std::vector<double>& v, std::string_view field) {
    count(v.size(), field);
    for (double x : v) f64(x);
  }
  template <class Pairs>
  void string_pairs(const Pairs& v, std::string_view field) {
    count(v.size(), field);
    for (const auto& [a, b] : v) {
      bytes(a, field);
      bytes(b, field);
    }
  }
  // The field-description interface (see the top of this file): io(value, "name").
  void operator()(uint8_t v, std::string_view) { u8(v); }
  void operator()(bool v, std::string_view) { boolean(v); }
  void operator()(uint16_t v, std::string_view) { u16(v); }
  void operator()(uint32_t v, std::string_view) { u32(v); }
  void operator()(uint64_t v, std::string_view) { u64(v); }
  void operator()(int32_t v, std::string_view) { i32(v); }
  void operator()(int64_t v, std::string_view) { i64(v); }
  void operator()(float v, std::string_view) { f32(v); }
  void operator()(double v, std::string_view) { f64(v); }
  template <class E>
    requires std::is_enum_v<E>
  void operator()(E v, std::string_view field) {
    (*this)(static_cast<std::underlying_type_t<E>>(v), field);
  }
  void operator()(const std::string& v, std::string_view field) { bytes(v, field); }
  void operator()(const std::vector<std::string>& v, std::string_view field) { strings(v, field); }
  void operator()(const std::vector<double>& v, std::string_view field) { f64s(v, field); }
  void operator()(const std::vector<std::pair<std::string, std::string>>& v, std::string_view field) {
    string_pairs(v, field);
  }
  void operator()(const std::map<std::string, std::string>& v, std::string_view field) { string_pairs(v, field); }
  /// A decoder's range check; nothing to check when encoding.
  void expect(bool, std::string_view, std::string_view) {}

  /// Bytes as they are, no length (an envelope's fixed magic).
  void append(std::string_view s) { out_.append(s); }

  size_t size() const { return out_.size(); }
  std::string& buffer() { return out_; }
  /// Ok, or kInvalidArgument naming the first field too long for its u32 prefix.
  Status status() const;
  std::string take() && { return std::move(out_); }

 private:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void length(size_t n, std::string_view field) {
    if (n > kMaxLength && oversized_.empty()) oversized_ = field;
    u32(static_cast<uint32_t>(n));
  }

  std::string out_;
  std::string_view oversized_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  uint8_t u8(std::string_view field) { return fixed<uint8_t>(field); }
  /// A byte that must be 0 or 1; anything else fails the read.
  bool boolean(std::string_view field);
  uint16_t u16(std::string_view field) { return fixed<uint16_t>(field); }
  uint32_t u32(std::string_view field) { return fixed<uint32_t>(field); }
  uint64_t u64(std::string_view field) { return fixed<uint64_t>(field); }
  int32_t i32(std::string_view field) { return fixed<int32_t>(field); }
  int64_t i64(std::string_view field) { return fixed<int64_t>(field); }
  float f32(std::string_view field) { return fixed<float>(field); }
  double f64(std::string_view field) { return fixed<double>(field); }

  /// Length-prefixed bytes, viewed in place (valid as long as the input is).
  std::string_view bytes_view(std::string_view field);
  std::string bytes(std::string_view field) { return std::string(bytes_view(field)); }
  /// A list's count, refused when it cannot fit in what is left (every item takes at least `min_item` bytes)
  /// or exceeds `max_items`: a corrupt count is an error, never a huge allocation.
  uint32_t count(std::string_view field, size_t min_item, uint64_t max_items = kMaxLength);
  std::vector<std::string> strings(std::string_view field);
  std::vector<double> f64s(std::string_view field);
  std::vector<std::pair<std::string, std::string>> string_pairs(std::string_view field);

  // The field-description interface (see the top of this file): io(value, "name"). An enum is read as its
  // underlying integer and must be one `known(E)` (found beside the enum) accepts: a decoder never yields a
  // value its enum does not name.
  void operator()(uint8_t& v, std::string_view field) { v = u8(field); }
  void operator()(bool& v, std::string_view field) { v = boolean(field); }
  void operator()(uint16_t& v, std::string_view field) { v = u16(field); }
  void operator()(uint32_t& v, std::string_view field) { v = u32(field); }
  void operator()(uint64_t& v, std::string_view field) { v = u64(field); }
  void operator()(int32_t& v, std::string_view field) { v = i32(field); }
  void operator()(int64_t& v, std::string_view field) { v = i64(field); }
  void operator()(float& v, std::string_view field) { v = f32(field); }
  void operator()(double& v, std::string_view field) { v = f64(field); }
  template <class E>
    requires std::is_enum_v<E>
  void operator()(E& v, std::string_view field) {
    static_assert(requires { known(v); }, "an enum field needs a known(E) overload beside its enum");
    std::underlying_type_t<E> raw{};
    (*this)(raw, field);
    v = static_cast<E>(raw);
    expect(known(v), field, "is out of range");
  }
  void operator()(std::string& v, std::string_view field) { v = bytes(field); }
  void operator()(std::vector<std::string>& v, std::string_view field) { v = strings(field); }
  void operator()(std::vector<double>& v, std::string_view field) { v = f64s(field); }
  void operator()(std::vector<std::pair<std::string, std::string>>& v, std::string_view field) {
    v = string_pairs(field);
  }
  void operator()(std::map<std::string, std::string>& v, std::string_view field) {
    v.clear();
    for (auto& [a, b] : string_pairs(field)) v[std::move(a)] = std::move(b);
  }

  /// A range check in a record description: a false `valid` fails the read at `field`.
  void expect(bool valid, std::string_view field, std::string_view why) {
    if (!valid) reject(field, why);
  }

  /// Fails the read at `field` for a value out of its range (an unknown enum, a bad flag).
  void reject(std::string_view field, std::string_view why);
  /// A well-formed field this build cannot use (a description it cannot parse): the read goes on, and
  /// finish() returns `why` (the first one) where the bytes themselves were fine.
  void refuse(Status why) {
    if (unusable_.ok()) unusable_ = std::move(why);
  }
  bool ok() const { return error_.empty(); }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

  /// Ok when every field read and nothing is left over; else kCorrupt: "<what>: <field> ...", or what
  /// refuse() was given.
  Status finish(std::string_view what) const;

 private:
  template <class T>
  T fixed(std::string_view field) {
    T v{};
    if (take(sizeof(T), field)) std::memcpy(&v, in_.data() + pos_ - sizeof(T), sizeof(T));
    return v;
  }
  bool take(size_t n, std::string_view field);

  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
  Status unusable_;
};

/// M is Record, const or not: a hand-written describe's constraint.
template <class M, class Record>
concept RecordOf = std::same_as<std::remove_const_t<M>, Record>;

/// A field of any type `io` knows; values.h and records add overloads for their own types.
template <class IO, class T>
  requires std::is_invocable_v<IO&, T&, std::string_view>
void field(IO& io, T& v, std::string_view name) {
  io(v, name);
}

/// A described record (KILN_CODEC_FIELDS), as a field of another or on its own.
template <class IO, class T>
  requires requires(IO& io, T& v) { describe(io, v); }
void field(IO& io, T& v, std::string_view) {
  describe(io, v);
}

/// A list of anything else field() knows: a u32 count, then the items. The count is checked against the
/// bytes left as it is read, so a corrupt one fails the read before it allocates more than the input holds.
template <class T>
  requires(!std::is_invocable_v<Writer&, const std::vector<T>&, std::string_view>)
void field(Writer& w, const std::vector<T>& v, std::string_view name) {
  w.count(v.size(), name);
  for (const T& item : v) field(w, item, name);
}

template <class T>
  requires(!std::is_invocable_v<Reader&, std::vector<T>&, std::string_view>)
void field(Reader& r, std::vector<T>& v, std::string_view name) {
  v.clear();
  const uint32_t n = r.count(name, 1);
  for (uint32_t i = 0; i < n && r.ok(); ++i) field(r, v.emplace_back(), name);
}

/// A value that may be absent: a u8 (1: present), then the value when present.
template <class T>
void field(Writer& w, const std::optional<T>& v, std::string_view name) {
  w.boolean(v.has_value());
  if (v) field(w, *v, name);
}

template <class T>
void field(Reader& r, std::optional<T>& v, std::string_view name) {
  v.reset();
  if (r.boolean(name)) field(r, v.emplace(), name);
}

/// Decodes a described record; kCorrupt naming `what` and the failing field.
template <class M>
Result<M> read_record(std::string_view payload, std::string_view what) {
  Reader r(payload);
  M m{};
  field(r, m, what);
  KILN_RETURN_IF_ERROR(r.finish(what));
  return m;
}

}  // namespace kiln::codec

// KILN_CODEC_FIELDS(Record, member, ...): see the top of this file. Expands, in Record's namespace, to a
// describe() that codec::field finds by argument-dependent lookup; each member's name is its field's name in
// errors.
#define KILN_CODEC_FIELDS(Record, ...)                   \
  template <class IO, class M>                           \
    requires ::kiln::codec::RecordOf<M, Record>          \
  static void describe(IO& io, M& m) {                   \
    using ::kiln::codec::field;                          \
    KILN_CODEC_FOR_EACH_(KILN_CODEC_FIELD_, __VA_ARGS__) \
  }
#define KILN_CODEC_FIELD_(member) field(io, m.member, #member);

// One macro applied to each argument (C++20 __VA_OPT__; up to 64 arguments).
#define KILN_CODEC_PARENS_ ()
#define KILN_CODEC_EXPAND_(...) KILN_CODEC_EXPAND3_(KILN_CODEC_EXPAND3_(KILN_CODEC_EXPAND3_(KILN_CODEC_EXPAND3_(__VA_ARGS__))))
#define KILN_CODEC_EXPAND3_(...) KILN_CODEC_EXPAND2_(KILN_CODEC_EXPAND2_(KILN_CODEC_EXPAND2_(KILN_CODEC_EXPAND2_(__VA_ARGS__))))
#define KILN_CODEC_EXPAND2_(...) KILN_CODEC_EXPAND1_(KILN_CODEC_EXPAND1_(KILN_CODEC_EXPAND1_(KILN_CODEC_EXPAND1_(__VA_ARGS__))))
#define KILN_CODEC_EXPAND1_(...) __VA_ARGS__
#define KILN_CODEC_FOR_EACH_(macro, ...) __VA_OPT__(KILN_CODEC_EXPAND_(KILN_CODEC_FOR_EACH_STEP_(macro, __VA_ARGS__)))
#define KILN_CODEC_FOR_EACH_STEP_(macro, first, ...) \
  macro(first) __VA_OPT__(KILN_CODEC_FOR_EACH_AGAIN_ KILN_CODEC_PARENS_(macro, __VA_ARGS__))
#define KILN_CODEC_FOR_EACH_AGAIN_() KILN_CODEC_FOR_EACH_STEP_
