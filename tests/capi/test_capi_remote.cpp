// The fleet's remote cache through kiln/kiln.h alone, against a real redis-server (tests/cache/remote/
// redis_server.h: a loopback port in a temporary folder; without one the tests fail unless
// KILN_ALLOW_NO_REDIS=1): context options and their environment defaults, push/pull between two cache folders
// through one Redis (decisions-only and arch selections), read-through on a compile, a tampered value refused
// and counted, a killed Redis leaving kiln local-only with honest counters and errors, and no key or password in
// any message or log line. Compiles need NVRTC only: no GPU. On a GPU: a variant op's decision tuned through one
// context is read through by a strict context on another folder (skipped without a device).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "../cache/remote/redis_server.h"
#include "kiln/kiln.h"

namespace {

namespace fs = std::filesystem;
using kiln::test::RedisServer;

// Key material a message must never show.
const std::string kKey = "capi-fleet-key-material-0123456789-never-printed";
const std::string kOtherKey = "another-fleets-key-material-abcdefghij-never-printed";

const char* kScale = "extern \"C\" __global__ void scale(float* x, float a, int n) {\n"
                     "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a * SCALE; }\n";

// Every log line any context sent to its callback, to look for secrets in.
std::mutex log_mu;
std::vector<std::string> log_lines;
void capture_log(void*, kiln_log_level, const char* message) {
  std::lock_guard lock(log_mu);
  log_lines.push_back(message);
}

// A variant op for the GPU test: y[i] = 2 * x[i], VEC elements a thread.
const char* kTwice = "extern \"C\" __global__ void twice(const float* x, float* y, int n) {\n"
                     "  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;\n"
                     "  for (int j = 0; j < VEC; ++j) if (i + j < n) y[i + j] = 2.0f * x[i + j];\n}\n";

struct TwiceBufs {
  kiln_context* ctx = nullptr;
  uint64_t x = 0, y = 0;
  int n = 0;
  void* params[3];
  kiln_output out;
};

kiln_status twice_geometry(void* user, const int64_t* sizes, size_t, kiln_launch_dims* out) {
  const int vec = static_cast<int>(reinterpret_cast<intptr_t>(user));
  out->block = {128, 1, 1};
  out->grid = {static_cast<unsigned>((sizes[0] + 128 * vec - 1) / (128 * vec)), 1, 1};
  return KILN_OK;
}

kiln_status twice_buffers(void* user, const int64_t* sizes, size_t, uint32_t, kiln_tune_buffers* out) {
  auto* b = new TwiceBufs;
  out->owner = b;
  b->ctx = static_cast<kiln_context*>(user);
  b->n = static_cast<int>(sizes[0]);
  std::vector<float> x(b->n);
  for (int i = 0; i < b->n; ++i) x[i] = static_cast<float>(i % 7);
  if (kiln_device_alloc(b->ctx, x.size() * sizeof(float), &b->x) != KILN_OK ||
      kiln_device_alloc(b->ctx, x.size() * sizeof(float), &b->y) != KILN_OK ||
      kiln_copy_to_device(b->ctx, b->x, x.data(), x.size() * sizeof(float)) != KILN_OK) {
    return KILN_ERROR_CUDA;
  }
  b->params[0] = &b->x;
  b->params[1] = &b->y;
  b->params[2] = &b->n;
  b->out = kiln_output{b->y, KILN_F32, 1, b->n, 0, "y"};
  out->params = b->params;
  out->num_params = 3;
  out->outputs = &b->out;
  out->num_outputs = 1;
  return KILN_OK;
}

void twice_release(void*, void* owner) {
  auto* b = static_cast<TwiceBufs*>(owner);
  if (b == nullptr) return;
  if (b->x) kiln_device_free(b->ctx, b->x);
  if (b->y) kiln_device_free(b->ctx, b->y);
  delete b;
}

// Registers the op on `ctx` and tunes it for n; the selection's info.
kiln_tune_info tune_twice(kiln_context* ctx, int64_t n, std::string* chosen) {
  static const char* names[] = {"vec1", "vec2", "vec4"};
  static kiln_define defines[] = {{"VEC", "1"}, {"VEC", "2"}, {"VEC", "4"}};
  kiln_variant variants[3];
  for (int i = 0; i < 3; ++i) {
    kiln_variant_init(&variants[i]);
    variants[i].name = names[i];
    variants[i].source = kTwice;
    variants[i].kernel = "twice";
    variants[i].defines = &defines[i];
    variants[i].num_defines = 1;
    variants[i].geometry = twice_geometry;
    variants[i].geometry_user = reinterpret_cast<void*>(static_cast<intptr_t>(1 << i));
  }
  kiln_variant_op op;
  kiln_variant_op_init(&op);
  op.name = "capi_test.remote_twice";
  op.variants = variants;
  op.num_variants = 3;
  op.buffers = twice_buffers;
  op.release = twice_release;
  op.user = ctx;
  kiln_tune_info info{};
  info.size = sizeof(info);
  kiln_op* handle = nullptr;
  kiln_selection* sel = nullptr;
  EXPECT_EQ(kiln_variants_register(ctx, &op, &handle), KILN_OK) << kiln_last_error();
  EXPECT_EQ(kiln_op_tune(handle, &n, 1, nullptr, 0, &sel), KILN_OK) << kiln_last_error();
  if (sel != nullptr) {
    EXPECT_EQ(kiln_selection_info(sel, &info), KILN_OK);
    const char* name = nullptr;
    EXPECT_EQ(kiln_selection_variant(sel, &name), KILN_OK);
    if (name) *chosen = name;
  }
  kiln_selection_destroy(sel);
  kiln_op_destroy(handle);
  return info;
}

class CApiRemote : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_capi_remote_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    key_file_ = write_key("fleet.key", kKey);
    other_key_file_ = write_key("other.key", kOtherKey);
    for (const char* v : {"KILN_REMOTE_CACHE", "KILN_CACHE_KEY_FILE", "KILN_REMOTE_ALLOW_UNSIGNED",
                          "KILN_REMOTE_CONNECT_TIMEOUT_MS", "KILN_REMOTE_READ_TIMEOUT_MS"}) {
      ::unsetenv(v);
    }
    std::lock_guard lock(log_mu);
    log_lines.clear();
  }
  void TearDown() override {
    for (auto* c : contexts_) kiln_context_destroy(c);
    fs::remove_all(dir_);
  }
  std::string write_key(const std::string& name, const std::string& content, mode_t mode = 0600) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << content;
    ::chmod(path.c_str(), mode);
    return path;
  }
  kiln_context_options options(const std::string& sub, const char* remote, const char* key_file) {
    dirs_.push_back((dir_ / sub).string());
    kiln_context_options o;
    kiln_context_options_init(&o);
    o.cache_dir = dirs_.back().c_str();
    o.tune_mode = KILN_TUNE_MODE_TUNE;
    o.executor = KILN_EXECUTOR_INLINE;
    o.log = capture_log;
    o.log_level = KILN_LOG_DEBUG;
    o.remote_cache = remote;
    o.cache_key_file = key_file;
    return o;
  }
  kiln_context* context(const std::string& sub, const char* remote, const char* key_file) {
    kiln_context_options o = options(sub, remote, key_file);
    kiln_context* ctx = nullptr;
    EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_OK) << kiln_last_error();
    if (ctx) contexts_.push_back(ctx);
    return ctx;
  }
  // Compiles kScale with SCALE=`scale` for `arch` (a new kernel per pair).
  static kiln_status compile(kiln_context* ctx, const char* arch, const char* scale) {
    kiln_define d{"SCALE", scale};
    kiln_source s;
    kiln_source_init(&s);
    s.source = kScale;
    s.kernel = "scale";
    s.arch = arch;
    s.defines = &d;
    s.num_defines = 1;
    kiln_kernel* k = nullptr;
    kiln_status st = kiln_compile(ctx, &s, &k);
    kiln_kernel_destroy(k);
    return st;
  }
  static kiln_sync_report report() {
    kiln_sync_report r{};
    r.size = sizeof(r);
    return r;
  }
  static kiln_remote_stats remote_stats(kiln_context* ctx) {
    kiln_remote_stats s{};
    s.size = sizeof(s);
    EXPECT_EQ(kiln_cache_remote_stats(ctx, &s), KILN_OK) << kiln_last_error();
    return s;
  }
  static uint64_t local_binaries(kiln_context* ctx) {
    kiln_cache_stats s{};
    s.size = sizeof(s);
    EXPECT_EQ(kiln_cache_stats_get(ctx, &s), KILN_OK) << kiln_last_error();
    return s.binaries;
  }
  // No key material in anything kiln said: the last error, and every log line so far.
  void expect_no_secrets(const std::string& what) {
    for (const std::string& secret : {kKey, kOtherKey, std::string("hunter2secret")}) {
      EXPECT_EQ(what.find(secret), std::string::npos) << what;
      std::lock_guard lock(log_mu);
      for (const auto& line : log_lines) EXPECT_EQ(line.find(secret), std::string::npos) << line;
    }
  }

  fs::path dir_;
  std::string key_file_, other_key_file_;
  std::deque<std::string> dirs_;  // stable: the options point into it
  std::vector<kiln_context*> contexts_;
};

