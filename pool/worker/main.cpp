// kiln-compile-worker: one compile worker of kiln's process pool (kiln/pool/process_pool.h).
//
// Started by the pool with posix_spawn; reads wire::Request frames from the socket on --fd (3), compiles each
// with kiln::compile and writes a wire::Reply; says hello once first. Exits when the socket reaches EOF (the
// pool closed it: shutdown or recycling) and when the pool process dies: PR_SET_PDEATHSIG, plus a thread
// that notices the socket hanging up even while a compile is running.
//
// Test faults (only when the pool sets KILN_WORKER_TEST_FAULTS=1): a request whose options contain
// -DKILN_WORKER_TEST=<what> makes this worker segfault (segv), abort, exit with status 3 (exit3) or hang
// after reading it, or answer at once without compiling (echo, for measuring the pool's own overhead);
// KILN_WORKER_TEST_HELLO_GATE=<fifo> holds the hello until a byte arrives there.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "kiln/jit/compiler.h"
#include "kiln/pool/wire.h"

namespace {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Reads exactly n bytes; false on EOF or error.
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

std::string test_fault(const kiln::KernelSource& s) {
  static const std::string_view kPrefix = "-DKILN_WORKER_TEST=";
  for (const auto& o : s.options) {
    if (std::string_view(o).substr(0, kPrefix.size()) == kPrefix) return o.substr(kPrefix.size());
  }
  return {};
}

[[noreturn]] void die_by(int sig) {
  // The default action, not a sanitizer's handler: the pool must see exactly this signal. Set through the
  // raw system call because sanitizers intercept signal()/sigaction() and may keep their own handler.
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

}  // namespace

int main(int argc, char** argv) {
  long parent = 0;
  int fd = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    if (a == "--parent-pid") parent = std::strtol(argv[i + 1], nullptr, 10);
    if (a == "--fd") fd = static_cast<int>(std::strtol(argv[i + 1], nullptr, 10));
  }
  // Die with the pool. The check after it closes the race with a parent that died before the prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent > 0 && ::getppid() != parent) return 0;
  ::signal(SIGPIPE, SIG_IGN);
  const char* faults_env = std::getenv("KILN_WORKER_TEST_FAULTS");
  const bool faults = faults_env && std::string_view(faults_env) == "1";

  // The pool closing its end (or dying, if PDEATHSIG could not fire) hangs the socket up; a compile in
  // progress would not notice, so a thread waits for exactly that. events = 0: only hang-ups wake it.
  std::thread([fd] {
    pollfd p{fd, 0, 0};
    while (true) {
      int n = ::poll(&p, 1, -1);
      if (n > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) ::_exit(0);
      if (n < 0 && errno != EINTR) ::_exit(0);
    }
  }).detach();

  // Test only: hold the hello until the test writes a byte to this FIFO, so "not ready yet" is a state a
  // test controls rather than a race with start-up.
  if (const char* gate = std::getenv("KILN_WORKER_TEST_HELLO_GATE"); faults && gate && *gate) {
    int g = ::open(gate, O_RDONLY | O_CLOEXEC);
    char byte;
    if (g < 0 || !read_full(g, &byte, 1)) return 0;
    ::close(g);
  }

  kiln::NvrtcVersion v = kiln::nvrtc_version();
  if (!write_full(fd, kiln::wire::encode(kiln::wire::Hello{static_cast<int32_t>(::getpid()), v.major, v.minor}))) {
    return 0;
  }

  std::string header(kiln::wire::kHeaderSize, '\0');
  std::string payload;
  while (read_full(fd, header.data(), header.size())) {
    auto h = kiln::wire::decode_header(header);
    if (!h.ok() || h->type != kiln::wire::MessageType::kRequest) {
      std::fprintf(stderr, "kiln-compile-worker: bad frame from the pool: %s\n",
                   h.ok() ? "not a request" : h.status().to_string().c_str());
      return 2;
    }
    payload.resize(h->length);
    if (!read_full(fd, payload.data(), payload.size())) break;
    const int64_t received_ns = monotonic_ns();
    auto req = kiln::wire::decode_request(payload);
    if (!req.ok()) {
      std::fprintf(stderr, "kiln-compile-worker: bad request: %s\n", req.status().to_string().c_str());
      return 2;
    }

    kiln::wire::Reply reply;
    reply.job_id = req->job_id;
    const std::string fault = faults ? test_fault(req->source) : std::string();
    if (!fault.empty() && fault != "echo") {
      std::fprintf(stderr, "kiln-compile-worker: injected fault '%s' while compiling '%s'\n", fault.c_str(),
                   req->source.name.c_str());
      std::fflush(stderr);
      if (fault == "segv") die_by(SIGSEGV);
      if (fault == "abort") die_by(SIGABRT);
      if (fault == "exit3") ::_exit(3);
      if (fault == "hang") {
        while (true) ::pause();
      }
    }
    if (fault == "echo") {
      kiln::Binary b;
      b.name = req->source.name;
      b.entry = req->source.entry;
      b.arch = req->target.arch;
      b.log = "received_ns=" + std::to_string(received_ns) + " replied_ns=" + std::to_string(monotonic_ns());
      reply.result = std::move(b);
    } else {
      kiln::CompileSettings settings;
      settings.want_ptx = req->want_ptx;
      settings.use_pch = req->use_pch;
      settings.pch_dir = req->pch_dir;
      reply.result = kiln::compile(req->source, req->target, settings);
    }
    if (!write_full(fd, kiln::wire::encode(reply))) break;
  }
  return 0;
}
