// The precompile gate: single flight, cache hooks, priorities, subgraphs, batches, withdrawal.
#include "kiln/pool/gate.h"

#include <gtest/gtest.h>

#include <latch>
#include <map>
#include <thread>

#include "fakes.h"
#include "kiln_test.h"

namespace kiln {
namespace {

using pool_test::FakeCompiler;
using pool_test::HeldThreadTest;
using pool_test::named;

const Target kTarget{"sm_90"};

std::unique_ptr<PrecompileGate> gate_over(std::shared_ptr<Executor> exec, GateOptions o = {}) {
  o.executor = std::move(exec);
  auto g = PrecompileGate::create(std::move(o));
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return std::move(g).value();
}

TEST(Gate, NeedsAnExecutor) {
  EXPECT_EQ(PrecompileGate::create({}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Gate, SixtyFourThreadsAskingForOneKernelCauseOneCompile) {
  FakeCompiler fake;
  fake.block("hot");  // the compile stays in flight until every thread has asked
  auto gate = gate_over(make_arena_executor({.threads = 4, .compile = fake.fn()}));
  constexpr int kThreads = 64;
  std::latch go(kThreads);
  std::vector<Future<Binary>> fs(kThreads);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      go.arrive_and_wait();
      fs[i] = gate->precompile(named("hot"), kTarget);
    });
  }
  for (auto& t : ts) t.join();
  fake.release("hot");
  for (auto& f : fs) {
    KILN_ASSERT_OK_AND_ASSIGN(Binary b, f.get());
    EXPECT_EQ(b.cubin, "cubin:hot");
  }
  EXPECT_EQ(fake.calls(), 1);
  GateCounters c = gate->counters();
  EXPECT_EQ(c.requests, 64u);
  EXPECT_EQ(c.compiles, 1u);
  EXPECT_EQ(c.joined, 63u);
}

TEST(Gate, SingleFlightWithRealNvrtc) {
  std::atomic<int> nvrtc_calls{0};
  constexpr int kThreads = 64;
  std::latch asked(kThreads);
  // Real kiln::compile, entered only once all 64 requests are made, so they provably overlap it.
  CompileFn counting = [&](const KernelSource& s, const Target& t, const CompileSettings& c) {
    ++nvrtc_calls;
    asked.wait();
    return compile(s, t, c);
  };
  auto gate = gate_over(make_arena_executor({.threads = 4, .compile = counting}));
  KernelSource src;
  src.name = "saxpy";
  src.entry = "saxpy";
  src.source =
      "extern \"C\" __global__ void saxpy(int n, float a, const float* x, float* y) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }\n";
  std::vector<Future<Binary>> fs(kThreads);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      fs[i] = gate->precompile(src, kTarget);
      asked.count_down();
    });
  }
  for (auto& t : ts) t.join();
  KILN_ASSERT_OK_AND_ASSIGN(Binary first, fs[0].get());
  EXPECT_FALSE(first.cubin.empty());
  EXPECT_EQ(first.key, make_key(src, kTarget));
  for (auto& f : fs) EXPECT_EQ(f.get()->cubin, first.cubin);
  EXPECT_EQ(nvrtc_calls.load(), 1);
}

TEST(Gate, DistinctKeysCompileSeparately) {
  FakeCompiler fake;
  auto gate = gate_over(make_arena_executor({.threads = 2, .compile = fake.fn()}));
  auto a = gate->precompile(named("a"), kTarget);
  auto a_sm80 = gate->precompile(named("a"), Target{"sm_80"});
  auto b = gate->precompile(named("b"), kTarget);
  KILN_EXPECT_OK(a.get());
  KILN_EXPECT_OK(a_sm80.get());
  KILN_EXPECT_OK(b.get());
  EXPECT_EQ(fake.calls(), 3);
}

