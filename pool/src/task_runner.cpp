#include "kiln/pool/task_runner.h"

#include <oneapi/tbb/task_arena.h>

#include <condition_variable>
#include <mutex>

#include "tbb_budget.h"

namespace kiln {
namespace {

// Posts tasks with task_arena::enqueue (never waits for a slot) and counts them, so the destructor can wait
// for the ones in flight: an arena has no wait of its own for enqueued work.
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
      ++pending_;
    }
    // oneTBB calls the functor as const; the holder lets the task release its captures once it has run.
    auto holder = std::make_shared<std::function<void()>>(std::move(task));
    arena_.enqueue([this, holder] {
      (*holder)();
      *holder = nullptr;  // release what the task captured before the runner may be destroyed
      std::lock_guard lock(mu_);
      if (--pending_ == 0) idle_.notify_all();
    });
  }

 private:
  pool_detail::ThreadReservation reservation_;
  tbb::task_arena arena_;
  std::mutex mu_;
  std::condition_variable idle_;
  size_t pending_ = 0;
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
