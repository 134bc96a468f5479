// The compile worker handshake, run on the host side through the pool itself: one worker, and the pool's own
// checks of its hello (frame magic and wire version, then the hello message) decide.
#include <condition_variable>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "kiln/pool/process_pool.h"

namespace kiln {

Status check_compile_worker(const std::string& path, std::chrono::milliseconds timeout) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::string> failure;  // set once: "" for a hello, else how the worker ended
  ProcessPoolOptions o;
  o.workers = 1;
  o.worker_path = path;
  o.startup_timeout = timeout;
  o.host_threads = 1;
  o.observer = [&](const PoolEvent& e) {
    if (e.kind != PoolEvent::Kind::kWorkerReady && e.kind != PoolEvent::Kind::kWorkerExited) return;
    std::lock_guard lock(mu);
    if (!failure) failure = e.kind == PoolEvent::Kind::kWorkerReady ? std::string() : e.detail;
    cv.notify_all();
  };
  KILN_ASSIGN_OR_RETURN(auto pool, ProcessPool::start(std::move(o)));
  std::string verdict;
  {
    std::unique_lock lock(mu);
    // The pool kills a worker that is silent past the startup timeout, which ends the wait too; the slack
    // covers the kill and the reap.
    cv.wait_for(lock, timeout + std::chrono::seconds(5), [&] { return failure.has_value(); });
    verdict = failure.value_or("did not answer");
  }
  const std::string tail = pool->stats().gave_up;
  pool->shutdown();
  if (verdict.empty()) return Status();
  return make_error(ErrorCode::kFailedPrecondition,
                    fmt::format("'{}' is not a kiln compile worker of this version: it {} before its hello (whose "
                                "frame carries the wire version) within {:.3g} s{}",
                                path, verdict, std::chrono::duration<double>(timeout).count(),
                                tail.empty() ? "" : "; " + tail));
}

}  // namespace kiln
