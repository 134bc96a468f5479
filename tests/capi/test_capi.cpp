// The C API through kiln/kiln.h alone, linked against libkiln.so: versions and error mapping, NULL and garbage
// arguments (errors, never crashes), NVRTC compiles blocking and asynchronous, variant ops (registration rules,
// precompile), workloads, cache stats/export/import; on a GPU, launches, a variant tune whose decision a second
// context loads without tuning, size dispatch and the built-in ops. GPU tests skip without a device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"

namespace {

namespace fs = std::filesystem;

const char* kScale = "extern \"C\" __global__ void scale(float* x, float a, int n) {\n"
                     "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }\n";

std::string gpu_missing() {
  int n = 0;
  kiln_status st = kiln_device_count(&n);
  if (st != KILN_OK) return kiln_last_error();
  return n > 0 ? std::string() : std::string("no CUDA device");
}

#define REQUIRE_GPU()                                                 \
  do {                                                                \
    std::string why_ = gpu_missing();                                 \
    if (!why_.empty()) GTEST_SKIP() << "needs a GPU: " << why_;       \
  } while (0)

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_capi_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (auto* c : contexts_) kiln_context_destroy(c);
    fs::remove_all(dir_);
  }
  kiln_context* context(const std::string& sub = "cache", kiln_tune_mode mode = KILN_TUNE_MODE_TUNE) {
    kiln_context_options o;
    kiln_context_options_init(&o);
    const std::string dir = (dir_ / sub).string();
    o.cache_dir = dir.c_str();
    o.tune_mode = mode;
    o.executor = KILN_EXECUTOR_ARENA;
    kiln_context* ctx = nullptr;
    EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_OK) << kiln_last_error();
    if (ctx) contexts_.push_back(ctx);
    return ctx;
  }
  static kiln_source scale_source(const char* arch = "sm_90") {
    kiln_source s;
    kiln_source_init(&s);
    s.source = kScale;
    s.kernel = "scale";
    s.arch = arch;
    return s;
  }
  fs::path dir_;
  std::vector<kiln_context*> contexts_;
};

TEST(CApiBasics, VersionAndStatusNames) {
  EXPECT_EQ(std::string(kiln_version()), std::to_string(KILN_VERSION_MAJOR) + "." + std::to_string(KILN_VERSION_MINOR) +
                                             "." + std::to_string(KILN_VERSION_PATCH));
  EXPECT_EQ(kiln_version_number(), KILN_VERSION_MAJOR * 10000 + KILN_VERSION_MINOR * 100 + KILN_VERSION_PATCH);
  EXPECT_STREQ(kiln_status_name(KILN_OK), "ok");
  EXPECT_STREQ(kiln_status_name(KILN_ERROR_COMPILE), "compile error");
  EXPECT_STREQ(kiln_status_name(KILN_ERROR_NOT_READY), "not ready");
  EXPECT_STREQ(kiln_status_name(static_cast<kiln_status>(77)), "unknown status");
}

