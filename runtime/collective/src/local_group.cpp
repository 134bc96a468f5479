// run_local_group(): one forked process per rank, supervised by the caller's process.
//
// Each rank talks to the parent over its own socket pair (sockets rather than pipes: a send to a rank that
// died must not raise SIGPIPE in the caller's process). A child sends kiln::codec frames: rank 0 its NCCL
// unique id, which the parent forwards to the other ranks, and every rank its outcome. The parent never
// touches CUDA or NCCL: the id is made in rank 0 after the fork, so the caller's process gets no bootstrap
// thread and forks from whatever state it is in.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kiln/pool/subprocess.h"
#include "kiln/codec/frame.h"
#include "kiln/codec/values.h"
#include "kiln/runtime/comm.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace kiln::runtime {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint16_t kIdMessage = 1;       // rank 0 -> parent: NCCL's unique id, forwarded to the other ranks
constexpr uint16_t kOutcomeMessage = 2;  // every rank -> parent: its Status and result string
// Version 2: kiln::codec's encodings.
constexpr codec::Protocol kGroupProtocol{0x31474C4Bu /* "KLG1" */, 2, kOutcomeMessage, "kiln local group"};
constexpr int kExitNoParent = 120;
constexpr int kExitCannotReport = 121;

// ---- framing

Result<std::string> encode_id(const NcclId& id) {
  codec::Writer w;
  w.bytes(std::string_view(id.data(), id.size()), "NCCL id");
  return codec::seal_frame(kGroupProtocol, kIdMessage, std::move(w));
}

Result<std::string> encode_outcome(const Status& status, const std::string& result) {
  codec::Writer w;
  codec::put_outcome(w, status);
  w.bytes(result, "rank result");
  return codec::seal_frame(kGroupProtocol, kOutcomeMessage, std::move(w));
}

Result<RankOutcome> decode_outcome(int rank, std::string_view payload) {
  codec::Reader r(payload);
  RankOutcome o;
  o.rank = rank;
  o.status = codec::get_outcome(r);
  o.result = r.bytes("rank result");
  if (Status s = r.finish("rank outcome"); !s.ok()) {
    return make_error(ErrorCode::kCorrupt, fmt::format("rank {} sent a malformed outcome ({})", rank, s.message()));
  }
  return o;
}

// ---- the child

// A frame to the parent; false when it could not be encoded or sent.
bool send_frame(int fd, const Result<std::string>& frame) { return frame.ok() && codec::write_all(fd, *frame).ok(); }

Result<NcclId> receive_id(int fd) {
  NcclId id;
  size_t got = 0;
  while (got < id.size()) {
    ssize_t n = ::recv(fd, id.data() + got, id.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return make_error(ErrorCode::kUnavailable, "rank 0 ended before sending NCCL's unique id");
    }
  }
  return id;
}

/// What a rank runs between the fork and its report. `comm` keeps the communicator for the caller to tear
/// down after the outcome has been sent.
Result<std::string> run_rank(const GroupOptions& options, const RankFunction& fn, int rank, int fd,
                             std::unique_ptr<Communicator>& comm) {
  if (!options.nccl) return fn(rank, nullptr);
  NcclId id;
  if (rank == 0) {
    KILN_ASSIGN_OR_RETURN(id, nccl_unique_id());
    if (!send_frame(fd, encode_id(id))) {
      return make_error(ErrorCode::kUnavailable, "cannot send NCCL's unique id to the parent");
    }
  } else {
    KILN_ASSIGN_OR_RETURN(id, receive_id(fd));
  }
  const int device = options.devices.empty() ? rank : options.devices[static_cast<size_t>(rank)];
  auto created = Communicator::init(id, rank, options.world, device);
  if (!created.ok()) {
    return std::move(created).status().with_context(
        fmt::format("creating rank {}'s communicator on device {}", rank, device));
  }
  comm = std::move(created).value();
  return fn(rank, comm.get());
}

