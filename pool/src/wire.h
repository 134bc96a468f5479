// The process pool's protocol: what crosses the socket between the host and a compile worker. Internal to
// kiln::pool (the worker executable and tests/pool see it); nothing else speaks it.
//
// Frames of kiln::codec (kiln/codec/frame.h) with the magic "KPW1"; payloads in the codec's layout, the
// source and the Binary in the encodings every kiln format shares (kiln/codec/values.h). tests/pool
// golden-tests the bytes: a layout change bumps kProtocol's version.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/codec/frame.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"

namespace kiln::wire {

enum class MessageType : uint16_t {
  kHello = 1,    // worker -> host, once, when it is ready for requests
  kRequest = 2,  // host -> worker
  kReply = 3,    // worker -> host
};

/// Version 2: kiln::codec's encodings (the Binary's fields in the cache's order).
inline constexpr codec::Protocol kProtocol{0x3157504Bu /* "KPW1" */, 2, 3, "kiln pool"};

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

/// Whole frames (header + payload), ready to write. Errors: a field or the frame over its size limit.
Result<std::string> encode(const Hello& m);
Result<std::string> encode(const Request& m);
Result<std::string> encode(const Reply& m);

/// Parse a payload (the bytes after the header) of the given type. Errors: kCorrupt naming the field.
Result<Hello> decode_hello(std::string_view payload);
Result<Request> decode_request(std::string_view payload);
Result<Reply> decode_reply(std::string_view payload);

}  // namespace kiln::wire
