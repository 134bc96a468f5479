// What the binary-decoder fuzz targets share: framing the input for a protocol, and the round-trip check.
//
// The first byte of an input picks how the rest is read. Odd: the rest is a message type byte and a payload,
// framed here with a correct header, so that mutations reach the payload decoders instead of dying on the
// header's magic and length. Even: the rest is a raw byte stream as a peer would send it (headers included),
// read the two ways kiln reads streams (take_frame on a buffer, read_frame on a file descriptor).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kiln/codec/frame.h"
#include "kiln/status.h"

namespace kiln::fuzz {

/// A finding that is not a crash: the decoder accepted something it cannot give back unchanged. Aborting makes
/// libFuzzer keep the input.
[[noreturn]] inline void fail(std::string_view what) {
  std::fprintf(stderr, "fuzz check failed: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

/// A value that decoded must encode, and its encoding must decode and encode to the same bytes again (the first
/// trip may normalise: a flag of 2 read as true, a key behind a "no kernel" flag dropped).
template <class T, class Encode, class Decode>
void check_round_trip(const T& decoded, Encode encode, Decode decode, std::string_view what) {
  Result<std::string> once = encode(decoded);
  if (!once.ok()) fail(std::string(what) + ": a decoded value does not encode: " + once.status().to_string());
  auto again = decode(*once);
  if (!again.ok()) fail(std::string(what) + ": its own encoding does not decode: " + again.status().to_string());
  Result<std::string> twice = encode(*again);
  if (!twice.ok() || *twice != *once) fail(std::string(what) + ": encoding is not stable over a round trip");
}

/// Every frame of a stream, each handed to `on_frame(type, payload)`, read both ways kiln reads them. Stops
/// at the first bad header, which is an error value, never a crash.
template <class OnFrame>
void each_frame(const codec::Protocol& p, std::string_view stream, OnFrame on_frame) {
  std::string buffer(stream);
  while (true) {
    auto f = codec::take_frame(p, buffer);
    if (!f.ok() || !f->has_value()) break;
    on_frame((*f)->type, std::string_view((*f)->payload));
  }
  // A worker reads its requests with read_frame from a socket: the same bytes from a memory file. read_frame
  // allocates the length a header declares (up to kMaxFramePayload, by design: the host is the worker's only
  // peer) before reading it; a stream that declares far more than it holds only times memset, so it is left
  // to take_frame above.
  for (std::string_view rest = stream; rest.size() >= codec::kFrameHeaderBytes;) {
    auto h = codec::parse_header(p, rest);
    if (!h.ok()) break;
    rest.remove_prefix(codec::kFrameHeaderBytes);
    if (h->length > rest.size() + (1u << 16)) return;
    rest.remove_prefix(std::min<size_t>(h->length, rest.size()));
  }
  int fd = ::memfd_create("kiln-fuzz", 0);
  if (fd < 0) return;
  if (::write(fd, stream.data(), stream.size()) == static_cast<ssize_t>(stream.size()) && ::lseek(fd, 0, SEEK_SET) == 0) {
    while (true) {
      auto f = codec::read_frame(p, fd);
      if (!f.ok() || !f->has_value()) break;
      on_frame((*f)->type, std::string_view((*f)->payload));
    }
  }
  ::close(fd);
}

/// The input as frames of `p` (see the top of this file).
template <class OnFrame>
void frames_of_input(const codec::Protocol& p, const uint8_t* data, size_t size, OnFrame on_frame) {
  if (size == 0) return;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    each_frame(p, rest, on_frame);
    return;
  }
  if (rest.empty()) return;
  const uint16_t type = static_cast<uint16_t>(1 + static_cast<uint8_t>(rest[0]) % p.max_type);
  codec::Writer payload;
  payload.append(rest.substr(1));
  auto frame = codec::seal_frame(p, type, std::move(payload));
  if (!frame.ok()) return;
  each_frame(p, *frame, on_frame);
}

}  // namespace kiln::fuzz
