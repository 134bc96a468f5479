#include "kiln/pool/task_runner.h"

#include <oneapi/tbb/task_arena.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include "tbb_budget.h"

namespace kiln {
namespace {

// Posts tasks with task_arena::enqueue (never waits for a slot) and counts them, so the destructor can wait
// for the ones in flight: an arena has no wait of its own for enqueued work.
//
// The tasks wait in this runner's own queue; what goes to the arena only says "run the next one". oneTBB keeps
// enqueued functors in memory of its own allocator, which LeakSanitizer does not scan: a task still queued when
// the process exits (a continuation posted by the last promise a program abandons) was reported as a leak of
// everything it captured. Held here, it stays reachable from default_task_runner().
class ArenaRunner final : public TaskRunner {
 public:
  explicit ArenaRunner(int threads) : reservation_(threads), arena_(threads, 0) {}
  ~ArenaRunner() override {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return pending_ == 0; });
  }

  void post(std::function<void()> task) override {
    {
      std::lock_guard lock(mu_);
      queued_.push_back(std::move(task));
      ++pending_;
    }
    arena_.enqueue([this] { run_next(); });
  }

 private:
  // One call per post(), so the queue is never empty here.
  void run_next() {
    std::function<void()> task;
    {
      std::lock_guard lock(mu_);
      task = std::move(queued_.front());
      queued_.pop_front();
    }
    task();
    task = nullptr;  // release what the task captured before the runner may be destroyed
    std::lock_guard lock(mu_);
    if (--pending_ == 0) idle_.notify_all();
  }

  pool_detail::ThreadReservation reservation_;
  tbb::task_arena arena_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queued_;
  size_t pending_ = 0;  // queued or running
};

class InlineRunner final : public TaskRunner {
 public:
  void post(std::function<void()> task) override { task(); }
};

}  // namespace

std::shared_ptr<TaskRunner> make_arena_runner(int threads) {
  return std::make_shared<ArenaRunner>(threads > 0 ? threads : 2);
}

std::shared_ptr<TaskRunner> make_inline_runner() { return std::make_shared<InlineRunner>(); }

const std::shared_ptr<TaskRunner>& default_task_runner() {
  // Never destroyed: futures may complete, and post continuations, during static destruction.
  static auto* runner = new std::shared_ptr<TaskRunner>(make_arena_runner(2));
  return *runner;
}

}  // namespace kiln
