#include "kiln/pool/subprocess.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <fmt/format.h>

extern char** environ;

namespace kiln {
namespace {

// posix_spawn's attribute and file-action objects, destroyed on every path.
struct SpawnAttr {
  posix_spawnattr_t a;
  SpawnAttr() { posix_spawnattr_init(&a); }
  ~SpawnAttr() { posix_spawnattr_destroy(&a); }
};
struct SpawnActions {
  posix_spawn_file_actions_t a;
  SpawnActions() { posix_spawn_file_actions_init(&a); }
  ~SpawnActions() { posix_spawn_file_actions_destroy(&a); }
};

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<WorkerProcess> spawn_worker_process(const std::string& path, const std::vector<std::string>& env,
                                           const std::vector<std::string>& extra_args) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return make_error(ErrorCode::kIoError, fmt::format("socketpair failed: {}", std::strerror(errno)));
  }
  Fd host_sock(sv[0]), child_sock(sv[1]);
  int ep[2];
  if (::pipe2(ep, O_CLOEXEC) != 0) {
    return make_error(ErrorCode::kIoError, fmt::format("pipe2 failed: {}", std::strerror(errno)));
  }
  Fd err_read(ep[0]), err_write(ep[1]);
  // Move the child's ends above the descriptors the file actions write (0-3), so that no dup2 below
  // overwrites another end before it is used.
  Fd child_sock_hi(fcntl(child_sock.get(), F_DUPFD_CLOEXEC, 10));
  Fd err_write_hi(fcntl(err_write.get(), F_DUPFD_CLOEXEC, 10));
  if (!child_sock_hi || !err_write_hi) {
    return make_error(ErrorCode::kIoError, fmt::format("fcntl(F_DUPFD_CLOEXEC) failed: {}", std::strerror(errno)));
  }

  SpawnActions actions;
  posix_spawn_file_actions_addopen(&actions.a, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions.a, err_write_hi.get(), 1);
  posix_spawn_file_actions_adddup2(&actions.a, err_write_hi.get(), 2);
  posix_spawn_file_actions_adddup2(&actions.a, child_sock_hi.get(), 3);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Descriptors the application opened without O_CLOEXEC must not leak into workers either.
  posix_spawn_file_actions_addclosefrom_np(&actions.a, 4);
#endif
  SpawnAttr attr;
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr.a, &none);
  posix_spawnattr_setsigdefault(&attr.a, &defaults);
  // Its own process group: a terminal's Ctrl-C goes to the host, which decides; PDEATHSIG covers its death.
  posix_spawnattr_setpgroup(&attr.a, 0);
  posix_spawnattr_setflags(&attr.a, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);

  std::vector<std::string> args = {path, "--parent-pid", std::to_string(::getpid()), "--fd", "3"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> extra = env;
  std::vector<char*> envp;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    bool overridden = false;
    for (const auto& x : extra) {
      size_t eq = x.find('=');
      if (eq != std::string::npos && entry.substr(0, eq + 1) == std::string_view(x).substr(0, eq + 1)) {
        overridden = true;
      }
    }
    if (!overridden) envp.push_back(*e);
  }
  for (auto& x : extra) envp.push_back(x.data());
  envp.push_back(nullptr);

  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, path.c_str(), &actions.a, &attr.a, argv.data(), envp.data());
  if (rc != 0) {
    return make_error(ErrorCode::kIoError, fmt::format("posix_spawn({}) failed: {}", path, std::strerror(rc)));
  }
  WorkerProcess w;
  w.pid = pid;
  w.sock = std::move(host_sock);
  w.err = std::move(err_read);
  set_nonblocking(w.sock.get());
  set_nonblocking(w.err.get());
  return w;
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return fmt::format("killed by signal {} ({})", sig, name ? name : "unknown");
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return fmt::format("ended with wait status {:#x}", status);
}

std::string stderr_tail_lines(const std::string& tail, size_t max_lines, size_t max_chars) {
  std::string_view t(tail);
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
  if (t.empty()) return "(empty)";
  size_t pos = t.size();
  for (size_t lines = 0; lines < max_lines && pos > 0; ++lines) {
    size_t nl = t.rfind('\n', pos - 1);
    pos = nl == std::string_view::npos ? 0 : nl;
    if (nl == std::string_view::npos) break;
  }
  std::string_view out = t.substr(pos);
  if (!out.empty() && out.front() == '\n') out.remove_prefix(1);
  if (out.size() > max_chars) out = out.substr(out.size() - max_chars);
  std::string s(out);
  std::replace(s.begin(), s.end(), '\n', '|');
  return s;
}

std::filesystem::path loaded_from() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_helper_executable), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path(info.dli_fname) : p;
}

void report_fallback_once(const std::string& what, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  {
    std::lock_guard lock(mu);
    if (!said.insert(what).second) return;
  }
  std::fprintf(stderr, "kiln: %s\n", message.c_str());
}

Result<std::string> find_helper_executable(std::string_view name, const char* env_var,
                                           const std::string& explicit_path, std::string_view hint) {
  auto usable = [](const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; };
  if (!explicit_path.empty()) {
    if (usable(explicit_path)) return explicit_path;
    return make_error(ErrorCode::kNotFound, fmt::format("{} '{}' is not an executable file", name, explicit_path));
  }
  std::vector<std::string> tried;
  if (const char* env = env_var ? std::getenv(env_var) : nullptr; env && *env) {
    if (usable(env)) return std::string(env);
    tried.push_back(fmt::format("${}={}", env_var, env));
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::string next_to = (self.parent_path() / name).string();
    if (usable(next_to)) return next_to;
    tried.push_back(next_to);
  }
  // Relative to the file this code was loaded from (libkiln.so wherever it was installed or unpacked, or the
  // executable kiln is linked into): never a path fixed when kiln was configured, so a relocated install works.
  const std::filesystem::path here = loaded_from();
  if (!here.empty()) {
    const std::filesystem::path dir = here.parent_path();
    for (const auto& candidate : {dir / name, dir / ".." / "libexec" / "kiln" / name, dir / ".." / "bin" / name}) {
      std::string p = candidate.lexically_normal().string();
      if (std::find(tried.begin(), tried.end(), p) != tried.end()) continue;
      if (usable(p)) return p;
      tried.push_back(p);
    }
  }
  std::string list;
  for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
  return make_error(ErrorCode::kNotFound, fmt::format("no {} executable found (tried {}); {}", name, list, hint));
}

}  // namespace kiln