[[noreturn]] void child_main(const GroupOptions& options, const RankFunction& fn, int rank, int fd,
                             const std::vector<int>& parent_fds, pid_t parent) {
  // A rank must not outlive the process supervising it (whose run_local_group call is its only reader).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(kExitNoParent);  // the parent died before prctl took effect
  for (int other : parent_fds) ::close(other);

  std::unique_ptr<Communicator> comm;
  Status status;
  std::string result;
  try {
    Result<std::string> r = run_rank(options, fn, rank, fd, comm);
    if (r.ok()) {
      result = std::move(r).value();
    } else {
      status = std::move(r).status();
    }
  } catch (const std::exception& e) {
    status = make_error(ErrorCode::kInternal, fmt::format("rank {}'s function threw: {}", rank, e.what()));
  } catch (...) {
    status = make_error(ErrorCode::kInternal, fmt::format("rank {}'s function threw a non-standard exception", rank));
  }
  bool reported = false;
  try {
    reported = send_frame(fd, encode_outcome(status, result));
    // The outcome is out before the teardown: a teardown that hangs or crashes cannot lose it. After a failure
    // the communicator is not destroyed at all: peers may be blocked in a collective with this rank, and
    // ncclCommDestroy could wait for them; the process exit releases everything.
    if (status.ok()) comm.reset();
  } catch (...) {
  }
  std::fflush(nullptr);
  // _exit, never exit or a return: the child shares the caller's stack and atexit handlers (a test
  // framework's, the caller's), none of which belongs to it.
  ::_exit(reported ? (status.ok() ? 0 : 1) : kExitCannotReport);
}

// ---- the parent

struct RankState {
  int pid = -1;
  Fd sock;   // the parent's end; reset at EOF
  Fd pidfd;  // readable once the process has ended; absent on kernels without pidfd_open
  std::string in;
  bool reaped = false;
  int wait_status = 0;
  bool reported = false;
  bool killed = false;  // by the parent
  RankOutcome outcome;
};

