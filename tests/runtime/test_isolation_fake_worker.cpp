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
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "isolation_wire.h"
#include "kiln/pool/wire.h"

namespace bw = kiln::runtime::detail::bench_wire;

namespace {

bool read_full(int fd, char* buf, size_t n) {
  while (n > 0) {
    ssize_t r = ::read(fd, buf, n);
    if (r > 0) {
      buf += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

bool write_full(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t w = ::write(fd, data.data(), data.size());
    if (w > 0) {
      data.remove_prefix(static_cast<size_t>(w));
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

// The default action of `sig`, not a sanitizer's handler: the host must see exactly this signal.
[[noreturn]] void die_by(int sig) {
  struct {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)();
    unsigned long mask;
  } dfl = {SIG_DFL, 0, nullptr, 0};
  ::syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof dfl.mask);
  ::raise(sig);
  ::_exit(128 + sig);
}

void wait_at_gate() {
  const char* gate = std::getenv("FAKE_BENCH_GATE");
  if (!gate || !*gate) return;
  int g = ::open(gate, O_RDONLY | O_CLOEXEC);
  char byte;
  if (g >= 0) (void)read_full(g, &byte, 1);
}

}  // namespace

int main(int argc, char** argv) {
  int fd = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string_view(argv[i]) == "--fd") fd = static_cast<int>(std::strtol(argv[i + 1], nullptr, 10));
  }
  ::signal(SIGPIPE, SIG_IGN);
  bw::Hello hello;
  hello.pid = static_cast<int32_t>(::getpid());
  hello.device_name = "fake";
  const char* mode = std::getenv("FAKE_BENCH_HELLO");
  if (mode && std::string_view(mode) == "error") {
    hello.status = kiln::make_error(kiln::ErrorCode::kNoDevice, "fake worker: no device here");
  }
  if (!write_full(fd, bw::encode(hello)) || !hello.status.ok()) return 1;

  std::set<std::string> has_binaries;
  std::string header(kiln::wire::kHeaderSize, '\0');
  std::string payload;
  while (read_full(fd, header.data(), header.size())) {
    auto h = bw::decode_header(header);
    if (!h.ok()) return 2;
    payload.resize(h->length);
    if (!read_full(fd, payload.data(), payload.size())) return 0;
    if (h->type == bw::Type::kEnd) continue;
    if (h->type == bw::Type::kBegin) {
      auto req = bw::decode_begin(payload);
      if (!req.ok()) return 2;
      std::fprintf(stderr, "fake worker: begin %s\n", req->problem.op.c_str());
      std::fflush(stderr);
      if (req->problem.op == "crash_in_begin") die_by(SIGSEGV);
      bw::Begun b;
      b.seq = req->seq;
      if (req->problem.op == "no_such_op") b.status = kiln::make_error(kiln::ErrorCode::kNotFound, "no op 'no_such_op'");
      for (const auto& c : req->choices) {
        if (c.name.rfind("unknown_", 0) == 0) b.unknown[c.name] = "fake worker: unknown";
      }
      has_binaries.clear();
      if (!write_full(fd, bw::encode(b))) return 0;
      continue;
    }
    if (h->type != bw::Type::kRun) return 2;
    auto req = bw::decode_run(payload);
    if (!req.ok()) return 2;
    const std::string& name = req->name;
    std::fprintf(stderr, "fake worker: running %s\n", name.c_str());
    std::fflush(stderr);
    bw::RunResult r;
    r.seq = req->seq;
    if (name == "segv" || name == "abort" || name == "exit3" || name == "hang") wait_at_gate();
    if (name == "segv") die_by(SIGSEGV);
    if (name == "abort") die_by(SIGABRT);
    if (name == "exit3") ::_exit(3);
    if (name == "hang") {
      while (true) ::pause();
    }
    if (req->has_binaries) {
      if (req->binaries.empty() || req->binaries.front().name != name) {
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
      r.partial = req->best_us > 0 && us > 2 * req->best_us;
      r.graph = req->graph;
    }
    r.worker_seconds = 1e-6;
    if (!write_full(fd, bw::encode(r))) return 0;
  }
  return 0;
}