TEST(Gate, CachedKeysNeverReachTheCompiler) {
  FakeCompiler fake;
  std::mutex mu;
  std::map<KernelKey, Result<Binary>> cache;
  std::vector<std::string> stored, remembered_failures;
  GateOptions o;
  o.lookup = [&](const KernelKey& k, std::string_view) -> std::optional<Result<Binary>> {
    std::lock_guard lock(mu);
    auto it = cache.find(k);
    if (it == cache.end()) return std::nullopt;
    return it->second;
  };
  o.on_compiled = [&](const Binary& b) {
    std::lock_guard lock(mu);
    stored.push_back(b.name);
    cache.emplace(b.key, b);
  };
  o.on_failed = [&](const KernelKey& k, const Status& s) {
    std::lock_guard lock(mu);
    remembered_failures.push_back(s.message());
    cache.emplace(k, s);
  };
  Binary cached;
  cached.name = "warm";
  cached.cubin = "from the cache";
  cache.emplace(make_key(named("warm"), kTarget), cached);
  cache.emplace(make_key(named("known_bad"), kTarget), make_error(ErrorCode::kCompileError, "remembered"));
  fake.fail("bad");
  auto gate = gate_over(make_arena_executor({.threads = 2, .compile = fake.fn()}), o);

  EXPECT_EQ(gate->precompile(named("warm"), kTarget).get()->cubin, "from the cache");
  EXPECT_EQ(gate->precompile(named("known_bad"), kTarget).get().status().message(), "remembered");
  EXPECT_EQ(fake.calls(), 0);

  // A fresh compile is stored before its future completes; the next request is a cache hit.
  auto cold = gate->precompile(named("cold"), kTarget);
  KILN_ASSERT_OK(cold.get());
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(stored, std::vector<std::string>{"cold"});
  }
  KILN_ASSERT_OK(gate->precompile(named("cold"), kTarget).get());
  EXPECT_EQ(fake.calls(), 1);

  // A compile error is remembered; a cancellation is not (it says nothing about the kernel).
  EXPECT_EQ(gate->precompile(named("bad"), kTarget).get().status().code(), ErrorCode::kCompileError);
  EXPECT_EQ(gate->precompile(named("bad"), kTarget).get().status().code(), ErrorCode::kCompileError);
  EXPECT_EQ(fake.calls(), 2);
  fake.block("stopped");
  auto stopped = gate->precompile(named("stopped"), kTarget);
  ASSERT_TRUE(fake.wait_started("stopped"));
  stopped.cancel();
  EXPECT_EQ(stopped.get().status().code(), ErrorCode::kCancelled);
  std::lock_guard lock(mu);
  EXPECT_EQ(remembered_failures, std::vector<std::string>{"fake error in 'bad'"});

  GateCounters c = gate->counters();
  EXPECT_EQ(c.cache_hits, 1u);       // warm
  EXPECT_EQ(c.cached_failures, 1u);  // known_bad
  EXPECT_EQ(c.repeats, 2u);          // cold and bad the second time: compiled here, not "already cached"
  EXPECT_EQ(c.compiles, 3u);         // cold, bad, stopped
}

TEST(Gate, ATimedOutCompileIsRememberedLikeACompileError) {
  // A compile that passed its timeout (a macro bomb) would cost the whole timeout again at every run.
  std::vector<std::string> remembered;
  GateOptions o;
  o.on_failed = [&](const KernelKey&, const Status& s) { remembered.push_back(s.message()); };
  CompileFn times_out = [](const KernelSource& s, const Target&, const CompileSettings&) -> Result<Binary> {
    return make_error(ErrorCode::kTimeout, "compile of '" + s.name + "' timed out");
  };
  auto gate = gate_over(make_arena_executor({.threads = 1, .compile = times_out}), o);
  EXPECT_EQ(gate->precompile(named("bomb"), kTarget).get().status().code(), ErrorCode::kTimeout);
  EXPECT_EQ(remembered, std::vector<std::string>{"compile of 'bomb' timed out"});
}

// A gate over one arena thread that is busy with "blocker": every compile a test asks for queues.
class HeldGate : public HeldThreadTest {
 protected:
  void SetUp() override { hold([&] { return gate->precompile(named("blocker"), kTarget); }); }
  /// warm0 .. warm<n-1>, queued at the batch's kBackground priority.
  Batch warmup_batch(int n) {
    std::vector<KernelSource> warmup;
    for (int i = 0; i < n; ++i) warmup.push_back(named("warm" + std::to_string(i)));
    return gate->precompile_batch(warmup, kTarget);
  }

  std::unique_ptr<PrecompileGate> gate = gate_over(exec);
};

TEST_F(HeldGate, OnDemandOvertakesABackgroundBatch) {
  Batch batch = warmup_batch(6);
  auto urgent = gate->precompile(named("urgent"), kTarget, Priority::kOnDemand);
  fake.release("blocker");
  KILN_ASSERT_OK(urgent.get());
  KILN_ASSERT_OK(batch.all.get());
  std::vector<std::string> order = fake.order();
  ASSERT_EQ(order.size(), 8u);
  EXPECT_EQ(order[0], "blocker");
  EXPECT_EQ(order[1], "urgent");
  EXPECT_EQ(order[2], "warm0");
}