// now + d, saturating: "never" may be spelled as a huge duration.
Clock::time_point after(Clock::time_point now, std::chrono::milliseconds d) {
  if (d >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + d;
}

int poll_ms(Clock::time_point until) {
  if (until == Clock::time_point::max()) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
}

class Supervisor {
 public:
  Supervisor(const GroupOptions& options, std::vector<RankState>& ranks, Clock::time_point start)
      : options_(options), ranks_(ranks), deadline_(after(start, options.timeout)) {}

  /// Runs until every rank has been reaped.
  void run() {
    for (;;) {
      bool all_reaped = std::all_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.reaped; });
      if (all_reaped) return;
      Clock::time_point now = Clock::now();
      if (now >= deadline_ || now >= kill_at_) {
        kill_remaining(/*timed_out=*/deadline_ <= kill_at_);
        return;
      }
      wait_for_events(std::min(deadline_, kill_at_));
    }
  }

 private:
  void wait_for_events(Clock::time_point until) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owners;  // rank index, whether the fd is the pidfd
    bool needs_polling = false;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankState& r = ranks_[i];
      if (r.reaped) continue;
      if (r.sock) {
        fds.push_back({r.sock.get(), POLLIN, 0});
        owners.emplace_back(i, false);
      }
      if (r.pidfd) {
        fds.push_back({r.pidfd.get(), POLLIN, 0});
        owners.emplace_back(i, true);
      } else if (!r.sock) {
        needs_polling = true;  // its socket ended but nothing signals its exit: check on it now and then
      }
    }
    int timeout = poll_ms(until);
    if (needs_polling && (timeout < 0 || timeout > 10)) timeout = 10;
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      // poll cannot fail on valid descriptors; rather than spin on it, the group ends here.
      abort_reason_ = fmt::format("run_local_group's poll failed: {}", std::strerror(errno));
      kill_at_ = Clock::now();
      return;
    }
    for (size_t k = 0; n > 0 && k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [i, is_pidfd] = owners[k];
      if (is_pidfd) {
        try_reap(i);
      } else {
        read_from(i);
      }
    }
    if (needs_polling) {
      for (size_t i = 0; i < ranks_.size(); ++i) {
        if (!ranks_[i].reaped && !ranks_[i].sock && !ranks_[i].pidfd) try_reap(i);
      }
    }
  }

  // Reads what rank i has sent; handles every whole message.
  void read_from(size_t i) {
    RankState& r = ranks_[i];
    char buf[65536];
    while (r.sock) {
      ssize_t n = ::recv(r.sock.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        r.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      r.sock.reset();  // EOF or a reset: the child has closed its end, so it is ending
    }
    handle_messages(i);
    if (!r.sock && !r.pidfd && !r.reaped) try_reap(i);
  }

  void handle_messages(size_t i) {
    RankState& r = ranks_[i];
    while (true) {
      auto frame = codec::take_frame(kGroupProtocol, r.in);
      if (frame.ok() && !frame->has_value()) return;  // wait for the rest
      std::string id;
      if (frame.ok() && (*frame)->type == kIdMessage && i == 0) {
        codec::Reader p((*frame)->payload);
        id = p.bytes("NCCL id");
        if (!p.finish("NCCL id").ok()) id.clear();
      }
      if (id.size() == sizeof(NcclId)) {
        forward_id(id);
      } else if (frame.ok() && (*frame)->type == kOutcomeMessage && !r.reported) {
        auto decoded = decode_outcome(static_cast<int>(i), (*frame)->payload);
        r.outcome = decoded.ok() ? std::move(decoded).value() : RankOutcome{static_cast<int>(i), decoded.status(), {}};
        r.reported = true;
        if (!r.outcome.status.ok()) note_failure(i, r.outcome.status);
        note_reported();
      } else {
        r.outcome = {static_cast<int>(i),
                     make_error(ErrorCode::kCorrupt, fmt::format("rank {} sent an unexpected message{}", i,
                                                                 frame.ok() ? "" : " (" + frame.status().message() + ")")),
                     {}};
        r.reported = true;
        note_failure(i, r.outcome.status);
        note_reported();
        r.in.clear();
        return;
      }
    }
  }

  void forward_id(std::string_view id) {
    if (id_done_) return;
    id_done_ = true;
    for (size_t j = 1; j < ranks_.size(); ++j) {
      // The socket's buffer is empty and far larger than the id, so this never blocks; a rank that has died
      // meanwhile is reported through its exit.
      if (ranks_[j].sock) (void)::send(ranks_[j].sock.get(), id.data(), id.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }

  // Rank 0 ended without sending an id: the ranks waiting for it get end-of-file and report that.
  void abandon_id() {
    if (id_done_ || !options_.nccl) return;
    id_done_ = true;
    for (size_t j = 1; j < ranks_.size(); ++j) {
      if (ranks_[j].sock) (void)::shutdown(ranks_[j].sock.get(), SHUT_WR);
    }
  }

  void try_reap(size_t i) {
    RankState& r = ranks_[i];
    if (r.reaped) return;
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(r.pid, &status, WNOHANG);
    } while (got < 0 && errno == EINTR);
    if (got == 0) return;
    finish(i, got == r.pid ? status : 0, got == r.pid);
  }

  // Rank i has been reaped (or is gone): collects what it sent before it ended and settles its outcome.
  void finish(size_t i, int wait_status, bool have_status) {
    RankState& r = ranks_[i];
    r.reaped = true;
    r.wait_status = wait_status;
    r.pidfd.reset();
    read_from(i);  // whatever it sent before it ended is in the socket now
    r.sock.reset();
    if (i == 0) abandon_id();
    std::string how = have_status ? describe_wait_status(wait_status) : "ended (its exit status was lost)";
    if (r.reported) {
      // The function's outcome stands; what happened in the teardown after it is only worth a warning.
      if (r.killed) {
        spdlog::warn("kiln: rank {} reported its outcome but had not exited when the group ended; killed", i);
      } else if (!have_status || !WIFEXITED(wait_status) ||
                 (WEXITSTATUS(wait_status) != 0 && r.outcome.status.ok())) {
        spdlog::warn("kiln: rank {} reported its outcome, then {}", i, how);
      }
      return;
    }
    if (r.killed) return;  // kill_remaining() sets the outcome
    r.outcome.rank = static_cast<int>(i);
    r.outcome.status = make_error(ErrorCode::kWorkerCrashed, fmt::format("rank {} {} before reporting an outcome", i, how));
    note_failure(i, r.outcome.status);
    note_reported();
  }

  void note_failure(size_t i, const Status& status) {
    if (first_failed_ >= 0) return;
    first_failed_ = static_cast<int>(i);
    first_failure_ = status.to_string();
    kill_at_ = std::min(kill_at_, after(Clock::now(), options_.grace));
  }

  // Once every rank has an outcome, the ones still running are only tearing down: they get the grace period
  // to exit before they are killed.
  void note_reported() {
    bool all = std::all_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.reported || r.reaped; });
    if (all) kill_at_ = std::min(kill_at_, after(Clock::now(), options_.grace));
  }

  void kill_remaining(bool timed_out) {
    for (RankState& r : ranks_) {
      if (r.reaped) continue;
      // Safe from pid reuse: the process is not reaped until the waitpid below.
      ::kill(r.pid, SIGKILL);
      r.killed = true;
    }
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankState& r = ranks_[i];
      if (r.reaped) continue;
      int status = 0;
      pid_t got;
      do {
        got = ::waitpid(r.pid, &status, 0);
      } while (got < 0 && errno == EINTR);
      finish(i, status, got == r.pid);
      if (r.reported) continue;
      r.outcome.rank = static_cast<int>(i);
      if (timed_out) {
        r.outcome.status = make_error(
            ErrorCode::kTimeout,
            fmt::format("timed out after {} ms{}", options_.timeout.count(),
                        first_failed_ >= 0 ? fmt::format(" (rank {} had failed: {})", first_failed_, first_failure_)
                                           : std::string()));
      } else if (first_failed_ >= 0) {
        r.outcome.status = make_error(ErrorCode::kCancelled, fmt::format("killed: rank {} failed first ({})",
                                                                         first_failed_, first_failure_));
      } else {
        r.outcome.status = make_error(ErrorCode::kInternal, fmt::format("killed: {}", abort_reason_));
      }
    }
  }

  const GroupOptions& options_;
  std::vector<RankState>& ranks_;
  Clock::time_point deadline_;
  Clock::time_point kill_at_ = Clock::time_point::max();
  int first_failed_ = -1;
  std::string first_failure_;
  std::string abort_reason_;
  bool id_done_ = false;
};

