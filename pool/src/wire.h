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
#include "kiln/codec/values.h"
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
constexpr const codec::Protocol& protocol(MessageType) { return kProtocol; }

// Each message's fields in order (kiln/codec/codec.h): the layout.
struct Hello {
  static constexpr MessageType kType = MessageType::kHello;
  int32_t pid = 0;
  int32_t nvrtc_major = 0;
  int32_t nvrtc_minor = 0;
};
KILN_CODEC_FIELDS(Hello, pid, nvrtc_major, nvrtc_minor)

struct Request {
  static constexpr MessageType kType = MessageType::kRequest;
  uint64_t job_id = 0;
  KernelSource source;
  Target target;
  bool want_ptx = false;
  bool use_pch = false;
  std::string pch_dir;
};
KILN_CODEC_FIELDS(Request, job_id, source, target, want_ptx, use_pch, pch_dir)

struct Reply {
  static constexpr MessageType kType = MessageType::kReply;
  uint64_t job_id = 0;
  Result<Binary> result = make_error(ErrorCode::kInternal, "empty reply");
};
KILN_CODEC_FIELDS(Reply, job_id, result)

// encode(m) and decode<M>(payload): kiln/codec/frame.h.
using codec::decode;
using codec::encode;

}  // namespace kiln::wire
