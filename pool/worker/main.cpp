// kiln-compile-worker: one compile worker of kiln's process pool (kiln/pool/process_pool.h).
//
// Started by the pool with posix_spawn; says hello once, then runs the worker skeleton (kiln/pool/worker_loop.h)
// on the socket on --fd (3): each wire::Request is compiled with kiln::compile and answered with a wire::Reply.
// Exits when the socket reaches EOF (the pool closed it: shutdown or recycling) and when the pool process
// dies: PR_SET_PDEATHSIG, plus a thread that notices the socket hanging up even while a compile is running.
//
// Test faults (only when the pool sets KILN_WORKER_TEST_FAULTS=1): a request whose options contain
// -DKILN_WORKER_TEST=<what> makes this worker segfault (segv), abort, exit with status 3 (exit3) or hang
// after reading it, or answer at once without compiling (echo, for measuring the pool's own overhead), or
// after N million steps of integer work without compiling (spin:N, for the pool's scaling apart from NVRTC);
// KILN_WORKER_TEST_HELLO_GATE=<fifo> holds the hello until a byte arrives there.
#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "huge_text.h"
#include "kiln/jit/compiler.h"
#include "kiln/pool/worker_loop.h"
#include "wire.h"

namespace {

// --pch-dir: where NVRTC's automatic PCH goes when a request asks for PCH without a folder of its own.
std::string g_pch_dir;

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string test_fault(const kiln::KernelSource& s) {
  static const std::string_view kPrefix = "-DKILN_WORKER_TEST=";
  for (const auto& o : s.options) {
    if (std::string_view(o).substr(0, kPrefix.size()) == kPrefix) return o.substr(kPrefix.size());
  }
  return {};
}

// One request: compiled, or (test faults) crashed, hung or echoed as asked.
kiln::Result<std::optional<std::string>> serve(const kiln::codec::Frame& frame, bool faults) {
  namespace wire = kiln::wire;
  if (frame.type != static_cast<uint16_t>(wire::MessageType::kRequest)) {
    return kiln::make_error(kiln::ErrorCode::kCorrupt, "a frame other than a request");
  }
  const int64_t received_ns = monotonic_ns();
  KILN_ASSIGN_OR_RETURN(wire::Request req, wire::decode<wire::Request>(frame.payload));
  wire::Reply reply;
  reply.job_id = req.job_id;
  const std::string fault = faults ? test_fault(req.source) : std::string();
  if (!fault.empty() && fault != "echo" && fault.rfind("spin:", 0) != 0) {
    std::fprintf(stderr, "kiln-compile-worker: injected fault '%s' while compiling '%s'\n", fault.c_str(),
                 req.source.name.c_str());
    std::fflush(stderr);
    if (fault == "segv") kiln::die_by_signal(SIGSEGV);
    if (fault == "abort") kiln::die_by_signal(SIGABRT);
    if (fault == "exit3") ::_exit(3);
    if (fault == "hang") {
      while (true) ::pause();
    }
  }
  if (fault.rfind("spin:", 0) == 0) {
    // A CPU-bound job of a fixed amount of work (millions of xorshift steps), for measuring the pool's own
    // scaling apart from NVRTC's (bench/pool's process-spin).
    const uint64_t steps = std::strtoull(fault.c_str() + 5, nullptr, 10) * 1'000'000ull;
    uint64_t x = 88172645463325252ull + static_cast<uint64_t>(req.job_id);
    for (uint64_t i = 0; i < steps; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      x *= 0x9e3779b97f4a7c15ull;
    }
    kiln::Binary b;
    b.name = req.source.name;
    b.entry = req.source.entry;
    b.arch = req.target.arch;
    b.log = "spin " + std::to_string(x & 0xff);
    reply.result = std::move(b);
  } else if (fault == "echo") {
    kiln::Binary b;
    b.name = req.source.name;
    b.entry = req.source.entry;
    b.arch = req.target.arch;
    b.log = "received_ns=" + std::to_string(received_ns) + " replied_ns=" + std::to_string(monotonic_ns());
    reply.result = std::move(b);
  } else {
    kiln::CompileSettings settings;
    settings.want_ptx = req.want_ptx;
    settings.use_pch = req.use_pch;
    settings.pch_dir = req.pch_dir;
    // No folder asked for: the one the host named for this worker, which it removes when this worker is gone
    // (NVRTC's own default is removed only at a normal exit, which a worker does not have).
    if (req.use_pch && req.pch_dir.empty() && !g_pch_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(g_pch_dir, ec);
      if (!ec) settings.pch_dir = g_pch_dir;
    }
    reply.result = kiln::compile(req.source, req.target, settings);
  }
  KILN_ASSIGN_OR_RETURN(std::string bytes, wire::encode(reply));
  return std::optional<std::string>(std::move(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  const kiln::WorkerArgs args = kiln::parse_worker_args(argc, argv);
  // --nice (ProcessPoolOptions::worker_nice) first, while this is the only thread: threads inherit it, and a
  // thread started before would keep the host's priority. Best effort: a value refused leaves the host's.
  if (auto it = args.other.find("--nice"); it != args.other.end()) {
    const int n = std::atoi(it->second.c_str());
    if (n > 0 && n <= 19) (void)::setpriority(PRIO_PROCESS, 0, n);
  }
  if (!kiln::attach_to_host(args)) return 0;
  if (auto it = args.other.find("--pch-dir"); it != args.other.end()) g_pch_dir = it->second;
  const char* faults_env = std::getenv("KILN_WORKER_TEST_FAULTS");
  const bool faults = faults_env && std::string_view(faults_env) == "1";

  // Test only: hold the hello until the test writes a byte to this FIFO, so "not ready yet" is a state a
  // test controls rather than a race with start-up.
  if (const char* gate = std::getenv("KILN_WORKER_TEST_HELLO_GATE"); faults && gate && *gate) {
    int g = ::open(gate, O_RDONLY | O_CLOEXEC);
    char byte;
    if (g < 0 || !kiln::codec::read_exactly(g, &byte, 1, "the hello gate").ok()) return 0;
    ::close(g);
  }

  kiln::NvrtcVersion v = kiln::nvrtc_version();
  auto hello = kiln::wire::encode(kiln::wire::Hello{static_cast<int32_t>(::getpid()), v.major, v.minor});
  if (!hello.ok() || !kiln::codec::write_all(args.fd, *hello).ok()) return 0;
  // After the hello, so that the host goes on (a tune plans its first problem) while this copies ~72 MB; before
  // the first request is read, so no NVRTC code runs while it moves (the only other thread, attach_to_host's,
  // runs none).
  if (args.get("--huge-text", 0) == 1) {
    auto moved = kiln::pool_detail::move_text_to_huge_pages("libnvrtc.so");
    if (!moved.ok()) {
      std::fprintf(stderr, "kiln-compile-worker: NVRTC's code stays on small pages: %s\n", moved.status().to_string().c_str());
    }
  }

  kiln::WorkerLoop loop;
  loop.protocol = &kiln::wire::kProtocol;
  loop.fd = args.fd;
  loop.name = "kiln-compile-worker";
  loop.handle = [faults](const kiln::codec::Frame& f) { return serve(f, faults); };
  return kiln::run_worker_loop(loop);
}
