// Any bytes as what the tuner and a bench worker send each other (runtime/isolation/src/isolation_wire.h):
// every message decodes or is an error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "isolation_wire.h"

namespace {

using namespace kiln;
namespace bw = kiln::runtime::detail::bench_wire;

// A Begin whose problem this build cannot describe is that problem's error, not kCorrupt: any error will do.
template <class M>
void check(std::string_view payload, std::string_view what) {
  fuzz::check_message<M>(
      payload, [](std::string_view p) { return bw::decode<M>(p); }, [](const M& v) { return bw::encode(v); }, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::frames_of_input(bw::kProtocol, data, size, [](uint16_t type, std::string_view payload) {
    switch (static_cast<bw::Type>(type)) {
      case bw::Type::kHello: check<bw::Hello>(payload, "bench hello"); break;
      case bw::Type::kBegin: check<bw::Begin>(payload, "bench begin"); break;
      case bw::Type::kBegun: check<bw::Begun>(payload, "bench begun"); break;
      case bw::Type::kRun: check<bw::Run>(payload, "bench run"); break;
      case bw::Type::kRunResult: check<bw::RunResult>(payload, "bench run result"); break;
      case bw::Type::kEnd: check<bw::End>(payload, "bench end"); break;
    }
  });
  return 0;
}
