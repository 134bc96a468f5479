// Any bytes as what a compile worker and the host send each other (pool/src/wire.h): hellos, compile requests
// and their replies decode or are a kCorrupt error, never a crash; whatever decodes survives a round trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "wire.h"

namespace {

using namespace kiln;

template <class M, class Decode>
void check(std::string_view payload, Decode decode, std::string_view what) {
  Result<M> m = decode(payload);
  if (!m.ok()) {
    if (m.status().code() != ErrorCode::kCorrupt) fuzz::fail(std::string(what) + ": not kCorrupt: " + m.status().to_string());
    return;
  }
  // The round trip goes through whole frames, as the peer's encoder writes them.
  auto encode = [](const M& v) { return wire::encode(v); };
  auto decode_frame = [&](const std::string& frame) {
    return decode(std::string_view(frame).substr(codec::kFrameHeaderBytes));
  };
  fuzz::check_round_trip(*m, encode, decode_frame, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::frames_of_input(wire::kProtocol, data, size, [](uint16_t type, std::string_view payload) {
    switch (static_cast<wire::MessageType>(type)) {
      case wire::MessageType::kHello: check<wire::Hello>(payload, wire::decode_hello, "pool hello"); break;
      case wire::MessageType::kRequest: check<wire::Request>(payload, wire::decode_request, "pool request"); break;
      case wire::MessageType::kReply: check<wire::Reply>(payload, wire::decode_reply, "pool reply"); break;
    }
  });
  return 0;
}
