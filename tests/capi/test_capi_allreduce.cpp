// The C API's all-reduce entry points (kiln/kiln.h, runtime/capi/src/capi_collective.cpp) without a communicator:
// argument checks in the documented order (a bad dtype is named before anything about the communicator or
// NCCL), and the symmetric heap's alloc/free refusing NULL handles and pointers. Multi-GPU behaviour is tested
// on the C++ API (tests/runtime/test_collective_gpu.cpp), which these calls pass straight through to.
#include <gtest/gtest.h>

#include <string>

#include "kiln/kiln.h"

namespace {

kiln_context* make_context() {
  kiln_context_options o;
  kiln_context_options_init(&o);
  o.tune_mode = KILN_TUNE_MODE_OFF;
  o.executor = KILN_EXECUTOR_INLINE;
  kiln_context* ctx = nullptr;
  EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_OK) << kiln_last_error();
  return ctx;
}

TEST(CApiAllReduce, CreateChecksTheDtypeBeforeTheCommunicator) {
  kiln_context* ctx = make_context();
  ASSERT_NE(ctx, nullptr);
  kiln_allreduce* ar = reinterpret_cast<kiln_allreduce*>(0x1);
  // No communicator and a bad dtype: the dtype is what is named, on any machine (with or without NCCL).
  EXPECT_EQ(kiln_allreduce_create(ctx, nullptr, 0, 2, static_cast<kiln_dtype>(99), 0, &ar), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ar, nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("dtype"), std::string::npos) << kiln_last_error();
  // A fake communicator pointer with a bad dtype never reaches NCCL or the communicator either.
  EXPECT_EQ(kiln_allreduce_create(ctx, reinterpret_cast<void*>(0x10), 0, 2, static_cast<kiln_dtype>(99), 0, &ar),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("dtype"), std::string::npos) << kiln_last_error();
  // A good dtype and no communicator: the communicator is named.
  EXPECT_EQ(kiln_allreduce_create(ctx, nullptr, 0, 2, KILN_BF16, 0, &ar), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("ncclComm_t"), std::string::npos) << kiln_last_error();
  kiln_context_destroy(ctx);
}

TEST(CApiAllReduce, AllocAndFreeRefuseNullArguments) {
  uint64_t p = 0xdead;
  EXPECT_EQ(kiln_allreduce_alloc(nullptr, 4096, &p), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, 0u) << "a failed alloc leaves no stale pointer";
  EXPECT_NE(std::string(kiln_last_error()).find("allreduce is NULL"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_allreduce_alloc(nullptr, 4096, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("ptr is NULL"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_allreduce_free(nullptr, 0x1000), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_allreduce_tune_call(nullptr, KILN_ALLREDUCE_SYMMETRIC), KILN_ERROR_INVALID_ARGUMENT);
}

}  // namespace
