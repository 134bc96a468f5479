// PlanAhead: a workload's compiles ahead of its tunes. One compile worker held busy by a blocked kernel makes
// the pool's queue order observable: the planned kernels of each problem in problem order, the speculative ones
// (what a widening may reach) after all of them, nothing a finished tune withdrew, and what a re-plan adds; with
// a promote window, the next problems' compiles first, in problem order.
#include "kiln/runtime/plan_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <map>
#include <mutex>

#include "fakes.h"
#include "kiln/pool/gate.h"

namespace kiln::runtime {
namespace {

using pool_test::FakeCompiler;

// A choice with one kernel of its own name.
class KernelChoice final : public Choice {
 public:
  explicit KernelChoice(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kTemplate; }
  std::vector<CompileRequest> kernels() const override { return {{pool_test::named(name_), Target{"sm_90"}, 0}}; }
  Status prepare(const Binaries&) override { return Status(); }
  Status run(const OpArgs&, CUdeviceptr, CUstream) const override { return Status(); }

 private:
  std::string name_;
};

ChoicePtr k(const std::string& name) { return std::make_shared<KernelChoice>(name); }

struct Fixture {
  FakeCompiler fake;
  std::unique_ptr<PrecompileGate> gate;
  Future<Binary> hold;  // occupies the only worker until released

  Fixture() {
    fake.block("hold");
    GateOptions o;
    o.executor = make_arena_executor({.threads = 1, .compile = fake.fn()});
    gate = std::move(PrecompileGate::create(std::move(o))).value();
    hold = gate->precompile(pool_test::named("hold"), Target{"sm_90"}, Priority::kOnDemand, 0);
    EXPECT_TRUE(fake.wait_started("hold"));
  }
  // Queues `late` at background priority, then "end" at speculative priority (after everything queued), lets
  // the worker go and returns the compile order once "end" is done.
  std::vector<std::string> drain(const std::string& late = "") {
    Future<Binary> l;
    if (!late.empty()) l = gate->precompile(pool_test::named(late), Target{"sm_90"}, Priority::kBackground, 0);
    auto end = gate->precompile(pool_test::named("end"), Target{"sm_90"}, Priority::kSpeculative, 0);
    fake.release("hold");
    EXPECT_TRUE(hold.get().ok());
    EXPECT_TRUE(end.get().ok());
    return fake.order();
  }
};

PlannedChoices plan_of(std::vector<ChoicePtr> first, std::vector<ChoicePtr> widening) {
  PlannedChoices p;
  p.first = std::move(first);
  p.widening = std::move(widening);
  return p;
}

TEST(PlanAhead, PlannedKernelsInProblemOrderThenTheSpeculativeOnes) {
  Fixture f;
  PlanAhead ahead(*f.gate, 2,
                  [](size_t i) -> Result<PlannedChoices> {
                    const std::string n = std::to_string(i);
                    return plan_of({k("a" + n), k("b" + n)}, {k("w" + n)});
                  },
                  {.replan = 0, .speculate = true, .promote = 0});
  ahead.wait_idle();
  EXPECT_EQ(ahead.requested(0), (std::vector<std::string>{"a0", "b0", "w0"}));
  EXPECT_EQ(ahead.pending(1), (std::vector<std::string>{"a1", "b1", "w1"}));
  // The last one asked for by hand at background priority comes after every planned kernel but before the
  // speculative ones.
  EXPECT_EQ(f.drain("late"), (std::vector<std::string>{"hold", "a0", "b0", "a1", "b1", "late", "w0", "w1", "end"}));
  EXPECT_TRUE(ahead.pending(0).empty());
}

TEST(PlanAhead, ATunedProblemsRequestsAreWithdrawn) {
  Fixture f;
  PlanAhead ahead(*f.gate, 2,
                  [](size_t i) -> Result<PlannedChoices> {
                    const std::string n = std::to_string(i);
                    return plan_of({k("a" + n), k("shared")}, {k("w" + n)});
                  },
                  {.replan = 0, .speculate = true, .promote = 0});
  ahead.wait_idle();
  ahead.tuned(0);
  ahead.tuned(0);  // twice: nothing more happens
  // a0 and w0 were wanted by problem 0 only; "shared" is still wanted by problem 1.
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "shared", "a1", "w1", "end"}));
}

TEST(PlanAhead, WithoutSpeculationNoWideningIsRequested) {
  Fixture f;
  PlanAhead ahead(*f.gate, 1, [](size_t) -> Result<PlannedChoices> { return plan_of({k("a")}, {k("w")}); },
                  {.replan = 0, .speculate = false, .promote = 0});
  ahead.wait_idle();
  EXPECT_EQ(ahead.requested(0), (std::vector<std::string>{"a"}));
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "a", "end"}));
}

