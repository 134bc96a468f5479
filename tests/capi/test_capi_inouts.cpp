// kiln_variant_op.inouts through kiln/kiln.h alone: outputs the variants read as well as write (an accumulator,
// y += a * x) are restored before each checked run instead of poisoned. Without a GPU: the field's checks and
// its versioning by size (an older caller's smaller struct has no inouts). On a GPU: an accumulating op tunes
// with every variant correct when y is an inout, every variant fails when it is not (the poison is read back),
// and a name no output has is an error naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace {

namespace fs = std::filesystem;

// y[i] += a * x[i], VEC elements a thread: reads the output it writes.
const char* kAccumulate = "extern \"C\" __global__ void acc(const float* x, float* y, float a, int n) {\n"
                          "  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;\n"
                          "  for (int j = 0; j < VEC; ++j) if (i + j < n) y[i + j] += a * x[i + j];\n}\n";

std::string gpu_missing() {
  int n = 0;
  if (kiln_device_count(&n) != KILN_OK) return kiln_last_error();
  return n > 0 ? std::string() : std::string("no CUDA device");
}

struct Acc {
  kiln_context* ctx = nullptr;
  int buffers_made = 0, released = 0, checks = 0, wrong = 0;
  struct Bufs {
    uint64_t x = 0, y = 0;
    float a = 2.0f;
    int n = 0;
    void* params[4];
    kiln_output out;
  };
};

kiln_status acc_geometry(void* user, const int64_t* sizes, size_t, kiln_launch_dims* out) {
  const int vec = static_cast<int>(reinterpret_cast<intptr_t>(user));
  out->block = {128, 1, 1};
  out->grid = {static_cast<unsigned>((sizes[0] + 128 * vec - 1) / (128 * vec)), 1, 1};
  return KILN_OK;
}

// x[i] = i % 5, y[i] = 1: one correct run leaves y[i] = 1 + 2 * (i % 5).
kiln_status acc_buffers(void* user, const int64_t* sizes, size_t, uint32_t, kiln_tune_buffers* out) {
  auto* a = static_cast<Acc*>(user);
  auto* b = new Acc::Bufs;
  out->owner = b;
  b->n = static_cast<int>(sizes[0]);
  const size_t bytes = sizeof(float) * b->n;
  std::vector<float> x(b->n), y(b->n, 1.0f);
  for (int i = 0; i < b->n; ++i) x[i] = static_cast<float>(i % 5);
  if (kiln_device_alloc(a->ctx, bytes, &b->x) != KILN_OK || kiln_device_alloc(a->ctx, bytes, &b->y) != KILN_OK ||
      kiln_copy_to_device(a->ctx, b->x, x.data(), bytes) != KILN_OK ||
      kiln_copy_to_device(a->ctx, b->y, y.data(), bytes) != KILN_OK) {
    return KILN_ERROR_CUDA;
  }
  b->params[0] = &b->x;
  b->params[1] = &b->y;
  b->params[2] = &b->a;
  b->params[3] = &b->n;
  b->out = kiln_output{b->y, KILN_F32, 1, b->n, 0, "y"};
  out->params = b->params;
  out->num_params = 4;
  out->outputs = &b->out;
  out->num_outputs = 1;
  ++a->buffers_made;
  return KILN_OK;
}

void acc_release(void* user, void* owner) {
  auto* a = static_cast<Acc*>(user);
  auto* b = static_cast<Acc::Bufs*>(owner);
  if (b == nullptr) return;
  if (b->x) kiln_device_free(a->ctx, b->x);
  if (b->y) kiln_device_free(a->ctx, b->y);
  delete b;
  ++a->released;
}

// Each checked run must have started from y = 1: exactly one accumulation.
kiln_status acc_check(void* user, const int64_t* sizes, size_t, void** params, void*) {
  auto* a = static_cast<Acc*>(user);
  ++a->checks;
  std::vector<float> y(sizes[0]);
  if (kiln_copy_to_host(a->ctx, y.data(), *static_cast<uint64_t*>(params[1]), sizeof(float) * y.size()) != KILN_OK) {
    return KILN_ERROR_CUDA;
  }
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] != 1.0f + 2.0f * static_cast<float>(i % 5)) {
      ++a->wrong;
      kiln_set_callback_error(("y[" + std::to_string(i) + "] is " + std::to_string(y[i])).c_str());
      return KILN_ERROR_WRONG_RESULT;
    }
  }
  return KILN_OK;
}

struct AccOp {
  std::vector<kiln_variant> variants;
  std::vector<kiln_define> defines;
  std::vector<const char*> inouts{"y"};
  kiln_variant_op op;

  explicit AccOp(Acc* user) {
    static const char* names[] = {"vec1", "vec2", "vec4"};
    static const char* vecs[] = {"1", "2", "4"};
    for (int i = 0; i < 3; ++i) defines.push_back({"VEC", vecs[i]});
    for (int i = 0; i < 3; ++i) {
      kiln_variant v;
      kiln_variant_init(&v);
      v.name = names[i];
      v.source = kAccumulate;
      v.kernel = "acc";
      v.defines = &defines[i];
      v.num_defines = 1;
      v.geometry = acc_geometry;
      v.geometry_user = reinterpret_cast<void*>(static_cast<intptr_t>(1 << i));
      variants.push_back(v);
    }
    kiln_variant_op_init(&op);
    op.name = "capi_test.accumulate";
    op.variants = variants.data();
    op.num_variants = variants.size();
    op.buffers = acc_buffers;
    op.release = acc_release;
    op.check = acc_check;
    op.user = user;
    op.tolerance = 1e-6;
    op.inouts = inouts.data();
    op.num_inouts = inouts.size();
  }
};

