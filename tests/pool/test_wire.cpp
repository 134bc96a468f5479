// The process pool's wire format: golden bytes (a change to the format must bump wire::kProtocol's version and
// update these), round trips, and corrupt input that must fail cleanly.
#include "wire.h"

#include <gtest/gtest.h>

#include "kiln_test.h"

namespace kiln {
namespace {

std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

constexpr size_t kHeader = codec::kFrameHeaderBytes;

// A whole frame; the test fails if it cannot be encoded.
template <class Message>
std::string frame(const Message& m) {
  auto bytes = wire::encode(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  return bytes.ok() ? *bytes : std::string();
}

wire::Request sample_request() {
  wire::Request r;
  r.job_id = 0x0102030405060708ull;
  r.source.name = "g";
  r.source.entry = "k";
  r.source.source = "src";
  r.source.options = {"-DA=1"};
  r.source.headers = {Header{"h.cuh", "x"}};
  r.source.include_dirs = {"/i"};
  r.source.name_expressions = {"k<1>"};
  r.target.arch = "sm_90a";
  r.want_ptx = true;
  r.use_pch = false;
  r.pch_dir = "";
  return r;
}

TEST(Wire, HelloGolden) {
  std::string bytes = frame(wire::Hello{1234, 13, 0});
  // magic "KPW1", version 2, type 1 (hello), length 12; pid 1234, NVRTC 13.0.
  EXPECT_EQ(hex(bytes), "4b505731" "0200" "0100" "0c000000" "d2040000" "0d000000" "00000000");
}

TEST(Wire, RequestGolden) {
  std::string bytes = frame(sample_request());
  EXPECT_EQ(hex(bytes),
            "4b505731" "0200" "0200" "5e000000"                     // header: type 2 (request), 94 bytes
            "0807060504030201"                                        // job id
            "0100000067" "010000006b" "03000000737263"                // name "g", entry "k", source "src"
            "01000000" "050000002d44413d31"                           // options ["-DA=1"]
            "01000000" "05000000682e637568" "0100000078"              // headers [("h.cuh", "x")]
            "01000000" "020000002f69"                                 // include dirs ["/i"]
            "01000000" "040000006b3c313e"                             // name expressions ["k<1>"]
            "06000000736d5f393061"                                    // target "sm_90a"
            "01" "00" "00000000");                                    // want_ptx, use_pch, pch_dir ""
}

TEST(Wire, RequestRoundTrip) {
  wire::Request in = sample_request();
  std::string bytes = frame(in);
  KILN_ASSERT_OK_AND_ASSIGN(codec::FrameHeader h, codec::parse_header(wire::kProtocol, bytes));
  EXPECT_EQ(h.type, static_cast<uint16_t>(wire::MessageType::kRequest));
  ASSERT_EQ(h.length + kHeader, bytes.size());
  KILN_ASSERT_OK_AND_ASSIGN(wire::Request out, wire::decode<wire::Request>(std::string_view(bytes).substr(kHeader)));
  EXPECT_EQ(out.job_id, in.job_id);
  EXPECT_EQ(out.source.name, in.source.name);
  EXPECT_EQ(out.source.entry, in.source.entry);
  EXPECT_EQ(out.source.source, in.source.source);
  EXPECT_EQ(out.source.options, in.source.options);
  ASSERT_EQ(out.source.headers.size(), 1u);
  EXPECT_EQ(out.source.headers[0].name, "h.cuh");
  EXPECT_EQ(out.source.headers[0].content, "x");
  EXPECT_EQ(out.source.include_dirs, in.source.include_dirs);
  EXPECT_EQ(out.source.name_expressions, in.source.name_expressions);
  EXPECT_EQ(out.target, in.target);
  EXPECT_EQ(out.want_ptx, in.want_ptx);
  EXPECT_EQ(out.use_pch, in.use_pch);
}

TEST(Wire, ReplyRoundTripsBinariesAndErrors) {
  const Binary b{.key = KernelKey{0xaa, 0xbb}, .name = "n", .entry = "e<1>", .arch = "sm_80",
                 .cubin = std::string("\x7f" "ELF\0\1\2", 7), .ptx = "ptx",
                 .lowered_names = {{"e<1>", "_Z1eILi1EEvv"}}, .log = "warning", .compile_seconds = 0.25,
                 .nvrtc_major = 13, .nvrtc_minor = 1};
  std::string bytes = frame(wire::Reply{7, b});
  KILN_ASSERT_OK_AND_ASSIGN(wire::Reply ok, wire::decode<wire::Reply>(std::string_view(bytes).substr(kHeader)));
  EXPECT_EQ(ok.job_id, 7u);
  ASSERT_TRUE(ok.result.ok());
  EXPECT_EQ(ok.result->key, b.key);
  EXPECT_EQ(ok.result->cubin, b.cubin);
  EXPECT_EQ(ok.result->lowered_names, b.lowered_names);
  EXPECT_EQ(ok.result->compile_seconds, 0.25);
  EXPECT_EQ(ok.result->nvrtc_minor, 1);

  Status err = make_error(ErrorCode::kCompileError, "bad", "the log");
  err.with_context("while compiling n");
  bytes = frame(wire::Reply{8, err});
  KILN_ASSERT_OK_AND_ASSIGN(wire::Reply bad, wire::decode<wire::Reply>(std::string_view(bytes).substr(kHeader)));
  ASSERT_FALSE(bad.result.ok());
  EXPECT_EQ(bad.result.status().code(), ErrorCode::kCompileError);
  EXPECT_EQ(bad.result.status().detail(), "the log");
  EXPECT_EQ(bad.result.status().to_string(), err.to_string());
}

TEST(Wire, CorruptFramesAreErrorsNotCrashes) {
  std::string good = frame(sample_request());
  std::string wrong_magic = good;
  wrong_magic[0] = 'X';
  EXPECT_EQ(codec::parse_header(wire::kProtocol, wrong_magic).status().code(), ErrorCode::kCorrupt);
  std::string wrong_version = good;
  wrong_version[4] = 9;
  auto v = codec::parse_header(wire::kProtocol, wrong_version);
  EXPECT_EQ(v.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(v.status().message().find("version"), std::string::npos);
  std::string huge = good;
  huge[11] = '\x7f';
  EXPECT_EQ(codec::parse_header(wire::kProtocol, huge).status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(codec::parse_header(wire::kProtocol, "KPW").status().code(), ErrorCode::kCorrupt);

  std::string_view payload = std::string_view(good).substr(kHeader);
  // Every truncation fails cleanly.
  for (size_t n = 0; n < payload.size(); ++n) {
    EXPECT_EQ(wire::decode<wire::Request>(payload.substr(0, n)).status().code(), ErrorCode::kCorrupt) << n;
  }
  // Trailing garbage too.
  EXPECT_EQ(wire::decode<wire::Request>(std::string(payload) + "x").status().code(), ErrorCode::kCorrupt);
  // A list count that cannot fit in the bytes left is rejected before anything is allocated.
  std::string lying(payload);
  lying[8 + 4 + 1 + 4 + 1 + 4 + 3] = '\xff';  // the options count's low byte... made huge below
  lying[8 + 4 + 1 + 4 + 1 + 4 + 3 + 3] = '\x7f';
  EXPECT_EQ(wire::decode<wire::Request>(lying).status().code(), ErrorCode::kCorrupt);
  // A reply whose status code is out of range.
  std::string reply = frame(wire::Reply{1, make_error(ErrorCode::kInternal, "x")});
  std::string body = reply.substr(kHeader);
  body[9] = '\x63';  // code 99 (after the job id and the ok byte)
  EXPECT_EQ(wire::decode<wire::Reply>(body).status().code(), ErrorCode::kCorrupt);
}

}  // namespace
}  // namespace kiln
