// LoadOnce and LazyKernel: a value made once at first use, shared by concurrent first users; a failed make is
// returned and retried by the next caller. The concurrency tests use sync points, not sleeps: the first make
// is held until every other caller has been started, so they all ask while it is in progress, and whatever
// the interleaving the outcome asserted is the same. The LazyKernel tests need a GPU and skip without one.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <latch>
#include <thread>
#include <vector>

#include "kiln/jit.h"
#include "kiln_test.h"

namespace kiln {
namespace {

TEST(LoadOnce, MakesOnceForConcurrentFirstUsers) {
  LoadOnce<int> once;
  EXPECT_FALSE(once.ready());
  std::atomic<int> makes{0};
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  auto make = [&]() -> Result<int> {
    if (makes++ == 0) {
      entered.set_value();
      released.wait();  // held until the other callers are started
    }
    return 42;
  };
  constexpr int kOthers = 8;
  std::vector<Result<const int*>> results(kOthers + 1, make_error(ErrorCode::kInternal, "not run"));
  std::latch started(kOthers);
  {
    std::vector<std::jthread> threads;
    threads.emplace_back([&] { results[0] = once.get(make); });
    entered.get_future().wait();  // the first make is in progress
    for (int i = 1; i <= kOthers; ++i) {
      threads.emplace_back([&, i] {
        started.count_down();
        results[i] = once.get(make);
      });
    }
    started.wait();
    release.set_value();
  }
  EXPECT_EQ(makes.load(), 1);
  ASSERT_TRUE(results[0].ok());
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, *results[0]);  // one value, shared
    EXPECT_EQ(**r, 42);
  }
  EXPECT_TRUE(once.ready());
  // Later calls never make again.
  KILN_ASSERT_OK_AND_ASSIGN(const int* again, once.get([&]() -> Result<int> {
    ++makes;
    return 7;
  }));
  EXPECT_EQ(again, *results[0]);
  EXPECT_EQ(makes.load(), 1);
}

TEST(LoadOnce, AFailureIsReturnedAndTheNextCallTriesAgain) {
  LoadOnce<std::string> once;
  int makes = 0;
  auto failing = [&]() -> Result<std::string> {
    ++makes;
    return make_error(ErrorCode::kCudaError, "CUDA_ERROR_OUT_OF_MEMORY");
  };
  auto r = once.get(failing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCudaError);
  EXPECT_FALSE(once.ready());
  KILN_ASSERT_OK_AND_ASSIGN(const std::string* v, once.get([&]() -> Result<std::string> {
    ++makes;
    return std::string("loaded");
  }));
  EXPECT_EQ(*v, "loaded");
  EXPECT_EQ(makes, 2);
  KILN_ASSERT_OK_AND_ASSIGN(const std::string* w, once.get(failing));
  EXPECT_EQ(w, v);
  EXPECT_EQ(makes, 2);
}

TEST(LoadOnce, ConcurrentCallersAfterAFailureEachTryInTurn) {
  // The first make fails while the others wait for it; each waiter then tries once more in turn, and exactly
  // one of those tries succeeds (the rest find the value).
  LoadOnce<int> once;
  std::atomic<int> makes{0};
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  auto make = [&]() -> Result<int> {
    if (makes++ == 0) {
      entered.set_value();
      released.wait();
      return make_error(ErrorCode::kCudaError, "first load failed");
    }
    return 5;
  };
  constexpr int kOthers = 6;
  std::vector<Result<const int*>> results(kOthers + 1, make_error(ErrorCode::kInternal, "not run"));
  std::latch started(kOthers);
  {
    std::vector<std::jthread> threads;
    threads.emplace_back([&] { results[0] = once.get(make); });
    entered.get_future().wait();
    for (int i = 1; i <= kOthers; ++i) {
      threads.emplace_back([&, i] {
        started.count_down();
        results[i] = once.get(make);
      });
    }
    started.wait();
    release.set_value();
  }
  EXPECT_EQ(makes.load(), 2);
  EXPECT_FALSE(results[0].ok());
  for (int i = 1; i <= kOthers; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().to_string();
    EXPECT_EQ(**results[i], 5);
  }
}

TEST(LoadOnce, MadeAlreadyAndMovable) {
  LoadOnce<int> once(3);
  EXPECT_TRUE(once.ready());
  LoadOnce<int> moved = std::move(once);
  KILN_ASSERT_OK_AND_ASSIGN(const int* v, moved.get([]() -> Result<int> { return make_error(ErrorCode::kInternal, "called"); }));
  EXPECT_EQ(*v, 3);
}

constexpr const char* kAdd = R"(
extern "C" __global__ void add_one(int* p) { p[threadIdx.x] += 1; }
)";

TEST(LazyKernel, LoadsAtFirstUseWithEitherApi) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Target t, Target::from_device(0));
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile({.name = "add_one", .entry = "add_one", .source = kAdd}, t));
  KILN_ASSERT_OK_AND_ASSIGN(CUcontext ctx, ensure_context(0));
  auto shared = std::make_shared<const Binary>(bin);
  for (ModuleApi api : {ModuleApi::kModule, ModuleApi::kLibrary}) {
    LazyKernel lazy(shared, ctx, api);
    EXPECT_FALSE(lazy.loaded());
    // First use from another thread with no current context: it goes into `ctx` anyway.
    Result<const Kernel*> first = make_error(ErrorCode::kInternal, "not run");
    std::thread([&] { first = lazy.get(); }).join();
    KILN_ASSERT_OK(first.status());
    EXPECT_TRUE(lazy.loaded());
    KILN_ASSERT_OK_AND_ASSIGN(const Kernel* k, lazy.get());
    EXPECT_EQ(k, *first);
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::allocate(32 * sizeof(int)));
    KILN_ASSERT_OK(buf.fill_bytes(0));
    LaunchConfig lc;
    lc.block = {32, 1, 1};
    KILN_ASSERT_OK((*k)(lc, buf.ptr()));
    std::vector<int> host(32);
    KILN_ASSERT_OK(buf.copy_to_host(host.data(), 32 * sizeof(int)));
    for (int x : host) ASSERT_EQ(x, 1);
    KILN_ASSERT_OK_AND_ASSIGN(KernelAttributes attrs, k->attributes());
    EXPECT_GT(attrs.max_threads_per_block, 0);
  }
}

TEST(LazyKernel, ABadImageFailsAtFirstUseWithItsName) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(CUcontext ctx, ensure_context(0));
  Binary bad;
  bad.name = "broken";
  bad.entry = "k";
  bad.cubin = "not an image";
  LazyKernel lazy(std::make_shared<const Binary>(bad), ctx);
  auto r = lazy.get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("broken"), std::string::npos) << r.status().to_string();
  EXPECT_FALSE(lazy.loaded());
}

}  // namespace
}  // namespace kiln
