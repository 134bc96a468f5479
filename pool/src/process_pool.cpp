// The process pool. One I/O thread owns the workers: it spawns them (so PR_SET_PDEATHSIG, which follows the
// spawning thread, fires only when the pool itself is gone), writes requests, reads replies and stderr,
// enforces timeouts and reaps. Other threads only touch the queue and counters under `mu` and wake it
// through an eventfd.
#include "kiln/pool/process_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "job_queue.h"
#include "kiln/pool/subprocess.h"
#include "wire.h"

namespace kiln {

using pool_detail::Job;
using pool_detail::complete;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kWorkerName = "kiln-compile-worker";

// A worker's malloc keeps the memory NVRTC frees for its next compile instead of returning it to the kernel
// and faulting it back in (glibc's defaults unmap blocks above 128 KiB-32 MiB at once and trim the heap top
// above 128 KiB). A compile of the pool bench's GEMM (after the first) took 1,350-2,700 minor faults and
// 0.04-0.06 s of system time with the defaults, 0-270 faults and 0.02-0.04 s with these (getrusage, 2-core
// development machine; ~3 s of user time each there): a few per cent of a compile that every worker pays on
// every job, and kernel work that 16 workers would do side by side. bench/pool reports faults and system
// time per job. hugetlb=1 advises malloc's heap onto transparent huge pages (where THP is `madvise`, as on the
// GPU machine; glibc before 2.35 ignores it): over 8 paired 16-worker batches on nvidia-h200 (27-28 Nov,
// bench/results/pool-hugetlb-ab-nvidia-h200-2026-11-2{7,8}-*) the pool's efficiency was higher with it in 6, by 6.0
// points on average. Only when the application set no GLIBC_TUNABLES of its own.
constexpr const char* kWorkerMalloc =
    "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456:"
    "glibc.malloc.top_pad=16777216:glibc.malloc.hugetlb=1";

// An on/off setting: the option if set, else the environment variable ("0" or "1"), else the default.
Result<bool> switch_setting(const std::optional<bool>& option, const char* env, bool fallback) {
  if (option) return *option;
  const char* v = std::getenv(env);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::string_view(v) != "0" && std::string_view(v) != "1") {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} is '{}' (give 0 or 1)", env, v));
  }
  return std::string_view(v) == "1";
}

// A worker's folder for NVRTC's automatic PCH (a request with use_pch and no pch_dir). Left to itself NVRTC
// writes /tmp/__nvrtc_auto_pch_<pid>_0 and removes it only at a normal exit, which a worker never has (the host
// hangs up and the worker ends in _exit, or it is killed): 57 MB left behind per worker that compiled the pool
// bench's GEMM with PCH (development machine, 1 Dec). The host names the folder and removes it when it reaps
// the worker; folders of hosts that died are removed by the next pool to start.
constexpr std::string_view kPchPrefix = "kiln-pch-";

std::filesystem::path temp_dir() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::temp_directory_path(ec);
  return ec ? std::filesystem::path("/tmp") : p;
}

// Removes kiln-pch-<pid>-<n> folders whose host process <pid> no longer exists.
void remove_orphaned_pch_dirs() {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(temp_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kPchPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + kPchPrefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    std::filesystem::remove_all(it->path(), rm);
  }
}

bool has_env(const std::vector<std::string>& env, std::string_view name) {
  for (const auto& e : env) {
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') return true;
  }
  return false;
}

}  // namespace

Result<std::string> find_worker_executable(const std::string& explicit_path) {
  return find_helper_executable(kWorkerName, "KILN_COMPILE_WORKER", explicit_path,
                                "build or install it, or set $KILN_COMPILE_WORKER or ProcessPoolOptions::worker_path");
}

struct ProcessPool::Impl : std::enable_shared_from_this<ProcessPool::Impl> {
  enum class WorkerState { kStarting, kIdle, kBusy, kRetiring };
  enum class KillReason { kNone, kTimeout, kCancel, kShutdown, kStartup, kProtocol };

