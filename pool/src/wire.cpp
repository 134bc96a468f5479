#include "kiln/pool/wire.h"

#include <cstring>

#include <fmt/format.h>

#include "kiln/pool/wire_codec.h"

namespace kiln::wire {

Status Reader::finish(std::string_view what) const {
  if (!ok_) return make_error(ErrorCode::kCorrupt, fmt::format("truncated {} frame", what));
  if (pos_ != data_.size()) {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("{} frame has {} unexpected trailing bytes", what, data_.size() - pos_));
  }
  return Status();
}

void put_source(Writer& w, const KernelSource& s) {
  w.str(s.name);
  w.str(s.entry);
  w.str(s.source);
  w.strs(s.options);
  w.u32(static_cast<uint32_t>(s.headers.size()));
  for (const auto& h : s.headers) {
    w.str(h.name);
    w.str(h.content);
  }
  w.strs(s.include_dirs);
  w.strs(s.name_expressions);
}

KernelSource get_source(Reader& r) {
  KernelSource s;
  s.name = r.str();
  s.entry = r.str();
  s.source = r.str();
  s.options = r.strs();
  uint32_t n = r.u32();
  if (n > r.remaining() / 8) {
    r.fail();
    return s;
  }
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    Header h;
    h.name = r.str();
    h.content = r.str();
    s.headers.push_back(std::move(h));
  }
  s.include_dirs = r.strs();
  s.name_expressions = r.strs();
  return s;
}

void put_status(Writer& w, const Status& s) {
  w.u32(static_cast<uint32_t>(s.code()));
  w.str(s.message());
  w.str(s.detail());
  w.strs(s.context());
}

Status get_status(Reader& r) {
  uint32_t code = r.u32();
  std::string message = r.str();
  std::string detail = r.str();
  std::vector<std::string> context = r.strs();
  if (!r.ok()) return Status();
  if (code == 0 || code > static_cast<uint32_t>(ErrorCode::kWrongResult)) {
    r.fail();
    return Status();
  }
  Status s(static_cast<ErrorCode>(code), std::move(message), std::move(detail));
  for (auto& c : context) s.with_context(std::move(c));
  return s;
}

void put_binary(Writer& w, const Binary& b) {
  w.u64(b.key.high);
  w.u64(b.key.low);
  w.str(b.name);
  w.str(b.entry);
  w.str(b.arch);
  w.str(b.cubin);
  w.str(b.ptx);
  w.u32(static_cast<uint32_t>(b.lowered_names.size()));
  for (const auto& [expr, lowered] : b.lowered_names) {
    w.str(expr);
    w.str(lowered);
  }
  w.str(b.log);
  w.f64(b.compile_seconds);
  w.i32(b.nvrtc_major);
  w.i32(b.nvrtc_minor);
}

Binary get_binary(Reader& r) {
  Binary b;
  b.key.high = r.u64();
  b.key.low = r.u64();
  b.name = r.str();
  b.entry = r.str();
  b.arch = r.str();
  b.cubin = r.str();
  b.ptx = r.str();
  uint32_t n = r.u32();
  if (n > r.remaining() / 8) {
    r.fail();
    return b;
  }
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string expr = r.str();
    std::string lowered = r.str();
    b.lowered_names.emplace_back(std::move(expr), std::move(lowered));
  }
  b.log = r.str();
  b.compile_seconds = r.f64();
  b.nvrtc_major = r.i32();
  b.nvrtc_minor = r.i32();
  return b;
}

std::string encode(const Hello& m) {
  Writer w(MessageType::kHello);
  w.i32(m.pid);
  w.i32(m.nvrtc_major);
  w.i32(m.nvrtc_minor);
  return std::move(w).finish();
}

std::string encode(const Request& m) {
  Writer w(MessageType::kRequest);
  w.u64(m.job_id);
  put_source(w, m.source);
  w.str(m.target.arch);
  w.u8(m.want_ptx ? 1 : 0);
  w.u8(m.use_pch ? 1 : 0);
  w.str(m.pch_dir);
  return std::move(w).finish();
}

std::string encode(const Reply& m) {
  Writer w(MessageType::kReply);
  w.u64(m.job_id);
  if (m.result.ok()) {
    w.u8(1);
    put_binary(w, *m.result);
  } else {
    w.u8(0);
    put_status(w, m.result.status());
  }
  return std::move(w).finish();
}

Result<FrameHeader> decode_header(std::string_view bytes) {
  if (bytes.size() < kHeaderSize) return make_error(ErrorCode::kCorrupt, "truncated frame header");
  Reader r(bytes.substr(0, kHeaderSize));
  uint32_t magic = r.u32();
  FrameHeader h;
  h.version = r.u16();
  uint16_t type = r.u16();
  h.length = r.u32();
  if (magic != kMagic) {
    return make_error(ErrorCode::kCorrupt, fmt::format("not a kiln pool frame (magic {:#010x})", magic));
  }
  if (h.version != kVersion) {
    return make_error(ErrorCode::kCorrupt, fmt::format("pool wire format version {} (this build speaks {}): the "
                                                       "worker executable and the library differ",
                                                       h.version, kVersion));
  }
  if (type < 1 || type > 3) return make_error(ErrorCode::kCorrupt, fmt::format("unknown message type {}", type));
  if (h.length > kMaxFramePayload) {
    return make_error(ErrorCode::kCorrupt, fmt::format("frame payload of {} bytes is over the limit", h.length));
  }
  h.type = static_cast<MessageType>(type);
  return h;
}

Result<Hello> decode_hello(std::string_view payload) {
  Reader r(payload);
  Hello m;
  m.pid = r.i32();
  m.nvrtc_major = r.i32();
  m.nvrtc_minor = r.i32();
  KILN_RETURN_IF_ERROR(r.finish("hello"));
  return m;
}

Result<Request> decode_request(std::string_view payload) {
  Reader r(payload);
  Request m;
  m.job_id = r.u64();
  m.source = get_source(r);
  m.target.arch = r.str();
  m.want_ptx = r.u8() != 0;
  m.use_pch = r.u8() != 0;
  m.pch_dir = r.str();
  KILN_RETURN_IF_ERROR(r.finish("request"));
  return m;
}

Result<Reply> decode_reply(std::string_view payload) {
  Reader r(payload);
  Reply m;
  m.job_id = r.u64();
  uint8_t ok = r.u8();
  if (ok == 1) {
    Binary b = get_binary(r);
    if (r.ok()) m.result = std::move(b);
  } else if (ok == 0) {
    Status s = get_status(r);
    if (r.ok()) m.result = std::move(s);
  } else {
    r.fail();
  }
  KILN_RETURN_IF_ERROR(r.finish("reply"));
  return m;
}

}  // namespace kiln::wire
