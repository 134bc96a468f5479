// Any bytes as what the tuner and a bench worker send each other (runtime/isolation/src/isolation_wire.h):
// every message decodes or is an error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "isolation_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace bw = kiln::runtime::detail::bench_wire;
  // Any error will do: a Begin whose problem this build cannot describe is that problem's error, not kCorrupt.
  kiln::fuzz::messages_of_input<bw::Hello, bw::Begin, bw::Begun, bw::Run, bw::RunResult, bw::End>(bw::kProtocol, data,
                                                                                                    size);
  return 0;
}
