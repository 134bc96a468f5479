// GPU tests: load, launch, check against a CPU reference, attribute queries, caller-owned contexts and
// streams. They skip with the reason where there is no GPU, and must pass on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kiln/jit.h"
#include "kiln_test.h"
#include "shared_kernels.h"

namespace kiln {
namespace {

Result<Binary> compile_for_device(KernelSource s) {
  KILN_ASSIGN_OR_RETURN(Target t, Target::from_device(0));
  return compile(s, t);
}

KernelSource axpy_source() { return {.name = "axpy", .entry = "axpy", .source = test_kernels::kAxpy}; }

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(Gpu, DeviceInfoAndTarget) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.cc_major, 7);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.max_shared_per_block_optin, 48 * 1024);
  KILN_ASSERT_OK_AND_ASSIGN(Target t, Target::from_device(0));
  EXPECT_EQ(t.arch, info.arch());
  EXPECT_EQ(device_info(info.ordinal + 1000).status().code(), ErrorCode::kNoDevice);
}

TEST(Gpu, LaunchMatchesCpuReference) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(axpy_source()));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel k, load_kernel(bin));
  const int n = 1 << 20 | 37;  // not a multiple of the block size: the tail must be handled
  auto x = random_floats(n, 1), y = random_floats(n, 2);
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer dx, DeviceBuffer::allocate(n * sizeof(float)));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer dy, DeviceBuffer::allocate(n * sizeof(float)));
  KILN_ASSERT_OK(dx.copy_from_host(x.data(), n * sizeof(float)));
  KILN_ASSERT_OK(dy.copy_from_host(y.data(), n * sizeof(float)));
  LaunchConfig cfg;
  cfg.block = {256};
  cfg.grid = {(n + 255) / 256u};
  const float a = 1.75f;
  KILN_ASSERT_OK(k(cfg, n, a, dx.ptr(), dy.ptr()));
  std::vector<float> out(n);
  KILN_ASSERT_OK(dy.copy_to_host(out.data(), n * sizeof(float)));
  // The GPU contracts a*x+y into one fused multiply-add: the reference rounds once too, so the match is exact.
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], std::fmaf(a, x[i], y[i])) << "at " << i;
}

TEST(Gpu, TemplateKernelByNameExpression) {
  KILN_REQUIRE_GPU();
  KernelSource s;
  s.name = "scale";
  s.source = test_kernels::kTemplated;
  s.name_expressions = {"scale<float, 3>", "scale<int, 5>"};
  s.entry = "scale<int, 5>";
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(s));
  KILN_ASSERT_OK_AND_ASSIGN(Module m, Module::load(bin));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel ki, m.kernel("scale<int, 5>"));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel kf, m.kernel("scale<float, 3>"));
  EXPECT_EQ(m.kernel("scale<float, 4>").status().code(), ErrorCode::kNotFound);
  const int n = 1000;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = i - 500;
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer din, DeviceBuffer::allocate(n * sizeof(int)));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer dout, DeviceBuffer::allocate(n * sizeof(int)));
  KILN_ASSERT_OK(din.copy_from_host(in.data(), n * sizeof(int)));
  KILN_ASSERT_OK(dout.fill_bytes(0xff));
  LaunchConfig cfg;
  cfg.block = {128};
  cfg.grid = {(n + 127) / 128u};
  KILN_ASSERT_OK(ki(cfg, n, din.ptr(), dout.ptr()));
  std::vector<int> out(n);
  KILN_ASSERT_OK(dout.copy_to_host(out.data(), n * sizeof(int)));
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], in[i] * 5);
}

TEST(Gpu, AttributesRegistersSharedAndSpills) {
  KILN_REQUIRE_GPU();
  KernelSource s{.name = "attrs", .entry = "smem", .source = R"(
extern "C" __global__ void smem(float* out) {
  __shared__ float tile[1024];
  tile[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = tile[1023 - threadIdx.x];
}
extern "C" __global__ void spill(float* out, int idx) {
  float local[512];
  for (int i = 0; i < 512; ++i) local[i] = out[i] * i;
  out[threadIdx.x] = local[(idx + threadIdx.x) & 511];
}
)"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(s));
  KILN_ASSERT_OK_AND_ASSIGN(Module m, Module::load(bin));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel smem, m.kernel("smem"));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel spill, m.kernel("spill"));
  KILN_ASSERT_OK_AND_ASSIGN(KernelAttributes a, smem.attributes());
  EXPECT_GT(a.registers, 0);
  EXPECT_EQ(a.static_shared_bytes, 1024 * 4);
  EXPECT_EQ(a.local_bytes, 0);
  EXPECT_GE(a.max_threads_per_block, 1024);
  KILN_ASSERT_OK_AND_ASSIGN(KernelAttributes b, spill.attributes());
  EXPECT_GE(b.local_bytes, 512 * 4) << "a run-time indexed array lives in local memory";
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  EXPECT_EQ(a.binary_version, info.cc_major * 10 + info.cc_minor);
}

TEST(Gpu, DynamicSharedMemoryAbove48KiBIsRaisedAutomatically) {
  KILN_REQUIRE_GPU();
  KernelSource s{.name = "dyn", .entry = "dyn", .source = R"(
extern "C" __global__ void dyn(int* out, int words) {
  extern __shared__ int buf[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) buf[i] = i;
  __syncthreads();
  int sum = 0;
  for (int i = threadIdx.x; i < words; i += blockDim.x) sum += buf[words - 1 - i];
  atomicAdd(out, sum);
}
)"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(s));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel k, load_kernel(bin));
  const int words = 100 * 1024 / 4;  // 100 KiB
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::allocate(sizeof(int)));
  KILN_ASSERT_OK(out.fill_bytes(0));
  LaunchConfig cfg;
  cfg.block = {256};
  cfg.shared_bytes = words * 4;
  KILN_ASSERT_OK(k(cfg, out.ptr(), words));
  int sum = 0;
  KILN_ASSERT_OK(out.copy_to_host(&sum, sizeof sum));
  EXPECT_EQ(sum, words * (words - 1) / 2);
}

