#include "wire.h"

#include "kiln/codec/values.h"

namespace kiln::wire {

using codec::Reader;
using codec::Writer;

namespace {

Result<std::string> seal(MessageType type, Writer&& w) {
  return codec::seal_frame(kProtocol, static_cast<uint16_t>(type), std::move(w));
}

}  // namespace

Result<std::string> encode(const Hello& m) {
  Writer w;
  w.i32(m.pid);
  w.i32(m.nvrtc_major);
  w.i32(m.nvrtc_minor);
  return seal(MessageType::kHello, std::move(w));
}

Result<std::string> encode(const Request& m) {
  Writer w;
  w.u64(m.job_id);
  codec::put_source(w, m.source);
  w.bytes(m.target.arch, "target arch");
  w.boolean(m.want_ptx);
  w.boolean(m.use_pch);
  w.bytes(m.pch_dir, "pch dir");
  return seal(MessageType::kRequest, std::move(w));
}

Result<std::string> encode(const Reply& m) {
  Writer w(m.result.ok() ? m.result->cubin.size() + m.result->ptx.size() + 256 : 256);
  w.u64(m.job_id);
  w.boolean(m.result.ok());
  if (m.result.ok()) {
    codec::put_binary(w, *m.result);
  } else {
    codec::put_error(w, m.result.status());
  }
  return seal(MessageType::kReply, std::move(w));
}

Result<Hello> decode_hello(std::string_view payload) {
  Reader r(payload);
  Hello m;
  m.pid = r.i32("pid");
  m.nvrtc_major = r.i32("nvrtc major");
  m.nvrtc_minor = r.i32("nvrtc minor");
  KILN_RETURN_IF_ERROR(r.finish("pool hello"));
  return m;
}

Result<Request> decode_request(std::string_view payload) {
  Reader r(payload);
  Request m;
  m.job_id = r.u64("job id");
  m.source = codec::get_source(r);
  m.target.arch = r.bytes("target arch");
  m.want_ptx = r.boolean("want ptx");
  m.use_pch = r.boolean("use pch");
  m.pch_dir = r.bytes("pch dir");
  KILN_RETURN_IF_ERROR(r.finish("pool request"));
  return m;
}

Result<Reply> decode_reply(std::string_view payload) {
  Reader r(payload);
  Reply m;
  m.job_id = r.u64("job id");
  if (r.boolean("result ok")) {
    Binary b = codec::get_binary(r);
    if (r.ok()) m.result = std::move(b);
  } else {
    Status s = codec::get_error(r);
    if (r.ok()) m.result = std::move(s);
  }
  KILN_RETURN_IF_ERROR(r.finish("pool reply"));
  return m;
}

}  // namespace kiln::wire
