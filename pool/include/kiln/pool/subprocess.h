// Worker processes: how kiln finds, starts and describes the helper executables it runs work in (the process
// pool's kiln-compile-worker, the runtime's kiln-bench-worker), so every worker is started the same careful way.
//
// A worker is started with posix_spawn, never a fork() of the host (which may hold threads, locks and a CUDA
// context). It gets a socket pair end as fd 3 for its protocol, stdout and stderr on a pipe whose tail the host
// keeps for error messages, /dev/null as stdin, no other descriptor, default SIGPIPE/SIGINT/SIGTERM and its own
// process group (a terminal's Ctrl-C goes to the host, which decides). The worker sets PR_SET_PDEATHSIG itself;
// that signal follows the *thread* that spawned it, so spawn from a thread that lives as long as the worker
// should.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln {

/// An owned file descriptor: closed when destroyed or reset. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  /// Closes the descriptor (if any).
  void reset();

 private:
  int fd_ = -1;
};

/// A started worker. `pid` is a child of this process that the caller must reap (waitpid); `sock` is the host
/// end of the socket pair that is fd 3 in the worker; `err` the read end of its stdout and stderr. Both host
/// ends are close-on-exec and non-blocking.
struct WorkerProcess {
  int pid = -1;
  Fd sock;
  Fd err;
};

/// Starts `path --parent-pid <this pid> --fd 3 [extra_args...]` as described at the top of this header. The
/// environment is this process's, with each "NAME=value" of `env` added or replacing the inherited entry.
/// kIoError naming the call that failed (socketpair, pipe2, posix_spawn).
Result<WorkerProcess> spawn_worker_process(const std::string& path, const std::vector<std::string>& env,
                                           const std::vector<std::string>& extra_args = {});

/// How a reaped process ended, from waitpid's status: "killed by signal 9 (Killed)", "exited with status 3".
std::string describe_wait_status(int status);

/// The last `max_lines` lines of a worker's stderr tail on one line ('|' between lines, at most `max_chars`),
/// for a one-line error message; "(empty)" when there are none.
std::string stderr_tail_lines(const std::string& tail, size_t max_lines = 3, size_t max_chars = 400);

/// Finds the helper executable `name`: `explicit_path` when given (kNotFound if it is not executable), else
/// the path in environment variable `env_var`, else `name` next to the running executable, else relative to
/// the file kiln's code was loaded from (libkiln.so, or the executable it is linked into): beside it, in
/// ../libexec/kiln/ or in ../bin/. kNotFound listing the places tried, followed by `hint`.
Result<std::string> find_helper_executable(std::string_view name, const char* env_var,
                                           const std::string& explicit_path, std::string_view hint);

/// The file kiln's code was loaded from (dladdr): libkiln.so, or the executable kiln is linked into statically.
/// Empty when it cannot be told.
std::filesystem::path loaded_from();

/// Prints "kiln: <message>" on stderr the first time `what` is reported in this process: where kiln takes a
/// fallback (a missing worker executable, workers that do not answer) it says so once, never silently.
void report_fallback_once(const std::string& what, const std::string& message);

}  // namespace kiln
