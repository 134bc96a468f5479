// Any bytes through the codec's primitives (jit/codec), which every decoder is made of, and through the local
// group's messages (runtime/collective/src/local_group.cpp: a forked rank sends its NCCL id as bytes and its
// outcome as get_outcome then bytes; those decoders sit in that file's anonymous namespace, so they are fuzzed
// here as the same sequence of reads). Each read ends in a value or a kCorrupt error naming the field, never
// a crash; every encoded value survives a round trip.
//
// The first byte picks the reader; the rest is its input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "kiln/codec/values.h"

namespace {

using namespace kiln;
using codec::Reader;
using codec::Writer;

// A decode of `in` by `read` (Reader -> T), checked: finish() decides, and what decoded encodes by `write`
// (Writer, T) into bytes that decode to the same bytes again.
template <class Read, class Write>
void check(std::string_view in, Read read, Write write, std::string_view what) {
  auto decode = [&](std::string_view bytes) {
    Reader r(bytes);
    auto v = read(r);
    Status s = r.finish(what);
    if (!s.ok() && s.code() != ErrorCode::kCorrupt) fuzz::fail(std::string(what) + ": not kCorrupt: " + s.to_string());
    return s.ok() ? Result<decltype(v)>(std::move(v)) : Result<decltype(v)>(s);
  };
  auto v = decode(in);
  if (!v.ok()) return;
  auto encode = [&](const auto& x) -> Result<std::string> {
    Writer w;
    write(w, x);
    KILN_RETURN_IF_ERROR(w.status());
    return Result<std::string>(std::move(w).take());
  };
  fuzz::check_round_trip(*v, encode, [&](const std::string& b) { return decode(b); }, what);
}

struct Outcome {
  Status status;
  std::string result;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8) {
    case 0:  // a rank's outcome
      check(in,
            [](Reader& r) {
              Outcome o;
              o.status = codec::get_outcome(r);
              o.result = r.bytes("rank result");
              return o;
            },
            [](Writer& w, const Outcome& o) {
              codec::put_outcome(w, o.status);
              w.bytes(o.result, "rank result");
            },
            "rank outcome");
      break;
    case 1:  // rank 0's NCCL id
      check(in, [](Reader& r) { return r.bytes("NCCL id"); },
            [](Writer& w, const std::string& id) { w.bytes(id, "NCCL id"); }, "NCCL id");
      break;
    case 2:
      check(in, [](Reader& r) { return codec::get_source(r); }, codec::put_source, "kernel source");
      break;
    case 3:
      check(in, [](Reader& r) { return codec::get_binaries(r); }, codec::put_binaries, "binaries");
      break;
    case 4:
      // (wrapped: a Result<Status> would read the Status as its error)
      check(in, [](Reader& r) { return Outcome{codec::get_error(r), {}}; },
            [](Writer& w, const Outcome& o) { codec::put_error(w, o.status); }, "status");
      break;
    case 5:
      check(in, [](Reader& r) { return r.strings("strings"); },
            [](Writer& w, const std::vector<std::string>& v) { w.strings(v, "strings"); }, "strings");
      check(in, [](Reader& r) { return r.f64s("doubles"); },
            [](Writer& w, const std::vector<double>& v) { w.f64s(v, "doubles"); }, "doubles");
      check(in, [](Reader& r) { return r.string_pairs("pairs"); },
            [](Writer& w, const std::vector<std::pair<std::string, std::string>>& v) { w.string_pairs(v, "pairs"); },
            "pairs");
      break;
    default: {  // frames of a protocol whose header constants come from the input, as a stream
      if (in.size() < 8) return 0;
      Reader r(in.substr(0, 8));
      codec::Protocol p;
      p.magic = r.u32("magic");
      p.version = r.u16("version");
      p.max_type = r.u16("max type");
      p.name = "fuzzed";
      fuzz::each_frame(p, in.substr(8), [&](uint16_t type, std::string_view payload) {
        if (type < 1 || type > p.max_type) fuzz::fail("a frame of an unknown type came through");
        (void)payload;
      });
    }
  }
  return 0;
}
