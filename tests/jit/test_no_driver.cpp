// Runs with KILN_CUDA_DRIVER pointing at a library that does not exist (set by CMake), so the driver is
// unavailable even on a GPU machine: compiling must still work and every GPU call must fail cleanly.
#include <gtest/gtest.h>

#include <filesystem>

#include <cstdlib>

#include "kiln/jit.h"
#include "kiln_test.h"
#include "shared_kernels.h"

namespace kiln {
namespace {

TEST(NoDriver, EnvironmentMakesTheDriverUnavailable) {
  const char* env = std::getenv("KILN_CUDA_DRIVER");
  ASSERT_NE(env, nullptr) << "this test must run with KILN_CUDA_DRIVER set to a missing library";
  auto d = driver();
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kNoDriver);
  EXPECT_NE(d.status().to_string().find("no CUDA driver"), std::string::npos) << d.status().to_string();
  EXPECT_NE(d.status().message().find(env), std::string::npos) << "the error names the library it tried";
}

TEST(NoDriver, CompileStillWorksAndLaunchReturnsTheClearError) {
  KernelSource s;
  s.name = "axpy";
  s.entry = "axpy";
  s.source = test_kernels::kAxpy;
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(s, Target{"sm_90"}));
  EXPECT_FALSE(bin.cubin.empty());

  auto kernel = load_kernel(bin);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.status().code(), ErrorCode::kNoDriver);
  EXPECT_NE(kernel.status().to_string().find("no CUDA driver"), std::string::npos);

  for (const Status& st : {ensure_context(0).status(), DeviceBuffer::allocate(1024).status(),
                           Stream::create().status(), Event::create().status(), device_count().status(),
                           Target::from_device(0).status()}) {
    EXPECT_EQ(st.code(), ErrorCode::kNoDriver) << st.to_string();
  }
}

TEST(NoDriver, LoadingAMissingLibraryDirectlyIsAnError) {
  auto api = load_driver("/definitely/not/here/libcuda.so.1");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::kNoDriver);
  // A library that exists but is not a CUDA driver is refused too.
  auto wrong = load_driver("libm.so.6");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), ErrorCode::kNoDriver);
  EXPECT_NE(wrong.status().message().find("not a CUDA driver"), std::string::npos) << wrong.status().message();
}

TEST(NoDriver, EveryEntryPointResolvesAgainstTheToolkitStub) {
  // The toolkit's stub libcuda exports every driver symbol but has no driver behind it: all of kiln's entry
  // points must resolve by the names cuda.h maps them to, and only cuInit may fail.
  if (!std::filesystem::exists(KILN_CUDA_STUB_DRIVER)) {
    // The build machine's toolkit path; a machine that runs the packed test may lay its toolkit out otherwise.
    GTEST_SKIP() << "no toolkit stub driver at " << KILN_CUDA_STUB_DRIVER << " on this machine";
  }
  auto api = load_driver(KILN_CUDA_STUB_DRIVER);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::kNoDevice) << api.status().to_string();
  EXPECT_NE(api.status().message().find("cuInit"), std::string::npos) << api.status().message();
}

}  // namespace
}  // namespace kiln
