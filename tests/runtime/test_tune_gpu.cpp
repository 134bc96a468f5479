// The autotuner end to end on a GPU: tuning, checking against the reference, cached decisions, tune modes,
// failing choices, deferred selection, size dispatch and graph capture. Skipped without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "kiln/cache/tuning.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

class TuneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    dir_ = fs::temp_directory_path() / ("kiln_tune_gpu_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<cache::TuningCache> cache(cache::TuneMode mode) {
    cache::StoreOptions store;
    store.dir = dir_.string();
    auto c = cache::TuningCache::open(mode, store);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return std::shared_ptr<cache::TuningCache>(std::move(c).value());
  }
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

  // Runs `sel` on fresh buffers of its problem and checks the output against the op's reference choice.
  // `given`: buffers made by the op with seed 77 for the selection's problem, to check in place.
  void expect_correct(const Selection& sel, OpBuffers* given = nullptr) {
    auto def = default_ops().find(sel.problem().op);
    ASSERT_TRUE(def.ok());
    OpBuffers own;
    if (!given) {
      KILN_ASSERT_OK_AND_ASSIGN(own, (*def)->buffers(sel.problem(), 77));
    }
    OpBuffers& mine = given ? *given : own;
    KILN_ASSERT_OK_AND_ASSIGN(OpBuffers ref, (*def)->buffers(sel.problem(), 77));
    KILN_ASSERT_OK(sel.run(mine.args, nullptr));
    KILN_ASSERT_OK_AND_ASSIGN(auto ctx, choice_context(0));
    KILN_ASSERT_OK_AND_ASSIGN(auto choices, default_ops().choices(sel.problem(), ctx));
    ChoicePtr reference;
    for (const auto& c : choices) {
      if (c->name() == (*def)->reference(sel.problem())) reference = c;
    }
    ASSERT_NE(reference, nullptr);
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, DeviceBuffer::allocate(reference->workspace_bytes()));
    KILN_ASSERT_OK_AND_ASSIGN(auto gate, PrecompileGate::create({.executor = make_inline_executor()}));
    auto binaries = reference->precompile(*gate, Priority::kNormal);
    KILN_ASSERT_OK(binaries.get());
    KILN_ASSERT_OK(reference->prepare(*binaries.get()));
    KILN_ASSERT_OK(reference->run(ref.args, ws.ptr(), nullptr));
    KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
    ASSERT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS);
    for (size_t i = 0; i < mine.outputs.size(); ++i) {
      const auto& o = mine.outputs[i];
      size_t n = static_cast<size_t>(o.rows * o.ld);
      size_t bytes = n * templates::dtype_bytes(o.dtype);
      std::vector<uint8_t> a(bytes), b(bytes);
      KILN_ASSERT_OK(d->cuMemcpyDtoH(a.data(), o.ptr, bytes) == CUDA_SUCCESS ? Status() : make_error(ErrorCode::kCudaError, "copy"));
      KILN_ASSERT_OK(d->cuMemcpyDtoH(b.data(), ref.outputs[i].ptr, bytes) == CUDA_SUCCESS ? Status() : make_error(ErrorCode::kCudaError, "copy"));
      double diff = 0, norm = 0;
      for (size_t j = 0; j < n; ++j) {
        auto val = [&](const std::vector<uint8_t>& v) -> double {
          if (o.dtype == DType::kF32) return reinterpret_cast<const float*>(v.data())[j];
          uint16_t h = reinterpret_cast<const uint16_t*>(v.data())[j];
          if (o.dtype == DType::kBF16) {
            uint32_t bits = uint32_t{h} << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
          }
          // f16
          int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
          double m = exp == 0 ? man / 1024.0 * std::pow(2.0, -14) : (1 + man / 1024.0) * std::pow(2.0, exp - 15);
          return exp == 31 ? std::nan("") : (sign ? -m : m);
        };
        double x = val(a), y = val(b);
        ASSERT_TRUE(std::isfinite(x)) << sel.choice_name() << ": " << o.name << "[" << j << "] not written";
        diff += (x - y) * (x - y);
        norm += y * y;
      }
      EXPECT_LE(std::sqrt(diff / norm), o.dtype == DType::kF32 ? 1e-3 : 1e-2) << sel.choice_name() << " " << o.name;
    }
  }

  fs::path dir_;
};

