// The process pool's wire format: what crosses the socket between the host and a compile worker.
//
// Every message is one frame: a 12-byte header (magic "KPW1" as a little-endian u32, u16 format version,
// u16 message type, u32 payload length) and the payload. Integers are little-endian, strings and byte
// blobs are a u32 length and the bytes, lists a u32 count and the items. A reader checks the magic, the
// version and the length (at most kMaxFramePayload) before trusting anything, and every decode is bounds
// checked: a corrupt or truncated frame is a kCorrupt error, never a crash. tests/pool golden-tests the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/jit/compiler.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"

namespace kiln::wire {

inline constexpr uint32_t kMagic = 0x3157504Bu;  // "KPW1"
/// Bump when any message's layout changes; host and worker must agree exactly.
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxFramePayload = 1u << 30;

enum class MessageType : uint16_t {
  kHello = 1,    // worker -> host, once, when it is ready for requests
  kRequest = 2,  // host -> worker
  kReply = 3,    // worker -> host
};

struct Hello {
  int32_t pid = 0;
  int32_t nvrtc_major = 0;
  int32_t nvrtc_minor = 0;
};

struct Request {
  uint64_t job_id = 0;
  KernelSource source;
  Target target;
  bool want_ptx = false;
  bool use_pch = false;
  std::string pch_dir;
};

struct Reply {
  uint64_t job_id = 0;
  Result<Binary> result = make_error(ErrorCode::kInternal, "empty reply");
};

struct FrameHeader {
  uint16_t version = 0;
  MessageType type = MessageType::kHello;
  uint32_t length = 0;
};

/// Whole frames (header + payload), ready to write.
std::string encode(const Hello& m);
std::string encode(const Request& m);
std::string encode(const Reply& m);

/// Parses the 12 header bytes. kCorrupt for a wrong magic, version or an oversized length.
Result<FrameHeader> decode_header(std::string_view bytes);
/// Parse a payload (the bytes after the header) of the given type.
Result<Hello> decode_hello(std::string_view payload);
Result<Request> decode_request(std::string_view payload);
Result<Reply> decode_reply(std::string_view payload);

}  // namespace kiln::wire
