#include "isolation.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kiln/jit/key.h"

namespace kiln::runtime::detail {

using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kWorkerName = "kiln-bench-worker";

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int poll_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
}

bench_wire::ChoiceSpec spec_of(const Choice& c) {
  bench_wire::ChoiceSpec s;
  s.name = c.name();
  for (const auto& k : c.kernels()) s.keys.push_back(make_key(k.source, k.target));
  return s;
}

}  // namespace

// ---- one worker process

/// A started bench worker: its pid, socket and stderr. Move-only in effect (owned through unique_ptr);
/// destroying it kills and reaps the process, so no worker outlives its owner.
class IsolationHost::Worker {
 public:
  Worker(WorkerProcess p, size_t tail_bytes) : p_(std::move(p)), tail_bytes_(std::max<size_t>(tail_bytes, 1)) {}
  ~Worker() { (void)end(false); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int pid() const { return p_.pid; }
  const std::string& tail() const { return tail_; }
  Clock::time_point spawned_at = Clock::now();
  bool ready = false;

  /// Writes `frame` whole, draining stderr meanwhile. kWorkerCrashed when the worker hung up (it is dying:
  /// end() tells how), kTimeout at `deadline`.
  Status send(const Result<std::string>& encoded, Clock::time_point deadline) {
    KILN_RETURN_IF_ERROR(encoded.status());
    std::string_view frame = *encoded;
    while (!frame.empty()) {
      ssize_t n = ::send(p_.sock.get(), frame.data(), frame.size(), MSG_NOSIGNAL);
      if (n > 0) {
        frame.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        return make_error(ErrorCode::kWorkerCrashed, "hung up");
      }
      KILN_RETURN_IF_ERROR(wait_for(POLLOUT, deadline));
    }
    return Status();
  }

  /// The next whole frame. kWorkerCrashed when the worker hung up (end() tells how), kTimeout at `deadline`
  /// (the worker is left running), kCorrupt for a malformed frame.
  Result<codec::Frame> receive(Clock::time_point deadline) {
    for (;;) {
      KILN_ASSIGN_OR_RETURN(std::optional<codec::Frame> frame, codec::take_frame(bench_wire::kProtocol, in_));
      if (frame) return std::move(*frame);
      char buf[65536];
      ssize_t n = ::recv(p_.sock.get(), buf, sizeof buf, 0);
      if (n > 0) {
        in_.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) return make_error(ErrorCode::kWorkerCrashed, "hung up");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return make_error(ErrorCode::kWorkerCrashed, "hung up");
      KILN_RETURN_IF_ERROR(wait_for(POLLIN, deadline));
    }
  }

  /// True when the worker has gone between requests (its end of the socket closed) or says something
  /// unasked: either way it cannot take the next request.
  bool gone() const {
    pollfd p{p_.sock.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    char c;
    return ::recv(p_.sock.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;  // EOF (0) or an unasked byte
  }

  /// Ends the process and reaps it; returns how it ended ("killed by signal 9 (Killed)"). `gracefully`: it is
  /// ending by itself (it hung up, or we close its socket so it exits), so give it a moment to exit with its
  /// own status before SIGKILL. Idempotent.
  std::string end(bool gracefully) {
    if (reaped_) return how_;
    if (gracefully) {
      p_.sock.reset();  // a live worker exits on the hang-up
      drain_stderr(Clock::now() + std::chrono::seconds(2));
    }
    // Safe from pid reuse: the process is not reaped until the waitpid below.
    ::kill(p_.pid, SIGKILL);
    drain_stderr(Clock::time_point::max());
    int status = 0;
    while (::waitpid(p_.pid, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    how_ = describe_wait_status(status);
    p_.sock.reset();
    return how_;
  }

 private:
  // Waits until the socket is ready for `events` or `deadline`, reading stderr as it comes (a worker blocked
  // on a full stderr pipe would look hung).
  Status wait_for(short events, Clock::time_point deadline) {
    for (;;) {
      pollfd fds[2] = {{p_.sock.get(), events, 0}, {p_.err ? p_.err.get() : -1, POLLIN, 0}};
      int n = ::poll(fds, 2, poll_ms(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (fds[1].revents) read_stderr();
      if (fds[0].revents) return Status();
      if (Clock::now() >= deadline) return make_error(ErrorCode::kTimeout, "timed out");
    }
  }

  // Reads what stderr holds now; false at EOF (every writer closed: the process is exiting).
  bool read_stderr() {
    char buf[4096];
    while (p_.err) {
      ssize_t n = ::read(p_.err.get(), buf, sizeof buf);
      if (n > 0) {
        tail_.append(buf, static_cast<size_t>(n));
        if (tail_.size() > tail_bytes_) tail_.erase(0, tail_.size() - tail_bytes_);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return true;
      } else {
        p_.err.reset();
        return false;
      }
    }
    return false;
  }

  // Reads stderr until EOF or `deadline`: once the process is gone the pipe ends, so after SIGKILL this is short.
  void drain_stderr(Clock::time_point deadline) {
    while (p_.err) {
      pollfd fd{p_.err.get(), POLLIN, 0};
      int n = ::poll(&fd, 1, poll_ms(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        read_stderr();
      } else if (Clock::now() >= deadline) {
        return;
      }
    }
  }

  WorkerProcess p_;
  size_t tail_bytes_;
  std::string in_;
  std::string tail_;
  bool reaped_ = false;
  std::string how_;
};

// ---- the host

IsolationHost::IsolationHost(IsolationOptions options, int device, std::string path)
    : options_(std::move(options)), device_(device), path_(std::move(path)) {
  spawner_ = std::thread([this] {
    std::unique_lock lock(spawn_mu_);
    for (;;) {
      spawn_cv_.wait(lock, [&] { return spawner_stop_ || !spawn_jobs_.empty(); });
      if (spawn_jobs_.empty()) return;
      auto job = std::move(spawn_jobs_.front());
      spawn_jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  });
}

Result<std::unique_ptr<IsolationHost>> IsolationHost::create(IsolationOptions options, int device) {
  if (options.choice_timeout <= std::chrono::milliseconds(0) || options.startup_timeout <= std::chrono::milliseconds(0)) {
    return make_error(ErrorCode::kInvalidArgument, "IsolationOptions timeouts must be positive");
  }
  KILN_ASSIGN_OR_RETURN(std::string path,
                        find_helper_executable(kWorkerName, "KILN_BENCH_WORKER", options.worker_path,
                                               "build or install it, or set $KILN_BENCH_WORKER or "
                                               "IsolationOptions::worker_path"));
  std::unique_ptr<IsolationHost> host(new IsolationHost(std::move(options), device, std::move(path)));
  KILN_RETURN_IF_ERROR(host->spawn());
  return host;
}

IsolationHost::~IsolationHost() {
  retire(true);  // closing its socket lets the worker exit by itself
  {
    std::lock_guard lock(spawn_mu_);
    spawner_stop_ = true;
  }
  spawn_cv_.notify_all();
  spawner_.join();
}

int IsolationHost::worker_pid() const { return worker_ ? worker_->pid() : 0; }

void IsolationHost::emit(IsolationEvent::Kind kind, std::string choice, std::string detail, double seconds,
                         double worker_seconds) {
  if (!options_.observer) return;
  options_.observer(IsolationEvent{kind, worker_pid(), std::move(choice), std::move(detail), seconds, worker_seconds});
}

Result<WorkerProcess> IsolationHost::spawn_on_spawner_thread() {
  std::promise<Result<WorkerProcess>> done;
  auto result = done.get_future();
  std::vector<std::string> args = {"--device", std::to_string(device_)};
  {
    std::lock_guard lock(spawn_mu_);
    spawn_jobs_.push_back([&] { done.set_value(spawn_worker_process(path_, options_.worker_env, args)); });
  }
  spawn_cv_.notify_one();
  return result.get();
}

Status IsolationHost::spawn() {
  KILN_ASSIGN_OR_RETURN(WorkerProcess p, spawn_on_spawner_thread());
  worker_ = std::make_unique<Worker>(std::move(p), options_.stderr_tail_bytes);
  session_begun_ = false;
  has_binaries_.clear();
  ++stats_.workers_spawned;
  emit(IsolationEvent::Kind::kWorkerSpawned);
  return Status();
}

IsolationHost::Ended IsolationHost::retire(bool gracefully) {
  if (!worker_) return {};
  Ended e;
  e.how = worker_->end(gracefully);
  e.tail = worker_->tail();
  emit(IsolationEvent::Kind::kWorkerExited, {}, e.how);
  worker_.reset();
  session_begun_ = false;
  has_binaries_.clear();
  return e;
}

Status IsolationHost::ensure_worker() {
  if (worker_ && worker_->ready && worker_->gone()) {
    // It died while idle (no choice was in flight, so none is blamed): start another.
    ++stats_.crashes;
    retire(true);
  }
  if (!worker_) KILN_RETURN_IF_ERROR(spawn());
  if (worker_->ready) return Status();
  const int pid = worker_->pid();
  auto frame = worker_->receive(worker_->spawned_at + options_.startup_timeout);
  auto fail = [&](ErrorCode code, const std::string& what) {
    // A worker that cannot start is not worth retrying: the next one would fail the same way.
    Ended e = retire(code == ErrorCode::kWorkerCrashed);
    return make_error(code, fmt::format("bench worker {} (pid {}) {} ({}); stderr: {}", path_, pid, what, e.how,
                                        stderr_tail_lines(e.tail)),
                      e.tail);
  };
  if (!frame.ok()) {
    if (frame.status().code() == ErrorCode::kTimeout) {
      return fail(ErrorCode::kTimeout, fmt::format("did not say hello within {:.3g} s",
                                                   std::chrono::duration<double>(options_.startup_timeout).count()));
    }
    if (frame.status().code() == ErrorCode::kWorkerCrashed) return fail(ErrorCode::kWorkerCrashed, "ended before it was ready");
    return fail(ErrorCode::kWorkerCrashed, "sent a malformed hello (" + frame.status().to_string() + ")");
  }
  if (frame->type != static_cast<uint16_t>(bench_wire::Type::kHello)) return fail(ErrorCode::kWorkerCrashed, "did not start with a hello");
  auto hello = bench_wire::decode<bench_wire::Hello>(frame->payload);
  if (!hello.ok()) return fail(ErrorCode::kWorkerCrashed, "sent a malformed hello (" + hello.status().to_string() + ")");
  if (!hello->status.ok()) {
    Status why = hello->status;
    retire(true);
    return std::move(why).with_context(fmt::format("starting bench worker {} on device {}", path_, device_));
  }
  worker_->ready = true;
  ++stats_.workers_ready;
  emit(IsolationEvent::Kind::kWorkerReady, {}, hello->device_name, seconds_between(worker_->spawned_at, Clock::now()),
       hello->context_seconds);
  return Status();
}

Status IsolationHost::ensure_session() {
  if (!session_) return make_error(ErrorCode::kFailedPrecondition, "no problem was begun in the bench worker");
  KILN_RETURN_IF_ERROR(ensure_worker());
  if (session_begun_) return Status();
  const int pid = worker_->pid();
  const std::string problem = session_->problem.describe();
  bench_wire::Begin b;
  b.seq = ++seq_;
  b.session = *session_;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options_.choice_timeout;
  Status sent = worker_->send(bench_wire::encode(b), deadline);
  auto frame = sent.ok() ? worker_->receive(deadline) : Result<codec::Frame>(sent);
  Result<bench_wire::Begun> begun = frame.ok() && frame->type == static_cast<uint16_t>(bench_wire::Type::kBegun)
                                        ? bench_wire::decode<bench_wire::Begun>(frame->payload)
                                        : Result<bench_wire::Begun>(frame.ok() ? make_error(ErrorCode::kCorrupt, "not a begun frame")
                                                                               : frame.status());
  if (begun.ok() && begun->seq != b.seq) begun = make_error(ErrorCode::kCorrupt, "an answer to another request");
  if (!begun.ok()) {
    const ErrorCode code = begun.status().code();
    Ended e = retire(code == ErrorCode::kWorkerCrashed);
    if (code == ErrorCode::kWorkerCrashed) ++stats_.crashes;
    if (code == ErrorCode::kTimeout) ++stats_.timeouts;
    std::string what =
        code == ErrorCode::kTimeout
            ? fmt::format("did not prepare {} within {:.3g} s and was killed", problem,
                          std::chrono::duration<double>(options_.choice_timeout).count())
        : code == ErrorCode::kWorkerCrashed
            ? fmt::format("{} while preparing {}", e.how, problem)
            : fmt::format("sent a malformed answer ({}) and was killed", begun.status().to_string());
    return make_error(code == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kWorkerCrashed,
                      fmt::format("bench worker (pid {}) {}; stderr: {}", pid, what, stderr_tail_lines(e.tail)), e.tail);
  }
  if (!begun->status.ok()) {
    if (begun->poisoned) {
      ++stats_.poisoned;
      retire(false);
    }
    return std::move(begun)->status;
  }
  session_begun_ = true;
  has_binaries_.clear();  // the worker prepares each problem's choices afresh
  emit(IsolationEvent::Kind::kSessionBegun, {}, problem, seconds_between(start, Clock::now()), begun->worker_seconds);
  unknown_ = std::move(begun)->unknown;
  return Status();
}

Result<std::map<std::string, std::string>> IsolationHost::begin(SessionSpec spec) {
  session_ = std::move(spec);
  session_begun_ = false;
  KILN_RETURN_IF_ERROR(ensure_session());
  return unknown_;
}

void IsolationHost::end() {
  if (worker_ && session_begun_) {
    bench_wire::End e;
    e.seq = ++seq_;
    // No answer comes; a worker that died meanwhile shows at the next request.
    (void)worker_->send(bench_wire::encode(e), Clock::now() + options_.choice_timeout);
  }
  session_begun_ = false;
  session_.reset();
}

Result<IsolatedRun> IsolationHost::run(bench_wire::Run request, const Binaries& binaries) {
  KILN_RETURN_IF_ERROR(ensure_session());
  const std::string name = request.name;
  if (!has_binaries_.count(name)) request.binaries = binaries;
  request.seq = ++seq_;
  const int pid = worker_->pid();
  emit(IsolationEvent::Kind::kChoiceSent, name);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options_.choice_timeout;
  Status sent = worker_->send(bench_wire::encode(request), deadline);
  auto frame = sent.ok() ? worker_->receive(deadline) : Result<codec::Frame>(sent);
  Result<bench_wire::RunResult> result =
      frame.ok() && frame->type == static_cast<uint16_t>(bench_wire::Type::kRunResult)
          ? bench_wire::decode<bench_wire::RunResult>(frame->payload)
          : Result<bench_wire::RunResult>(frame.ok() ? make_error(ErrorCode::kCorrupt, "not a run-result frame")
                                                     : frame.status());
  if (result.ok() && result->seq != request.seq) result = make_error(ErrorCode::kCorrupt, "an answer to another request");
  const double seconds = seconds_between(start, Clock::now());
  IsolatedRun out;
  if (!result.ok()) {
    // The worker died, hung or spoke nonsense while running this choice: the choice fails, the worker goes.
    const ErrorCode code = result.status().code();
    Ended e = retire(code == ErrorCode::kWorkerCrashed);
    Status why;
    if (code == ErrorCode::kTimeout) {
      ++stats_.timeouts;
      why = make_error(ErrorCode::kTimeout,
                       fmt::format("choice '{}' did not finish within {:.3g} s in bench worker (pid {}), which was "
                                   "killed and is replaced; stderr: {}",
                                   name, std::chrono::duration<double>(options_.choice_timeout).count(), pid,
                                   stderr_tail_lines(e.tail)),
                       e.tail);
    } else if (code == ErrorCode::kWorkerCrashed) {
      ++stats_.crashes;
      why = make_error(ErrorCode::kWorkerCrashed,
                       fmt::format("bench worker (pid {}) {} while running choice '{}'; it is replaced; stderr: {}",
                                   pid, e.how, name, stderr_tail_lines(e.tail)),
                       e.tail);
    } else {
      why = make_error(ErrorCode::kWorkerCrashed,
                       fmt::format("bench worker (pid {}) sent a malformed answer ({}) for choice '{}' and was "
                                   "killed; stderr: {}",
                                   pid, result.status().to_string(), name, stderr_tail_lines(e.tail)),
                       e.tail);
    }
    emit(IsolationEvent::Kind::kChoiceFailed, name, why.to_string(), seconds);
    out.samples = std::move(why);
    return out;
  }
  has_binaries_.insert(name);
  ++stats_.choices_run;
  out.error = result->error;
  if (!result->status.ok()) {
    Status why = std::move(result)->status;
    if (result->poisoned) {
      // The worker's context is unusable (an illegal address, say): retire it; the next choice gets a new one.
      ++stats_.poisoned;
      why.with_context(fmt::format("in bench worker (pid {}), whose context it poisoned; the worker is replaced", pid));
      emit(IsolationEvent::Kind::kChoiceFailed, name, why.to_string(), seconds, result->worker_seconds);
      retire(false);
    } else {
      emit(IsolationEvent::Kind::kChoiceDone, name, why.to_string(), seconds, result->worker_seconds);
    }
    out.samples = std::move(why);
    return out;
  }
  Samples s;
  s.us = std::move(result->us);
  // A worker's placements that do not match its runs one to one are dropped (the runs count as one set).
  if (result->placement.size() == s.us.size()) s.placement = std::move(result->placement);
  s.graph = result->graph;
  s.partial = result->partial;
  out.samples = std::move(s);
  emit(IsolationEvent::Kind::kChoiceDone, name, {}, seconds, result->worker_seconds);
  return out;
}

Result<IsolatedRun> IsolationHost::check_and_measure(const std::string& name, const Binaries& binaries,
                                                     double best_us) {
  bench_wire::Run r;
  r.name = name;
  r.mode = bench_wire::RunMode::kCheckAndMeasure;
  r.best_us = best_us;
  return run(std::move(r), binaries);
}

Result<IsolatedRun> IsolationHost::time_runs(const std::string& name, const Binaries& binaries, int n, bool graph) {
  bench_wire::Run r;
  r.name = name;
  r.mode = bench_wire::RunMode::kTimeRuns;
  r.n = n;
  r.graph = graph;
  return run(std::move(r), binaries);
}

void IsolationHost::report_in_process(const std::string& choice, const std::string& why) {
  emit(IsolationEvent::Kind::kInProcess, choice, why);
}

// ---- the tuner's view

Result<std::unique_ptr<IsolatedSession>> IsolatedSession::begin(IsolationHost& host, const TuneOptions& options,
                                                                const Problem& problem, const Choice& reference,
                                                                const Binaries& reference_binaries,
                                                                const std::vector<ChoicePtr>& to_measure) {
  std::unique_ptr<IsolatedSession> s(new IsolatedSession());
  std::map<std::string, std::string> left;  // choice -> why it runs in this process
  auto in_process = [&](const std::string& why) {
    for (const auto& c : to_measure) left[c->name()] = why;
  };
  if (auto sent = bench_wire::round_trip(problem); !sent.ok()) {
    in_process(sent.status().message());
  } else {
    SessionSpec spec;
    spec.problem = problem;
    spec.seed = options.seed;
    spec.bench = options.bench;
    spec.max_template_configs = options.max_template_configs;
    spec.max_cublas_algos = options.max_cublas_algos;
    spec.split_k = options.split_k;
    spec.reference = spec_of(reference);
    spec.reference_binaries = reference_binaries;
    for (const auto& c : to_measure) spec.choices.push_back(spec_of(*c));
    auto unknown = host.begin(std::move(spec));
    if (!unknown.ok() && unknown.status().code() != ErrorCode::kNotFound) return unknown.status();
    if (!unknown.ok()) {
      in_process(unknown.status().message());
    } else {
      s->host_ = &host;
      left = std::move(unknown).value();
      for (const auto& c : to_measure) {
        if (!left.count(c->name())) s->covered_.insert(c->name());
      }
    }
  }
  if (!left.empty()) {
    std::string names;
    for (const auto& [name, why] : left) {
      host.report_in_process(name, why);
      names += (names.empty() ? "" : ", ") + name;
    }
    spdlog::warn("kiln: {} choice(s) of {} run in this process, not isolated ({}): {}", left.size(),
                 problem.describe(), left.begin()->second, names);
  }
  return s;
}

IsolatedSession::~IsolatedSession() {
  if (host_) host_->end();
}

Result<Result<Samples>> IsolatedSession::check_and_measure(const Choice& choice, const Binaries& binaries,
                                                           double best_us, double* error) {
  if (!host_) return make_error(ErrorCode::kInternal, "the bench worker has no session for this problem");
  binaries_[choice.name()] = &binaries;
  KILN_ASSIGN_OR_RETURN(IsolatedRun run, host_->check_and_measure(choice.name(), binaries, best_us));
  if (error) *error = run.error;
  return Result<Result<Samples>>(std::move(run.samples));
}

Result<Result<Samples>> IsolatedSession::time_runs(const Choice& choice, int n, bool graph) {
  auto it = binaries_.find(choice.name());
  if (!host_ || it == binaries_.end()) {
    return make_error(ErrorCode::kInternal, fmt::format("{} was not measured in the bench worker", choice.name()));
  }
  KILN_ASSIGN_OR_RETURN(IsolatedRun run, host_->time_runs(choice.name(), *it->second, n, graph));
  return Result<Result<Samples>>(std::move(run.samples));
}

namespace {

// The sandbox of one tuner: its bench worker, started when the sandbox is made.
class IsolationSandbox final : public BenchSandbox {
 public:
  explicit IsolationSandbox(std::unique_ptr<IsolationHost> host) : host_(std::move(host)) {}
  Result<std::unique_ptr<BenchSession>> begin(const TuneOptions& options, const Problem& problem,
                                              const Choice& reference, const Binaries& reference_binaries,
                                              const std::vector<ChoicePtr>& to_measure) override {
    KILN_ASSIGN_OR_RETURN(auto session,
                          IsolatedSession::begin(*host_, options, problem, reference, reference_binaries, to_measure));
    return std::unique_ptr<BenchSession>(std::move(session));
  }

 private:
  std::unique_ptr<IsolationHost> host_;
};

}  // namespace

}  // namespace kiln::runtime::detail

namespace kiln::runtime {

Result<std::unique_ptr<BenchSandbox>> make_isolation_sandbox(const IsolationOptions& options, int device) {
  KILN_ASSIGN_OR_RETURN(auto host, detail::IsolationHost::create(options, device));
  return std::unique_ptr<BenchSandbox>(std::make_unique<detail::IsolationSandbox>(std::move(host)));
}

}  // namespace kiln::runtime
