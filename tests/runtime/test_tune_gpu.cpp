// The autotuner end to end on a GPU: tuning, checking against the reference, cached decisions, tune modes,
// failing choices, deferred selection, size dispatch and graph capture. Skipped without a GPU.
#include <gtest/gtest.h>

#include <thread>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <functional>
#include <vector>

#include "kiln/cache/tuning.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln/runtime/helper_kernels.h"
#include "kiln/runtime/measure.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/registry.h"
#include "kiln_test.h"
#include "reference_check.h"
#include "test_isolation_planted.h"
#include "tuning_dir.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;
using reference_check::expect_correct;

class TuneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
  }

  std::shared_ptr<cache::TuningCache> cache(cache::TuneMode mode) { return dir_.open(mode); }
  std::unique_ptr<Tuner> tuner(cache::TuneMode mode, int configs = 4) {
    TuneOptions o;
    o.cache = cache(mode);
    o.max_template_configs = configs;
    o.max_cublas_algos = 4;
    o.bench.budget_ms = 2;
    auto t = make_tuner(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }

  TuningDir dir_{"kiln_tune_gpu"};
};

Problem gemm(int64_t m, int64_t n, int64_t k, const char* epilogue = "") {
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  g.epilogue = *templates::parse_epilogue(epilogue, DType::kBF16);
  return Problem::gemm(g);
}

// Captures body(stream) into a CUDA graph (`mode`), checks that the capture ended and body succeeded, then
// replays the graph `replays` times and waits for it. `why` is added to a failed end of capture.
void capture_and_replay(const Stream& stream, CUstreamCaptureMode mode, int replays,
                        const std::function<Status(CUstream)>& body, const char* why = "") {
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  CUgraph graph = nullptr;
  ASSERT_EQ(d->cuStreamBeginCapture(stream.get(), mode), CUDA_SUCCESS);
  Status captured = body(stream.get());
  ASSERT_EQ(d->cuStreamEndCapture(stream.get(), &graph), CUDA_SUCCESS) << why;
  KILN_ASSERT_OK(captured);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  for (int i = 0; i < replays; ++i) ASSERT_EQ(d->cuGraphLaunch(exec, stream.get()), CUDA_SUCCESS);
  KILN_ASSERT_OK(stream.synchronize());
  d->cuGraphExecDestroy(exec);
  d->cuGraphDestroy(graph);
}

std::vector<uint8_t> download(const OutputRegion& o) {
  std::vector<uint8_t> bytes(static_cast<size_t>(o.rows * o.ld) * templates::dtype_bytes(o.dtype));
  auto d = driver();
  if (!d.ok() || (*d)->cuCtxSynchronize() != CUDA_SUCCESS ||
      (*d)->cuMemcpyDtoH(bytes.data(), o.ptr, bytes.size()) != CUDA_SUCCESS) {
    ADD_FAILURE() << "could not download " << o.name;
  }
  return bytes;
}

TEST_F(TuneGpu, GemmPicksACheckedChoiceAndRecordsEverything) {
  auto t = tuner(cache::TuneMode::kTune);
  const Problem p = gemm(64, 1024, 512);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  const TuneReport& r = sel->report();
  std::cout << r.table(8);
  EXPECT_FALSE(r.decision_from_cache);
  EXPECT_GE(r.candidates, 8);
  EXPECT_EQ(r.failures, 0) << r.table(50);
  int measured = 0;
  for (const auto& c : r.choices) {
    if (!c.status.ok()) continue;
    ++measured;
    EXPECT_GT(c.median_us, 0.0) << c.name;
    EXPECT_LE(c.error, 1e-2) << c.name;
  }
  // Every candidate was measured, except those the performance model pruned (default effort).
  EXPECT_EQ(measured + r.pruned, r.candidates) << r.table(50);
  EXPECT_GT(measured, 0);
  EXPECT_EQ(r.chosen, sel->choice_name());
  expect_correct(*sel);
  // The host phases, the compile wait and the benchmark are apart and together within the tune's total.
  for (double phase : {r.generate_seconds, r.plan_seconds, r.setup_seconds, r.compile_wait_seconds, r.benchmark_seconds}) {
    EXPECT_GE(phase, 0.0);
  }
  EXPECT_GT(r.generate_seconds, 0.0);
  EXPECT_GT(r.setup_seconds, 0.0);
  EXPECT_LE(r.generate_seconds + r.plan_seconds + r.setup_seconds + r.compile_wait_seconds + r.benchmark_seconds,
            r.total_seconds + 1e-6);
  // The measuring's phases: every timed run counted; the runs inside their batches' GPU spans, the phases inside
  // the time spent measuring.
  const MeasureCosts& m = r.measure_costs;
  int runs = 0;
  for (const auto& c : r.choices) runs += c.status.ok() ? c.reps : 0;
  EXPECT_GE(m.runs, runs);  // (estimates that did not stop a choice are not among its reps)
  EXPECT_GT(m.batches, 0);
  EXPECT_GT(m.timed_s, 0.0);
  EXPECT_LE(m.timed_s, m.gpu_span_s);
  EXPECT_LE(m.warmup_s + m.capture_s + m.queue_s + m.wait_s, r.measure_seconds + r.remeasure_seconds + 1e-6);
  // Every timing and the decision are in the cache.
  const auto timings = t->cache().timings(r.key);
  EXPECT_EQ(timings.size(), static_cast<size_t>(measured));
  for (const auto& timing : timings) {  // as the report has them, after a near-tie's re-measure too
    const auto c = std::find_if(r.choices.begin(), r.choices.end(),
                                [&](const ChoiceResult& c) { return c.name == timing.choice; });
    ASSERT_NE(c, r.choices.end()) << timing.choice;
    EXPECT_EQ(timing.samples, static_cast<uint32_t>(c->reps)) << timing.choice;
    EXPECT_DOUBLE_EQ(timing.median_us, c->median_us) << timing.choice;
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto decision, t->cache().lookup_decision(r.key));
  ASSERT_NE(decision, nullptr);
  EXPECT_EQ(decision->choice, r.chosen);
  // Asking again in the same tuner returns the same selection.
  KILN_ASSERT_OK_AND_ASSIGN(auto again, t->tune(p));
  EXPECT_EQ(again.get(), sel.get());
}

