// TaskRunner: somewhere to run short tasks later. Future continuations (`then`) and the gate's bookkeeping
// run on one, so user code never runs on a compile thread's stack or under a pool's lock.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace kiln {

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  /// Runs `task` later, on some thread of the runner; never blocks on the task itself. Thread-safe.
  virtual void post(std::function<void()> task) = 0;
};

/// A runner backed by its own capped oneTBB task_arena (`threads` at most; 0: 2). Tasks are enqueued, so
/// posting never waits for a free slot. The destructor waits for the tasks already posted.
std::shared_ptr<TaskRunner> make_arena_runner(int threads = 0);

/// A runner that runs each task at once on the posting thread: for tests and single-threaded tools.
std::shared_ptr<TaskRunner> make_inline_runner();

/// The process-wide runner continuations use unless told otherwise: an arena of 2 threads, separate from
/// any compile arena so a continuation never waits behind queued compiles. Created on first use and never
/// destroyed (tasks may still be posted during static destruction).
const std::shared_ptr<TaskRunner>& default_task_runner();

}  // namespace kiln
