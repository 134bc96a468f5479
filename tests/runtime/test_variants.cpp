// Variant ops (kiln/runtime/variants.h): registration rules, keys that follow the sources, compiles through
// NVRTC and the cache without a GPU; on a GPU, a whole tune with a wrong variant and a failing check, the
// decision reused by a second tuner without measuring, and size dispatch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "kiln/cache/tuning.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln/runtime/variants.h"
#include "kiln_test.h"
#include "tuning_dir.h"

namespace kiln::runtime {
namespace {

// y[i] = a * x[i] + y0[i] with VEC elements per thread; BROKEN writes wrong values everywhere, FIRST_OFF only
// into y[0] (too little for the relative-norm comparison to see; the caller's check sees it).
const char* kAxpy = R"(
extern "C" __global__ void axpy(const float* x, const float* y0, float* y, float a, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  #pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (i + j < n) y[i + j] = a * x[i + j] + y0[i + j] + (BROKEN || (FIRST_OFF && i + j == 0) ? 1.0f : 0.0f);
  }
}
)";

enum Fault { kNone, kBroken, kFirstOff };

Variant axpy_variant(int vec, int block, Fault fault = kNone) {
  const bool broken = fault == kBroken;
  Variant v;
  v.name = fmt::format("vec{}_b{}{}", vec, block, broken ? "_broken" : fault == kFirstOff ? "_first_off" : "");
  v.source = kAxpy;
  v.kernel = "axpy";
  v.defines = {{"VEC", std::to_string(vec)}, {"BROKEN", broken ? "1" : "0"}, {"FIRST_OFF", fault == kFirstOff ? "1" : "0"}};
  v.parameters = {{"vec", std::to_string(vec)}, {"block", std::to_string(block)}};
  v.geometry = [vec, block](std::span<const int64_t> sizes) -> Result<LaunchDims> {
    LaunchDims d;
    d.block.x = block;
    d.grid.x = static_cast<unsigned>((sizes[0] + int64_t(vec) * block - 1) / (int64_t(vec) * block));
    return d;
  };
  return v;
}

// Buffers of an axpy of n floats: x = i % 7, y0 = 1, a = 2.
struct AxpyBuffers {
  DeviceBuffer x, y0, y;
  float a = 2.0f;
  int n = 0;
  CUdeviceptr xp = 0, y0p = 0, yp = 0;
};

Result<VariantBuffers> axpy_buffers(std::span<const int64_t> sizes, uint32_t) {
  auto b = std::make_shared<AxpyBuffers>();
  b->n = static_cast<int>(sizes[0]);
  const size_t bytes = sizeof(float) * b->n;
  KILN_ASSIGN_OR_RETURN(b->x, DeviceBuffer::allocate(bytes));
  KILN_ASSIGN_OR_RETURN(b->y0, DeviceBuffer::allocate(bytes));
  KILN_ASSIGN_OR_RETURN(b->y, DeviceBuffer::allocate(bytes));
  std::vector<float> x(b->n), y0(b->n, 1.0f);
  for (int i = 0; i < b->n; ++i) x[i] = static_cast<float>(i % 7);
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuMemcpyHtoD(b->x.ptr(), x.data(), bytes));
  KILN_CHECK(d->cuMemcpyHtoD(b->y0.ptr(), y0.data(), bytes));
  b->xp = b->x.ptr();
  b->y0p = b->y0.ptr();
  b->yp = b->y.ptr();
  VariantBuffers vb;
  vb.params = {&b->xp, &b->y0p, &b->yp, &b->a, &b->n};
  vb.outputs = {OutputRegion{b->yp, DType::kF32, 1, b->n, b->n, "y"}};
  vb.owner = b;
  return vb;
}

VariantOp axpy_op(std::string name, std::vector<Variant> variants) {
  VariantOp op;
  op.name = std::move(name);
  op.variants = std::move(variants);
  op.buffers = axpy_buffers;
  op.tolerance = 1e-5;
  return op;
}

