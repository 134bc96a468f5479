#include "kiln/codec/frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace kiln::codec {

Result<std::string> seal_frame(const Protocol& p, uint16_t type, Writer&& payload) {
  KILN_RETURN_IF_ERROR(payload.status());
  if (payload.size() > kMaxFramePayload) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} message of {} bytes is over the {}-byte frame limit",
                                                               p.name, payload.size(), kMaxFramePayload));
  }
  Writer header(kFrameHeaderBytes + payload.size());
  header.u32(p.magic);
  header.u16(p.version);
  header.u16(type);
  header.u32(static_cast<uint32_t>(payload.size()));
  header.append(payload.buffer());
  return std::move(header).take();
}

Status finish_message(const Reader& r, const Protocol& p, uint16_t type) {
  if (r.ok() && r.remaining() == 0) return r.finish("");
  return r.finish(fmt::format("{} message {}", p.name, type));
}

Result<FrameHeader> parse_header(const Protocol& p, std::string_view bytes) {
  Reader r(bytes.substr(0, kFrameHeaderBytes));
  const uint32_t magic = r.u32("magic");
  const uint16_t version = r.u16("version");
  FrameHeader h;
  h.type = r.u16("type");
  h.length = r.u32("length");
  if (!r.ok()) return make_error(ErrorCode::kCorrupt, fmt::format("truncated {} frame header", p.name));
  if (magic != p.magic) {
    return make_error(ErrorCode::kCorrupt, fmt::format("not a {} frame (magic {:#010x})", p.name, magic));
  }
  if (version != p.version) {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("{} protocol version {} (this build speaks {}): the worker executable and the "
                                  "library are from different builds",
                                  p.name, version, p.version));
  }
  if (h.type < 1 || h.type > p.max_type) {
    return make_error(ErrorCode::kCorrupt, fmt::format("unknown {} message type {}", p.name, h.type));
  }
  if (h.length > kMaxFramePayload) {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("{} frame payload of {} bytes is over the limit", p.name, h.length));
  }
  return h;
}

Result<std::optional<Frame>> take_frame(const Protocol& p, std::string& buffer) {
  if (buffer.size() < kFrameHeaderBytes) return std::optional<Frame>();
  KILN_ASSIGN_OR_RETURN(FrameHeader h, parse_header(p, buffer));
  if (buffer.size() - kFrameHeaderBytes < h.length) return std::optional<Frame>();
  Frame f{h.type, buffer.substr(kFrameHeaderBytes, h.length)};
  buffer.erase(0, kFrameHeaderBytes + h.length);
  return std::optional<Frame>(std::move(f));
}

namespace {

// Bytes read until `n` or the end of the stream; -1 with errno on an error.
ssize_t read_some(int fd, char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, out + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      break;
    } else if (errno != EINTR) {
      return -1;
    }
  }
  return static_cast<ssize_t>(got);
}

}  // namespace

Status read_exactly(int fd, char* out, size_t n, std::string_view what) {
  ssize_t got = read_some(fd, out, n);
  if (got < 0) return make_error(ErrorCode::kIoError, fmt::format("reading {}: {}", what, std::strerror(errno)));
  if (static_cast<size_t>(got) < n) {
    return make_error(ErrorCode::kIoError, fmt::format("the stream ended {} bytes into {} of {} bytes", got, what, n));
  }
  return Status();
}

Result<std::optional<Frame>> read_frame(const Protocol& p, int fd) {
  char header[kFrameHeaderBytes];
  ssize_t got = read_some(fd, header, sizeof header);
  if (got == 0) return std::optional<Frame>();
  if (got < 0) return make_error(ErrorCode::kIoError, fmt::format("reading a {} frame: {}", p.name, std::strerror(errno)));
  if (static_cast<size_t>(got) < sizeof header) {
    return make_error(ErrorCode::kIoError, fmt::format("the stream ended inside a {} frame header", p.name));
  }
  KILN_ASSIGN_OR_RETURN(FrameHeader h, parse_header(p, std::string_view(header, sizeof header)));
  Frame f{h.type, std::string(h.length, '\0')};
  KILN_RETURN_IF_ERROR(read_exactly(fd, f.payload.data(), h.length, fmt::format("a {} frame's payload", p.name)));
  return std::optional<Frame>(std::move(f));
}

Status write_all(int fd, std::string_view bytes) {
  // send() with MSG_NOSIGNAL where the fd is a socket: a peer that died must not raise SIGPIPE in a process
  // that did not ignore it (a forked rank, the caller's process); write() for pipes.
  bool socket = true;
  while (!bytes.empty()) {
    ssize_t w = socket ? ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) : ::write(fd, bytes.data(), bytes.size());
    if (w < 0 && errno == ENOTSOCK && socket) {
      socket = false;
      continue;
    }
    if (w > 0) {
      bytes.remove_prefix(static_cast<size_t>(w));
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      return make_error(ErrorCode::kIoError, fmt::format("writing a frame: {}", w < 0 ? std::strerror(errno) : "no progress"));
    }
  }
  return Status();
}

}  // namespace kiln::codec