TEST_F(HeldGate, OnDemandRequestRaisesAQueuedBackgroundCompileOfTheSameKernel) {
  Batch batch = warmup_batch(5);
  auto urgent = gate->precompile(named("warm3"), kTarget, Priority::kOnDemand);  // joins warm3's flight
  fake.release("blocker");
  KILN_ASSERT_OK(batch.all.get());
  EXPECT_EQ(fake.order(), (std::vector<std::string>{"blocker", "warm3", "warm0", "warm1", "warm2", "warm4"}));
  EXPECT_EQ(gate->counters().joined, 1u);
}

// raise() moves a queued compile up as a request would, behind what already waits at that priority, and adds no
// request of its own: the compile still stops when its only requester withdraws.
TEST_F(HeldGate, RaiseMovesAQueuedCompileUpWithoutRequestingIt) {
  auto a = gate->precompile(named("a"), kTarget, Priority::kNormal);
  auto spec = gate->precompile(named("spec"), kTarget, Priority::kSpeculative);
  auto b = gate->precompile(named("b"), kTarget, Priority::kBackground);
  auto gone = gate->precompile(named("gone"), kTarget, Priority::kSpeculative);
  gate->raise(make_key(named("spec"), kTarget), Priority::kNormal);
  gate->raise(make_key(named("gone"), kTarget), Priority::kNormal);
  gate->raise(make_key(named("a"), kTarget), Priority::kBackground);       // lower: no effect
  gate->raise(make_key(named("nowhere"), kTarget), Priority::kOnDemand);  // not in flight: no effect
  gone.cancel();
  fake.release("blocker");
  for (auto* f : {&a, &spec, &b}) KILN_ASSERT_OK(f->get());
  EXPECT_EQ(gone.get().status().code(), ErrorCode::kCancelled);
  EXPECT_EQ(fake.order(), (std::vector<std::string>{"blocker", "a", "spec", "b"}));
  EXPECT_EQ(gate->counters().requests, 5u);
}

// A binary compiled here for speculative requests only is told apart (a tune does not count it as a cached
// candidate) until something asks for it at a higher priority; a raise does not make it wanted.
TEST_F(HeldGate, ASpeculativeOnlyBinaryIsToldApartUntilSomethingAsksForIt) {
  const KernelKey guess = make_key(named("guess"), kTarget), joined = make_key(named("joined"), kTarget);
  auto g = gate->precompile(named("guess"), kTarget, Priority::kSpeculative);
  auto j = gate->precompile(named("joined"), kTarget, Priority::kSpeculative);
  auto j2 = gate->precompile(named("joined"), kTarget, Priority::kBackground);  // wanted while in flight
  gate->raise(guess, Priority::kNormal);
  EXPECT_FALSE(gate->speculative_only(guess));  // not compiled yet
  fake.release("blocker");
  for (auto* f : {&g, &j, &j2}) KILN_ASSERT_OK(f->get());
  EXPECT_TRUE(gate->speculative_only(guess));
  EXPECT_FALSE(gate->speculative_only(joined));
  KILN_ASSERT_OK(gate->precompile(named("guess"), kTarget, Priority::kSpeculative).get());
  EXPECT_TRUE(gate->speculative_only(guess));
  KILN_ASSERT_OK(gate->precompile(named("guess"), kTarget, Priority::kNormal).get());
  EXPECT_FALSE(gate->speculative_only(guess));
}

// A template's compile-cost estimate reaches the executor's queue through the gate: within one priority the
// longest expected compile starts first, those without an estimate last in submission order.
TEST_F(HeldGate, CostHintsStartTheLongestCompileFirst) {
  auto small = gate->precompile(named("small"), kTarget, Priority::kNormal, 0.1);
  auto unknown = gate->precompile(named("unknown"), kTarget, Priority::kNormal);
  auto large = gate->precompile(named("large"), kTarget, Priority::kNormal, 0.8);
  auto medium = gate->precompile(named("medium"), kTarget, Priority::kNormal, 0.3);
  auto again = gate->precompile(named("small"), kTarget, Priority::kNormal, 5.0);  // joins small's flight as it was
  fake.release("blocker");
  for (auto* f : {&small, &unknown, &large, &medium, &again}) KILN_ASSERT_OK(f->get());
  EXPECT_EQ(fake.order(), (std::vector<std::string>{"blocker", "large", "medium", "small", "unknown"}));
}