TEST(PlanAhead, AfterATuneTheProblemReplanPlacesOnIsPlannedAgainAndItsNewChoicesRequested) {
  Fixture f;
  std::mutex mu;
  std::map<size_t, int> calls;
  PlanAhead ahead(*f.gate, 4,
                  [&](size_t i) -> Result<PlannedChoices> {
                    std::lock_guard lock(mu);
                    const int call = ++calls[i];
                    const std::string n = std::to_string(i);
                    // The second plan of a problem (the cache learnt from a tune since) keeps one choice and
                    // adds one.
                    if (call == 1) return plan_of({k("a" + n), k("b" + n)}, {});
                    return plan_of({k("a" + n), k("c" + n)}, {});
                  },
                  {.replan = 2, .speculate = true, .promote = 0});
  ahead.wait_idle();
  ahead.tuned(0);
  ahead.wait_idle();
  ahead.tuned(1);
  ahead.wait_idle();
  ahead.tuned(2);  // its re-plan would be problem 4: past the end, nothing
  ahead.wait_idle();
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(calls, (std::map<size_t, int>{{0, 1}, {1, 1}, {2, 2}, {3, 2}}));
  }
  EXPECT_EQ(ahead.requested(3), (std::vector<std::string>{"a3", "b3", "c3"}));
  // b3 stays requested (the re-plan adds, it never withdraws: the tune may still want it); problems 0-2 were
  // withdrawn before the worker was free.
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "a3", "b3", "c3", "end"}));
}

TEST(PlanAhead, TheNextProblemsCompilesGoFirstInProblemOrderAndTheirGuessesStaySpeculative) {
  Fixture f;
  PlanAhead ahead(*f.gate, 4,
                  [](size_t i) -> Result<PlannedChoices> {
                    const std::string n = std::to_string(i);
                    return plan_of({k("a" + n)}, {k("w" + n)});
                  },
                  {.replan = 0, .speculate = true, .promote = 2});
  ahead.wait_idle();
  // Problems 0 and 1 are the window: raised to normal as planned. After problem 0's tune the window is 1-2:
  // problem 2's compiles are raised behind problem 1's; problem 3's stay where the plan put them.
  ahead.tuned(0);
  EXPECT_EQ(f.drain("late"), (std::vector<std::string>{"hold", "a1", "w1", "a2", "w2", "a3", "late", "w3", "end"}));
  // The raised guesses were compiled for speculative requests only: a tune does not count them as cached.
  EXPECT_TRUE(f.gate->speculative_only(make_key(pool_test::named("w1"), Target{"sm_90"})));
  EXPECT_FALSE(f.gate->speculative_only(make_key(pool_test::named("a1"), Target{"sm_90"})));
}

TEST(PlanAhead, AProblemThatCannotBePlannedIsCountedAndTheOthersGoOn) {
  Fixture f;
  PlanAhead ahead(*f.gate, 3,
                  [](size_t i) -> Result<PlannedChoices> {
                    if (i == 1) return make_error(ErrorCode::kInvalidArgument, "no choices for problem 1");
                    return plan_of({k("a" + std::to_string(i))}, {});
                  },
                  {.replan = 1, .speculate = true, .promote = 0});
  ahead.wait_idle();
  EXPECT_EQ(ahead.failed_plans(), 1);
  EXPECT_TRUE(ahead.requested(1).empty());
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "a0", "a2", "end"}));
}

// Sync points: the plan of problem 0 holds until both problems are tuned.
TEST(PlanAhead, APlanThatATuneOvertookIsWithdrawnAndATunedProblemIsNeverPlanned) {
  Fixture f;
  std::latch in_plan(1), go_on(1);
  std::atomic<int> calls{0};
  PlanAhead ahead(*f.gate, 2,
                  [&](size_t i) -> Result<PlannedChoices> {
                    ++calls;
                    if (i == 0) {
                      in_plan.count_down();
                      go_on.wait();
                    }
                    return plan_of({k("a" + std::to_string(i))}, {k("w" + std::to_string(i))});
                  },
                  {.replan = 0, .speculate = true, .promote = 0});
  in_plan.wait();
  ahead.tuned(0);
  ahead.tuned(1);
  go_on.count_down();
  ahead.wait_idle();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(ahead.requested(0).empty());
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "end"}));
}

TEST(PlanAhead, DestructionWithdrawsEverything) {
  Fixture f;
  {
    PlanAhead ahead(*f.gate, 2,
                    [&](size_t i) -> Result<PlannedChoices> {
                      return plan_of({k("a" + std::to_string(i))}, {k("w" + std::to_string(i))});
                    },
                    {.replan = 3, .speculate = true, .promote = 0});
    ahead.wait_idle();
    ahead.tuned(5);  // out of range: ignored
    EXPECT_EQ(ahead.requested(1), (std::vector<std::string>{"a1", "w1"}));
  }
  EXPECT_EQ(f.drain(), (std::vector<std::string>{"hold", "end"}));
}

}  // namespace
}  // namespace kiln::runtime