TEST(CApiBasics, NullAndGarbageArgumentsAreErrorsWithMessages) {
  EXPECT_EQ(kiln_context_create(nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("out is NULL"), std::string::npos) << kiln_last_error();

  kiln_context_options o;
  kiln_context_options_init(&o);
  o.size = 3;  // garbage
  kiln_context* ctx = reinterpret_cast<kiln_context*>(0x1);
  EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("options.size is 3"), std::string::npos) << kiln_last_error();
  kiln_context_options_init(&o);
  // C++ may only make values in the enum's range (0..7 here); test_capi_c99.c passes a C caller's garbage
  // (42, -3, 1000) to every enum-typed field.
  o.tune_mode = static_cast<kiln_tune_mode>(7);
  EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("options.tune_mode 7 is not a kiln_tune_mode"), std::string::npos)
      << kiln_last_error();

  kiln_kernel* k = nullptr;
  EXPECT_EQ(kiln_compile(nullptr, nullptr, &k), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_kernel_launch(nullptr, {1, 1, 1}, {1, 1, 1}, 0, nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_compile_job_poll(nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_compile_job_wait(nullptr, &k), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_variants_register(nullptr, nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_op_tune(nullptr, nullptr, 0, nullptr, 0, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_selection_launch(nullptr, nullptr, 0, nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_gemm(nullptr, nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cache_stats_get(nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_device_count(nullptr), KILN_ERROR_INVALID_ARGUMENT);
  // Destroying nothing is fine.
  kiln_context_destroy(nullptr);
  kiln_kernel_destroy(nullptr);
  kiln_compile_job_destroy(nullptr);
  kiln_op_destroy(nullptr);
  kiln_selection_destroy(nullptr);
  kiln_dispatcher_destroy(nullptr);
  kiln_allreduce_destroy(nullptr);
}

TEST(CApiBasics, TheLastErrorIsPerThread) {
  EXPECT_EQ(kiln_context_create(nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  std::string other;
  std::thread([&] { other = kiln_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(kiln_last_error()), "");
}

TEST_F(CApi, CompilesThroughNvrtcAndTheCache) {
  kiln_context* ctx = context();
  ASSERT_NE(ctx, nullptr);
  kiln_source s = scale_source();
  kiln_kernel* k = nullptr;
  ASSERT_EQ(kiln_compile(ctx, &s, &k), KILN_OK) << kiln_last_error();
  char key[33];
  ASSERT_EQ(kiln_kernel_key(k, key), KILN_OK);
  EXPECT_EQ(std::strlen(key), 32u);
  const void* cubin = nullptr;
  size_t size = 0;
  ASSERT_EQ(kiln_kernel_cubin(k, &cubin, &size), KILN_OK);
  ASSERT_GT(size, 4u);
  EXPECT_EQ(std::memcmp(cubin, "\x7f" "ELF", 4), 0);
  kiln_kernel_destroy(k);

  // A second context on the same cache finds the binary: same key, nothing compiled.
  kiln_cache_stats stats{};
  stats.size = sizeof(stats);
  ASSERT_EQ(kiln_cache_stats_get(ctx, &stats), KILN_OK) << kiln_last_error();
  EXPECT_GE(stats.binaries, 1u);

  // Defines, name expressions and in-memory headers.
  kiln_source t;
  kiln_source_init(&t);
  t.source = "#include \"factor.h\"\n#ifndef WIDTH\n#error WIDTH is needed\n#endif\n"
             "template <int V> __global__ void widen(float* x) { x[threadIdx.x * V] *= FACTOR * WIDTH; }\n";
  t.kernel = "widen<4>";
  kiln_define defs[] = {{"WIDTH", "2"}};
  t.defines = defs;
  t.num_defines = 1;
  kiln_header hdr[] = {{"factor.h", "#define FACTOR 3.0f\n"}};
  t.headers = hdr;
  t.num_headers = 1;
  t.arch = "sm_90";
  ASSERT_EQ(kiln_compile(ctx, &t, &k), KILN_OK) << kiln_last_error() << "\n" << kiln_last_error_detail();
  kiln_kernel_destroy(k);
  t.num_defines = 0;
  EXPECT_EQ(kiln_compile(ctx, &t, &k), KILN_ERROR_COMPILE);
  EXPECT_EQ(k, nullptr);
  EXPECT_NE(std::string(kiln_last_error_detail()).find("WIDTH is needed"), std::string::npos) << kiln_last_error_detail();
}

TEST_F(CApi, CompileErrorsAndBadSourcesAreReported) {
  kiln_context* ctx = context();
  kiln_source s = scale_source();
  s.source = "extern \"C\" __global__ void scale() { this is not cuda }";
  kiln_kernel* k = nullptr;
  EXPECT_EQ(kiln_compile(ctx, &s, &k), KILN_ERROR_COMPILE);
  EXPECT_NE(std::string(kiln_last_error()).find("compile error"), std::string::npos) << kiln_last_error();
  EXPECT_NE(std::string(kiln_last_error_detail()), "");
  s = scale_source("sm_9000x");
  EXPECT_EQ(kiln_compile(ctx, &s, &k), KILN_ERROR_INVALID_ARGUMENT);
  s = scale_source();
  s.kernel = nullptr;
  EXPECT_EQ(kiln_compile(ctx, &s, &k), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("source.kernel is empty"), std::string::npos) << kiln_last_error();
  s = scale_source();
  s.num_options = 2;  // with options NULL
  EXPECT_EQ(kiln_compile(ctx, &s, &k), KILN_ERROR_INVALID_ARGUMENT);
  s = scale_source();
  s.size = 0;
  EXPECT_EQ(kiln_compile(ctx, &s, &k), KILN_ERROR_INVALID_ARGUMENT);
}

TEST_F(CApi, AsyncCompilesCanBeWaitedOnAndPolled) {
  kiln_context* ctx = context();
  kiln_source s = scale_source();
  kiln_compile_job* c = nullptr;
  ASSERT_EQ(kiln_compile_async(ctx, &s, &c), KILN_OK) << kiln_last_error();
  kiln_status polled = kiln_compile_job_poll(c);
  EXPECT_TRUE(polled == KILN_OK || polled == KILN_ERROR_NOT_READY);
  kiln_kernel* k = nullptr;
  ASSERT_EQ(kiln_compile_job_wait(c, &k), KILN_OK) << kiln_last_error();
  EXPECT_EQ(kiln_compile_job_poll(c), KILN_OK);
  ASSERT_NE(k, nullptr);
  kiln_kernel_destroy(k);
  kiln_compile_job_destroy(c);
  // A failing async compile reports at wait.
  s.source = "broken";
  ASSERT_EQ(kiln_compile_async(ctx, &s, &c), KILN_OK);
  EXPECT_EQ(kiln_compile_job_wait(c, &k), KILN_ERROR_COMPILE);
  kiln_compile_job_destroy(c);
}

// ---- variant ops

struct Axpy {
  kiln_context* ctx = nullptr;
  int buffers_made = 0, released = 0, checks = 0;
  bool fail_buffers = false;
  // One tune's buffers.
  struct Bufs {
    uint64_t x = 0, y0 = 0, y = 0;
    float a = 2.0f;
    int n = 0;
    void* params[5];
    kiln_output out;
  };
};

const char* kAxpy = "extern \"C\" __global__ void axpy(const float* x, const float* y0, float* y, float a, int n) {\n"
                    "  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;\n"
                    "  for (int j = 0; j < VEC; ++j) if (i + j < n) y[i + j] = a * x[i + j] + y0[i + j] + OFF;\n}\n";

kiln_status axpy_geometry(void* user, const int64_t* sizes, size_t, kiln_launch_dims* out) {
  const int vec = static_cast<int>(reinterpret_cast<intptr_t>(user));
  out->block = {128, 1, 1};
  out->grid = {static_cast<unsigned>((sizes[0] + 128 * vec - 1) / (128 * vec)), 1, 1};
  return KILN_OK;
}

kiln_status axpy_buffers(void* user, const int64_t* sizes, size_t, uint32_t, kiln_tune_buffers* out) {
  auto* a = static_cast<Axpy*>(user);
  if (a->fail_buffers) {
    kiln_set_callback_error("no memory for the DSL today");
    return KILN_ERROR_UNAVAILABLE;
  }
  auto* b = new Axpy::Bufs;
  b->n = static_cast<int>(sizes[0]);
  const size_t bytes = sizeof(float) * b->n;
  std::vector<float> x(b->n), y0(b->n, 1.0f);
  for (int i = 0; i < b->n; ++i) x[i] = static_cast<float>(i % 5);
  if (kiln_device_alloc(a->ctx, bytes, &b->x) != KILN_OK || kiln_device_alloc(a->ctx, bytes, &b->y0) != KILN_OK ||
      kiln_device_alloc(a->ctx, bytes, &b->y) != KILN_OK || kiln_copy_to_device(a->ctx, b->x, x.data(), bytes) != KILN_OK ||
      kiln_copy_to_device(a->ctx, b->y0, y0.data(), bytes) != KILN_OK) {
    return KILN_ERROR_CUDA;
  }
  b->params[0] = &b->x;
  b->params[1] = &b->y0;
  b->params[2] = &b->y;
  b->params[3] = &b->a;
  b->params[4] = &b->n;
  b->out = kiln_output{b->y, KILN_F32, 1, b->n, 0, "y"};
  out->params = b->params;
  out->num_params = 5;
  out->outputs = &b->out;
  out->num_outputs = 1;
  out->owner = b;
  ++a->buffers_made;
  return KILN_OK;
}

void axpy_release(void* user, void* owner) {
  auto* a = static_cast<Axpy*>(user);
  auto* b = static_cast<Axpy::Bufs*>(owner);
  if (b == nullptr) return;
  kiln_device_free(a->ctx, b->x);
  kiln_device_free(a->ctx, b->y0);
  kiln_device_free(a->ctx, b->y);
  delete b;
  ++a->released;
}

kiln_status axpy_check(void* user, const int64_t*, size_t, void** params, void*) {
  auto* a = static_cast<Axpy*>(user);
  ++a->checks;
  float y0 = 0;
  if (kiln_copy_to_host(a->ctx, &y0, *static_cast<uint64_t*>(params[2]), sizeof(float)) != KILN_OK) return KILN_ERROR_CUDA;
  if (y0 != 1.0f) {
    kiln_set_callback_error(("y[0] is " + std::to_string(y0)).c_str());
    return KILN_ERROR_WRONG_RESULT;
  }
  return KILN_OK;
}

struct AxpyVariants {
  std::vector<kiln_variant> variants;
  std::vector<std::vector<kiln_define>> defines;
  std::vector<std::string> names;
  std::vector<std::string> vecs;
  kiln_variant_op op;

  AxpyVariants(Axpy* user, std::vector<std::pair<int, const char*>> specs) {
    names.reserve(specs.size());
    vecs.reserve(specs.size());
    for (auto& [vec, off] : specs) {
      names.push_back("vec" + std::to_string(vec) + (std::string(off) == "0" ? "" : "_off"));
      vecs.push_back(std::to_string(vec));
    }
    for (size_t i = 0; i < specs.size(); ++i) defines.push_back({{"VEC", vecs[i].c_str()}, {"OFF", specs[i].second}});
    for (size_t i = 0; i < specs.size(); ++i) {
      kiln_variant v;
      kiln_variant_init(&v);
      v.name = names[i].c_str();
      v.source = kAxpy;
      v.kernel = "axpy";
      v.defines = defines[i].data();
      v.num_defines = defines[i].size();
      v.geometry = axpy_geometry;
      v.geometry_user = reinterpret_cast<void*>(static_cast<intptr_t>(specs[i].first));
      v.parameters = &defines[i][0];
      v.num_parameters = 1;
      variants.push_back(v);
    }
    kiln_variant_op_init(&op);
    op.name = "capi_test.axpy";
    op.variants = variants.data();
    op.num_variants = variants.size();
    op.buffers = axpy_buffers;
    op.release = axpy_release;
    op.check = axpy_check;
    op.user = user;
    op.tolerance = 1e-5;
  }
};

TEST_F(CApi, VariantRegistrationNamesWhatIsWrong) {
  kiln_context* ctx = context();
  Axpy user{ctx};
  AxpyVariants v(&user, {{1, "0"}, {4, "0"}});
  kiln_op* op = nullptr;
  v.op.buffers = nullptr;
  EXPECT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("buffers function"), std::string::npos) << kiln_last_error();
  v.op.buffers = axpy_buffers;
  v.variants[1].name = v.variants[0].name;
  EXPECT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("two variants are named 'vec1'"), std::string::npos) << kiln_last_error();
  v.variants[1].name = v.names[1].c_str();
  v.variants[1].size = 1;  // garbage
  EXPECT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("variants[1].size is 1"), std::string::npos) << kiln_last_error();
  v.variants[1].size = sizeof(kiln_variant);
  v.op.name = "gemm";
  EXPECT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_ERROR_ALREADY_EXISTS);
  v.op.name = "capi_test.axpy";
  ASSERT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_OK) << kiln_last_error();
  // Attributes named kiln.* are kiln's; sizes must be given.
  kiln_selection* sel = nullptr;
  kiln_define bad_attr = {"kiln.variants", "x"};
  int64_t n = 1024;
  EXPECT_EQ(kiln_op_tune(op, &n, 1, &bad_attr, 1, &sel), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_op_tune(op, nullptr, 0, nullptr, 0, &sel), KILN_ERROR_INVALID_ARGUMENT);
  kiln_op_destroy(op);
}

TEST_F(CApi, VariantsPrecompileWithoutAGpu) {
  kiln_context* ctx = context();
  Axpy user{ctx};
  AxpyVariants v(&user, {{1, "0"}, {2, "0"}, {4, "0"}});
  kiln_op* op = nullptr;
  ASSERT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_OK) << kiln_last_error();
  int64_t n = 4096;
  int compiled = -1, failed = -1;
  ASSERT_EQ(kiln_op_precompile(op, &n, 1, "sm_90", &compiled, &failed), KILN_OK) << kiln_last_error();
  EXPECT_EQ(compiled, 3);
  EXPECT_EQ(failed, 0);
  kiln_cache_stats stats{};
  stats.size = sizeof(stats);
  ASSERT_EQ(kiln_cache_stats_get(ctx, &stats), KILN_OK);
  EXPECT_GE(stats.binaries, 3u);
  kiln_op_destroy(op);
}

TEST_F(CApi, WorkloadsPrecompileWithoutAGpu) {
  kiln_context* ctx = context();
  kiln_workload_report r{};
  r.size = sizeof(r);
  const char* workload = R"({"name": "t", "problems": [{"op": "softmax", "rows": 4, "cols": 1000}]})";
  ASSERT_EQ(kiln_precompile_workload(ctx, workload, "sm_90", &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.problems, 1);
  EXPECT_GT(r.kernels, 0);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(kiln_precompile_workload(ctx, "{\"problems\": [{\"op\": \"nope\"}]}", "sm_90", &r), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("nope"), std::string::npos) << kiln_last_error();
}

TEST_F(CApi, CacheStatsExportAndImport) {
  kiln_context* ctx = context("a");
  kiln_source s = scale_source();
  kiln_kernel* k = nullptr;
  ASSERT_EQ(kiln_compile(ctx, &s, &k), KILN_OK) << kiln_last_error();
  kiln_kernel_destroy(k);
  const std::string bundle = (dir_ / "bundle.json").string();
  ASSERT_EQ(kiln_cache_export(ctx, bundle.c_str(), 1), KILN_OK) << kiln_last_error();
  ASSERT_TRUE(fs::exists(bundle));
  kiln_context* other = context("b");
  size_t imported = 7, rejected = 7;
  kiln_cache_stats stats{};
  stats.size = sizeof(stats);
  // An unsigned bundle's binaries are code from elsewhere: not stored unless the importer says to trust them.
  ASSERT_EQ(kiln_cache_import(other, bundle.c_str(), &imported, &rejected), KILN_OK) << kiln_last_error();
  EXPECT_EQ(imported, 0u);
  EXPECT_EQ(rejected, 0u);
  ASSERT_EQ(kiln_cache_stats_get(other, &stats), KILN_OK) << kiln_last_error();
  EXPECT_EQ(stats.binaries, 0u);
  kiln_import_trust trust;
  kiln_import_trust_init(&trust);
  trust.trust_unsigned = 1;
  int trusted = 0;
  ASSERT_EQ(kiln_cache_import_trusted(other, bundle.c_str(), &trust, &imported, &rejected, &trusted), KILN_OK)
      << kiln_last_error();
  EXPECT_GE(imported, 1u);
  EXPECT_EQ(trusted, 1);
  ASSERT_EQ(kiln_cache_stats_get(other, &stats), KILN_OK) << kiln_last_error();
  EXPECT_GE(stats.binaries, 1u);
  // Signed with a key the importer holds: trusted without trust_unsigned; with another key: not.
  const std::string key = (dir_ / "bundle.key").string(), other_key = (dir_ / "other.key").string();
  std::ofstream(key) << std::string(32, 'k');
  std::ofstream(other_key) << std::string(32, 'o');
  fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(other_key, fs::perms::owner_read | fs::perms::owner_write);
  const std::string signed_bundle = (dir_ / "signed.json").string();
  ASSERT_EQ(kiln_cache_export_signed(ctx, signed_bundle.c_str(), 1, key.c_str()), KILN_OK) << kiln_last_error();
  const char* keys[] = {key.c_str()};
  kiln_import_trust_init(&trust);
  trust.trusted_key_files = keys;
  trust.trusted_key_count = 1;
  kiln_context* third = context("d");
  ASSERT_EQ(kiln_cache_import_trusted(third, signed_bundle.c_str(), &trust, &imported, &rejected, &trusted), KILN_OK)
      << kiln_last_error();
  EXPECT_EQ(trusted, 1);
  ASSERT_EQ(kiln_cache_stats_get(third, &stats), KILN_OK) << kiln_last_error();
  EXPECT_GE(stats.binaries, 1u);
  const char* wrong[] = {other_key.c_str()};
  trust.trusted_key_files = wrong;
  kiln_context* fourth = context("e");
  ASSERT_EQ(kiln_cache_import_trusted(fourth, signed_bundle.c_str(), &trust, &imported, &rejected, &trusted), KILN_OK)
      << kiln_last_error();
  EXPECT_EQ(trusted, 0);
  ASSERT_EQ(kiln_cache_stats_get(fourth, &stats), KILN_OK) << kiln_last_error();
  EXPECT_EQ(stats.binaries, 0u);
  trust.trusted_key_files = nullptr;
  EXPECT_EQ(kiln_cache_import_trusted(fourth, signed_bundle.c_str(), &trust, nullptr, nullptr, nullptr),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cache_export_signed(ctx, signed_bundle.c_str(), 1, (dir_ / "no.key").string().c_str()),
            KILN_ERROR_NOT_FOUND) << kiln_last_error();
  // Not a bundle, no file, no cache.
  const std::string junk = (dir_ / "junk.json").string();
  std::ofstream(junk) << "this is not a bundle";
  EXPECT_EQ(kiln_cache_import(other, junk.c_str(), nullptr, nullptr), KILN_ERROR_CORRUPT) << kiln_last_error();
  EXPECT_EQ(kiln_cache_import(other, (dir_ / "missing.json").string().c_str(), nullptr, nullptr), KILN_ERROR_NOT_FOUND)
      << kiln_last_error();
  kiln_context* off = context("c", KILN_TUNE_MODE_OFF);
  EXPECT_EQ(kiln_cache_stats_get(off, &stats), KILN_ERROR_FAILED_PRECONDITION);
  stats.size = 1;
  EXPECT_EQ(kiln_cache_stats_get(ctx, &stats), KILN_ERROR_INVALID_ARGUMENT);
}

TEST_F(CApi, BuiltInOpsCheckTheirArgumentsFirst) {
  kiln_context* ctx = context();
  kiln_gemm_args g;
  kiln_gemm_args_init(&g);
  g.m = 0;
  g.n = g.k = 64;
  g.a = g.b = g.d = 0x1000;
  EXPECT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("m is 0"), std::string::npos) << kiln_last_error();
  g.m = 16;
  g.epilogue = "bias+gelu";
  EXPECT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("bias is 0"), std::string::npos) << kiln_last_error();
  g.epilogue = "bias+frobnicate";
  g.bias = 0x1000;
  EXPECT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("frobnicate"), std::string::npos) << kiln_last_error();
  g.epilogue = nullptr;
  g.a_dtype = static_cast<kiln_dtype>(2 + 1);  // in the C++ enum's range; test_capi_c99.c passes true garbage
  EXPECT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("args.a_dtype 3 is not a kiln_dtype"), std::string::npos)
      << kiln_last_error();
  g.a_dtype = KILN_BF16;
  g.b_constant = 7;
  EXPECT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("b_constant must be 0 or 1"), std::string::npos) << kiln_last_error();
  // A caller built before b_constant existed passes the smaller struct: read as 0, not refused for its size.
  kiln_gemm_args old;
  kiln_gemm_args_init(&old);
  EXPECT_EQ(old.b_constant, 0);
  old.size = offsetof(kiln_gemm_args, b_constant);
  old.m = 0, old.n = old.k = 64;
  old.a = old.b = old.d = 0x1000;
  EXPECT_EQ(kiln_gemm(ctx, &old, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("m is 0"), std::string::npos) << kiln_last_error();
  old.size = offsetof(kiln_gemm_args, b_constant) - 1;
  EXPECT_EQ(kiln_gemm(ctx, &old, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("args.size is"), std::string::npos) << kiln_last_error();
  kiln_rmsnorm_args r;
  kiln_rmsnorm_args_init(&r);
  r.rows = 4;
  r.cols = 64;
  r.x = r.weight = r.y = 0x1000;
  r.residual = 0x2000;
  EXPECT_EQ(kiln_rmsnorm(ctx, &r, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  kiln_softmax_args sm;
  kiln_softmax_args_init(&sm);
  sm.rows = 4;
  sm.cols = 64;
  EXPECT_EQ(kiln_softmax(ctx, &sm, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  kiln_allreduce* ar = nullptr;
  EXPECT_EQ(kiln_allreduce_create(ctx, nullptr, 0, 1, KILN_BF16, 0, &ar), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("ncclComm_t"), std::string::npos) << kiln_last_error();
}

TEST_F(CApi, WithoutAGpuLaunchesFailCleanly) {
  if (gpu_missing().empty()) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  kiln_context* ctx = context();
  kiln_source s = scale_source();
  kiln_kernel* k = nullptr;
  ASSERT_EQ(kiln_compile(ctx, &s, &k), KILN_OK) << kiln_last_error();
  float a = 2;
  int n = 1;
  uint64_t x = 0;
  void* args[] = {&x, &a, &n};
  kiln_status st = kiln_kernel_launch(k, {1, 1, 1}, {32, 1, 1}, 0, nullptr, args);
  EXPECT_TRUE(st == KILN_ERROR_NO_DRIVER || st == KILN_ERROR_NO_DEVICE) << kiln_status_name(st) << ": " << kiln_last_error();
  kiln_kernel_destroy(k);
  // With no arch and no device, a compile says what to do.
  s.arch = nullptr;
  st = kiln_compile(ctx, &s, &k);
  EXPECT_NE(st, KILN_OK);
  EXPECT_NE(std::string(kiln_last_error()).find("pass one"), std::string::npos) << kiln_last_error();
  Axpy user{ctx};
  AxpyVariants v(&user, {{1, "0"}});
  kiln_op* op = nullptr;
  ASSERT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_OK);
  int64_t size = 64;
  kiln_selection* sel = nullptr;
  st = kiln_op_tune(op, &size, 1, nullptr, 0, &sel);
  EXPECT_TRUE(st == KILN_ERROR_NO_DRIVER || st == KILN_ERROR_NO_DEVICE) << kiln_last_error();
  kiln_op_destroy(op);
}

// ---- on a GPU

TEST_F(CApi, GpuLaunchVariantsTuneCacheAndDispatch) {
  REQUIRE_GPU();
  kiln_context* ctx = context();
  // One kernel, launched.
  {
    kiln_source s = scale_source(nullptr);
    kiln_kernel* k = nullptr;
    ASSERT_EQ(kiln_compile(ctx, &s, &k), KILN_OK) << kiln_last_error();
    uint64_t x = 0;
    ASSERT_EQ(kiln_device_alloc(ctx, 256 * sizeof(float), &x), KILN_OK);
    std::vector<float> h(256, 1.5f);
    ASSERT_EQ(kiln_copy_to_device(ctx, x, h.data(), 256 * sizeof(float)), KILN_OK);
    float a = 2;
    int n = 256;
    void* args[] = {&x, &a, &n};
    ASSERT_EQ(kiln_kernel_launch(k, {2, 1, 1}, {128, 1, 1}, 0, nullptr, args), KILN_OK) << kiln_last_error();
    ASSERT_EQ(kiln_synchronize(ctx, nullptr), KILN_OK);
    ASSERT_EQ(kiln_copy_to_host(ctx, h.data(), x, 256 * sizeof(float)), KILN_OK);
    for (float v : h) ASSERT_EQ(v, 3.0f);
    kiln_device_free(ctx, x);
    kiln_kernel_destroy(k);
  }
  Axpy user{ctx};
  AxpyVariants v(&user, {{1, "0"}, {2, "0"}, {4, "0"}, {4, "1"}});
  kiln_op* op = nullptr;
  ASSERT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_OK) << kiln_last_error();
  int64_t n = 1 << 20;
  kiln_selection* sel = nullptr;
  ASSERT_EQ(kiln_op_tune(op, &n, 1, nullptr, 0, &sel), KILN_OK) << kiln_last_error();
  const char* chosen = nullptr;
  ASSERT_EQ(kiln_selection_variant(sel, &chosen), KILN_OK);
  const std::string winner = chosen;
  EXPECT_EQ(winner.find("_off"), std::string::npos);
  kiln_tune_info info{};
  info.size = sizeof(info);
  ASSERT_EQ(kiln_selection_info(sel, &info), KILN_OK);
  EXPECT_EQ(info.from_cache, 0);
  EXPECT_EQ(info.candidates, 4);
  EXPECT_EQ(info.failures, 1);
  EXPECT_GT(info.median_us, 0);
  EXPECT_GE(user.checks, 3);
  EXPECT_EQ(user.buffers_made, user.released);
  size_t needed = 0;
  EXPECT_EQ(kiln_selection_report(sel, nullptr, 0, &needed), KILN_ERROR_BUFFER_TOO_SMALL);
  std::string json(needed, '\0');
  ASSERT_EQ(kiln_selection_report(sel, json.data(), json.size(), &needed), KILN_OK);
  EXPECT_NE(json.find("vec4_off"), std::string::npos);
  kiln_selection_destroy(sel);

  // A second context on the same cache: the decision, no tuning (no buffers made, no checks).
  kiln_context* again = context("cache", KILN_TUNE_MODE_STRICT);
  Axpy user2{again};
  AxpyVariants v2(&user2, {{1, "0"}, {2, "0"}, {4, "0"}, {4, "1"}});
  kiln_op* op2 = nullptr;
  ASSERT_EQ(kiln_variants_register(again, &v2.op, &op2), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_op_tune(op2, &n, 1, nullptr, 0, &sel), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_selection_info(sel, &info), KILN_OK);
  EXPECT_EQ(info.from_cache, 1);
  ASSERT_EQ(kiln_selection_variant(sel, &chosen), KILN_OK);
  EXPECT_EQ(std::string(chosen), winner);
  EXPECT_EQ(user2.buffers_made, 0);
  EXPECT_EQ(user2.checks, 0);
  // The winner on the caller's buffers.
  kiln_tune_buffers tb{};
  int64_t small = 1000;
  ASSERT_EQ(axpy_buffers(&user2, &small, 1, 0, &tb), KILN_OK);
  ASSERT_EQ(kiln_selection_launch(sel, &small, 1, tb.params, nullptr), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_synchronize(again, nullptr), KILN_OK);
  std::vector<float> y(1000);
  auto* b = static_cast<Axpy::Bufs*>(tb.owner);
  ASSERT_EQ(kiln_copy_to_host(again, y.data(), b->y, sizeof(float) * 1000), KILN_OK);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(y[i], 2.0f * (i % 5) + 1.0f) << i;
  kiln_selection_destroy(sel);
  // A strict miss (another size) is an error, not a tune.
  int64_t other = 12345;
  EXPECT_EQ(kiln_op_tune(op2, &other, 1, nullptr, 0, &sel), KILN_ERROR_NOT_FOUND) << kiln_last_error();

  // Size dispatch in tune mode.
  kiln_dispatcher* d = nullptr;
  int64_t top = 1 << 16;
  int64_t buckets[] = {256, 1 << 16};
  ASSERT_EQ(kiln_op_dispatcher(op, &top, 1, nullptr, 0, buckets, 2, &d), KILN_OK) << kiln_last_error();
  const char* small_variant = nullptr;
  ASSERT_EQ(kiln_dispatcher_variant(d, 100, &small_variant), KILN_OK);
  EXPECT_EQ(std::string(small_variant).find("_off"), std::string::npos);
  ASSERT_EQ(kiln_dispatcher_launch(d, &small, 1, tb.params, nullptr), KILN_OK) << kiln_last_error();
  kiln_dispatcher_destroy(d);
  axpy_release(&user2, tb.owner);

  // A buffers callback's error reaches the caller with its message. (Op names are process-wide: the second
  // context's registration replaced the first's callbacks, so register the first's again.)
  kiln_op_destroy(op);
  ASSERT_EQ(kiln_variants_register(ctx, &v.op, &op), KILN_OK) << kiln_last_error();
  user.fail_buffers = true;
  int64_t fresh = 77777;
  EXPECT_EQ(kiln_op_tune(op, &fresh, 1, nullptr, 0, &sel), KILN_ERROR_UNAVAILABLE);
  EXPECT_NE(std::string(kiln_last_error()).find("no memory for the DSL today"), std::string::npos) << kiln_last_error();
  kiln_op_destroy(op);
  kiln_op_destroy(op2);
}

TEST_F(CApi, GpuBuiltInOps) {
  REQUIRE_GPU();
  kiln_context* ctx = context();
  const int64_t rows = 16, cols = 1024;
  const size_t bytes = rows * cols * 2;  // bf16
  uint64_t x = 0, w = 0, y = 0;
  ASSERT_EQ(kiln_device_alloc(ctx, bytes, &x), KILN_OK);
  ASSERT_EQ(kiln_device_alloc(ctx, cols * 2, &w), KILN_OK);
  ASSERT_EQ(kiln_device_alloc(ctx, bytes, &y), KILN_OK);
  // bf16 1.0 = 0x3f80 everywhere: rmsnorm of ones with weight one is one; softmax of equal values is 1/cols.
  std::vector<uint16_t> ones(rows * cols, 0x3f80);
  ASSERT_EQ(kiln_copy_to_device(ctx, x, ones.data(), bytes), KILN_OK);
  ASSERT_EQ(kiln_copy_to_device(ctx, w, ones.data(), cols * 2), KILN_OK);
  kiln_rmsnorm_args r;
  kiln_rmsnorm_args_init(&r);
  r.rows = rows;
  r.cols = cols;
  r.x = x;
  r.weight = w;
  r.y = y;
  ASSERT_EQ(kiln_rmsnorm(ctx, &r, nullptr), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_synchronize(ctx, nullptr), KILN_OK);
  std::vector<uint16_t> out(rows * cols);
  ASSERT_EQ(kiln_copy_to_host(ctx, out.data(), y, bytes), KILN_OK);
  EXPECT_EQ(out[0], 0x3f80);
  EXPECT_EQ(out[rows * cols - 1], 0x3f80);
  kiln_softmax_args s;
  kiln_softmax_args_init(&s);
  s.rows = rows;
  s.cols = cols;
  s.x = x;
  s.y = y;
  ASSERT_EQ(kiln_softmax(ctx, &s, nullptr), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_synchronize(ctx, nullptr), KILN_OK);
  ASSERT_EQ(kiln_copy_to_host(ctx, out.data(), y, bytes), KILN_OK);
  EXPECT_EQ(out[5], 0x3a80);  // bf16(1/1024)
  // GEMM: ones[16 x 1024] . ones[1024 x 16] = 1024 everywhere (+ bias 1 = 1025 -> bf16 1024).
  uint64_t b = 0, d = 0, bias = 0;
  ASSERT_EQ(kiln_device_alloc(ctx, cols * 16 * 2, &b), KILN_OK);
  ASSERT_EQ(kiln_device_alloc(ctx, rows * 16 * 2, &d), KILN_OK);
  ASSERT_EQ(kiln_device_alloc(ctx, 16 * 2, &bias), KILN_OK);
  ASSERT_EQ(kiln_copy_to_device(ctx, b, ones.data(), cols * 16 * 2), KILN_OK);
  ASSERT_EQ(kiln_copy_to_device(ctx, bias, ones.data(), 16 * 2), KILN_OK);
  kiln_gemm_args g;
  kiln_gemm_args_init(&g);
  g.m = rows;
  g.n = 16;
  g.k = cols;
  g.a = x;
  g.b = b;
  g.d = d;
  g.bias = bias;
  g.epilogue = "bias";
  ASSERT_EQ(kiln_gemm(ctx, &g, nullptr), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_synchronize(ctx, nullptr), KILN_OK);
  std::vector<uint16_t> dh(rows * 16);
  ASSERT_EQ(kiln_copy_to_host(ctx, dh.data(), d, dh.size() * 2), KILN_OK);
  EXPECT_EQ(dh[0], 0x4480);  // bf16(1025) rounds to 1024
  for (uint64_t p : {x, w, y, b, d, bias}) kiln_device_free(ctx, p);
}

}  // namespace