TEST(Variants, ValidationNamesWhatIsWrong) {
  auto expect_invalid = [](const VariantOp& op, const std::string& words) {
    Status s = validate_variants(op);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  VariantOp good = axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256)});
  KILN_EXPECT_OK(validate_variants(good));

  VariantOp op = good;
  op.name.clear();
  expect_invalid(op, "needs a name");
  op = good;
  op.variants.clear();
  expect_invalid(op, "has no variants");
  op = good;
  op.buffers = nullptr;
  expect_invalid(op, "buffers function");
  op = good;
  op.tolerance = 0;
  expect_invalid(op, "tolerance");
  op = good;
  op.variants[1].name = op.variants[0].name;
  expect_invalid(op, "two variants are named 'vec1_b128'");
  op = good;
  op.variants[0].source.clear();
  expect_invalid(op, "'vec1_b128' has no source");
  op = good;
  op.variants[0].kernel.clear();
  expect_invalid(op, "names no kernel");
  op = good;
  op.variants[0].name.clear();
  expect_invalid(op, "variant 0 has no name");
  op = good;
  op.reference = "nope";
  expect_invalid(op, "reference 'nope' is not one of its variants");
  op = good;
  op.variants[0].geometry = nullptr;
  op.variants[0].dims.block.x = 0;
  expect_invalid(op, "zero dimension");
  op = good;
  op.variants[0].defines.push_back({"", "1"});
  expect_invalid(op, "define with no name");
}

TEST(Variants, RegistrationNeverReplacesAnOpThatIsNotAVariantOp) {
  OpRegistry ops;
  OpDef plain;
  plain.name = "t.plain";
  plain.choices = [](const Problem&, const ChoiceContext&) -> Result<std::vector<ChoicePtr>> { return std::vector<ChoicePtr>{}; };
  plain.reference = [](const Problem&) { return std::string("x"); };
  plain.buffers = [](const Problem&, uint32_t) -> Result<OpBuffers> { return OpBuffers{}; };
  plain.tolerance = [](DType) { return 0.0; };
  KILN_ASSERT_OK(ops.add(plain));
  auto clash = register_variants(ops, axpy_op("t.plain", {axpy_variant(1, 128)}));
  EXPECT_EQ(clash.status().code(), ErrorCode::kAlreadyExists);
  // A variant op may be registered again (a DSL re-JITs its variants).
  KILN_ASSERT_OK(register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128)})));
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet again, register_variants(ops, axpy_op("t.axpy", {axpy_variant(2, 128)})));
  EXPECT_EQ(again.op(), "t.axpy");
  // The built-in ops are not variant ops either.
  EXPECT_EQ(register_variants(default_ops(), axpy_op("gemm", {axpy_variant(1, 128)})).status().code(),
            ErrorCode::kAlreadyExists);
}

TEST(Variants, KeysFollowTheSourcesAndTheSizes) {
  OpRegistry ops;
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet a, register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256)})));
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet same, register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256)})));
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet edited,
                            register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256, kBroken)})));
  EXPECT_EQ(a.fingerprint(), same.fingerprint());
  EXPECT_NE(a.fingerprint(), edited.fingerprint());
  cache::DeviceFingerprint dev;
  cache::VersionStamp ver;
  const std::string k1 = a.problem({1024}).key(dev, ver).canonical();
  EXPECT_EQ(k1, same.problem({1024}).key(dev, ver).canonical());
  EXPECT_NE(k1, edited.problem({1024}).key(dev, ver).canonical());
  EXPECT_NE(k1, a.problem({2048}).key(dev, ver).canonical());
  EXPECT_NE(k1, a.problem({1024}, {{"dtype", "f32"}}).key(dev, ver).canonical());
  EXPECT_EQ(a.problem({1024}).op, "t.axpy");
  EXPECT_EQ(a.problem({1024}).dynamic_size(), 1024);
  EXPECT_FALSE(a.problem({0}).validate().ok());
}

