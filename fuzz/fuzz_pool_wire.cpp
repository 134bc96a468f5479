// Any bytes as what a compile worker and the host send each other (pool/src/wire.h): hellos, compile requests
// and their replies decode or are a kCorrupt error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "wire.h"

namespace {

using namespace kiln;

template <class M>
void check(std::string_view payload, std::string_view what) {
  fuzz::check_message<M>(
      payload, [](std::string_view p) { return wire::decode<M>(p); }, [](const M& v) { return wire::encode(v); }, what, ErrorCode::kCorrupt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::frames_of_input(wire::kProtocol, data, size, [](uint16_t type, std::string_view payload) {
    switch (static_cast<wire::MessageType>(type)) {
      case wire::MessageType::kHello: check<wire::Hello>(payload, "pool hello"); break;
      case wire::MessageType::kRequest: check<wire::Request>(payload, "pool request"); break;
      case wire::MessageType::kReply: check<wire::Reply>(payload, "pool reply"); break;
    }
  });
  return 0;
}
