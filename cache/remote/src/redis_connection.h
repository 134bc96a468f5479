// Internal: one blocking hiredis connection with kiln's timeouts, and Redis replies as values. Not
// thread-safe: the tier keeps one per thread that talks to Redis (lookups under a mutex, the writer its own).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/remote.h"
#include "kiln/status.h"

struct redisContext;

namespace kiln::cache {

/// A reply, copied out of hiredis.
struct Reply {
  enum Type { kNil, kString, kInteger, kArray, kStatus, kError } type = kNil;
  std::string str;          // kString, kStatus, kError
  long long integer = 0;    // kInteger
  std::vector<Reply> elements;  // kArray
};

class RedisConnection {
 public:
  /// Connects (within connect_timeout), authenticates and selects the database. Errors: kUnavailable
  /// (refused, unreachable, authentication failed), kTimeout; messages name url.display(), never the password.
  static Result<std::unique_ptr<RedisConnection>> connect(const RemoteUrl& url, std::chrono::milliseconds connect_timeout,
                                                          std::chrono::milliseconds read_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// One command. An error reply is a Reply of type kError, not an error Status: the connection still works.
  /// Errors (the connection is then broken; drop it): kTimeout, kUnavailable.
  Result<Reply> command(const std::vector<std::string_view>& args);
  /// Several commands written at once, then their replies in order (one round trip). Errors as command().
  Result<std::vector<Reply>> pipeline(const std::vector<std::vector<std::string>>& commands);

 private:
  RedisConnection(redisContext* c, std::string where, std::chrono::milliseconds read_timeout)
      : c_(c), where_(std::move(where)), read_timeout_(read_timeout) {}
  Status broken(std::string_view doing);

  redisContext* c_;
  std::string where_;
  std::chrono::milliseconds read_timeout_;
};

}  // namespace kiln::cache
