// The executors' queue order: priority first; within a priority the largest cost hint (longest expected
// compile) first, so that a batch's long compiles do not start last; then submission order. Re-prioritising
// and removal by id keep that order.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "job_queue.h"
#include "kiln/pool/task_runner.h"

namespace kiln::pool_detail {
namespace {

std::unique_ptr<Job> job(JobId id, Priority p, double cost = 0) {
  CompileJob cj;
  cj.source.name = "k" + std::to_string(id);
  cj.priority = p;
  cj.cost_hint = cost;
  return std::make_unique<Job>(id, std::move(cj), default_task_runner());
}

std::vector<JobId> drain(JobQueue& q) {
  std::vector<JobId> out;
  while (auto j = q.pop()) out.push_back(j->id);
  return out;
}

TEST(JobQueue, WithoutHintsSubmissionOrderWithinAPriority) {
  JobQueue q;
  q.push(job(1, Priority::kNormal));
  q.push(job(2, Priority::kBackground));
  q.push(job(3, Priority::kNormal));
  q.push(job(4, Priority::kOnDemand));
  q.push(job(5, Priority::kNormal));
  EXPECT_EQ(drain(q), (std::vector<JobId>{4, 1, 3, 5, 2}));
}

TEST(JobQueue, LongestExpectedFirstWithinAPriority) {
  JobQueue q;
  q.push(job(1, Priority::kNormal, 0.5));
  q.push(job(2, Priority::kNormal, 2.0));
  q.push(job(3, Priority::kNormal));  // unknown: after the hinted ones
  q.push(job(4, Priority::kNormal, 1.0));
  q.push(job(5, Priority::kNormal, 2.0));  // ties keep submission order
  q.push(job(6, Priority::kOnDemand, 0.1));  // priority still comes first
  q.push(job(7, Priority::kBackground, 9.0));
  EXPECT_EQ(drain(q), (std::vector<JobId>{6, 2, 5, 4, 1, 3, 7}));
}

// A speculative compile (what a tune might widen into) runs only when nothing else waits, whatever its hint,
// and a tune that turns out to need it raises it like a background one.
TEST(JobQueue, SpeculativeJobsWaitForEverythingElse) {
  JobQueue q;
  q.push(job(1, Priority::kSpeculative, 9.0));
  q.push(job(2, Priority::kBackground));
  q.push(job(3, Priority::kSpeculative));
  q.push(job(4, Priority::kBackground, 0.5));
  q.push(job(5, Priority::kSpeculative, 1.0));
  EXPECT_TRUE(q.raise(5, Priority::kNormal));
  EXPECT_EQ(drain(q), (std::vector<JobId>{5, 4, 2, 1, 3}));
  EXPECT_EQ(priority_name(Priority::kSpeculative), "speculative");
}

TEST(JobQueue, NonsenseHintsCountAsUnknown) {
  JobQueue q;
  q.push(job(1, Priority::kNormal, -3));
  q.push(job(2, Priority::kNormal, std::numeric_limits<double>::quiet_NaN()));
  q.push(job(3, Priority::kNormal, std::numeric_limits<double>::infinity()));
  q.push(job(4, Priority::kNormal, 0.25));
  q.push(job(5, Priority::kNormal));
  EXPECT_EQ(drain(q), (std::vector<JobId>{4, 1, 2, 3, 5}));
}

TEST(JobQueue, RaiseKeepsTheHintAndRemoveFindsById) {
  JobQueue q;
  q.push(job(1, Priority::kOnDemand, 0.1));
  q.push(job(2, Priority::kBackground, 5.0));
  q.push(job(3, Priority::kBackground, 1.0));
  q.push(job(4, Priority::kOnDemand, 3.0));
  EXPECT_TRUE(q.raise(2, Priority::kOnDemand));
  EXPECT_FALSE(q.raise(2, Priority::kNormal));  // already higher
  EXPECT_FALSE(q.raise(99, Priority::kOnDemand));
  auto removed = q.remove(4);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->id, 4u);
  EXPECT_EQ(q.remove(4), nullptr);
  EXPECT_EQ(q.size(), 3u);
  // 2 joined the on-demand jobs with its hint of 5 s, so it runs before 1 (0.1 s).
  EXPECT_EQ(drain(q), (std::vector<JobId>{2, 1, 3}));
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace kiln::pool_detail
