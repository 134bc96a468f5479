// A real redis-server for tests: started on a free loopback port (and a unix socket) in a temporary folder,
// ready once it answers PING (polled against a deadline, never a fixed sleep), killed and removed at the end.
// The binary: $KILN_REDIS_SERVER, else redis-server on PATH; tests skip with a message when there is none.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kiln::test {

/// A loopback TCP port nothing listens on now (bound, read back, closed).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

inline std::string find_redis_server() {
  if (const char* e = std::getenv("KILN_REDIS_SERVER"); e && *e) return std::filesystem::exists(e) ? e : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/usr/sbin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/redis-server";
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  for (const char* c : {"/usr/bin/redis-server", "/usr/sbin/redis-server"}) {
    if (::access(c, X_OK) == 0) return c;
  }
  return "";
}

class RedisServer {
 public:
  /// Starts one; `extra` are more redis-server arguments ("--maxmemory", "1mb", ...). Check ok() (and
  /// error()) after.
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
    binary_ = find_redis_server();
    if (binary_.empty()) {
      error_ = "no redis-server (install the redis-server package, or set KILN_REDIS_SERVER)";
      return;
    }
    char tmpl[] = "/tmp/kiln-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    for (int attempt = 0; attempt < 3 && !ok(); ++attempt) start();
  }
  ~RedisServer() {
    kill_now();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool ok() const { return pid_ > 0 && error_.empty(); }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string url(int db = 0) const { return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db); }
  std::string socket_path() const { return dir_ + "/redis.sock"; }
  const std::string& dir() const { return dir_; }

  /// SIGSTOP: the socket still accepts connections (the kernel does), but nothing answers.
  void pause() { if (pid_ > 0) ::kill(pid_, SIGSTOP); }
  void resume() { if (pid_ > 0) ::kill(pid_, SIGCONT); }
  /// SIGKILL and reap: the port closes.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  /// One command through hiredis, for tests to look at or damage what kiln stored. Null on failure.
  redisReply* command(const std::vector<std::string>& args) const {
    redisContext* c = connect();
    if (!c) return nullptr;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, int(argv.size()), argv.data(), lens.data()));
    redisFree(c);
    return r;
  }
  /// Every key matching `pattern` (KEYS: fine for a test's small database).
  std::vector<std::string> keys(const std::string& pattern, int db = 0) const {
    std::vector<std::string> out;
    redisContext* c = connect();
    if (!c) return out;
    std::string sel = std::to_string(db);
    const char* sv[] = {"SELECT", sel.c_str()};
    size_t sl[] = {6, sel.size()};
    if (auto* r = static_cast<redisReply*>(redisCommandArgv(c, 2, sv, sl))) freeReplyObject(r);
    const char* argv[] = {"KEYS", pattern.c_str()};
    size_t lens[] = {4, pattern.size()};
    if (auto* r = static_cast<redisReply*>(redisCommandArgv(c, 2, argv, lens))) {
      for (size_t i = 0; i < r->elements; ++i) out.emplace_back(r->element[i]->str, r->element[i]->len);
      freeReplyObject(r);
    }
    redisFree(c);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  redisContext* connect() const {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c && c->err) {
      redisFree(c);
      return nullptr;
    }
    if (c) redisSetTimeout(c, tv);
    return c;
  }

  void start() {
    error_.clear();
    port_ = free_port();
    std::vector<std::string> args = {binary_, "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                     "--dir", dir_, "--save", "", "--appendonly", "no", "--daemonize", "no",
                                     "--logfile", dir_ + "/redis.log", "--unixsocket", socket_path(),
                                     "--unixsocketperm", "700"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary_.c_str(), argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "redis-server exited at start (see its log in " + dir_ + ")";
        return;
      }
      if (redisReply* r = command({"PING"})) {
        bool pong = r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG";
        freeReplyObject(r);
        if (pong) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling its start, bounded by the deadline
    }
    error_ = "redis-server did not answer PING within 20 s";
    kill_now();
  }

  std::string binary_, dir_, error_;
  std::vector<std::string> extra_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace kiln::test

// Without a redis-server the test fails (setup.sh installs one), unless KILN_ALLOW_NO_REDIS=1 says to skip.
#define KILN_REQUIRE_REDIS(server)                                                          \
  do {                                                                                      \
    if (!(server).ok()) {                                                                   \
      const char* allow = std::getenv("KILN_ALLOW_NO_REDIS");                               \
      if (allow && std::string(allow) == "1") GTEST_SKIP() << (server).error();             \
      FAIL() << (server).error() << " (KILN_ALLOW_NO_REDIS=1 skips the Redis tests)";       \
    }                                                                                       \
  } while (0)
