// Frames: how kiln's records cross a socket or pipe between two processes of the same build.
//
// A frame is a 12-byte header, then the payload (a record written with codec.h):
//
//   offset  size  field
//   0       4     magic, a little-endian u32 naming the protocol ("KPW1": the pool, "KBW1": the bench worker, ...)
//   4       2     protocol version: both ends must speak exactly this one
//   6       2     message type, 1..max_type
//   8       4     payload length, at most kMaxFramePayload
//
// The header is checked before a payload byte is trusted: a frame of another protocol, of another version
// (a worker executable from another build) or of an unknown type is a kCorrupt error that says which, and a
// length over the cap is refused before anything is allocated.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/codec/codec.h"
#include "kiln/status.h"

namespace kiln::codec {

inline constexpr size_t kFrameHeaderBytes = 12;
inline constexpr uint32_t kMaxFramePayload = 1u << 30;

/// One protocol's frame header constants.
struct Protocol {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t max_type = 0;  // types are 1..max_type
  std::string_view name;  // for errors: "kiln pool", "kiln bench worker"
};

struct FrameHeader {
  uint16_t type = 0;
  uint32_t length = 0;
};

struct Frame {
  uint16_t type = 0;
  std::string payload;
};

/// Header + the writer's payload. Errors: the writer's (a field over its prefix) or a payload over the cap.
Result<std::string> seal_frame(const Protocol& p, uint16_t type, Writer&& payload);

/// A protocol's message: a described record (codec.h) that names its frame type, the type's enum naming its
/// protocol by a `protocol(E)` beside it:
///   constexpr const codec::Protocol& protocol(Type) { return kProtocol; }
///   struct Hello { static constexpr Type kType = Type::kHello; ... };
template <class M>
concept Message = requires {
  { protocol(M::kType) } -> std::convertible_to<const Protocol&>;
};

/// A message sealed in its frame (header + payload), ready to write. Errors: a field or the frame over its
/// size limit.
template <Message M>
Result<std::string> encode(const M& m) {
  Writer w;
  field(w, m, "message");
  return seal_frame(protocol(M::kType), static_cast<uint16_t>(M::kType), std::move(w));
}

/// Reader::finish for a message of `type`: kCorrupt "malformed <protocol> message <type>: <field> ...".
Status finish_message(const Reader& r, const Protocol& p, uint16_t type);

/// A message from its payload (the frame's bytes after the header). Errors: kCorrupt naming the field, or
/// what a field refused (Reader::refuse).
template <Message M>
Result<M> decode(std::string_view payload) {
  Reader r(payload);
  M m{};
  field(r, m, "message");
  KILN_RETURN_IF_ERROR(finish_message(r, protocol(M::kType), static_cast<uint16_t>(M::kType)));
  return m;
}

/// Checks the header at the front of `bytes` (at least kFrameHeaderBytes of them). Errors: kCorrupt naming the
/// wrong magic, the other version, an unknown type or an oversized length.
Result<FrameHeader> parse_header(const Protocol& p, std::string_view bytes);

/// A whole frame from the front of `buffer`, removed from it; nullopt while the frame is incomplete (read
/// more). A bad header is an error and leaves `buffer` as it is: the stream cannot be resynchronised.
Result<std::optional<Frame>> take_frame(const Protocol& p, std::string& buffer);

/// Blocking, on a socket or pipe. nullopt: the peer closed the stream at a frame boundary (a clean end).
/// Errors: kCorrupt for a bad header; kIoError for a stream that ends inside a frame or fails.
Result<std::optional<Frame>> read_frame(const Protocol& p, int fd);
/// Writes all of `bytes` (a sealed frame), retrying short writes. kIoError when the peer is gone.
Status write_all(int fd, std::string_view bytes);
/// Reads exactly `n` bytes; kIoError naming what was expected when the stream ends or fails first.
Status read_exactly(int fd, char* out, size_t n, std::string_view what);

}  // namespace kiln::codec
