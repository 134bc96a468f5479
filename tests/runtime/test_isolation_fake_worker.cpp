// A bench worker without a GPU, for test_isolation: it speaks the real protocol (isolation_wire.h) and does what
// the choice's name says, so that the host's handling of crashes, hangs and poisoned contexts is tested
// deterministically on any machine.
//
//   Begin: every choice is known except names starting "unknown_"; op "no_such_op" answers kNotFound, op
//          "crash_in_begin" dies by SIGSEGV.
//   Run:   "segv" / "abort" / "exit3" die that way; "hang" never answers; "poison" answers a failure with
//          `poisoned`; "wrong" answers kWrongResult; anything else answers samples {len(name), len(name)+1}.
//          A choice first seen by this process must come with its binaries (as the real worker requires), and
//          their first binary's name must be the choice's name.
//   FAKE_BENCH_HELLO=error: the hello reports kNoDevice. FAKE_BENCH_GATE=<fifo>: before dying or hanging, read
//          one byte from the FIFO, so a test can act while the choice is in flight (a sync point).
// Each request writes a line naming the choice to stderr, which the host keeps as the worker's tail.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "isolation_wire.h"
#include "kiln/codec/frame.h"
#include "kiln/pool/worker_loop.h"

namespace bw = kiln::runtime::detail::bench_wire;

namespace {

void wait_at_gate() {
  const char* gate = std::getenv("FAKE_BENCH_GATE");
  if (!gate || !*gate) return;
  int g = ::open(gate, O_RDONLY | O_CLOEXEC);
  char byte;
  if (g >= 0) (void)kiln::codec::read_exactly(g, &byte, 1, "the gate");
}

bw::Begun begin(const bw::Begin& req, std::set<std::string>& has_binaries) {
  std::fprintf(stderr, "fake worker: begin %s\n", req.session.problem.op.c_str());
  std::fflush(stderr);
  if (req.session.problem.op == "crash_in_begin") kiln::die_by_signal(SIGSEGV);
  bw::Begun b;
  b.seq = req.seq;
  if (req.session.problem.op == "no_such_op") b.status = kiln::make_error(kiln::ErrorCode::kNotFound, "no op 'no_such_op'");
  for (const auto& c : req.session.choices) {
    if (c.name.rfind("unknown_", 0) == 0) b.unknown[c.name] = "fake worker: unknown";
  }
  has_binaries.clear();
  return b;
}

bw::RunResult run(const bw::Run& req, std::set<std::string>& has_binaries) {
  const std::string& name = req.name;
  std::fprintf(stderr, "fake worker: running %s\n", name.c_str());
  std::fflush(stderr);
  bw::RunResult r;
  r.seq = req.seq;
  if (name == "segv" || name == "abort" || name == "exit3" || name == "hang") wait_at_gate();
  if (name == "segv") kiln::die_by_signal(SIGSEGV);
  if (name == "abort") kiln::die_by_signal(SIGABRT);
  if (name == "exit3") ::_exit(3);
  if (name == "hang") {
    while (true) ::pause();
  }
  if (req.binaries) {
    if (req.binaries->empty() || req.binaries->front().name != name) {
      r.status = kiln::make_error(kiln::ErrorCode::kInternal, "fake worker: binaries of another choice");
    }
    has_binaries.insert(name);
  } else if (!has_binaries.count(name)) {
    r.status = kiln::make_error(kiln::ErrorCode::kInternal, "fake worker: no binaries sent for " + name);
  }
  if (!r.status.ok()) {
  } else if (name == "poison") {
    r.status = kiln::make_error(kiln::ErrorCode::kCudaError, "CUDA_ERROR_ILLEGAL_ADDRESS (fake)");
    r.poisoned = true;
  } else if (name == "wrong") {
    r.status = kiln::make_error(kiln::ErrorCode::kWrongResult, "fake worker: wrong values");
  } else {
    const double us = static_cast<double>(name.size());
    r.us = {us, us + 1};
    r.partial = req.best_us > 0 && us > 2 * req.best_us;
    r.graph = req.graph;
  }
  r.worker_seconds = 1e-6;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const kiln::WorkerArgs args = kiln::parse_worker_args(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  bw::Hello hello;
  hello.pid = static_cast<int32_t>(::getpid());
  hello.device_name = "fake";
  const char* mode = std::getenv("FAKE_BENCH_HELLO");
  if (mode && std::string_view(mode) == "error") {
    hello.status = kiln::make_error(kiln::ErrorCode::kNoDevice, "fake worker: no device here");
  }
  auto hello_frame = bw::encode(hello);
  if (!hello_frame.ok() || !kiln::codec::write_all(args.fd, *hello_frame).ok() || !hello.status.ok()) return 1;

  std::set<std::string> has_binaries;
  kiln::WorkerLoop loop;
  loop.protocol = &bw::kProtocol;
  loop.fd = args.fd;
  loop.name = "fake worker";
  loop.handle = [&has_binaries](const kiln::codec::Frame& f) -> kiln::Result<std::optional<std::string>> {
    if (f.type == static_cast<uint16_t>(bw::Type::kEnd)) return std::optional<std::string>();
    if (f.type == static_cast<uint16_t>(bw::Type::kBegin)) {
      KILN_ASSIGN_OR_RETURN(bw::Begin req, bw::decode<bw::Begin>(f.payload));
      KILN_ASSIGN_OR_RETURN(std::string reply, bw::encode(begin(req, has_binaries)));
      return std::optional<std::string>(std::move(reply));
    }
    if (f.type != static_cast<uint16_t>(bw::Type::kRun)) {
      return kiln::make_error(kiln::ErrorCode::kCorrupt, "fake worker: not a request");
    }
    KILN_ASSIGN_OR_RETURN(bw::Run req, bw::decode<bw::Run>(f.payload));
    KILN_ASSIGN_OR_RETURN(std::string reply, bw::encode(run(req, has_binaries)));
    return std::optional<std::string>(std::move(reply));
  };
  return kiln::run_worker_loop(loop);
}