class CApiInouts : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_capi_inouts_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    for (auto* c : contexts_) kiln_context_destroy(c);
    fs::remove_all(dir_);
  }
  kiln_context* context(const std::string& sub) {
    kiln_context_options o;
    kiln_context_options_init(&o);
    const std::string dir = (dir_ / sub).string();
    o.cache_dir = dir.c_str();
    o.tune_mode = KILN_TUNE_MODE_TUNE;
    o.executor = KILN_EXECUTOR_INLINE;
    o.remote_cache = "";  // whatever the environment says: this test is about variants
    kiln_context* ctx = nullptr;
    EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_OK) << kiln_last_error();
    if (ctx) contexts_.push_back(ctx);
    return ctx;
  }
  fs::path dir_;
  std::vector<kiln_context*> contexts_;
};

TEST_F(CApiInouts, TheFieldIsCheckedAtRegistration) {
  kiln_context* ctx = context("cache");
  Acc user{ctx};
  AccOp a(&user);
  kiln_op* op = nullptr;
  a.op.inouts = nullptr;
  EXPECT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("op.inouts is NULL with a count of 1"), std::string::npos)
      << kiln_last_error();
  EXPECT_EQ(op, nullptr);
  const char* empty[] = {""};
  a.op.inouts = empty;
  EXPECT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("op.inouts[0] is NULL or empty"), std::string::npos) << kiln_last_error();
  const char* twice[] = {"y", "y"};
  a.op.inouts = twice;
  a.op.num_inouts = 2;
  EXPECT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("op.inouts names 'y' twice"), std::string::npos) << kiln_last_error();
  a.op.inouts = a.inouts.data();
  a.op.num_inouts = 1;
  ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
  kiln_op_destroy(op);
  // No inouts at all (the default): registered as before.
  a.op.inouts = nullptr;
  a.op.num_inouts = 0;
  ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
  kiln_op_destroy(op);
}

TEST_F(CApiInouts, AnOlderCallersSmallerStructHasNoInouts) {
  kiln_context* ctx = context("cache");
  Acc user{ctx};
  AccOp a(&user);
  // An older program's struct ends before `inouts`: whatever lies beyond its size is not its, and is not read.
  const char* garbage = reinterpret_cast<const char*>(0x1);
  a.op.inouts = reinterpret_cast<const char* const*>(garbage);
  a.op.num_inouts = 12345;
  a.op.size = offsetof(kiln_variant_op, inouts);
  kiln_op* op = nullptr;
  ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
  kiln_op_destroy(op);
  // One byte short of the first version is a bad size, said as such.
  a.op.size = offsetof(kiln_variant_op, inouts) - 1;
  EXPECT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("op.size is"), std::string::npos) << kiln_last_error();
}

TEST_F(CApiInouts, GpuAnAccumulatingVariantTunesCorrectlyOnlyAsAnInout) {
  if (std::string why = gpu_missing(); !why.empty()) GTEST_SKIP() << "needs a GPU: " << why;
  int64_t n = 1 << 16;
  kiln_tune_info info{};
  info.size = sizeof(info);
  {
    kiln_context* ctx = context("inout");
    Acc user{ctx};
    AccOp a(&user);
    kiln_op* op = nullptr;
    ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
    kiln_selection* sel = nullptr;
    ASSERT_EQ(kiln_op_tune(op, &n, 1, nullptr, 0, &sel), KILN_OK) << kiln_last_error();
    ASSERT_EQ(kiln_selection_info(sel, &info), KILN_OK);
    EXPECT_EQ(info.candidates, 3);
    EXPECT_EQ(info.failures, 0) << "every variant started its checked run from y = 1";
    EXPECT_GE(user.checks, 3);
    EXPECT_EQ(user.wrong, 0);
    EXPECT_EQ(user.buffers_made, user.released);
    kiln_selection_destroy(sel);
    kiln_op_destroy(op);
  }
  {
    // The same op with y not declared: it is poisoned before each checked run, the kernels read the poison,
    // and every variant fails (the reference then runs unchecked).
    kiln_context* ctx = context("no_inout");
    Acc user{ctx};
    AccOp a(&user);
    a.op.inouts = nullptr;
    a.op.num_inouts = 0;
    kiln_op* op = nullptr;
    ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
    kiln_selection* sel = nullptr;
    ASSERT_EQ(kiln_op_tune(op, &n, 1, nullptr, 0, &sel), KILN_OK) << kiln_last_error();
    ASSERT_EQ(kiln_selection_info(sel, &info), KILN_OK);
    EXPECT_EQ(info.failures, info.candidates);
    kiln_selection_destroy(sel);
    kiln_op_destroy(op);
  }
  {
    // A name no output has: the tune fails, naming it and the outputs there are.
    kiln_context* ctx = context("bad_name");
    Acc user{ctx};
    AccOp a(&user);
    const char* wrong[] = {"z"};
    a.op.inouts = wrong;
    kiln_op* op = nullptr;
    ASSERT_EQ(kiln_variants_register(ctx, &a.op, &op), KILN_OK) << kiln_last_error();
    kiln_selection* sel = nullptr;
    EXPECT_EQ(kiln_op_tune(op, &n, 1, nullptr, 0, &sel), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kiln_last_error()).find("inouts[0] 'z' names no output of the buffers callback (its outputs: y)"),
              std::string::npos)
        << kiln_last_error();
    EXPECT_EQ(user.buffers_made, user.released);
    kiln_op_destroy(op);
  }
}

}  // namespace