Problem gemm(int64_t m, int64_t n, int64_t k, const char* epilogue = "") {
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  g.epilogue = *templates::parse_epilogue(epilogue, DType::kBF16);
  return Problem::gemm(g);
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
  EXPECT_EQ(measured, r.candidates);
  EXPECT_EQ(r.chosen, sel->choice_name());
  expect_correct(*sel);
  // Every timing and the decision are in the cache.
  EXPECT_EQ(t->cache().timings(r.key).size(), static_cast<size_t>(r.candidates));
  KILN_ASSERT_OK_AND_ASSIGN(auto decision, t->cache().lookup_decision(r.key));
  ASSERT_NE(decision, nullptr);
  EXPECT_EQ(decision->choice, r.chosen);
  // Asking again in the same tuner returns the same selection.
  KILN_ASSERT_OK_AND_ASSIGN(auto again, t->tune(p));
  EXPECT_EQ(again.get(), sel.get());
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
Result<std::vector<ChoicePtr>> planted(const Problem& p, const ChoiceContext& ctx) {
  const char* body[] = {
      "extern \"C\" __global__ void k(const KilnGemmArgs a) { this does not compile }",
      "extern \"C\" __global__ void k(const KilnGemmArgs a) { int i = blockIdx.x * blockDim.x + threadIdx.x;"
      " if (i < a.m * a.n) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(1.0f); }",
      "extern \"C\" __global__ void k(const KilnGemmArgs a) { int i = blockIdx.x * blockDim.x + threadIdx.x;"
      " if (i < a.m * a.n / 2) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(0.0f); }",
  };
  const char* names[] = {"planted_syntax_error", "planted_wrong_values", "planted_half_written"};
  std::vector<ChoicePtr> out;
  for (int i = 0; i < 3; ++i) {
    KernelSource s;
    s.name = names[i];
    s.entry = "k";
    s.source = std::string("#include <cuda_bf16.h>\n#include \"kiln/templates/kernel_args.h\"\n") + body[i];
    s.headers.push_back(kernel_abi_header());
    out.push_back(make_user_choice(names[i], s, ctx.target, [](const Kernel& k, const OpArgs& args, CUstream st) {
      const auto& a = std::get<KilnGemmArgs>(args);
      LaunchConfig cfg;
      cfg.block = {256};
      cfg.grid = {static_cast<unsigned>((a.m * a.n + 255) / 256)};
      cfg.stream = st;
      return k(cfg, a);
    }));
  }
  (void)p;
  return out;
}

TEST_F(TuneGpu, FailingChoicesAreRecordedAndTheTuneCompletes) {
  auto gemm_def = default_ops().find("gemm");
  ASSERT_TRUE(gemm_def.ok());
  OpDef def = **gemm_def;
  def.name = "gemm_with_planted_faults";
  KILN_ASSERT_OK(default_ops().add(def));
  KILN_ASSERT_OK(default_ops().add_choices(def.name, planted));
  Problem p = gemm(64, 256, 128);
  p.op = def.name;
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
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  CUgraph graph = nullptr;
  ASSERT_EQ(d->cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  Status captured = dispatcher->run(bufs.args, stream.get());
  ASSERT_EQ(d->cuStreamEndCapture(stream.get(), &graph), CUDA_SUCCESS);
  KILN_ASSERT_OK(captured);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(d->cuGraphLaunch(exec, stream.get()), CUDA_SUCCESS);
  KILN_ASSERT_OK(stream.synchronize());
  d->cuGraphExecDestroy(exec);
  d->cuGraphDestroy(graph);
  Selection at40(gemm(40, 1024, 1024), s64.choice(), s64.report());
  KILN_ASSERT_OK(at40.reserve_workspace(s64.choice()->workspace_bytes()));
  expect_correct(at40, &bufs);
}

}  // namespace
}  // namespace kiln::runtime
