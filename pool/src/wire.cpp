#include "wire.h"

#include "kiln/codec/values.h"

namespace kiln::wire {

using codec::Reader;
using codec::Writer;

namespace {

// Each message's fields, in order, for both directions (kiln/codec/codec.h).
template <class IO, class M>
void hello_fields(IO& io, M& m) {
  io(m.pid, "pid");
  io(m.nvrtc_major, "nvrtc major");
  io(m.nvrtc_minor, "nvrtc minor");
}

template <class IO, class M>
void request_fields(IO& io, M& m) {
  io(m.job_id, "job id");
  codec::field(io, m.source, "source");
  io(m.target.arch, "target arch");
  io(m.want_ptx, "want ptx");
  io(m.use_pch, "use pch");
  io(m.pch_dir, "pch dir");
}

template <class M, class Fields>
Result<std::string> seal(MessageType type, const M& m, Fields fields, size_t reserve = 0) {
  return codec::seal_record(kProtocol, static_cast<uint16_t>(type), m, fields, reserve);
}

}  // namespace

Result<std::string> encode(const Hello& m) { return seal(MessageType::kHello, m, hello_fields<Writer, const Hello>); }

Result<std::string> encode(const Request& m) {
  return seal(MessageType::kRequest, m, request_fields<Writer, const Request>, m.source.source.size() + 256);
}

// A reply: the job id, then its result as a Binary or an error.
Result<std::string> encode(const Reply& m) {
  Writer w(m.result.ok() ? m.result->cubin.size() + m.result->ptx.size() + 256 : 256);
  w.u64(m.job_id);
  w.boolean(m.result.ok());
  if (m.result.ok()) {
    codec::put_binary(w, *m.result);
  } else {
    codec::put_error(w, m.result.status());
  }
  return codec::seal_frame(kProtocol, static_cast<uint16_t>(MessageType::kReply), std::move(w));
}

Result<Hello> decode_hello(std::string_view payload) {
  return codec::read_record<Hello>(payload, "pool hello", hello_fields<Reader, Hello>);
}

Result<Request> decode_request(std::string_view payload) {
  return codec::read_record<Request>(payload, "pool request", request_fields<Reader, Request>);
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