TEST(Variants, SourcesCarryDefinesAndNameExpressions) {
  Variant v = axpy_variant(4, 256);
  v.options = {"--use_fast_math"};
  KernelSource s = variant_source("t.axpy", v);
  EXPECT_EQ(s.name, "t.axpy.vec4_b256");
  EXPECT_EQ(s.entry, "axpy");
  EXPECT_EQ(s.options, (std::vector<std::string>{"-DVEC=4", "-DBROKEN=0", "-DFIRST_OFF=0", "--use_fast_math"}));
  EXPECT_TRUE(s.name_expressions.empty());
  v.kernel = "scale<4>";
  v.defines = {{"FLAG", ""}};
  s = variant_source("t.axpy", v);
  EXPECT_EQ(s.name_expressions, (std::vector<std::string>{"scale<4>"}));
  EXPECT_EQ(s.options.front(), "-DFLAG");
}

class VariantsCompile : public ::testing::Test {
 protected:
  std::shared_ptr<cache::TuningCache> open_cache(cache::TuneMode mode) { return dir_.open(mode); }
  TuningDir dir_{"kiln_variants"};
};

// What `kiln precompile` does on a build machine: every variant through NVRTC into the cache, no GPU needed.
TEST_F(VariantsCompile, PrecompileWithoutAGpuFillsTheCache) {
  OpRegistry ops;
  Variant templated;
  templated.name = "templated";
  templated.source = "template <int V> __global__ void scale(float* x) { x[threadIdx.x * V] *= 2.0f; }";
  templated.kernel = "scale<4>";
  templated.dims.block.x = 32;
  Variant broken = axpy_variant(2, 128);
  broken.name = "syntax_error";
  broken.source = "extern \"C\" __global__ void axpy() { this is not cuda }";
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet set,
                            register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256), templated, broken})));
  auto cache = open_cache(cache::TuneMode::kTune);
  std::shared_ptr<Executor> exec = make_inline_executor();
  KILN_ASSERT_OK_AND_ASSIGN(auto gate, make_cached_gate(cache, exec));
  KILN_ASSERT_OK_AND_ASSIGN(PrecompileReport r, precompile_problem(ops, set.problem({4096}), Target{"sm_90"}, *gate, {}));
  EXPECT_EQ(r.kernels, 4);
  EXPECT_EQ(r.failed, 1);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("t.axpy.syntax_error"), std::string::npos) << r.failures[0];
  EXPECT_NE(r.failures[0].find("compile error"), std::string::npos) << r.failures[0];
  // A second gate over the same cache compiles nothing: every good binary is a cache hit.
  auto again_cache = open_cache(cache::TuneMode::kTune);
  KILN_ASSERT_OK_AND_ASSIGN(auto again, make_cached_gate(again_cache, exec));
  KILN_ASSERT_OK_AND_ASSIGN(PrecompileReport r2, precompile_problem(ops, set.problem({4096}), Target{"sm_90"}, *again, {}));
  EXPECT_EQ(r2.cached, 3);
  EXPECT_EQ(again->counters().compiled, 0u);
}

TEST_F(VariantsCompile, ChoicesAreTheVariantsWithTheirParameters) {
  OpRegistry ops;
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet set, register_variants(ops, axpy_op("t.axpy", {axpy_variant(1, 128), axpy_variant(4, 256)})));
  KILN_ASSERT_OK_AND_ASSIGN(ChoiceContext ctx, choice_context_for_arch(Target{"sm_90"}));
  KILN_ASSERT_OK_AND_ASSIGN(auto choices, ops.choices(set.problem({100}), ctx));
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[1]->name(), "vec4_b256");
  EXPECT_EQ(choices[1]->kind(), ChoiceKind::kUser);
  EXPECT_EQ(choices[1]->parameters().at("vec"), "4");
  ASSERT_EQ(choices[1]->kernels().size(), 1u);
  EXPECT_EQ(choices[1]->kernels()[0].target.arch, "sm_90");
  KILN_ASSERT_OK_AND_ASSIGN(auto def, ops.find("t.axpy"));
  EXPECT_EQ(def->reference(set.problem({100})), "vec1_b128");
  EXPECT_FALSE(def->verify);  // no check callback given
  // A variant that was never prepared says so rather than launching nothing.
  void* params[] = {nullptr};
  Status s = choices[0]->run(CustomArgs{{}, {100}, params}, 0, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
}

