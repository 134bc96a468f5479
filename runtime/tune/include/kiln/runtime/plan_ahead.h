// A workload's compiles ahead of its tunes: what `kiln tune`, the Python package's warm-up and the suite bench
// run beside their loop over the problems.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit/key.h"
#include "kiln/pool/future.h"
#include "kiln/runtime/problem.h"
#include "kiln/runtime/tuner.h"
#include "kiln/status.h"

namespace kiln::runtime {

/// A thread plans each problem of a workload in order and starts its planned choices compiling at background
/// priority, and (with `speculate`) what the tune's first widening may reach at speculative priority, below
/// everything else. The tunes start at once instead of after the whole workload is planned, and find the
/// kernels of later problems compiling or done. After each tune, `tuned(i)` withdraws that problem's requests (a
/// compile stops once nobody wants it) and plans the problem `replan` places on again: what the cache learnt
/// from the tunes since (the neighbours' timings refine the model) can change its plan, and the new choices
/// start compiling before its tune asks for them. Thread-safe.
class PlanAhead {
 public:
  struct Options {
    // Why 4: a kernel compiles in ~0.3 s on a busy pool and a default tune takes ~0.08 s, so a re-plan must
    // come about four problems ahead to finish in time (H200 suite, 2 Dec: compile waits of kernels no plan
    // ahead had named fell from 0.75-1.34 s to 0.15-0.18 s over the 120 problems).
    int replan = 4;
    bool speculate = true;
    /// The next this many problems (after the last tuned) have their compiles still queued raised to normal
    /// priority, in problem order, each problem's planned choices before its widening guesses (which stay
    /// speculative for the tune: a binary only guessed is not a cached candidate). Why: background and
    /// speculative compiles queue behind the whole workload's plans (on the H200 suite, 2 Dec, 6b54bb8, 2.1 s of
    /// the 3.2 s of compile waits were kernels requested ahead and still queued or compiling when the tune came),
    /// and a pool that falls behind the tunes (fewer cores) should work on the next problems first. Measured on
    /// the H200 suite (3677e50) it changed nothing (0.132 s a problem without it, 0.128-0.136 with): there the
    /// waits left sit in each part's first problems, where the whole pool is busy with the cold start. 0: no raise.
    int promote = 4;
  };
  /// Plans problem i (Tuner::plan_ahead).
  using PlanFn = std::function<Result<PlannedChoices>(size_t)>;

  PlanAhead(PrecompileGate& gate, size_t problems, PlanFn plan, Options options);
  /// The problems planned with tuner.plan_ahead (the tuner must outlive this).
  PlanAhead(Tuner& tuner, const std::vector<Problem>& problems, Options options);
  /// Stops planning and withdraws every request still standing.
  ~PlanAhead();
  PlanAhead(const PlanAhead&) = delete;
  PlanAhead& operator=(const PlanAhead&) = delete;

  /// Problem i was tuned (or skipped): its requests are withdrawn and it is not planned again.
  void tuned(size_t i);
  /// The names of the choices requested for problem i so far (first, then widening), and those of them whose
  /// compiles had not finished at the call.
  std::vector<std::string> requested(size_t i) const;
  std::vector<std::string> pending(size_t i) const;
  /// Blocks until every problem not yet tuned was planned and no re-plan waits (tests).
  void wait_idle();
  /// Plans that failed (a problem whose choices cannot be generated is left to its tune to report).
  int failed_plans() const;

 private:
  struct Slot {
    bool done = false;     // tuned(i) came
    bool planned = false;  // planned at least once
    std::vector<std::string> names;
    std::vector<Future<Binaries>> requests;
    std::vector<KernelKey> kernels;  // of the requests, in order (planned choices first)
  };
  void run();
  void plan_one(size_t i);
  /// Raises the queued compiles of the problems in the promote window (the caller holds no lock).
  void promote(const std::vector<KernelKey>& kernels);
  /// The kernels of the window's problems, in problem order (under mu_).
  std::vector<KernelKey> window_kernels() const;

  PrecompileGate& gate_;
  PlanFn plan_;
  Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::vector<Slot> slots_;
  size_t next_first_ = 0;      // the first pass's next problem
  size_t next_tune_ = 0;       // one past the last problem tuned: the promote window starts here
  std::deque<size_t> replans_;
  bool busy_ = false;          // the thread is planning one now
  bool stop_ = false;
  int failed_ = 0;
  std::thread thread_;
};

/// A workload's problems that the tuner's cache holds no decision for (a cache that cannot say counts as none:
/// planning costs only compiles), in `order` (every index in turn when empty): what a PlanAhead is made of.
/// `index[i]` is workload problem i's place among them, -1 for a decided one (or one not in `order`).
struct UndecidedProblems {
  std::vector<Problem> problems;
  std::vector<std::ptrdiff_t> index;
};
UndecidedProblems undecided_problems(const Tuner& tuner, const std::vector<Problem>& workload,
                                     const std::vector<size_t>& order = {});

}  // namespace kiln::runtime
