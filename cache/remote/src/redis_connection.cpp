#include "redis_connection.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>

#include <fmt/format.h>

#include <cerrno>
#include <ctime>
#include <string_view>

namespace kiln::cache {
namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = ms.count() / 1000;
  tv.tv_usec = (ms.count() % 1000) * 1000;
  return tv;
}

// hiredis writes with write(2): a peer that closed the connection raises SIGPIPE, which would kill the
// process. Blocks it on this thread for the call and consumes one raised meanwhile, leaving the process's
// disposition alone (it belongs to the application).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false, blocked_ = false;
};

Reply convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = Reply::kString; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_STATUS: out.type = Reply::kStatus; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_ERROR: out.type = Reply::kError; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_INTEGER: out.type = Reply::kInteger; out.integer = r->integer; break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default: out.type = Reply::kNil; break;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<RedisConnection>> RedisConnection::connect(const RemoteUrl& url,
                                                                  std::chrono::milliseconds connect_timeout,
                                                                  std::chrono::milliseconds read_timeout) {
  SigpipeGuard guard;
  const std::string where = url.display();
  redisContext* c = url.socket.empty() ? redisConnectWithTimeout(url.host.c_str(), url.port, to_timeval(connect_timeout))
                                       : redisConnectUnixWithTimeout(url.socket.c_str(), to_timeval(connect_timeout));
  if (c == nullptr) return make_error(ErrorCode::kUnavailable, fmt::format("cannot connect to {}: out of memory", where));
  if (c->err) {
    std::string why = c->errstr;
    redisFree(c);
    // hiredis reports a connect that ran out of time as an I/O error with ETIMEDOUT's or EINPROGRESS's text.
    bool timed_out = why.find("timed out") != std::string::npos || why.find("in progress") != std::string::npos;
    return make_error(timed_out ? ErrorCode::kTimeout : ErrorCode::kUnavailable,
                      timed_out ? fmt::format("cannot connect to {}: no answer within {} ms", where, connect_timeout.count())
                                : fmt::format("cannot connect to {}: {}", where, why));
  }
  redisSetTimeout(c, to_timeval(read_timeout));
  std::unique_ptr<RedisConnection> conn(new RedisConnection(c, where, read_timeout));
  if (!url.password.empty()) {
    std::vector<std::string_view> auth{"AUTH"};
    if (!url.user.empty()) auth.push_back(url.user);
    auth.push_back(url.password);
    KILN_ASSIGN_OR_RETURN(Reply r, conn->command(auth));
    if (r.type == Reply::kError) {
      // The reply names no secret ("WRONGPASS invalid username-password pair"), but keep only its first word.
      return make_error(ErrorCode::kUnavailable,
                        fmt::format("{} refused the credentials in the URL ({})", where, r.str.substr(0, r.str.find(' '))));
    }
  }
  if (url.db != 0) {
    const std::string db = std::to_string(url.db);
    KILN_ASSIGN_OR_RETURN(Reply r, conn->command({"SELECT", db}));
    if (r.type == Reply::kError) {
      return make_error(ErrorCode::kUnavailable, fmt::format("{}: SELECT {} failed: {}", where, db, r.str));
    }
  }
  return conn;
}

RedisConnection::~RedisConnection() {
  if (c_) redisFree(c_);
}

Status RedisConnection::broken(std::string_view doing) {
  // A read past SO_RCVTIMEO fails with EAGAIN; hiredis keeps its text.
  const std::string_view why = c_->errstr;
  const bool timed_out = c_->err == REDIS_ERR_IO && (why.find("temporarily unavailable") != std::string_view::npos ||
                                                     why.find("timed out") != std::string_view::npos);
  if (timed_out) {
    return make_error(ErrorCode::kTimeout,
                      fmt::format("{} did not answer {} within {} ms", where_, doing, read_timeout_.count()));
  }
  return make_error(ErrorCode::kUnavailable, fmt::format("{}: {} failed: {}", where_, doing,
                                                         c_->errstr[0] ? c_->errstr : "connection lost"));
}

Result<Reply> RedisConnection::command(const std::vector<std::string_view>& args) {
  SigpipeGuard guard;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  errno = 0;
  auto* r = static_cast<redisReply*>(redisCommandArgv(c_, int(argv.size()), argv.data(), lens.data()));
  if (r == nullptr) return broken(args.empty() ? "a command" : std::string(args[0]));
  Reply out = convert(r);
  freeReplyObject(r);
  return out;
}

Result<std::vector<Reply>> RedisConnection::pipeline(const std::vector<std::vector<std::string>>& commands) {
  SigpipeGuard guard;
  for (const auto& cmd : commands) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, int(argv.size()), argv.data(), lens.data()) != REDIS_OK) return broken("a pipeline");
  }
  std::vector<Reply> out;
  out.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    errno = 0;
    if (redisGetReply(c_, &raw) != REDIS_OK || raw == nullptr) return broken(commands[i].empty() ? "a pipeline" : commands[i][0]);
    out.push_back(convert(static_cast<redisReply*>(raw)));
    freeReplyObject(raw);
  }
  return out;
}

}  // namespace kiln::cache