  struct Worker {
    int pid = -1;
    Fd sock;  // host end of the socket pair; closed early when retiring
    Fd err;   // read end of the worker's stderr (and stdout)
    WorkerState state = WorkerState::kStarting;
    std::string in;   // bytes read, not yet a whole frame
    std::string out;  // bytes to write
    std::unique_ptr<Job> job;
    Clock::time_point spawned_at;
    Clock::time_point deadline = Clock::time_point::max();
    int jobs_done = 0;
    std::string tail;
    KillReason kill_reason = KillReason::kNone;
    std::string protocol_error;
    bool dead = false;  // its stderr reached EOF or its socket broke: reap it
    std::string pch_dir;  // its automatic-PCH folder (see kPchPrefix), removed when it is reaped
    int cpu = -1;         // the CPU it is pinned to (ProcessPoolOptions::pin_workers), else -1
  };

  ProcessPoolOptions opt;
  std::string worker_path;
  int target = 1;
  bool pin = false;  // ProcessPoolOptions::pin_workers, resolved
  int nice = 0;      // ProcessPoolOptions::worker_nice, resolved
  bool huge_text = kDefaultHugeText;  // ProcessPoolOptions::huge_text, resolved
  uint64_t pch_dirs = 0;  // workers named a PCH folder so far (on the I/O thread)
  std::unique_ptr<Executor> host;  // the host arena, used until ready and when the pool cannot start workers
  std::shared_ptr<TaskRunner> callbacks;
  Fd wake_fd;

  mutable std::mutex mu;
  mutable std::condition_variable ready_cv;
  pool_detail::JobQueue queue;
  std::vector<JobId> cancels;                                // cancel requests for running jobs
  std::unordered_map<JobId, Future<Binary>> forwarded;       // queued jobs handed to the host arena
  std::vector<int> pids;                                     // live workers
  bool ready = false;
  bool shutting_down = false;
  std::string broken;  // why the pool gave up starting workers; jobs go to the host arena
  ExecutorCounters counters;
  size_t busy = 0;  // workers with a job
  ProcessPoolStats stats;
  std::atomic<bool> ready_flag{false};

  // Owned by the I/O thread.
  std::vector<std::unique_ptr<Worker>> workers;
  uint64_t hellos = 0;
  int consecutive_start_failures = 0;
  bool shutdown_begun = false;
  Clock::time_point shutdown_deadline = Clock::time_point::max();
  std::thread io;
  std::once_flag join_once;

  void emit(PoolEvent::Kind kind, int pid, JobId job = 0, std::string kernel = {}, std::string detail = {}) {
    if (opt.observer) opt.observer(PoolEvent{kind, pid, job, std::move(kernel), std::move(detail)});
  }

