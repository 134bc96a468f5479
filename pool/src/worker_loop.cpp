#include "kiln/pool/worker_loop.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kiln {

long WorkerArgs::get(std::string_view name, long fallback) const {
  auto it = other.find(name);
  return it == other.end() ? fallback : std::strtol(it->second.c_str(), nullptr, 10);
}

WorkerArgs parse_worker_args(int argc, char** argv) {
  WorkerArgs args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    if (a == "--fd") {
      args.fd = static_cast<int>(std::strtol(argv[i + 1], nullptr, 10));
    } else if (a == "--parent-pid") {
      args.parent = std::strtol(argv[i + 1], nullptr, 10);
    } else {
      args.other.emplace(a, argv[i + 1]);
    }
  }
  return args;
}

bool attach_to_host(const WorkerArgs& args) {
  // The check after the prctl closes the race with a host that died before it took effect.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (args.parent > 0 && ::getppid() != args.parent) return false;
  ::signal(SIGPIPE, SIG_IGN);
  // events = 0: only a hang-up (or an error) wakes the thread.
  std::thread([fd = args.fd] {
    pollfd p{fd, 0, 0};
    while (true) {
      int n = ::poll(&p, 1, -1);
      if (n > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) ::_exit(0);
      if (n < 0 && errno != EINTR) ::_exit(0);
    }
  }).detach();
  return true;
}

void die_by_signal(int sig) {
  // Through the raw system call: sanitizers intercept signal()/sigaction() and may keep their own handler.
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

namespace {

int fault(const WorkerLoop& loop, std::string_view what, const Status& s) {
  std::fprintf(stderr, "%s: %.*s: %s\n", loop.name.c_str(), static_cast<int>(what.size()), what.data(),
               s.to_string().c_str());
  std::fflush(stderr);
  return 2;
}

}  // namespace

int run_worker_loop(const WorkerLoop& loop) {
  while (true) {
    auto frame = codec::read_frame(*loop.protocol, loop.fd);
    if (!frame.ok()) return fault(loop, "bad frame from the host", frame.status());
    if (!frame->has_value()) return 0;  // the host closed the stream
    auto reply = loop.handle(**frame);
    if (!reply.ok()) {
      if (!loop.error_reply) return fault(loop, "cannot serve the request", reply.status());
      auto answer = loop.error_reply(reply.status());
      if (!answer.ok()) return fault(loop, "cannot answer a failed request", answer.status());
      reply = std::optional<std::string>(std::move(answer).value());
    }
    if (reply->has_value() && !codec::write_all(loop.fd, **reply).ok()) return 0;  // the host is gone
  }
}

}  // namespace kiln