// ---- on a GPU

class VariantsGpu : public VariantsCompile {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    VariantsCompile::SetUp();
  }
  std::unique_ptr<Tuner> tuner(cache::TuneMode mode) {
    TuneOptions o;
    o.cache = open_cache(mode);
    o.bench.budget_ms = 1;
    auto t = make_tuner(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
};

TEST_F(VariantsGpu, TunesChecksCachesAndDispatches) {
  VariantOp op = axpy_op("t.gpu_axpy", {axpy_variant(1, 128), axpy_variant(2, 256), axpy_variant(4, 128),
                                        axpy_variant(4, 256, kBroken), axpy_variant(2, 128, kFirstOff),
                                        axpy_variant(8, 64)});
  op.tolerance = 1e-3;
  // The caller's check catches what the comparison lets through (y[0] off by one in a million elements).
  int checks = 0;
  op.check = [&checks](std::span<const int64_t> sizes, void** params, CUstream) -> Status {
    ++checks;
    const CUdeviceptr y = *static_cast<CUdeviceptr*>(params[2]);
    float first = 0;
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuMemcpyDtoH(&first, y, sizeof(float)));
    if (first != 1.0f) return make_error(ErrorCode::kWrongResult, fmt::format("y[0] = {} for n = {}", first, sizes[0]));
    return Status();
  };
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet set, register_variants(default_ops(), op));
  const Problem p = set.problem({1 << 20});
  std::string chosen;
  {
    auto t = tuner(cache::TuneMode::kTune);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    const TuneReport& r = sel->report();
    std::cout << r.table(10);
    EXPECT_FALSE(r.decision_from_cache);
    EXPECT_EQ(r.failures, 2) << r.table(10);
    for (const auto& c : r.choices) {
      if (c.name == "vec4_b256_broken") {
        EXPECT_EQ(c.status.code(), ErrorCode::kWrongResult) << c.status.to_string();
      }
      if (c.name == "vec2_b128_first_off") {
        EXPECT_EQ(c.status.code(), ErrorCode::kWrongResult) << c.status.to_string();
        EXPECT_NE(c.status.message().find("y[0] = 2"), std::string::npos) << c.status.to_string();
      }
    }
    EXPECT_EQ(sel->choice_name().find("_broken"), std::string::npos);
    EXPECT_EQ(sel->choice_name().find("_first_off"), std::string::npos);
    EXPECT_GE(checks, 5);
    chosen = sel->choice_name();
    // The winner runs on the caller's own buffers.
    KILN_ASSERT_OK_AND_ASSIGN(VariantBuffers vb, axpy_buffers(std::vector<int64_t>{1000}, 0));
    const int64_t n = 1000;
    KILN_ASSERT_OK(run_variant(*sel, {&n, 1}, vb.params.data(), nullptr));
    std::vector<float> y(1000);
    KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
    ASSERT_EQ(d->cuMemcpyDtoH(y.data(), vb.outputs[0].ptr, sizeof(float) * 1000), CUDA_SUCCESS);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(y[i], 2.0f * (i % 7) + 1.0f) << i;
  }
  // A second tuner (another process would do the same) loads the decision and measures nothing.
  {
    checks = 0;
    auto t = tuner(cache::TuneMode::kUse);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    EXPECT_TRUE(sel->report().decision_from_cache);
    EXPECT_EQ(sel->choice_name(), chosen);
    EXPECT_EQ(checks, 0);
  }
  // Size dispatch: one variant per bucket of n.
  {
    auto t = tuner(cache::TuneMode::kTune);
    KILN_ASSERT_OK_AND_ASSIGN(auto deferred, t->defer(set.problem({1 << 16})));
    KILN_ASSERT_OK_AND_ASSIGN(auto dispatcher, deferred->finalize({256, 1 << 16}));
    ASSERT_EQ(dispatcher->selections().size(), 2u);
    KILN_ASSERT_OK_AND_ASSIGN(VariantBuffers vb, axpy_buffers(std::vector<int64_t>{300}, 0));
    KILN_ASSERT_OK(dispatcher->run(CustomArgs{{}, {300}, vb.params.data()}, nullptr));
    std::vector<float> y(300);
    KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
    ASSERT_EQ(d->cuMemcpyDtoH(y.data(), vb.outputs[0].ptr, sizeof(float) * 300), CUDA_SUCCESS);
    for (int i = 0; i < 300; ++i) ASSERT_EQ(y[i], 2.0f * (i % 7) + 1.0f) << i;
  }
}