TEST(Gate, ACompileStopsOnlyWhenEveryRequesterWithdraws) {
  FakeCompiler fake;
  auto gate = gate_over(make_arena_executor({.threads = 1, .compile = fake.fn()}));
  fake.block("shared");
  auto first = gate->precompile(named("shared"), kTarget);
  auto second = gate->precompile(named("shared"), kTarget);
  ASSERT_TRUE(fake.wait_started("shared"));
  first.cancel();
  EXPECT_FALSE(second.ready());  // still wanted: not stopped
  second.cancel();
  EXPECT_EQ(second.get().status().code(), ErrorCode::kCancelled);
  // A new request after the withdrawal starts a new compile rather than joining the cancelled one.
  fake.release("shared");
  KILN_EXPECT_OK(gate->precompile(named("shared"), kTarget).get());
  EXPECT_EQ(fake.calls(), 2);
}

TEST_F(HeldGate, WithdrawnWhileStillQueuedNeverCompiles) {
  auto queued = gate->precompile(named("queued"), kTarget);
  queued.cancel();
  EXPECT_EQ(queued.get().status().code(), ErrorCode::kCancelled);
  fake.release("blocker");
  KILN_EXPECT_OK(blocker.get());
  EXPECT_EQ(fake.calls(), 1);
  // Counted as withdrawn, not as a failure (the suite bench printed PlanAhead's withdrawals as failed compiles).
  const GateCounters c = gate->counters();
  EXPECT_EQ(c.withdrawn, 1u);
  EXPECT_EQ(c.failed, 0u);
  EXPECT_EQ(c.compiled, 1u);
}

TEST(Gate, SubgraphCompletesWhenAllOfItsKernelsAre) {
  FakeCompiler fake;
  auto gate = gate_over(make_arena_executor({.threads = 2, .compile = fake.fn()}));
  fake.block("reduce");
  auto sub = gate->precompile_all({named("partial"), named("reduce")}, kTarget);
  ASSERT_TRUE(fake.wait_started("reduce"));
  EXPECT_FALSE(sub.ready());
  fake.release("reduce");
  KILN_ASSERT_OK_AND_ASSIGN(std::vector<Binary> bins, sub.get());
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0].name, "partial");
  EXPECT_EQ(bins[1].name, "reduce");

  fake.fail("broken");
  auto bad = gate->precompile_all({named("ok"), named("broken")}, kTarget);
  EXPECT_EQ(bad.get().status().code(), ErrorCode::kCompileError);

  auto nothing = PrecompileGate::nothing_to_compile();
  ASSERT_TRUE(nothing.ready());
  EXPECT_TRUE(nothing.get()->empty());
}

TEST(Gate, BatchReportsProgressAndFailures) {
  FakeCompiler fake;
  fake.fail("k3");
  fake.fail("k7");
  auto gate = gate_over(make_arena_executor({.threads = 2, .compile = fake.fn()}));
  std::vector<KernelSource> srcs;
  for (int i = 0; i < 10; ++i) srcs.push_back(named("k" + std::to_string(i)));
  std::atomic<int> updates{0};
  Batch batch = gate->precompile_batch(srcs, kTarget, Priority::kBackground,
                                       [&](const ProgressSnapshot&) { ++updates; });
  EXPECT_EQ(batch.all.get().status().code(), ErrorCode::kCompileError);
  for (auto& f : batch.futures) f.wait();
  // Progress is recorded by the futures' completion callbacks; `all` completing implies every one ran.
  ProgressSnapshot s = batch.progress->snapshot();
  EXPECT_EQ(s.total, 10u);
  EXPECT_EQ(s.done, 10u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(updates.load(), 10);
}

TEST(Gate, DestroyingTheGateCancelsWhatIsInFlight) {
  FakeCompiler fake;
  auto exec = std::shared_ptr<Executor>(make_arena_executor({.threads = 1, .compile = fake.fn()}));
  Future<Binary> f;
  {
    auto gate = gate_over(exec);
    fake.block("forever");
    f = gate->precompile(named("forever"), kTarget);
    ASSERT_TRUE(fake.wait_started("forever"));
  }
  ASSERT_TRUE(f.ready());
  EXPECT_EQ(f.get().status().code(), ErrorCode::kCancelled);
  KILN_EXPECT_OK(exec->submit({named("after"), kTarget, {}, Priority::kNormal}).future.get());
}

TEST(Gate, RealCompileErrorCarriesTheLog) {
  auto gate = gate_over(make_arena_executor({.threads = 1}));
  KernelSource bad;
  bad.name = "typo";
  bad.entry = "k";
  bad.source = "extern \"C\" __global__ void k() { this_is_not_declared = 1; }\n";
  Future<Binary> f = gate->precompile(bad, kTarget);
  const Result<Binary>& r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCompileError);
  EXPECT_NE(r.status().detail().find("this_is_not_declared"), std::string::npos);
  EXPECT_NE(r.status().message().find("typo"), std::string::npos);
}

}  // namespace
}  // namespace kiln
