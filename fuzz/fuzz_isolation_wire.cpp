// Any bytes as what the tuner and a bench worker send each other (runtime/isolation/src/isolation_wire.h):
// every message decodes or is an error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "isolation_wire.h"

namespace {

using namespace kiln;
namespace bw = kiln::runtime::detail::bench_wire;

template <class M, class Decode>
void check(std::string_view payload, Decode decode, std::string_view what) {
  Result<M> m = decode(payload);
  // A Begin whose problem this build cannot describe is that problem's error, not kCorrupt; any error will do.
  if (!m.ok()) return;
  auto encode = [](const M& v) { return bw::encode(v); };
  auto decode_frame = [&](const std::string& frame) {
    return decode(std::string_view(frame).substr(codec::kFrameHeaderBytes));
  };
  fuzz::check_round_trip(*m, encode, decode_frame, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::frames_of_input(bw::kProtocol, data, size, [](uint16_t type, std::string_view payload) {
    switch (static_cast<bw::Type>(type)) {
      case bw::Type::kHello: check<bw::Hello>(payload, bw::decode_hello, "bench hello"); break;
      case bw::Type::kBegin: check<bw::Begin>(payload, bw::decode_begin, "bench begin"); break;
      case bw::Type::kBegun: check<bw::Begun>(payload, bw::decode_begun, "bench begun"); break;
      case bw::Type::kRun: check<bw::Run>(payload, bw::decode_run, "bench run"); break;
      case bw::Type::kRunResult: check<bw::RunResult>(payload, bw::decode_run_result, "bench run result"); break;
      case bw::Type::kEnd: check<bw::End>(payload, bw::decode_end, "bench end"); break;
    }
  });
  return 0;
}