// An in-place update (y = a * x + y): the variants read what they write, so the poison a checked run starts
// from would fail all of them; an output marked `restore` starts each checked run from its content before the
// reference ran, and the caller's check then sees each variant's true result.
TEST_F(VariantsGpu, InPlaceOutputsAreRestoredBeforeEachCheckedRun) {
  const char* in_place = R"(
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  for (int j = 0; j < VEC; ++j) if (i + j < n) y[i + j] = a * x[i + j] + y[i + j];
}
)";
  std::vector<Variant> variants;
  for (int vec : {1, 2, 4}) {
    Variant v = axpy_variant(vec, 128);
    v.source = in_place;
    variants.push_back(std::move(v));
  }
  auto make = [](bool restore) {
    return [restore](std::span<const int64_t> sizes, uint32_t seed) -> Result<VariantBuffers> {
      KILN_ASSIGN_OR_RETURN(VariantBuffers vb, axpy_buffers(sizes, seed));
      auto* b = static_cast<AxpyBuffers*>(vb.owner.get());
      KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
      std::vector<float> ones(b->n, 1.0f);
      KILN_CHECK(d->cuMemcpyHtoD(b->yp, ones.data(), sizeof(float) * b->n));  // y starts at y0's value
      vb.params = {&b->xp, &b->yp, &b->a, &b->n};
      vb.outputs[0].restore = restore;
      return vb;
    };
  };
  std::vector<float> seen;
  VariantOp op = axpy_op("t.gpu_axpy_in_place", variants);
  op.buffers = make(true);
  op.check = [&seen](std::span<const int64_t>, void** params, CUstream) -> Status {
    const CUdeviceptr y = *static_cast<CUdeviceptr*>(params[1]);
    float second = 0;
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuMemcpyDtoH(&second, y + sizeof(float), sizeof(float)));
    seen.push_back(second);
    return Status();
  };
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet set, register_variants(default_ops(), op));
  {
    auto t = tuner(cache::TuneMode::kOff);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(set.problem({1 << 16})));
    EXPECT_EQ(sel->report().failures, 0) << sel->report().table(10);
    ASSERT_EQ(seen.size(), 3u);
    for (float v : seen) EXPECT_EQ(v, 3.0f);  // 2 * x[1] + 1, from the restored y every time
  }
  // Without `restore` the same op is checked from poison: every variant reads it and fails, named as such.
  op.name = "t.gpu_axpy_in_place_poisoned";
  op.buffers = make(false);
  op.check = nullptr;
  KILN_ASSERT_OK_AND_ASSIGN(VariantSet poisoned, register_variants(default_ops(), op));
  auto t = tuner(cache::TuneMode::kOff);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(poisoned.problem({1 << 16})));
  EXPECT_EQ(sel->report().failures, 3) << sel->report().table(10);
  for (const auto& c : sel->report().choices) {
    EXPECT_NE(c.status.message().find("not finite"), std::string::npos) << c.status.to_string();
  }
}

}  // namespace
}  // namespace kiln::runtime
