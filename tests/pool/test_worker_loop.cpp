// The worker skeleton (kiln/pool/worker_loop.h) over a socket pair, in this process: requests answered in
// order, and each fault ending the loop the one way it should (EOF: 0; a bad frame, a frame of another
// version, a stream cut inside a frame, an unanswerable handler error: 2 with a line naming it; a host that
// is gone: 0). Deterministic: the test writes everything the loop will read before the loop starts.
#include "kiln/pool/worker_loop.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "kiln/codec/frame.h"
#include "kiln_test.h"

namespace kiln {
namespace {

constexpr codec::Protocol kTest{0x31545354u /* "TST1" */, 3, 2, "test"};
constexpr uint16_t kAsk = 1, kAnswer = 2;

std::string frame(const codec::Protocol& p, uint16_t type, std::string_view text) {
  codec::Writer w;
  w.bytes(text, "text");
  auto f = codec::seal_frame(p, type, std::move(w));
  EXPECT_TRUE(f.ok());
  return f.ok() ? *f : std::string();
}

// Answers "x" with "x!", fails for "fail", answers nothing for "quiet".
Result<std::optional<std::string>> echo(const codec::Frame& f) {
  codec::Reader r(f.payload);
  std::string text = r.bytes("text");
  KILN_RETURN_IF_ERROR(r.finish("test request"));
  if (text == "fail") return make_error(ErrorCode::kInvalidArgument, "asked to fail");
  if (text == "quiet") return std::optional<std::string>();
  return std::optional<std::string>(frame(kTest, kAnswer, text + "!"));
}

struct LoopRun {
  int status = -1;
  std::string replies;  // every byte the loop wrote
  std::string stderr_text;
};

// Runs the loop on one end of a socket pair after `input` was written to the other and that end was shut
// for writing (the host's EOF); collects what the loop wrote back.
LoopRun run_loop(const std::string& input, bool with_error_reply = false, bool host_gone = false) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  KILN_EXPECT_OK(codec::write_all(sv[0], input));
  if (host_gone) {
    ::close(sv[0]);
    sv[0] = -1;
  } else {
    ::shutdown(sv[0], SHUT_WR);
  }
  WorkerLoop loop;
  loop.protocol = &kTest;
  loop.fd = sv[1];
  loop.name = "test-worker";
  loop.handle = echo;
  if (with_error_reply) {
    loop.error_reply = [](const Status& s) { return codec::seal_frame(kTest, kAnswer, [&] {
      codec::Writer w;
      w.bytes("error: " + s.message(), "text");
      return w;
    }()); };
  }
  LoopRun out;
  ::testing::internal::CaptureStderr();
  out.status = run_worker_loop(loop);
  out.stderr_text = ::testing::internal::GetCapturedStderr();
  ::close(sv[1]);
  if (sv[0] >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(sv[0], buf, sizeof buf)) > 0) out.replies.append(buf, static_cast<size_t>(n));
    ::close(sv[0]);
  }
  return out;
}

std::vector<std::string> answers(std::string bytes) {
  std::vector<std::string> out;
  while (true) {
    auto f = codec::take_frame(kTest, bytes);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (!f.ok() || !f->has_value()) break;
    EXPECT_EQ((*f)->type, kAnswer);
    codec::Reader r((*f)->payload);
    out.push_back(r.bytes("text"));
  }
  EXPECT_TRUE(bytes.empty());
  return out;
}

TEST(WorkerLoop, AnswersEachRequestInOrderUntilTheHostCloses) {
  LoopRun r = run_loop(frame(kTest, kAsk, "a") + frame(kTest, kAsk, "quiet") + frame(kTest, kAsk, "b"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(answers(r.replies), (std::vector<std::string>{"a!", "b!"}));
  EXPECT_EQ(r.stderr_text, "");
}

TEST(WorkerLoop, FrameOfAnotherVersionEndsItWithTheReason) {
  codec::Protocol old = kTest;
  old.version = 2;
  LoopRun r = run_loop(frame(kTest, kAsk, "a") + frame(old, kAsk, "b") + frame(kTest, kAsk, "c"));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(answers(r.replies), (std::vector<std::string>{"a!"}));  // nothing after the bad frame is read
  EXPECT_NE(r.stderr_text.find("test-worker: bad frame from the host"), std::string::npos) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("test protocol version 2 (this build speaks 3)"), std::string::npos) << r.stderr_text;
}

TEST(WorkerLoop, MalformedFramesEndIt) {
  const std::string good = frame(kTest, kAsk, "a");
  std::string wrong_magic = good;
  wrong_magic[0] = 'X';
  std::string unknown_type = good;
  unknown_type[6] = 7;
  std::string oversized = good;
  oversized[11] = '\x7f';
  for (const auto& [input, says] : std::vector<std::pair<std::string, std::string>>{
           {wrong_magic, "not a test frame"},
           {unknown_type, "unknown test message type 7"},
           {oversized, "over the limit"},
           {good.substr(0, 5), "inside a test frame header"},
           {good.substr(0, good.size() - 1), "the stream ended"}}) {
    LoopRun r = run_loop(input);
    EXPECT_EQ(r.status, 2) << says;
    EXPECT_EQ(r.replies, "") << says;
    EXPECT_NE(r.stderr_text.find(says), std::string::npos) << r.stderr_text;
  }
}

TEST(WorkerLoop, HandlerErrorIsAnsweredWhenTheProtocolCanSaySo) {
  LoopRun r = run_loop(frame(kTest, kAsk, "a") + frame(kTest, kAsk, "fail") + frame(kTest, kAsk, "b"), true);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(answers(r.replies), (std::vector<std::string>{"a!", "error: asked to fail", "b!"}));
}

TEST(WorkerLoop, HandlerErrorEndsItOtherwise) {
  LoopRun r = run_loop(frame(kTest, kAsk, "a") + frame(kTest, kAsk, "fail") + frame(kTest, kAsk, "b"));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(answers(r.replies), (std::vector<std::string>{"a!"}));
  EXPECT_NE(r.stderr_text.find("test-worker: cannot serve the request: invalid argument: asked to fail"),
            std::string::npos)
      << r.stderr_text;
  // A payload that does not decode is a handler error too, naming the field.
  std::string bad_payload = frame(kTest, kAsk, "a");
  bad_payload[8] = 2;  // the length field: a payload of 2 bytes: the text's length is cut short
  bad_payload.resize(codec::kFrameHeaderBytes + 2);
  r = run_loop(bad_payload);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.stderr_text.find("malformed test request: text needs 4 bytes, 2 left"), std::string::npos)
      << r.stderr_text;
}

TEST(WorkerLoop, HostGoneBeforeTheReplyIsACleanEnd) {
  LoopRun r = run_loop(frame(kTest, kAsk, "a"), false, /*host_gone=*/true);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.stderr_text, "");
}

TEST(WorkerArgs, ParsesFdParentAndTheRest) {
  const char* argv[] = {"w", "--fd", "7", "--device", "2", "--parent-pid", "1234"};
  WorkerArgs a = parse_worker_args(7, const_cast<char**>(argv));
  EXPECT_EQ(a.fd, 7);
  EXPECT_EQ(a.parent, 1234);
  EXPECT_EQ(a.get("--device", 0), 2);
  EXPECT_EQ(a.get("--missing", 5), 5);
}

}  // namespace
}  // namespace kiln