// Under the caller's promise that B is constant, the decode problem's early-weights choices (their first stages'
// weights loaded before the wait for the previous kernel) compute what the reference does, on the op's own buffers
// (which carry KILN_GEMM_B_CONSTANT), right after a kernel that keeps the GPU busy.
TEST_F(TuneGpu, EarlyWeightsChoicesOfABConstantProblemMatchTheReference) {
  GemmProblem g;
  g.m = 1, g.n = 4096, g.k = 4096;
  g.b_constant = true;
  const Problem p = Problem::gemm(g);
  auto def = default_ops().find(p.op);
  ASSERT_TRUE(def.ok());
  KILN_ASSERT_OK_AND_ASSIGN(auto ctx, choice_context(0));
  KILN_ASSERT_OK_AND_ASSIGN(auto choices, default_ops().choices(p, ctx));
  KILN_ASSERT_OK_AND_ASSIGN(auto gate, PrecompileGate::create({.executor = make_inline_executor()}));
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  auto run_into = [&](const ChoicePtr& c, OpBuffers& bufs) -> std::vector<uint8_t> {
    auto binaries = c->precompile(*gate, Priority::kNormal);
    KILN_EXPECT_OK(binaries.get());
    if (!binaries.get().ok()) return {};
    KILN_EXPECT_OK(c->prepare(*binaries.get()));
    auto ws = DeviceBuffer::allocate(std::max<size_t>(c->workspace_bytes(), 16));
    KILN_EXPECT_OK(ws.status());
    KILN_EXPECT_OK(c->run(bufs.args, ws->ptr(), nullptr));
    EXPECT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS) << c->name();
    return download(bufs.outputs[0]);
  };
  ChoicePtr reference;
  std::vector<ChoicePtr> early;
  for (const auto& c : choices) {
    if (c->name() == (*def)->reference(p)) reference = c;
    const std::string& n = c->name();
    if (n.find("_e6_tt") != std::string::npos || n.find("_e12_ts") != std::string::npos) early.push_back(c);
  }
  ASSERT_NE(reference, nullptr);
  ASSERT_EQ(early.size(), 3u);
  KILN_ASSERT_OK_AND_ASSIGN(OpBuffers ref_bufs, (*def)->buffers(p, 77));
  ASSERT_NE(std::get<KilnGemmArgs>(ref_bufs.args).flags & KILN_GEMM_B_CONSTANT, 0) << "the op's buffers carry the promise";
  const std::vector<uint8_t> want = run_into(reference, ref_bufs);
  for (const auto& c : early) {
    KILN_ASSERT_OK_AND_ASSIGN(OpBuffers bufs, (*def)->buffers(p, 77));
    const std::vector<uint8_t> got = run_into(c, bufs);
    ASSERT_EQ(got.size(), want.size()) << c->name();
    double diff = 0, norm = 0;
    for (size_t j = 0; j < got.size() / 2; ++j) {
      const double x = reference_check::element(got, j, DType::kBF16), y = reference_check::element(want, j, DType::kBF16);
      ASSERT_TRUE(std::isfinite(x)) << c->name() << ": d[" << j << "] not written";
      diff += (x - y) * (x - y);
      norm += y * y;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-2) << c->name();
  }
}

