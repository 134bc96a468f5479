// Internal: the state behind RedisTier, shared by redis_tier.cpp (read-through, write-behind) and sync.cpp
// (push, pull, summaries).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "breaker.h"
#include "kiln/cache/remote.h"
#include "kiln/cache/sealed.h"
#include "redis_connection.h"

namespace kiln::cache {

void log_reachable_again(std::string_view where);

struct RedisTier::Impl {
  RemoteOptions opt;
  RemoteUrl url;
  std::string where;  // url.display()
  std::optional<SigningKey> key;
  SealPolicy policy;
  CircuitBreaker breaker;

  std::mutex read_mu;
  std::unique_ptr<RedisConnection> read_conn;  // lookups, one at a time

  // The write-behind queue.
  using Entry = std::variant<Binary, TimingRecord, Decision>;
  struct Queued {
    Entry entry;
    size_t bytes = 0;
  };
  std::mutex q_mu;
  std::condition_variable q_cv, idle_cv;
  std::deque<Queued> queue;
  size_t queue_bytes = 0;
  size_t in_flight = 0;
  bool stopping = false;
  std::unique_ptr<RedisConnection> write_conn;  // the writer thread's
  std::jthread writer;

  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, refused_unsigned{0}, refused_signature{0}, refused_malformed{0},
        errors{0}, skipped{0}, queued{0}, published{0}, queue_drops{0}, write_errors{0}, withheld{0};
  } n;
  mutable std::mutex err_mu;
  std::string last_error;
  bool reported_write_refusal = false;

  explicit Impl(RemoteOptions o);

  void note_error(const Status& s);
  // A call failed to reach the remote: counts it for the breaker and logs the outage once.
  void note_unreachable(const Status& s);
  void count_refusal(Refusal why, std::string_view slot, const Status& s);

  /// Runs `fn` on `conn` (connecting first when needed) if the breaker allows; nullopt when skipped (counted
  /// in `*skipped`) or failed (the connection is dropped, the failure counted in `*failed` and by the breaker).
  template <class T>
  std::optional<T> attempt(std::unique_ptr<RedisConnection>& conn, const std::function<Result<T>(RedisConnection&)>& fn,
                           std::atomic<uint64_t>* skipped, std::atomic<uint64_t>* failed);

  /// A connection outside the breaker, for commands a person runs (push, pull, stats, ping).
  Result<std::unique_ptr<RedisConnection>> connect_now() const;

  bool may_send_binaries() const { return key.has_value() || opt.allow_unsigned_binaries; }
  void enqueue(Entry e, size_t bytes);
  void write_loop();
  // The commands that store `e` (SET or HSET), sealed.
  std::vector<std::string> store_command(const Entry& e) const;
};

template <class T>
std::optional<T> RedisTier::Impl::attempt(std::unique_ptr<RedisConnection>& conn,
                                          const std::function<Result<T>(RedisConnection&)>& fn,
                                          std::atomic<uint64_t>* skipped, std::atomic<uint64_t>* failed) {
  if (!breaker.allow()) {
    if (skipped) ++*skipped;
    return std::nullopt;
  }
  if (!conn) {
    auto c = RedisConnection::connect(url, opt.connect_timeout, opt.read_timeout);
    if (!c.ok()) {
      if (failed) ++*failed;
      note_unreachable(c.status());
      return std::nullopt;
    }
    conn = std::move(c).value();
  }
  auto r = fn(*conn);
  if (!r.ok()) {
    conn.reset();
    if (failed) ++*failed;
    note_unreachable(r.status());
    return std::nullopt;
  }
  if (breaker.success()) log_reachable_again(where);
  return std::move(r).value();
}

}  // namespace kiln::cache