Status validate(const GroupOptions& o, const RankFunction& fn) {
  if (o.world < 1) return make_error(ErrorCode::kInvalidArgument, fmt::format("a group of {} ranks", o.world));
  if (!o.devices.empty() && o.devices.size() != static_cast<size_t>(o.world)) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} devices for a group of {} ranks", o.devices.size(), o.world));
  }
  for (int d : o.devices) {
    if (d < 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("device {}", d));
  }
  if (o.timeout.count() <= 0 || o.grace.count() < 0) {
    return make_error(ErrorCode::kInvalidArgument, "the group's timeout must be positive and its grace not negative");
  }
  if (!fn) return make_error(ErrorCode::kInvalidArgument, "no rank function");
  return Status();
}

}  // namespace

Result<std::vector<RankOutcome>> run_local_group(const GroupOptions& options, const RankFunction& fn) {
  KILN_RETURN_IF_ERROR(validate(options, fn));
  std::vector<RankState> ranks(static_cast<size_t>(options.world));
  std::vector<int> parent_fds;
  const pid_t parent = ::getpid();
  // Output buffered now would otherwise be written once more by every child.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  Status start_error;
  const Clock::time_point start = Clock::now();
  for (int rank = 0; rank < options.world; ++rank) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      start_error = make_error(ErrorCode::kIoError, fmt::format("socketpair failed: {}", std::strerror(errno)));
      break;
    }
    Fd parent_end(sv[0]), child_end(sv[1]);
    parent_fds.push_back(parent_end.get());
    pid_t pid = ::fork();
    if (pid < 0) {
      start_error = make_error(ErrorCode::kIoError, fmt::format("fork failed: {}", std::strerror(errno)));
      break;
    }
    if (pid == 0) child_main(options, fn, rank, child_end.get(), parent_fds, parent);
    RankState& r = ranks[static_cast<size_t>(rank)];
    r.pid = pid;
    r.sock = std::move(parent_end);
    r.outcome.rank = rank;
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) r.pidfd = Fd(pidfd);
  }
  if (!start_error.ok()) {
    // No rank may be left behind: the ones already started are killed and reaped before the error returns.
    for (RankState& r : ranks) {
      if (r.pid <= 0) continue;
      ::kill(r.pid, SIGKILL);
      int status = 0;
      while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    return std::move(start_error).with_context(fmt::format("starting a local group of {} ranks", options.world));
  }

  Supervisor(options, ranks, start).run();
  std::vector<RankOutcome> outcomes;
  outcomes.reserve(ranks.size());
  for (RankState& r : ranks) outcomes.push_back(std::move(r.outcome));
  return outcomes;
}

}  // namespace kiln::runtime