// A user choice that does `before` on the host, then launches a few-microsecond kernel.
class SmallKernelChoice final : public Choice {
 public:
  SmallKernelChoice(std::string name, CUdeviceptr buffer, std::function<void(const OpArgs&)> before)
      : name_(std::move(name)), buffer_(buffer), before_(std::move(before)) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kUser; }
  Status prepare(const Binaries&) override { return Status(); }
  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    before_(args);
    return fill_uniform(buffer_, 256, DType::kF32, 1, 0.f, 1.f, stream);
  }

 private:
  std::string name_;
  CUdeviceptr buffer_;
  std::function<void(const OpArgs&)> before_;
};

// A choice whose run() spends 3 ms on the host before it launches: the timed interval is the kernel's, not the
// host's, because a batch of timed runs starts on the GPU only once all of it is queued; with either hold.
TEST_F(TuneGpu, HostWorkBeforeALaunchIsNotTimed) {
  KILN_ASSERT_OK_AND_ASSIGN(int ordinal, current_device());
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo device, device_info(ordinal));
  for (bool on_host : {false, true}) {
    BenchmarkOptions options;
    options.hold_on_host = on_host;
    KILN_ASSERT_OK_AND_ASSIGN(auto runner, BenchRunner::create(options, device));
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buffer, DeviceBuffer::allocate(256 * sizeof(float)));
    SmallKernelChoice choice("slow_host", buffer.ptr(), [](const OpArgs&) { usleep(3000); });
    // 20 runs: two batches behind the stream hold (16 a batch), and 20 more: the release words' tickets go on.
    for (int call = 0; call < 2; ++call) {
      KILN_ASSERT_OK_AND_ASSIGN(Samples s, runner->time_runs(choice, CustomArgs{}, 0, 20, false));
      ASSERT_EQ(s.us.size(), 20u);
      for (double us : s.us) {
        EXPECT_LT(us, 500.0) << "a 3 ms host delay landed inside a timed run (hold on host: " << on_host << ")";
      }
    }
    EXPECT_EQ(runner->costs().batches, 4);
    EXPECT_EQ(runner->costs().runs, 40);
  }
}