  void wake() {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd.get(), &one, sizeof one);
    (void)n;  // a full eventfd counter already means "awake"
  }

  // Completes a job's future (never under `mu`: callbacks run on this thread).
  void finish(Job& job, Result<Binary> r) { complete(mu, counters, job, std::move(r)); }

  void cancel(JobId id) {
    std::unique_ptr<Job> job;
    {
      std::lock_guard lock(mu);
      job = queue.remove(id);
      if (!job) {
        if (auto it = forwarded.find(id); it != forwarded.end()) {
          it->second.cancel();
          return;
        }
        cancels.push_back(id);
      }
    }
    if (job) {
      finish(*job, pool_detail::cancelled_in_queue_error(job->name()));
    } else {
      wake();
    }
  }

  Submission submit(CompileJob cj) {
    if (!ready_flag.load(std::memory_order_acquire)) {
      Submission s = host->submit(std::move(cj));
      std::lock_guard lock(mu);
      ++stats.jobs_in_host;
      return s;
    }
    auto owned = std::make_unique<Job>(pool_detail::next_job_id(), std::move(cj), callbacks);
    Job& j = *owned;
    Submission out{j.promise.future(), j.id};
    std::weak_ptr<Impl> weak = weak_from_this();
    j.promise.on_cancel([weak, id = j.id] {
      if (auto self = weak.lock()) self->cancel(id);
    });
    {
      std::unique_lock lock(mu);
      ++counters.submitted;
      if (shutting_down) {
        lock.unlock();
        finish(j, pool_detail::shutdown_error(j.name()));
        return out;
      }
      queue.push(std::move(owned));
    }
    wake();
    return out;
  }

  // ---- the I/O thread ----

  void spawn_worker() {
    auto w = std::make_unique<Worker>();
    std::vector<std::string> env = opt.worker_env;
    env.push_back(opt.enable_test_faults ? "KILN_WORKER_TEST_FAULTS=1" : "KILN_WORKER_TEST_FAULTS=0");
    if (!has_env(env, "GLIBC_TUNABLES") && std::getenv("GLIBC_TUNABLES") == nullptr) env.push_back(kWorkerMalloc);
    w->pch_dir = (temp_dir() / fmt::format("{}{}-{}", kPchPrefix, ::getpid(), ++pch_dirs)).string();
    std::vector<std::string> args{"--pch-dir", w->pch_dir};
    if (nice > 0) args.insert(args.end(), {"--nice", std::to_string(nice)});
    if (huge_text) args.insert(args.end(), {"--huge-text", "1"});
    auto started = spawn_worker_process(worker_path, env, args);
    if (!started.ok()) {
      start_failed(started.status().message());
      return;
    }
    const int pid = started->pid;
    w->pid = pid;
    if (pin) w->cpu = pin_to_cpu(pid);
    w->sock = std::move(started->sock);
    w->err = std::move(started->err);
    w->spawned_at = Clock::now();
    w->deadline = w->spawned_at + opt.startup_timeout;
    {
      std::lock_guard lock(mu);
      ++stats.workers_spawned;
      pids.push_back(pid);
      stats.workers_alive = static_cast<int>(pids.size());
    }
    emit(PoolEvent::Kind::kWorkerSpawned, pid);
    workers.push_back(std::move(w));
  }

  // Pins `pid` to the CPU of the host's affinity set that the fewest workers in service (not dead, not retiring)
  // are pinned to; returns it, or -1 if it could not be set.
  int pin_to_cpu(int pid) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (::sched_getaffinity(0, sizeof mine, &mine) != 0) return -1;
    int best = -1, best_users = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &mine)) continue;
      int users = 0;
      for (const auto& w : workers) users += w->cpu == cpu && !w->dead && w->state != WorkerState::kRetiring;
      if (best < 0 || users < best_users) best = cpu, best_users = users;
    }
    if (best < 0) return -1;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(best, &one);
    return ::sched_setaffinity(pid, sizeof one, &one) == 0 ? best : -1;
  }

  // A worker could not be started, or died before saying hello. After three in a row the pool stops trying
  // and sends every job to the host arena, so a missing or broken worker executable costs speed, not work.
  void start_failed(std::string why) {
    if (++consecutive_start_failures < 3) return;
    std::vector<std::unique_ptr<Job>> queued;
    {
      std::lock_guard lock(mu);
      if (!broken.empty()) return;
      broken = fmt::format("compile workers could not start ({}); compiling in the host instead", why);
      report_fallback_once("compile worker start", fmt::format("{} (a TBB arena in this process, not the process pool)", broken));
      stats.gave_up = broken;
      ready = false;
      ready_flag.store(false, std::memory_order_release);
      queued = queue.take_all();
    }
    for (auto& job : queued) forward_to_host(std::move(job));
  }

  void forward_to_host(std::unique_ptr<Job> job) {
    std::shared_ptr<Job> shared(std::move(job));
    Submission s = host->submit(shared->job);
    {
      std::lock_guard lock(mu);
      ++stats.jobs_in_host;
      --counters.submitted;  // the host arena counts it from now on
      forwarded.emplace(shared->id, s.future);
    }
    std::weak_ptr<Impl> weak = weak_from_this();
    Future<Binary> f = s.future;
    f.notify([weak, shared, f] {
      if (auto self = weak.lock()) {
        std::lock_guard lock(self->mu);
        self->forwarded.erase(shared->id);
      }
      shared->promise.set(f.get());
    });
  }

  void send(Worker& w, std::unique_ptr<Job> job) {
    wire::Request req;
    req.job_id = job->id;
    req.source = job->job.source;
    req.target = job->job.target;
    req.want_ptx = job->job.settings.want_ptx;
    req.use_pch = job->job.settings.use_pch;
    req.pch_dir = job->job.settings.pch_dir;
    Result<std::string> frame = wire::encode(req);
    if (!frame.ok()) {
      // A source too large for a frame: this job fails, the worker stays idle for the next.
      finish(*job, std::move(frame).status().with_context(fmt::format("sending {} to a compile worker", job->name())));
      return;
    }
    w.out += *frame;
    w.state = WorkerState::kBusy;
    w.deadline = Clock::now() + opt.job_timeout;
    emit(PoolEvent::Kind::kJobSent, w.pid, job->id, job->name());
    w.job = std::move(job);
    {
      std::lock_guard lock(mu);
      ++stats.jobs_in_workers;
      ++busy;
    }
    flush(w);
  }

  void flush(Worker& w) {
    while (!w.out.empty() && w.sock) {
      ssize_t n = ::send(w.sock.get(), w.out.data(), w.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        w.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        // EPIPE/ECONNRESET: the worker is gone; its stderr EOF (or the kill below) leads to the reap.
        w.out.clear();
        w.dead = true;
        return;
      }
    }
  }

  void read_stderr(Worker& w) {
    char buf[4096];
    while (w.err) {
      ssize_t n = ::read(w.err.get(), buf, sizeof buf);
      if (n > 0) {
        w.tail.append(buf, static_cast<size_t>(n));
        if (w.tail.size() > opt.stderr_tail_bytes) w.tail.erase(0, w.tail.size() - opt.stderr_tail_bytes);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        // EOF: every copy of the write end is closed, which for our worker means it has exited.
        w.err.reset();
        w.dead = true;
        return;
      }
    }
  }

  void read_socket(Worker& w) {
    char buf[65536];
    while (w.sock) {
      ssize_t n = ::recv(w.sock.get(), buf, sizeof buf, 0);
      if (n > 0) {
        w.in.append(buf, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        w.dead = true;
        break;
      }
    }
    while (!w.dead) {
      auto frame = codec::take_frame(wire::kProtocol, w.in);
      if (!frame.ok()) {
        protocol_failure(w, frame.status().to_string());
        return;
      }
      if (!frame->has_value()) break;
      const codec::Frame& f = **frame;
      if (f.type == static_cast<uint16_t>(wire::MessageType::kHello)) {
        auto hello = wire::decode<wire::Hello>(f.payload);
        if (!hello.ok() || w.state != WorkerState::kStarting) {
          protocol_failure(w, hello.ok() ? "a second hello" : hello.status().to_string());
          return;
        }
        on_hello(w);
      } else if (f.type == static_cast<uint16_t>(wire::MessageType::kReply)) {
        auto reply = wire::decode<wire::Reply>(f.payload);
        if (!reply.ok() || w.state != WorkerState::kBusy || !w.job || reply->job_id != w.job->id) {
          protocol_failure(w, reply.ok() ? "a reply for a job it was not given" : reply.status().to_string());
          return;
        }
        on_reply(w, std::move(reply->result));
      } else {
        protocol_failure(w, "a request frame");
        return;
      }
    }
  }

  void protocol_failure(Worker& w, std::string what) {
    w.protocol_error = fmt::format("sent a malformed message ({})", what);
    kill_worker(w, KillReason::kProtocol);
  }

  void on_hello(Worker& w) {
    w.state = WorkerState::kIdle;
    w.deadline = Clock::time_point::max();
    consecutive_start_failures = 0;
    double seconds = std::chrono::duration<double>(Clock::now() - w.spawned_at).count();
    bool now_ready = false;
    {
      std::lock_guard lock(mu);
      ++stats.workers_ready;
      stats.startup_seconds.push_back(seconds);
      if (stats.startup_seconds.size() > 1024) stats.startup_seconds.erase(stats.startup_seconds.begin());
      ++hellos;
      if (!ready && broken.empty() && hellos >= static_cast<uint64_t>(target)) {
        ready = true;
        now_ready = true;
        ready_flag.store(true, std::memory_order_release);
      }
    }
    emit(PoolEvent::Kind::kWorkerReady, w.pid, 0, {}, fmt::format("{:.1f} ms", seconds * 1e3));
    if (now_ready) {
      ready_cv.notify_all();
      emit(PoolEvent::Kind::kPoolReady, w.pid);
    }
  }

  void on_reply(Worker& w, Result<Binary> result) {
    std::unique_ptr<Job> job = std::move(w.job);
    {
      std::lock_guard lock(mu);
      --busy;
    }
    ++w.jobs_done;
    w.deadline = Clock::time_point::max();
    if (opt.max_jobs_per_worker > 0 && w.jobs_done >= opt.max_jobs_per_worker) {
      // Closing our end is the worker's signal to exit; its stderr EOF then leads to the reap.
      w.state = WorkerState::kRetiring;
      w.sock.reset();
      std::lock_guard lock(mu);
      ++stats.recycled;
    } else {
      w.state = WorkerState::kIdle;
    }
    emit(result.ok() ? PoolEvent::Kind::kJobDone : PoolEvent::Kind::kJobFailed, w.pid, job->id, job->name(),
         result.ok() ? std::string() : result.status().to_string());
    // The worker's next job goes out before this one's completion is handled (its callbacks, the other
    // descriptors of this poll round): the worker compiles while the host does its bookkeeping.
    dispatch_to(w);
    finish(*job, std::move(result));
  }

  // Hands an idle worker the best queued job, if any (and the pool is neither shutting down nor given up).
  void dispatch_to(Worker& w) {
    if (w.state != WorkerState::kIdle || w.dead || !w.sock || w.kill_reason != KillReason::kNone || shutdown_begun) return;
    std::unique_ptr<Job> job;
    {
      std::lock_guard lock(mu);
      if (!broken.empty()) return;
      job = queue.pop();
    }
    if (job) send(w, std::move(job));
  }

  void kill_worker(Worker& w, KillReason why) {
    if (w.kill_reason == KillReason::kNone) w.kill_reason = why;
    // Safe from pid reuse: the worker is not reaped until reap() below. Its whole process group goes: a
    // "worker" that is a script leaves children holding its stderr, and reap() would wait on them.
    ::kill(-w.pid, SIGKILL);
    ::kill(w.pid, SIGKILL);
  }

  // Waits for a dead (or killed) worker, fails its job if it had one, and forgets it.
  void reap(Worker& w) {
    // A reply it wrote before exiting (a recycled worker, say) is still in the socket: take it first.
    if (w.sock) read_socket(w);
    // Its stderr may still hold the last lines; once the process is gone the pipe ends, so reading until
    // EOF cannot block for long. A worker whose socket broke but which is still alive is killed first.
    if (w.err) {
      ::kill(-w.pid, SIGKILL);
      ::kill(w.pid, SIGKILL);
      // Bounded: a descendant that left the group can hold the pipe open forever.
      const auto until = Clock::now() + std::chrono::seconds(2);
      while (w.err && Clock::now() < until) {
        pollfd p{w.err.get(), POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) read_stderr(w);
      }
    }
    int status = 0;
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!w.pch_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(w.pch_dir, ec);
    }
    std::string how = describe_wait_status(status);
    const bool started = w.state != WorkerState::kStarting;
    // Why a worker that never said hello went: what the handshake (check_compile_worker) reports.
    if (!started && w.kill_reason == KillReason::kProtocol) how += "; it " + w.protocol_error;
    if (!started && w.kill_reason == KillReason::kStartup) {
      how += fmt::format(" after saying no hello within {:.3g} s", std::chrono::duration<double>(opt.startup_timeout).count());
    }
    {
      std::lock_guard lock(mu);
      pids.erase(std::remove(pids.begin(), pids.end(), w.pid), pids.end());
      stats.workers_alive = static_cast<int>(pids.size());
      if (started) --stats.workers_ready;
      if (w.kill_reason == KillReason::kNone && w.state != WorkerState::kRetiring && !shutdown_begun) ++stats.crashes;
      if (w.kill_reason == KillReason::kTimeout) ++stats.timeouts;
    }
    // Before the event, so that whoever waits for the exit sees the pool's verdict (gave_up) too.
    if (!started && w.kill_reason != KillReason::kShutdown) {
      start_failed(
          fmt::format("worker pid {} {} before it was ready; stderr: {}", w.pid, how, stderr_tail_lines(w.tail)));
    }
    emit(PoolEvent::Kind::kWorkerExited, w.pid, 0, {}, how);
    if (w.job) {
      std::unique_ptr<Job> job = std::move(w.job);
      {
        std::lock_guard lock(mu);
        --busy;
      }
      Status s = job_error(w, *job, how);
      emit(PoolEvent::Kind::kJobFailed, w.pid, job->id, job->name(), s.to_string());
      finish(*job, std::move(s));
    }
  }

  Status job_error(const Worker& w, const Job& job, const std::string& how) {
    const std::string& name = job.name();
    switch (w.kill_reason) {
      case KillReason::kTimeout:
        return make_error(ErrorCode::kTimeout,
                          fmt::format("compile of '{}' timed out after {:.3g} s; its worker (pid {}) was killed; "
                                      "stderr: {}",
                                      name, std::chrono::duration<double>(opt.job_timeout).count(), w.pid,
                                      stderr_tail_lines(w.tail)),
                          w.tail);
      case KillReason::kCancel:
        return make_error(ErrorCode::kCancelled,
                          fmt::format("compile of '{}' cancelled; its worker (pid {}) was killed", name, w.pid));
      case KillReason::kShutdown:
        return make_error(ErrorCode::kShutdown, fmt::format("pool shut down while compiling '{}'", name));
      case KillReason::kProtocol:
        return make_error(ErrorCode::kWorkerCrashed,
                          fmt::format("compile worker (pid {}) {} while compiling '{}' and was killed; stderr: {}",
                                      w.pid, w.protocol_error, name, stderr_tail_lines(w.tail)),
                          w.tail);
      case KillReason::kStartup:
      case KillReason::kNone:
        break;
    }
    return make_error(ErrorCode::kWorkerCrashed,
                      fmt::format("compile worker (pid {}) {} while compiling '{}'; stderr: {}", w.pid, how, name,
                                  stderr_tail_lines(w.tail)),
                      w.tail);
  }

  void begin_shutdown() {
    shutdown_begun = true;
    shutdown_deadline = Clock::now() + std::chrono::seconds(5);
    for (auto& w : workers) {
      if (w->state == WorkerState::kBusy || w->state == WorkerState::kStarting) {
        kill_worker(*w, KillReason::kShutdown);
      } else if (w->state == WorkerState::kIdle) {
        w->state = WorkerState::kRetiring;
        w->sock.reset();  // EOF: the worker exits by itself
      }
    }
  }

  void io_loop() {
    for (int i = 0; i < target; ++i) spawn_worker();
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, bool>> who;  // (worker, is_socket) for each fd after the first
    while (true) {
      // Requests from other threads.
      std::vector<JobId> to_cancel;
      bool stopping;
      {
        std::lock_guard lock(mu);
        to_cancel.swap(cancels);
        stopping = shutting_down;
      }
      for (JobId id : to_cancel) {
        for (auto& w : workers) {
          if (w->job && w->job->id == id) kill_worker(*w, KillReason::kCancel);
        }
      }
      if (stopping && !shutdown_begun) begin_shutdown();

      // Reap the dead.
      for (size_t i = 0; i < workers.size();) {
        if (workers[i]->dead) {
          reap(*workers[i]);
          workers.erase(workers.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (shutdown_begun && workers.empty()) break;

      // Keep the pool at strength, then hand out work.
      bool gave_up;
      {
        std::lock_guard lock(mu);
        gave_up = !broken.empty();
      }
      if (!shutdown_begun && !gave_up) {
        int live = 0;
        for (auto& w : workers) live += w->state != WorkerState::kRetiring;
        for (; live < target; ++live) spawn_worker();
      }
      if (!shutdown_begun) {
        for (auto& w : workers) {
          if (w->state != WorkerState::kIdle) continue;
          std::unique_ptr<Job> job;
          {
            std::lock_guard lock(mu);
            job = queue.pop();
          }
          if (!job) break;
          send(*w, std::move(job));
        }
      }

      // Timeouts.
      Clock::time_point now = Clock::now();
      Clock::time_point next = Clock::time_point::max();
      for (auto& w : workers) {
        if (w->kill_reason != KillReason::kNone) continue;
        if (now >= w->deadline) {
          kill_worker(*w, w->state == WorkerState::kBusy ? KillReason::kTimeout : KillReason::kStartup);
        } else {
          next = std::min(next, w->deadline);
        }
      }
      if (shutdown_begun) {
        if (now >= shutdown_deadline) {
          for (auto& w : workers) kill_worker(*w, KillReason::kShutdown);
        } else {
          next = std::min(next, shutdown_deadline);
        }
      }
      int timeout_ms = -1;
      if (next != Clock::time_point::max()) {
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
      }

      fds.clear();
      who.clear();
      fds.push_back({wake_fd.get(), POLLIN, 0});
      for (auto& w : workers) {
        if (w->err) {
          fds.push_back({w->err.get(), POLLIN, 0});
          who.emplace_back(w.get(), false);
        }
        if (w->sock) {
          short events = POLLIN;
          if (!w->out.empty()) events |= POLLOUT;
          fds.push_back({w->sock.get(), events, 0});
          who.emplace_back(w.get(), true);
        }
      }
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        // Cannot happen with valid descriptors; avoid spinning if it does.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (n <= 0) continue;
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        ssize_t r = ::read(wake_fd.get(), &v, sizeof v);
        (void)r;
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [w, is_sock] = who[i - 1];
        if (is_sock) {
          if (fds[i].revents & POLLOUT) flush(*w);
          if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_socket(*w);
        } else {
          read_stderr(*w);
        }
      }
    }
  }
};

ProcessPool::ProcessPool(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessPool::~ProcessPool() { shutdown(); }

Result<std::unique_ptr<ProcessPool>> ProcessPool::start(ProcessPoolOptions options) {
  if (options.workers < 0) return make_error(ErrorCode::kInvalidArgument, "ProcessPoolOptions::workers < 0");
  if (options.job_timeout <= std::chrono::milliseconds(0)) {
    return make_error(ErrorCode::kInvalidArgument, "ProcessPoolOptions::job_timeout must be positive");
  }
  KILN_ASSIGN_OR_RETURN(std::string path, find_worker_executable(options.worker_path));
  remove_orphaned_pch_dirs();
  auto impl = std::make_shared<Impl>();
  impl->worker_path = std::move(path);
  impl->target = options.workers > 0 ? options.workers : available_cores();
  KILN_ASSIGN_OR_RETURN(impl->pin, switch_setting(options.pin_workers, "KILN_POOL_PIN", false));
  KILN_ASSIGN_OR_RETURN(impl->huge_text, switch_setting(options.huge_text, "KILN_POOL_HUGE_TEXT", kDefaultHugeText));
  impl->nice = kDefaultWorkerNice;
  if (options.worker_nice) {
    impl->nice = *options.worker_nice;
    if (impl->nice < 0 || impl->nice > 19) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("ProcessPoolOptions::worker_nice is {} (give 0-19)", impl->nice));
    }
  } else if (const char* v = std::getenv("KILN_POOL_NICE"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || errno != 0 || n < 0 || n > 19) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("KILN_POOL_NICE is '{}' (give 0-19)", v));
    }
    impl->nice = static_cast<int>(n);
  }
  impl->callbacks = options.callbacks ? options.callbacks : default_task_runner();
  if (options.stderr_tail_bytes == 0) options.stderr_tail_bytes = 1;
  ArenaOptions host;
  host.threads = options.host_threads > 0 ? options.host_threads : impl->target;
  host.compile = options.host_compile;
  host.callbacks = impl->callbacks;
  impl->host = make_arena_executor(std::move(host));
  impl->opt = std::move(options);
  impl->wake_fd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake_fd) return make_error(ErrorCode::kIoError, fmt::format("eventfd failed: {}", std::strerror(errno)));
  // The thread keeps its Impl alive: the pool's last owner may let go on this very thread (a completion
  // callback holding a gate that holds the pool), and shutdown() then detaches instead of joining itself.
  impl->io = std::thread([self = impl] { self->io_loop(); });
  return std::unique_ptr<ProcessPool>(new ProcessPool(std::move(impl)));
}