TEST_F(CApiRemote, PushAndPullBetweenTwoCachesThroughOneRedis) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string url = redis.url();
  kiln_context* build = context("build", url.c_str(), key_file_.c_str());
  ASSERT_NE(build, nullptr);
  ASSERT_EQ(compile(build, "sm_90", "1"), KILN_OK) << kiln_last_error();
  ASSERT_EQ(compile(build, "sm_80", "1"), KILN_OK) << kiln_last_error();
  kiln_remote_stats rs = remote_stats(build);
  EXPECT_EQ(rs.configured, 1);
  EXPECT_EQ(rs.signing, 1);
  EXPECT_EQ(rs.misses, 2u);  // each compile asked the remote first
  EXPECT_EQ(rs.breaker, KILN_BREAKER_CLOSED);
  EXPECT_EQ(std::string(rs.remote), url);

  kiln_sync_report r = report();
  ASSERT_EQ(kiln_cache_push(build, nullptr, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 2u);
  EXPECT_EQ(r.withheld, 0u);
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(redis.keys("kiln:f*:bin:*").size(), 2u);

  // Another cache folder, the same remote: everything, then selections.
  kiln_context* gpu = context("gpu", url.c_str(), key_file_.c_str());
  r = report();
  ASSERT_EQ(kiln_cache_pull(gpu, nullptr, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 2u);
  EXPECT_EQ(r.refused, 0u);
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(local_binaries(gpu), 2u);

  kiln_context* picky = context("picky", url.c_str(), key_file_.c_str());
  kiln_sync_options so;
  kiln_sync_options_init(&so);
  so.decisions_only = 1;
  r = report();
  ASSERT_EQ(kiln_cache_pull(picky, &so, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 0u);
  EXPECT_EQ(r.timings, 0u);
  EXPECT_EQ(local_binaries(picky), 0u);
  kiln_sync_options_init(&so);
  so.arch = "sm_80";
  r = report();
  ASSERT_EQ(kiln_cache_pull(picky, &so, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 1u);
  EXPECT_EQ(local_binaries(picky), 1u);

  // A remote named in the call rather than the context's; without a key its binaries stay home.
  kiln_context* plain = context("plain", "", nullptr);
  EXPECT_EQ(remote_stats(plain).configured, 0);
  EXPECT_EQ(kiln_cache_push(plain, nullptr, &r), KILN_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(kiln_last_error()).find("no remote cache named"), std::string::npos) << kiln_last_error();
  ASSERT_EQ(compile(plain, "sm_90", "3"), KILN_OK) << kiln_last_error();
  kiln_sync_options_init(&so);
  so.remote_cache = url.c_str();
  so.key_file = "";
  r = report();
  ASSERT_EQ(kiln_cache_push(plain, &so, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 0u);
  EXPECT_EQ(r.withheld, 1u);
  EXPECT_EQ(redis.keys("kiln:f*:bin:*").size(), 2u);
  expect_no_secrets(kiln_last_error());
}

TEST_F(CApiRemote, ALocalMissReadsThroughAndWhatIsRecordedIsPublished) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string url = redis.url();
  {
    kiln_context* build = context("build", url.c_str(), key_file_.c_str());
    ASSERT_EQ(compile(build, "sm_90", "2"), KILN_OK) << kiln_last_error();
    // Write-behind: the compile's binary is published from the queue; destroying the context drains it.
    kiln_context_destroy(build);
    contexts_.clear();
  }
  ASSERT_EQ(redis.keys("kiln:f*:bin:sm_90:*").size(), 1u);
  kiln_context* gpu = context("gpu", url.c_str(), key_file_.c_str());
  ASSERT_EQ(compile(gpu, "sm_90", "2"), KILN_OK) << kiln_last_error();
  kiln_remote_stats rs = remote_stats(gpu);
  EXPECT_EQ(rs.hits, 1u);
  EXPECT_EQ(rs.misses, 0u);
  EXPECT_EQ(local_binaries(gpu), 1u);  // verified, then stored locally
}

TEST_F(CApiRemote, ATamperedValueIsRefusedCountedAndNeverStored) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string url = redis.url();
  kiln_context* build = context("build", url.c_str(), key_file_.c_str());
  ASSERT_EQ(compile(build, "sm_90", "1"), KILN_OK) << kiln_last_error();
  ASSERT_EQ(compile(build, "sm_90", "2"), KILN_OK) << kiln_last_error();
  kiln_sync_report r = report();
  ASSERT_EQ(kiln_cache_push(build, nullptr, &r), KILN_OK) << kiln_last_error();
  ASSERT_EQ(r.binaries, 2u);
  // One value edited in Redis: a byte in its middle.
  const auto keys = redis.keys("kiln:f*:bin:*");
  ASSERT_EQ(keys.size(), 2u);
  redisReply* got = redis.command({"GET", keys[0]});
  ASSERT_TRUE(got != nullptr && got->type == REDIS_REPLY_STRING);
  std::string value(got->str, got->len);
  freeReplyObject(got);
  value[value.size() / 2] ^= 0x40;
  freeReplyObject(redis.command({"SET", keys[0], value}));

  kiln_context* gpu = context("gpu", url.c_str(), key_file_.c_str());
  r = report();
  ASSERT_EQ(kiln_cache_pull(gpu, nullptr, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 1u);
  EXPECT_EQ(r.refused, 1u);
  EXPECT_EQ(local_binaries(gpu), 1u);
  kiln_remote_stats rs = remote_stats(gpu);
  EXPECT_EQ(rs.refused, 1u);
  EXPECT_EQ(rs.refused_signature + rs.refused_malformed, 1u);
  EXPECT_NE(std::string(rs.last_error), "");

  // A machine holding another fleet's key refuses both, and says so without either key.
  kiln_context* other = context("other", url.c_str(), other_key_file_.c_str());
  r = report();
  ASSERT_EQ(kiln_cache_pull(other, nullptr, &r), KILN_OK) << kiln_last_error();
  EXPECT_EQ(r.binaries, 0u);
  EXPECT_EQ(r.refused, 2u);
  EXPECT_EQ(local_binaries(other), 0u);
  rs = remote_stats(other);
  expect_no_secrets(rs.last_error);
  expect_no_secrets(kiln_last_error());
}

TEST_F(CApiRemote, AKilledRedisLeavesTheContextLocalOnlyWithAnHonestStatus) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  kiln_context* ctx = context("cache", redis.url().c_str(), key_file_.c_str());
  ASSERT_EQ(compile(ctx, "sm_90", "1"), KILN_OK) << kiln_last_error();
  EXPECT_EQ(remote_stats(ctx).misses, 1u);
  redis.kill_now();
  // Compiles go on locally; their lookups fail (or, once the breaker is open, are skipped), fast.
  for (const char* scale : {"2", "3", "4", "5", "6"}) ASSERT_EQ(compile(ctx, "sm_90", scale), KILN_OK) << kiln_last_error();
  EXPECT_EQ(local_binaries(ctx), 6u);
  kiln_remote_stats rs = remote_stats(ctx);
  EXPECT_EQ(rs.breaker, KILN_BREAKER_OPEN);
  EXPECT_EQ(rs.breaker_opened, 1u);
  EXPECT_EQ(rs.errors + rs.skipped, 5u);
  EXPECT_GE(rs.errors, 1u);
  EXPECT_GE(rs.skipped, 2u);
  EXPECT_EQ(rs.hits, 0u);
  EXPECT_NE(std::string(rs.last_error).find("127.0.0.1"), std::string::npos) << rs.last_error;
  // An explicit pull says the remote is down, naming it; nothing local is lost.
  kiln_sync_report r = report();
  kiln_status st = kiln_cache_pull(ctx, nullptr, &r);
  EXPECT_TRUE(st == KILN_ERROR_UNAVAILABLE || st == KILN_ERROR_TIMEOUT) << kiln_status_name(st) << ": " << kiln_last_error();
  EXPECT_NE(std::string(kiln_last_error()).find("pulling from " + redis.url()), std::string::npos) << kiln_last_error();
  EXPECT_EQ(local_binaries(ctx), 6u);
  expect_no_secrets(kiln_last_error());
}

TEST_F(CApiRemote, OptionsAndTheirEnvironmentDefaults) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string url = redis.url();
  ::setenv("KILN_REMOTE_CACHE", url.c_str(), 1);
  ::setenv("KILN_CACHE_KEY_FILE", key_file_.c_str(), 1);
  kiln_context* from_env = context("env", nullptr, nullptr);
  kiln_context* none = context("none", "", nullptr);
  kiln_context* unsigned_ctx = context("unsigned", nullptr, "");
  ::unsetenv("KILN_REMOTE_CACHE");
  ::unsetenv("KILN_CACHE_KEY_FILE");
  kiln_remote_stats rs = remote_stats(from_env);
  EXPECT_EQ(rs.configured, 1);
  EXPECT_EQ(rs.signing, 1);
  EXPECT_EQ(std::string(rs.remote), url);
  EXPECT_EQ(remote_stats(none).configured, 0);
  rs = remote_stats(unsigned_ctx);
  EXPECT_EQ(rs.configured, 1);
  EXPECT_EQ(rs.signing, 0);

  // A program built before the remote fields: its smaller struct is read as far as it goes.
  kiln_context_options old = options("old", "redis://ignored:1/0", nullptr);
  old.size = offsetof(kiln_context_options, remote_cache);
  kiln_context* ctx = nullptr;
  ASSERT_EQ(kiln_context_create(&old, &ctx), KILN_OK) << kiln_last_error();
  contexts_.push_back(ctx);
  EXPECT_EQ(remote_stats(ctx).configured, 0);  // no $KILN_REMOTE_CACHE now

  // Bad values, each named.
  struct Bad {
    const char* remote;
    int allow, connect, read;
    const char* says;
  };
  for (const Bad& b : {Bad{"http://h:1", 0, 0, 0, "remote cache URL"}, Bad{url.c_str(), 2, 0, 0, "options.remote_allow_unsigned is 2"},
                       Bad{url.c_str(), 0, -1, 0, "options.remote_connect_timeout_ms is -1"},
                       Bad{url.c_str(), 0, 0, 700000, "options.remote_read_timeout_ms is 700000"}}) {
    kiln_context_options o = options("bad", b.remote, nullptr);
    o.remote_allow_unsigned = b.allow;
    o.remote_connect_timeout_ms = b.connect;
    o.remote_read_timeout_ms = b.read;
    ctx = reinterpret_cast<kiln_context*>(0x1);
    EXPECT_EQ(kiln_context_create(&o, &ctx), KILN_ERROR_INVALID_ARGUMENT) << b.says;
    EXPECT_EQ(ctx, nullptr);
    EXPECT_NE(std::string(kiln_last_error()).find(b.says), std::string::npos) << kiln_last_error();
  }
  kiln_context* c = context("calls", url.c_str(), key_file_.c_str());
  kiln_sync_report r = report();
  EXPECT_EQ(kiln_cache_push(nullptr, nullptr, &r), KILN_ERROR_INVALID_ARGUMENT);
  kiln_sync_options so;
  kiln_sync_options_init(&so);
  so.decisions_only = 7;
  EXPECT_EQ(kiln_cache_pull(c, &so, &r), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("options.decisions_only is 7"), std::string::npos) << kiln_last_error();
  kiln_sync_options_init(&so);
  so.arch = "bogus";
  EXPECT_EQ(kiln_cache_pull(c, &so, &r), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("options.arch"), std::string::npos) << kiln_last_error();
  kiln_sync_options_init(&so);
  so.key_file = key_file_.c_str();  // a key goes with a remote named in the call
  EXPECT_EQ(kiln_cache_push(c, &so, &r), KILN_ERROR_INVALID_ARGUMENT);
  so.size = 3;
  EXPECT_EQ(kiln_cache_push(c, &so, &r), KILN_ERROR_INVALID_ARGUMENT);
  r.size = 8;
  EXPECT_EQ(kiln_cache_push(c, nullptr, &r), KILN_ERROR_INVALID_ARGUMENT);
  kiln_remote_stats small{};
  small.size = 16;
  EXPECT_EQ(kiln_cache_remote_stats(c, &small), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cache_remote_stats(nullptr, &small), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cache_push(c, nullptr, nullptr), KILN_OK) << kiln_last_error();  // the report is optional
}

TEST_F(CApiRemote, KeyMaterialAndPasswordsNeverAppearInMessages) {
  // A key file others can read is refused, naming the file, not its content.
  const std::string loose = write_key("loose.key", kKey, 0644);
  kiln_context_options o = options("a", "redis://127.0.0.1:1/0", loose.c_str());
  kiln_context* ctx = nullptr;
  EXPECT_NE(kiln_context_create(&o, &ctx), KILN_OK);
  EXPECT_NE(std::string(kiln_last_error()).find("loose.key"), std::string::npos) << kiln_last_error();
  expect_no_secrets(kiln_last_error());
  // Too short to be a key.
  const std::string short_key = write_key("short.key", "hunter2secret");
  o = options("b", "redis://127.0.0.1:1/0", short_key.c_str());
  EXPECT_NE(kiln_context_create(&o, &ctx), KILN_OK);
  expect_no_secrets(kiln_last_error());
  // A password in the URL of a remote that is not there: redacted in the error and the counters.
  const std::string url = "redis://kiln:hunter2secret@127.0.0.1:" + std::to_string(kiln::test::free_port()) + "/0";
  kiln_context* c = context("c", url.c_str(), key_file_.c_str());
  ASSERT_NE(c, nullptr);
  kiln_sync_report r = report();
  EXPECT_EQ(kiln_cache_pull(c, nullptr, &r), KILN_ERROR_UNAVAILABLE) << kiln_last_error();
  expect_no_secrets(kiln_last_error());
  ASSERT_EQ(compile(c, "sm_90", "1"), KILN_OK) << kiln_last_error();  // a lookup fails, locally compiled
  kiln_remote_stats rs = remote_stats(c);
  EXPECT_NE(std::string(rs.remote).find("kiln:***@"), std::string::npos) << rs.remote;
  EXPECT_GE(rs.errors, 1u);
  expect_no_secrets(rs.last_error);
  expect_no_secrets(rs.remote);
}

TEST_F(CApiRemote, GpuADecisionTunedInOneFolderIsReadThroughInAnother) {
  int devices = 0;
  if (kiln_device_count(&devices) != KILN_OK || devices == 0) GTEST_SKIP() << "needs a GPU: " << kiln_last_error();
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string url = redis.url();
  std::string first, second;
  {
    kiln_context* tuner = context("tuner", url.c_str(), key_file_.c_str());
    kiln_tune_info info = tune_twice(tuner, 1 << 20, &first);
    EXPECT_EQ(info.from_cache, 0);
    EXPECT_EQ(info.failures, 0);
    kiln_context_destroy(tuner);  // drains the write-behind queue: decision, timings, binaries
    contexts_.clear();
  }
  EXPECT_EQ(redis.keys("kiln:f*:dec:*").size(), 1u);
  // Another machine's empty folder, strict mode: the decision and its kernel come from the remote, verified;
  // nothing is measured or compiled.
  kiln_context_options o = options("gpu", url.c_str(), key_file_.c_str());
  o.tune_mode = KILN_TUNE_MODE_STRICT;
  kiln_context* gpu = nullptr;
  ASSERT_EQ(kiln_context_create(&o, &gpu), KILN_OK) << kiln_last_error();
  contexts_.push_back(gpu);
  kiln_tune_info info = tune_twice(gpu, 1 << 20, &second);
  EXPECT_EQ(info.from_cache, 1);
  EXPECT_EQ(second, first);
  kiln_remote_stats rs = remote_stats(gpu);
  EXPECT_GE(rs.hits, 2u);  // the decision and the chosen variant's binary
  EXPECT_EQ(rs.refused, 0u);
}

}  // namespace
