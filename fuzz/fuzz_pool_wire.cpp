// Any bytes as what a compile worker and the host send each other (pool/src/wire.h): hellos, compile requests
// and their replies decode or are a kCorrupt error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::messages_of_input<wire::Hello, wire::Request, wire::Reply>(wire::kProtocol, data, size, ErrorCode::kCorrupt);
  return 0;
}
