// Preloading: real kernels compiled for this GPU, stored, preloaded and launched; what is missing, foreign
// or library-only is counted, not fatal. Without a GPU, preload fails with a clear error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "kiln/cache/preload.h"
#include "kiln/jit.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

using testing::store_options;
using testing::TempDir;

constexpr const char* kFill = R"(
extern "C" __global__ void fill(int* out, int n, int value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + i;
}
)";

TEST(Preload, WithoutAGpuItSaysSo) {
  if (ensure_context(0).ok()) GTEST_SKIP() << "a GPU is present";
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  auto r = preload(*store, {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == ErrorCode::kNoDriver || r.status().code() == ErrorCode::kNoDevice)
      << r.status().to_string();
}

TEST(Preload, LoadsLaunchesAndCountsWhatIsMissing) {
  KILN_REQUIRE_GPU();
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(Target target, Target::from_device(0));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceFingerprint dev, DeviceFingerprint::of_device(0));
  VersionStamp ver = VersionStamp::current();
  auto problem = [&](int m, DeviceFingerprint d) {
    ProblemKey p = testing::sample_problem(m);
    p.device = std::move(d);
    p.versions = ver;
    return p.canonical();
  };
  std::vector<std::string> loaded_problems;
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
    for (int v = 0; v < 6; ++v) {
      KernelSource src;
      src.name = "fill";
      src.entry = "fill";
      src.source = kFill;
      src.options = {"-DVARIANT=" + std::to_string(v)};  // distinct keys
      KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(src, target));
      KILN_ASSERT_OK(store->put_binary(bin));
      Decision d;
      d.problem = problem(16 * (v + 1), dev);
      d.choice = "fill_v" + std::to_string(v);
      d.kernel = bin.key;
      KILN_ASSERT_OK(store->put_decision(d));
      loaded_problems.push_back(d.problem);
    }
    Decision missing;  // its binary was never stored
    missing.problem = problem(1000, dev);
    missing.choice = "gone";
    missing.kernel = KernelKey{123, 456};
    KILN_ASSERT_OK(store->put_decision(missing));
    Decision library;  // a cuBLAS choice: nothing to load
    library.problem = problem(2000, dev);
    library.choice = "cublaslt/algo3";
    KILN_ASSERT_OK(store->put_decision(library));
    Binary foreign = testing::fake_binary(77, 1000, "sm_80");
    KILN_ASSERT_OK(store->put_binary(foreign));
    Decision wrong_arch;
    wrong_arch.problem = problem(3000, dev);
    wrong_arch.choice = "old";
    wrong_arch.kernel = foreign.key;
    KILN_ASSERT_OK(store->put_decision(wrong_arch));
    DeviceFingerprint other = dev;
    other.name = "Some Other GPU";
    Decision elsewhere;
    elsewhere.problem = problem(16, other);
    elsewhere.choice = "fill_v0";
    elsewhere.kernel = KernelKey{1, 1};
    KILN_ASSERT_OK(store->put_decision(elsewhere));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  struct Mode {
    int threads;
    bool lazy;
    ModuleApi api;
  };
  for (Mode mode : {Mode{1, false, ModuleApi::kModule}, Mode{3, false, ModuleApi::kModule},
                    Mode{3, false, ModuleApi::kLibrary}, Mode{1, true, ModuleApi::kModule},
                    Mode{3, true, ModuleApi::kLibrary}}) {
    SCOPED_TRACE(fmt::format("threads {} lazy {} library {}", mode.threads, mode.lazy, mode.api == ModuleApi::kLibrary));
    PreloadOptions po;
    po.threads = mode.threads;
    po.lazy = mode.lazy;
    po.api = mode.api;
    KILN_ASSERT_OK_AND_ASSIGN(Preloaded p, preload(*store, po));
    const PreloadReport& r = p.report();
    EXPECT_EQ(r.decisions, 9u);  // not the other device's
    EXPECT_EQ(r.loaded, mode.lazy ? 0u : 6u);
    EXPECT_EQ(r.deferred, mode.lazy ? 6u : 0u);
    EXPECT_EQ(r.missing, 2u);
    EXPECT_EQ(r.without_kernel, 1u);
    EXPECT_EQ(r.failed, 0u);
    EXPECT_EQ(p.size(), 6u);
    EXPECT_EQ(p.loaded(), mode.lazy ? 0u : 6u);
    // The breakdown: every phase that ran took time, and the driver's share only when it loaded eagerly.
    EXPECT_GT(r.read_seconds, 0);
    EXPECT_GT(r.verify_seconds, 0);
    EXPECT_EQ(r.driver_seconds > 0, !mode.lazy);
    EXPECT_LE(r.load_seconds, r.total_seconds);
    // Every loaded kernel runs and computes what its source says.
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::allocate(256 * sizeof(int)));
    for (const auto& prob : loaded_problems) {
      const Kernel* k = p.find(prob);
      ASSERT_NE(k, nullptr);
      KILN_ASSERT_OK(buf.fill_bytes(0xff));
      LaunchConfig lc;
      lc.grid = {1, 1, 1};
      lc.block = {256, 1, 1};
      KILN_ASSERT_OK((*k)(lc, buf.ptr(), 256, 1000));
      std::vector<int> host(256);
      KILN_ASSERT_OK(buf.copy_to_host(host.data(), 256 * sizeof(int)));
      for (int i = 0; i < 256; ++i) ASSERT_EQ(host[i], 1000 + i);
    }
    EXPECT_EQ(p.loaded(), 6u);  // a lazy kernel is loaded by its first use
    KILN_EXPECT_OK(p.load_all(2));
  }
  // Lazy: load_all() loads what is still deferred, from several threads at once.
  {
    KILN_ASSERT_OK_AND_ASSIGN(Preloaded p, preload(*store, {}));
    EXPECT_EQ(p.loaded(), 0u);
    KILN_ASSERT_OK(p.load_all(4));
    EXPECT_EQ(p.loaded(), 6u);
    EXPECT_EQ(p.kernel("not preloaded").status().code(), ErrorCode::kNotFound);
  }
  // Read and verify only: nothing loaded, every binary verified and remembered.
  {
    PreloadOptions po;
    po.load_modules = false;
    KILN_ASSERT_OK_AND_ASSIGN(Preloaded p, preload(*store, po));
    EXPECT_EQ(p.size(), 0u);
    EXPECT_EQ(p.report().verified, 6u);
    EXPECT_EQ(p.report().missing, 2u);
    EXPECT_EQ(p.report().driver_seconds, 0);
  }
  // A workload: exactly the listed problems.
  PreloadOptions po;
  po.problems = {loaded_problems[0], loaded_problems[3]};
  KILN_ASSERT_OK_AND_ASSIGN(Preloaded p, preload(*store, po));
  EXPECT_EQ(p.size(), 2u);
  EXPECT_NE(p.find(loaded_problems[3]), nullptr);
  EXPECT_EQ(p.find(loaded_problems[1]), nullptr);
  po.problems = {"not a key"};
  EXPECT_EQ(preload(*store, po).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::cache
