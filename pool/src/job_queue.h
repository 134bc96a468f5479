// The queue every executor keeps its waiting jobs in: highest priority first, submission order within a
// priority; removal by id (cancellation) and re-prioritising by id (an on-demand request joining a queued
// background compile). Not thread-safe: its owner locks.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
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
    Key k{-static_cast<int>(job->job.priority), seq_++};
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
    if (found == ids_.end() || -found->second.first >= static_cast<int>(priority)) return false;
    auto it = jobs_.find(found->second);
    std::unique_ptr<Job> job = std::move(it->second);
    jobs_.erase(it);
    job->job.priority = priority;
    Key k{-static_cast<int>(priority), seq_++};
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
  using Key = std::pair<int, uint64_t>;  // (-priority, sequence): std::map's order is the run order
  std::map<Key, std::unique_ptr<Job>> jobs_;
  std::unordered_map<JobId, Key> ids_;
  uint64_t seq_ = 0;
};

/// "pool shut down" for job `name`.
Status shutdown_error(const std::string& name);
/// "compile of 'name' cancelled before it started".
Status cancelled_in_queue_error(const std::string& name);

}  // namespace kiln::pool_detail