// Timed runs rotate over operand sets allocated apart (BenchmarkOptions::placements), each with the same values;
// sets past the first are made only within the byte budget.
TEST_F(TuneGpu, TimedRunsRotateOverOperandSetsAllocatedApart) {
  auto t = tuner(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto def, t->ops().find("gemm"));
  const Problem p = gemm(64, 1024, 512);
  KILN_ASSERT_OK_AND_ASSIGN(OperandSets sets, make_operand_sets(*def, p, 1, 3, size_t{1} << 30));
  ASSERT_EQ(sets.sets.size(), 3u);
  std::set<const void*> a_pointers;
  for (const auto& s : sets.sets) a_pointers.insert(std::get<KilnGemmArgs>(s.args).a);
  EXPECT_EQ(a_pointers.size(), 3u) << "the sets share their operands";
  {  // the same values in each
    KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
    ASSERT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS);
    std::vector<uint16_t> first(64 * 512), third(64 * 512);
    ASSERT_EQ(d->cuMemcpyDtoH(first.data(), reinterpret_cast<CUdeviceptr>(std::get<KilnGemmArgs>(sets.sets[0].args).a),
                              first.size() * 2), CUDA_SUCCESS);
    ASSERT_EQ(d->cuMemcpyDtoH(third.data(), reinterpret_cast<CUdeviceptr>(std::get<KilnGemmArgs>(sets.sets[2].args).a),
                              third.size() * 2), CUDA_SUCCESS);
    EXPECT_TRUE(first == third);
  }
  // A budget under one set's bytes gives the first alone; one of two sets' bytes, three in all.
  size_t set_bytes = 0;
  for (const auto& b : sets.sets[0].storage) set_bytes += b.size();
  ASSERT_GT(set_bytes, 0u);
  KILN_ASSERT_OK_AND_ASSIGN(OperandSets one, make_operand_sets(*def, p, 1, 3, set_bytes - 1));
  EXPECT_EQ(one.sets.size(), 1u);
  KILN_ASSERT_OK_AND_ASSIGN(OperandSets budget_of_two, make_operand_sets(*def, p, 1, 5, 2 * set_bytes));
  EXPECT_EQ(budget_of_two.sets.size(), 3u);

  KILN_ASSERT_OK_AND_ASSIGN(int ordinal, current_device());
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo device, device_info(ordinal));
  KILN_ASSERT_OK_AND_ASSIGN(auto runner, BenchRunner::create(BenchmarkOptions{}, device));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buffer, DeviceBuffer::allocate(256 * sizeof(float)));
  std::vector<const OpArgs*> seen;  // which operand set each run() got
  SmallKernelChoice choice("set_recording", buffer.ptr(), [&](const OpArgs& args) { seen.push_back(&args); });
  const std::vector<const OpArgs*> args = sets.args();
  KILN_ASSERT_OK_AND_ASSIGN(Samples eager, runner->time_runs(choice, args, 0, 7, false));
  EXPECT_EQ(eager.us.size(), 7u);
  ASSERT_EQ(seen.size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(seen[i], args[i % 3]) << "run " << i;
  EXPECT_EQ(eager.placement, (std::vector<uint32_t>{0, 1, 2, 0, 1, 2, 0}));
  // A later round goes on where the earlier left off.
  seen.clear();
  KILN_ASSERT_OK_AND_ASSIGN(Samples later, runner->time_runs(choice, args, 0, 2, false, nullptr, 7));
  EXPECT_EQ(later.placement, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(seen, (std::vector<const OpArgs*>{args[1], args[2]}));
  // As graph replays: one capture per set, each replayed in turn.
  seen.clear();
  ReplayGraphs graphs;
  KILN_ASSERT_OK_AND_ASSIGN(Samples replayed, runner->time_runs(choice, args, 0, 6, true, &graphs));
  EXPECT_TRUE(replayed.graph);
  EXPECT_EQ(replayed.us.size(), 6u);
  EXPECT_EQ(seen, args);
  KILN_ASSERT_OK_AND_ASSIGN(Samples again, runner->time_runs(choice, args, 0, 6, true, &graphs));
  EXPECT_EQ(seen.size(), 3u) << "the kept graphs were captured again";
  // measure() warms every set up before it times.
  seen.clear();
  KILN_ASSERT_OK_AND_ASSIGN(Samples measured, runner->measure(choice, args, 0, 0));
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(std::set<const OpArgs*>(seen.begin(), seen.begin() + 3), std::set<const OpArgs*>(args.begin(), args.end()));
  // Every set is timed, and the figure is the placement-balanced median.
  EXPECT_EQ(std::set<uint32_t>(measured.placement.begin(), measured.placement.end()), (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ(summarize(measured).median, placed_median(measured.us, measured.placement));
  EXPECT_EQ(runner->time_runs(choice, std::vector<const OpArgs*>{}, 0, 3, false).status().code(),
            ErrorCode::kInvalidArgument);
}

// The L2 flush between timed runs reads its whole buffer and writes nothing back into it (a write would leave L2
// dirty: the point of reading). Its kernel stores to the buffer's first word only when a thread's XOR of what it
// read equals 0x9e3779b9, which a buffer of one repeated word never gives: planting that value as the last word's
// second element shows the last word was read; the repeated-word buffer comes back unchanged.
TEST_F(TuneGpu, TheL2FlushReadsEveryWordAndWritesNothing) {
  constexpr uint32_t kSentinel = 0x9e3779b9u;
  const size_t words = (size_t{96} << 20) / 4;  // 96 MiB: twice an H100/H200's L2, more words than threads
  std::vector<uint32_t> host(words, 0x5a5a5a5au);
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buffer, DeviceBuffer::allocate(words * 4));
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  ASSERT_EQ(d->cuMemcpyHtoD(buffer.ptr(), host.data(), words * 4), CUDA_SUCCESS);
  KILN_ASSERT_OK(read_through_l2(buffer.ptr(), words * 4, nullptr));
  std::vector<uint32_t> back(words);
  ASSERT_EQ(d->cuMemcpyDtoH(back.data(), buffer.ptr(), words * 4), CUDA_SUCCESS);
  EXPECT_TRUE(back == host) << "the flush changed its buffer";

  host[words - 3] = kSentinel ^ 0x5a5a5a5au;  // the last 16-byte word: {w, s ^ w, w, w} XORs to s
  ASSERT_EQ(d->cuMemcpyHtoD(buffer.ptr(), host.data(), words * 4), CUDA_SUCCESS);
  KILN_ASSERT_OK(read_through_l2(buffer.ptr(), words * 4, nullptr));
  uint32_t first = 0;
  ASSERT_EQ(d->cuMemcpyDtoH(&first, buffer.ptr(), 4), CUDA_SUCCESS);
  EXPECT_EQ(first, kSentinel) << "the flush did not read the buffer's last word";

  EXPECT_EQ(read_through_l2(buffer.ptr() + 4, 64, nullptr).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(read_through_l2(buffer.ptr(), 100, nullptr).code(), ErrorCode::kInvalidArgument);
}

TEST_F(TuneGpu, CachedDecisionInANewTunerMeasuresNothing) {
  const Problem p = gemm(16, 2048, 1024, "bias+gelu");
  std::string chosen;
  {
    auto t = tuner(cache::TuneMode::kTune);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    chosen = sel->choice_name();
  }
  auto t = tuner(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  EXPECT_TRUE(sel->report().decision_from_cache);
  EXPECT_TRUE(sel->report().choices.empty());
  EXPECT_EQ(sel->choice_name(), chosen);
  expect_correct(*sel);
}

// A warm start keeps a cached decision's binary and loads its module at the first run. That first run may be
// inside a graph capture in global mode (a serving engine captures sizes it never ran eagerly), which forbids
// module loads unless the loading thread relaxes its mode: the capture must succeed and replay correctly.
TEST_F(TuneGpu, ACachedDecisionLoadsAtItsFirstRunEvenInsideAGlobalCapture) {
  const Problem p = Problem::norm({.rows = 8, .cols = 4096});
  {
    auto t = tuner(cache::TuneMode::kTune);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    ASSERT_EQ(sel->choice()->kind(), ChoiceKind::kTemplate)
        << "the test needs a template decision (a module to load); chosen: " << sel->choice_name();
  }
  // TuneOptions::defer_loads is the default. The executor is made only when compiles are coming: none are.
  int executors_made = 0;
  TuneOptions warm;
  warm.cache = cache(cache::TuneMode::kTune);
  warm.executor = std::make_shared<DeferredExecutor>([&] {
    ++executors_made;
    return make_executor();
  }, "lazy", 1);
  KILN_ASSERT_OK_AND_ASSIGN(auto t, make_tuner(warm));
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  ASSERT_TRUE(sel->report().decision_from_cache);
  EXPECT_EQ(executors_made, 0) << "a warm start started the compile executor";
  auto def = default_ops().find(p.op);
  KILN_ASSERT_OK(def.status());
  KILN_ASSERT_OK_AND_ASSIGN(OpBuffers bufs, (*def)->buffers(p, 77));
  KILN_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::create());
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  capture_and_replay(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, 1,
                     [&](CUstream st) { return sel->run(bufs.args, st); }, "the first run's load broke the capture");
  if (HasFatalFailure()) return;
  ASSERT_FALSE(bufs.outputs.empty());
  const auto& o = bufs.outputs[0];
  const size_t bytes = static_cast<size_t>(o.rows * o.ld) * templates::dtype_bytes(o.dtype);
  std::vector<uint8_t> replayed(bytes), eager(bytes);
  ASSERT_EQ(d->cuMemcpyDtoH(replayed.data(), o.ptr, bytes), CUDA_SUCCESS);
  expect_correct(*sel, &bufs);  // runs eagerly on the same buffers and checks against the reference
  ASSERT_EQ(d->cuMemcpyDtoH(eager.data(), o.ptr, bytes), CUDA_SUCCESS);
  EXPECT_EQ(replayed, eager) << "the replayed graph computed something else than an eager run";
}

TEST_F(TuneGpu, UseAndStrictModesNeverMeasure) {
  const Problem p = gemm(32, 512, 256);
  {
    auto t = tuner(cache::TuneMode::kUse);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    EXPECT_EQ(sel->choice_name(), "cublas_default");
    EXPECT_TRUE(t->cache().timings(sel->report().key).empty());
    expect_correct(*sel);
  }
  auto t = tuner(cache::TuneMode::kStrict);
  auto sel = t->tune(p);
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), ErrorCode::kNotFound);
}

TEST_F(TuneGpu, NormsAndSoftmax) {
  auto t = tuner(cache::TuneMode::kTune, 6);
  for (const Problem& p : {Problem::norm({.rows = 17, .cols = 4096, .residual = true}),
                           Problem::norm({.layernorm = true, .rows = 7, .cols = 1000, .bias = true}),
                           Problem::softmax({.rows = 33, .cols = 5000})}) {
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    std::cout << sel->report().table(4);
    EXPECT_EQ(sel->report().failures, 0) << sel->report().table(50);
    expect_correct(*sel);
  }
}

// A private GEMM op with planted bad choices: one that does not compile, one that computes the wrong thing,
// one that writes only half its output.
Result<std::vector<ChoicePtr>> faulty_choices(const Problem& p, const ChoiceContext& ctx) {
  const char* body[] = {
      " this does not compile ",
      " int i = blockIdx.x * blockDim.x + threadIdx.x;"
      " if (i < a.m * a.n) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(1.0f); ",
      " int i = blockIdx.x * blockDim.x + threadIdx.x;"
      " if (i < a.m * a.n / 2) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(0.0f); ",
  };
  const char* names[] = {"planted_syntax_error", "planted_wrong_values", "planted_half_written"};
  std::vector<ChoicePtr> out;
  for (int i = 0; i < 3; ++i) {
    out.push_back(make_user_choice(names[i], planted::user_source(names[i], body[i]), ctx.target,
                                   planted::elementwise_launch()));
  }
  (void)p;
  return out;
}

TEST_F(TuneGpu, FailingChoicesAreRecordedAndTheTuneCompletes) {
  const std::string op = "gemm_with_planted_faults";
  KILN_ASSERT_OK(planted::add_gemm_copy(op));
  KILN_ASSERT_OK(default_ops().add_choices(op, faulty_choices));
  Problem p = gemm(64, 256, 128);
  p.op = op;
  auto t = tuner(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  const TuneReport& r = sel->report();
  std::cout << r.table(3);
  std::map<std::string, Status> failed;
  for (const auto& c : r.choices) {
    if (!c.status.ok()) failed[c.name] = c.status;
  }
  ASSERT_EQ(failed.size(), 3u) << r.table(50);
  EXPECT_EQ(failed["planted_syntax_error"].code(), ErrorCode::kCompileError);
  EXPECT_EQ(failed["planted_wrong_values"].code(), ErrorCode::kWrongResult);
  EXPECT_NE(failed["planted_wrong_values"].message().find("relative error"), std::string::npos);
  EXPECT_EQ(failed["planted_half_written"].code(), ErrorCode::kWrongResult);
  EXPECT_NE(failed["planted_half_written"].message().find("not written"), std::string::npos);
  EXPECT_EQ(sel->choice_name().rfind("planted", 0), std::string::npos);
  expect_correct(*sel);
  // The failures are cached with their reasons: a new tuner does not try them again.
  auto again = tuner(cache::TuneMode::kTune);
  for (const auto& [name, why] : failed) {
    EXPECT_FALSE(again->cache().should_measure(r.key, name)) << name;
    auto rec = again->cache().cached_timing(r.key, name);
    ASSERT_TRUE(rec.has_value());
    EXPECT_FALSE(rec->ok);
  }
}

// A user kernel presented as a built-in choice (kind `as`): what the tuner's built-in order (timed first,
// checked only when it could win) sees. (As an extern it is measured without being ranked by the model; it
// compiles, so cuBLAS, ready at once, sets the best time before it is measured.)
class AsBuiltin : public Choice {
 public:
  AsBuiltin(ChoicePtr inner, ChoiceKind as) : inner_(std::move(inner)), as_(as) {}
  const std::string& name() const override { return inner_->name(); }
  ChoiceKind kind() const override { return as_; }
  std::vector<CompileRequest> kernels() const override { return inner_->kernels(); }
  Status prepare(const Binaries& b) override { return inner_->prepare(b); }
  Status run(const OpArgs& args, CUdeviceptr ws, CUstream st) const override { return inner_->run(args, ws, st); }

 private:
  ChoicePtr inner_;
  ChoiceKind as_;
};

// Built-in choices are timed before they are checked: a wrong one fast enough to win is still checked and
// refused; a wrong one its short estimate drops is not checked at all (it cannot be chosen).
TEST_F(TuneGpu, BuiltinChoicesAreCheckedWhenTheyCouldWin) {
  const std::string op = "gemm_with_planted_builtins";
  KILN_ASSERT_OK(planted::add_gemm_copy(op));
  KILN_ASSERT_OK(default_ops().add_choices(op, [](const Problem&, const ChoiceContext& ctx)
                                                  -> Result<std::vector<ChoicePtr>> {
    const std::string ones = " int i = blockIdx.x * blockDim.x + threadIdx.x;"
                             " if (i < a.m * a.n) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(1.0f); ";
    // ~1 ms of spinning before the same wrong store: far slower than any GEMM of this size.
    const std::string slow = " long long t0 = clock64(); while (clock64() - t0 < 2000000) { }" + ones;
    std::vector<ChoicePtr> out;
    out.push_back(std::make_shared<AsBuiltin>(
        make_user_choice("planted_fast_wrong", planted::user_source("planted_fast_wrong", ones), ctx.target,
                         planted::elementwise_launch()),
        ChoiceKind::kExtern));
    out.push_back(std::make_shared<AsBuiltin>(
        make_user_choice("planted_slow_wrong", planted::user_source("planted_slow_wrong", slow), ctx.target,
                         planted::elementwise_launch()),
        ChoiceKind::kExtern));
    return out;
  }));
  Problem p = gemm(64, 256, 128);
  p.op = op;
  auto t = tuner(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  const TuneReport& r = sel->report();
  std::cout << r.table(50);
  const ChoiceResult* fast = nullptr;
  const ChoiceResult* slow = nullptr;
  for (const auto& c : r.choices) {
    if (c.name == "planted_fast_wrong") fast = &c;
    if (c.name == "planted_slow_wrong") slow = &c;
  }
  ASSERT_NE(fast, nullptr) << r.table(50);
  ASSERT_NE(slow, nullptr) << r.table(50);
  EXPECT_EQ(fast->status.code(), ErrorCode::kWrongResult) << fast->status.to_string();
  EXPECT_TRUE(slow->status.ok()) << slow->status.to_string();
  EXPECT_TRUE(slow->partial) << r.table(50);
  EXPECT_EQ(sel->choice_name().rfind("planted", 0), std::string::npos);
  expect_correct(*sel);
}

TEST_F(TuneGpu, DeferredSelectionBecomesADispatcherThatWorksInAGraph) {
  auto t = tuner(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto deferred, t->defer(gemm(64, 1024, 1024)));
  KILN_ASSERT_OK_AND_ASSIGN(TuneReport at16, deferred->choice_timings(16));
  EXPECT_NE(at16.problem.find("gemm 16x1024x1024"), std::string::npos);
  KILN_ASSERT_OK_AND_ASSIGN(auto dispatcher, deferred->finalize({16, 64}));
  ASSERT_EQ(dispatcher->selections().size(), 2u);
  EXPECT_EQ(&dispatcher->select(16), dispatcher->selections()[0].get());
  EXPECT_EQ(&dispatcher->select(17), dispatcher->selections()[1].get());
  // M = 20 runs bucket 64's choice, with M as a run-time argument.
  const Selection& s64 = *dispatcher->selections()[1];
  Selection at20(gemm(20, 1024, 1024), s64.choice(), s64.report());
  KILN_ASSERT_OK(at20.reserve_workspace(s64.choice()->workspace_bytes()));
  expect_correct(at20);
  // The dispatcher inside CUDA-graph capture, replayed.
  auto def = default_ops().find("gemm");
  KILN_ASSERT_OK_AND_ASSIGN(OpBuffers bufs, (*def)->buffers(gemm(40, 1024, 1024), 77));
  KILN_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::create());
  capture_and_replay(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, 3,
                     [&](CUstream st) { return dispatcher->run(bufs.args, st); });
  if (HasFatalFailure()) return;
  Selection at40(gemm(40, 1024, 1024), s64.choice(), s64.report());
  KILN_ASSERT_OK(at40.reserve_workspace(s64.choice()->workspace_bytes()));
  expect_correct(at40, &bufs);
}

// A stream-K template choice carries a fixed workspace (flags and per-SM slots): a selection reserves it once and
// serves a 64x larger call, inside graph capture too, without growing it (a workspace scaled by the call's size
// would be ~64x larger and refused in capture), and the results are right on a poisoned workspace, and again with
// the flags the choice keeps lowered per stream.
TEST_F(TuneGpu, AStreamKChoiceServesLargerCallsFromItsFixedWorkspace) {
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "stream-K is a gemm_wgmma_sm90 mode (Hopper)";
  KILN_ASSERT_OK_AND_ASSIGN(templates::TemplatePtr t, templates::find_template("gemm_wgmma_sm90"));
  using templates::Value;
  // The layouts of gemm()'s problems: A and B row-major.
  templates::Params p = templates::gemm_problem_params(DType::kBF16, templates::Layout::kRowMajor,
                                                        templates::Layout::kRowMajor,
                                                        *templates::parse_epilogue("", DType::kBF16), false);
  for (auto [k, v] : std::initializer_list<std::pair<const char*, Value>>{
           {"bm", Value::integer(128)}, {"bn", Value::integer(128)}, {"consumers", Value::integer(2)},
           {"stages", Value::integer(6)}, {"group_m", Value::integer(8)}, {"persistent", Value::boolean(true)},
           {"cluster_k", Value::integer(1)}, {"blocks_per_sm", Value::integer(1)}, {"swap_ab", Value::boolean(false)},
           {"stream_k", Value::boolean(true)}})
    p.insert_or_assign(k, v);
  KILN_ASSERT_OK_AND_ASSIGN(templates::Rendered r, t->render(p));
  ChoicePtr c = make_template_choice(t, r, Target{"sm_90a"}, templates::Shape{16, 1024, 4096});
  const size_t bytes = c->workspace_bytes();
  EXPECT_EQ(bytes, 4096u + static_cast<size_t>(info.sm_count) * 128 * 128 * 4);
  EXPECT_FALSE(c->workspace_scales());
  KILN_ASSERT_OK_AND_ASSIGN(auto gate, PrecompileGate::create({.executor = make_inline_executor()}));
  auto binaries = c->precompile(*gate, Priority::kNormal);
  KILN_ASSERT_OK(binaries.get());
  KILN_ASSERT_OK(c->prepare(*binaries.get()));
  Selection small(gemm(16, 1024, 4096), c, TuneReport{});
  KILN_ASSERT_OK(small.reserve_workspace(bytes));
  Selection large(gemm(1000, 1024, 4096), c, TuneReport{});
  KILN_ASSERT_OK(large.reserve_workspace(bytes));
  auto def = default_ops().find("gemm");
  KILN_ASSERT_OK_AND_ASSIGN(OpBuffers bufs, (*def)->buffers(large.problem(), 77));
  KILN_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::create());
  // The small selection (dynamic size 16) runs the 1000-row call in capture: no growth is needed.
  capture_and_replay(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, 3,
                     [&](CUstream st) { return small.run(bufs.args, st); });
  if (HasFatalFailure()) return;
  expect_correct(large, &bufs);
  if (HasFatalFailure()) return;
  const std::vector<uint8_t> eager = download(bufs.outputs[0]);

  // That capture was the stream's first run, so the graph lowers the workspace's flags with a memset node. Run
  // eagerly on the stream, the choice lowers flags of its own for it once; a graph captured after that has no
  // memset node, and each run and replay must leave those flags lowered for the next. The outputs are poisoned
  // first and must come back bit for bit as the checked run wrote them (the sum order is fixed).
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  for (int i = 0; i < 2; ++i) KILN_ASSERT_OK(small.run(bufs.args, stream.get()));
  const OutputRegion& out = bufs.outputs[0];
  ASSERT_EQ(d->cuMemsetD8Async(out.ptr, 0xFF, eager.size(), stream.get()), CUDA_SUCCESS);
  capture_and_replay(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, 3,
                     [&](CUstream st) { return small.run(bufs.args, st); });
  if (HasFatalFailure()) return;
  EXPECT_TRUE(download(out) == eager) << "a replay with the choice's own flags differs from the checked run";
  KILN_ASSERT_OK(small.run(bufs.args, stream.get()));
  KILN_ASSERT_OK(stream.synchronize());
  EXPECT_TRUE(download(out) == eager) << "an eager run after the replays differs from the checked run";
}

// A workload plans on a thread of its own (PlanAhead), which has no current CUDA context: its plans must hold
// cuBLASLt's algorithms as the tuning thread's do (on 2 Dec they held none, and the suite's tunes, which take
// the planned choices, lost them), and the tune that takes them measures them.
TEST_F(TuneGpu, AProblemPlannedOnAThreadWithoutAContextKeepsCublasLtsAlgorithms) {
  auto t = tuner(cache::TuneMode::kTune);
  const Problem p = gemm(64, 4096, 4096);
  auto count_lt = [](const std::vector<ChoicePtr>& cs) {
    int n = 0;
    for (const auto& c : cs) n += c->name().rfind("cublaslt_", 0) == 0;
    return n;
  };
  KILN_ASSERT_OK_AND_ASSIGN(PlannedChoices here, t->plan_ahead(p));
  ASSERT_GT(count_lt(here.first), 0) << "the fixture's premise: this thread's plan has cuBLASLt algorithms";
  PlanAhead ahead(*t, {p}, PlanAhead::Options{});
  ahead.wait_idle();
  EXPECT_EQ(ahead.failed_plans(), 0);
  int lt = 0;
  for (const auto& name : ahead.requested(0)) lt += name.rfind("cublaslt_", 0) == 0;
  EXPECT_EQ(lt, count_lt(here.first));
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  ahead.tuned(0);
  int measured = 0;
  for (const auto& c : sel->report().choices) measured += c.name.rfind("cublaslt_", 0) == 0 && c.reps > 0;
  EXPECT_GT(measured, 0) << "the tune took the planned choices without cuBLASLt's";
  expect_correct(*sel);
}

// tune() itself on a thread with no current context (a serving engine's worker thread): it runs in the tuner's
// context, measures cuBLASLt's algorithms as on the tuner's own thread, and its pick runs correctly here.
TEST_F(TuneGpu, ATuneOnAThreadWithoutAContextRunsInTheTunersContext) {
  auto t = tuner(cache::TuneMode::kTune);
  const Problem p = gemm(64, 4096, 2048);
  Result<std::shared_ptr<Selection>> sel = make_error(ErrorCode::kInternal, "not run");
  bool had_context = true;
  std::thread worker([&] {
    auto current = current_context();
    had_context = !current.ok() || *current != nullptr;
    sel = t->tune(p);
  });
  worker.join();
  ASSERT_FALSE(had_context) << "the fixture's premise: a new thread has no current context";
  KILN_ASSERT_OK(sel.status());
  int measured = 0;
  for (const auto& c : (*sel)->report().choices) measured += c.name.rfind("cublaslt_", 0) == 0 && c.reps > 0;
  EXPECT_GT(measured, 0) << "no cuBLASLt algorithm was measured on a thread without a context";
  expect_correct(**sel);
}

}  // namespace
}  // namespace kiln::runtime
