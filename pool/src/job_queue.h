// The queue every executor keeps its waiting jobs in: highest priority first; within a priority the longest
// expected compile (CompileJob::cost_hint) first, a longest-processing-time-first schedule that keeps a batch's
// tail short; then submission order. Removal by id (cancellation) and re-prioritising by id (an on-demand request joining a queued
// background compile). Not thread-safe: its owner locks.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/pool/executor.h"

namespace kiln::pool_detail {

struct Job {
  JobId id = 0;
  CompileJob job;
  Promise<Binary> promise;
  std::stop_source stop;

  Job(JobId i, CompileJob j, std::shared_ptr<TaskRunner> runner)
      : id(i), job(std::move(j)), promise(std::move(runner)) {}
  const std::string& name() const { return job.source.name; }
};

/// The next id of the process-wide job counter (ids start at 1).
JobId next_job_id();

/// Completes a job's future with `r` and counts it in `counters` (guarded by `mu`, which the caller must not
/// hold: the future's callbacks run on this thread).
inline void complete(std::mutex& mu, ExecutorCounters& counters, Job& job, Result<Binary> r) {
  {
    std::lock_guard lock(mu);
    ++counters.completed;
    if (!r.ok()) ++counters.failed;
    if (!r.ok() && r.status().code() == ErrorCode::kCancelled) ++counters.cancelled;
  }
  job.promise.set(std::move(r));
}

class JobQueue {
 public:
  void push(std::unique_ptr<Job> job) {
    Key k = key(job->job.priority, job->job.cost_hint);
    ids_[job->id] = k;
    jobs_.emplace(k, std::move(job));
  }
  /// The best job, or null when empty.
  std::unique_ptr<Job> pop() {
    if (jobs_.empty()) return nullptr;
    auto it = jobs_.begin();
    std::unique_ptr<Job> job = std::move(it->second);
    jobs_.erase(it);
    ids_.erase(job->id);
    return job;
  }
  /// The queued job `id`, removed; null if it is not queued.
  std::unique_ptr<Job> remove(JobId id) {
    auto found = ids_.find(id);
    if (found == ids_.end()) return nullptr;
    auto it = jobs_.find(found->second);
    std::unique_ptr<Job> job = std::move(it->second);
    jobs_.erase(it);
    ids_.erase(found);
    return job;
  }
  /// Moves a queued job up to `priority` (behind the jobs already queued at that priority). False if it is
  /// not queued or already at least that high.
  bool raise(JobId id, Priority priority) {
    auto found = ids_.find(id);
    if (found == ids_.end() || -std::get<0>(found->second) >= static_cast<int>(priority)) return false;
    auto it = jobs_.find(found->second);
    std::unique_ptr<Job> job = std::move(it->second);
    jobs_.erase(it);
    job->job.priority = priority;
    Key k = key(priority, job->job.cost_hint);
    found->second = k;
    jobs_.emplace(k, std::move(job));
    return true;
  }
  std::vector<std::unique_ptr<Job>> take_all() {
    std::vector<std::unique_ptr<Job>> out;
    for (auto& [k, job] : jobs_) out.push_back(std::move(job));
    jobs_.clear();
    ids_.clear();
    return out;
  }
  size_t size() const { return jobs_.size(); }
  bool empty() const { return jobs_.empty(); }

 private:
  // (-priority, -cost hint, sequence): std::map's order is the run order. A hint that is not a positive
  // finite number counts as 0 (unknown: after every hinted job of the priority, in submission order).
  using Key = std::tuple<int, double, uint64_t>;
  Key key(Priority priority, double cost_hint) {
    double cost = std::isfinite(cost_hint) && cost_hint > 0 ? cost_hint : 0.0;
    return Key{-static_cast<int>(priority), -cost, seq_++};
  }
  std::map<Key, std::unique_ptr<Job>> jobs_;
  std::unordered_map<JobId, Key> ids_;
  uint64_t seq_ = 0;
};

/// "pool shut down" for job `name`.
Status shutdown_error(const std::string& name);
/// "compile of 'name' cancelled before it started".
Status cancelled_in_queue_error(const std::string& name);

}  // namespace kiln::pool_detail