TEST(Gpu, CallerOwnedContextAndStream) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  // The caller (a serving engine) has its own context current on this thread, not the primary one.
  CUdevice dev;
  ASSERT_EQ(d->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  CUcontext own = nullptr;
  ASSERT_EQ(d->cuCtxCreate(&own, nullptr, 0, dev), CUDA_SUCCESS);
  KILN_ASSERT_OK_AND_ASSIGN(CUcontext current, ensure_context(0));
  EXPECT_EQ(current, own) << "ensure_context keeps the caller's context";
  {
    KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(axpy_source()));
    KILN_ASSERT_OK_AND_ASSIGN(Module m, Module::load(bin));
    EXPECT_EQ(m.context(), own);
    KILN_ASSERT_OK_AND_ASSIGN(Kernel k, m.kernel("axpy"));
    KILN_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::create());
    const int n = 4096;
    auto x = random_floats(n, 3);
    std::vector<float> y(n, 1.0f);
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer dx, DeviceBuffer::allocate(n * 4));
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer dy, DeviceBuffer::allocate(n * 4));
    KILN_ASSERT_OK(dx.copy_from_host(x.data(), n * 4));
    KILN_ASSERT_OK(dy.copy_from_host(y.data(), n * 4));
    KILN_ASSERT_OK_AND_ASSIGN(Event start, Event::create());
    KILN_ASSERT_OK_AND_ASSIGN(Event stop, Event::create());
    LaunchConfig cfg;
    cfg.block = {256};
    cfg.grid = {n / 256};
    cfg.stream = stream.get();
    KILN_ASSERT_OK(start.record(stream.get()));
    KILN_ASSERT_OK(k(cfg, n, 2.0f, dx.ptr(), dy.ptr()));
    KILN_ASSERT_OK(stop.record(stream.get()));
    KILN_ASSERT_OK(stream.synchronize());
    KILN_ASSERT_OK_AND_ASSIGN(float ms, stop.elapsed_ms_since(start));
    EXPECT_GE(ms, 0.0f);
    std::vector<float> out(n);
    KILN_ASSERT_OK(dy.copy_to_host(out.data(), n * 4));
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], std::fmaf(2.0f, x[i], 1.0f));
  }
  ASSERT_EQ(d->cuCtxDestroy(own), CUDA_SUCCESS);
  // With no current context, the primary context is used.
  ASSERT_EQ(d->cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  KILN_ASSERT_OK_AND_ASSIGN(CUcontext primary, ensure_context(0));
  EXPECT_NE(primary, nullptr);
}

TEST(Gpu, KernelKeepsItsModuleAlive) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(axpy_source()));
  Result<Kernel> k = [&]() -> Result<Kernel> {
    KILN_ASSIGN_OR_RETURN(Module m, Module::load(bin));
    return m.kernel("axpy");  // the Module object dies here; its CUmodule must not
  }();
  KILN_ASSERT_OK(k);
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::allocate(256 * 4));
  std::vector<float> ones(256, 1.0f);
  KILN_ASSERT_OK(buf.copy_from_host(ones.data(), 256 * 4));
  LaunchConfig cfg;
  cfg.block = {256};
  KILN_ASSERT_OK((*k)(cfg, 256, 1.0f, buf.ptr(), buf.ptr()));
  KILN_ASSERT_OK(buf.copy_to_host(ones.data(), 256 * 4));
  EXPECT_FLOAT_EQ(ones[17], 2.0f);
}

TEST(Gpu, BadLaunchIsAnErrorAndTheContextSurvives) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(axpy_source()));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel k, load_kernel(bin));
  LaunchConfig bad;
  bad.block = {4096};  // over the per-block thread limit
  Status st = k(bad, 1, 1.0f, CUdeviceptr{0}, CUdeviceptr{0});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kCudaError);
  EXPECT_NE(st.to_string().find("CUDA_ERROR_INVALID_VALUE"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("launching 'axpy'"), std::string::npos) << st.to_string();
  // A corrupt image is refused before it reaches the driver.
  EXPECT_EQ(Module::load_image("not a cubin").status().code(), ErrorCode::kInvalidArgument);
  // The context still works.
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::allocate(64 * 4));
  LaunchConfig ok;
  ok.block = {64};
  KILN_EXPECT_OK(k(ok, 64, 1.0f, buf.ptr(), buf.ptr()));
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  EXPECT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS);
}

TEST(Gpu, ClusterLaunchOnHopper) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major < 9) GTEST_SKIP() << "thread-block clusters need sm_90";
  KernelSource s;
  s.name = "cluster";
  s.entry = "rank";
  s.source = R"(
extern "C" __global__ void rank(unsigned* out) {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}
)";
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile_for_device(s));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel k, load_kernel(bin));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::allocate(8 * 4));
  LaunchConfig cfg;
  cfg.grid = {8};
  cfg.block = {32};
  cfg.cluster = {2, 1, 1};
  KILN_ASSERT_OK(k(cfg, out.ptr()));
  std::vector<unsigned> ranks(8);
  KILN_ASSERT_OK(out.copy_to_host(ranks.data(), 8 * 4));
  for (unsigned i = 0; i < 8; ++i) EXPECT_EQ(ranks[i], i % 2);
}

}  // namespace
}  // namespace kiln