bool ProcessPool::ready() const { return impl_->ready_flag.load(std::memory_order_acquire); }

bool ProcessPool::wait_ready(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->ready_cv.wait_for(lock, timeout, [&] { return impl_->ready; });
}

std::vector<int> ProcessPool::worker_pids() const {
  std::lock_guard lock(impl_->mu);
  return impl_->pids;
}

ProcessPoolStats ProcessPool::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

const std::string& ProcessPool::worker_path() const { return impl_->worker_path; }

Submission ProcessPool::submit(CompileJob job) { return impl_->submit(std::move(job)); }

void ProcessPool::raise_priority(JobId id, Priority priority) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->queue.raise(id, priority)) return;
  }
  impl_->host->raise_priority(id, priority);
}

void ProcessPool::shutdown() {
  std::vector<std::unique_ptr<Job>> queued;
  {
    std::lock_guard lock(impl_->mu);
    impl_->shutting_down = true;
    queued = impl_->queue.take_all();
  }
  for (auto& job : queued) impl_->finish(*job, pool_detail::shutdown_error(job->name()));
  impl_->wake();
  std::call_once(impl_->join_once, [&] {
    if (!impl_->io.joinable()) return;
    if (impl_->io.get_id() == std::this_thread::get_id()) {
      impl_->io.detach();  // joining itself would throw; the loop ends on its own once this callback returns
    } else {
      impl_->io.join();
    }
  });
  impl_->host->shutdown();
}

int ProcessPool::concurrency() const { return impl_->target; }

ExecutorCounters ProcessPool::counters() const {
  ExecutorCounters host = impl_->host->counters();
  std::lock_guard lock(impl_->mu);
  ExecutorCounters c = impl_->counters;
  c.submitted += host.submitted;
  c.completed += host.completed;
  c.failed += host.failed;
  c.cancelled += host.cancelled;
  c.queued = impl_->queue.size() + host.queued;
  c.running = host.running + impl_->busy;
  return c;
}

}  // namespace kiln
