// The fleet tier against a real redis-server: URLs, the circuit breaker on a fake clock, sealed values, read-
// through and write-behind round trips, refusals, and a Redis that is killed, stopped, absent or full.
#include <gtest/gtest.h>

#include <fstream>
#include <sys/stat.h>

#include "../cache_test_util.h"
#include "breaker.h"
#include "kiln/cache/remote.h"
#include "kiln/cache/sealed.h"
#include "kiln/cache/tuning.h"
#include "redis_server.h"

namespace kiln::cache {
namespace {

using namespace std::chrono_literals;
using testing::fake_binary;
using testing::sample_problem;
using testing::store_options;
using testing::TempDir;
using test::RedisServer;

SigningKey key_a() { return SigningKey::from_bytes(std::string(40, 'a')).value(); }
SigningKey key_b() { return SigningKey::from_bytes(std::string(40, 'b')).value(); }

// A clock the test moves by hand.
struct FakeClock {
  std::shared_ptr<std::chrono::steady_clock::time_point> now =
      std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::time_point{} + 1h);
  RemoteClock fn() const {
    auto p = now;
    return [p] { return *p; };
  }
  void advance(std::chrono::milliseconds d) { *now += d; }
};

RemoteOptions options_for(const std::string& url, std::optional<SigningKey> key = key_a()) {
  RemoteOptions o;
  o.url = url;
  o.key = std::move(key);
  return o;
}

Decision sample_decision(const std::string& problem, std::string choice = "gemm_128x128") {
  Decision d;
  d.problem = problem;
  d.choice = std::move(choice);
  d.params = {{"bm", "128"}, {"bn", "128"}};
  d.kernel = KernelKey{1, 2};
  d.median_us = 12.5;
  return d;
}

TimingRecord sample_timing(const std::string& problem, std::string choice, double us) {
  TimingRecord t;
  t.problem = problem;
  t.choice = std::move(choice);
  t.median_us = t.min_us = t.p90_us = us;
  t.samples = 10;
  return t;
}

// A tuning cache over a fresh local store with `tier` behind it.
struct Machine {
  TempDir dir;
  std::shared_ptr<RedisTier> tier;
  std::unique_ptr<TuningCache> cache;
  explicit Machine(RemoteOptions o, TuneMode mode = TuneMode::kTune) {
    tier = RedisTier::open(std::move(o)).value();
    cache = TuningCache::open(mode, store_options(dir), tier).value();
  }
};

// ---- URLs

TEST(RemoteUrl, ParsesTcpAndUnixForms) {
  auto a = RemoteUrl::parse("redis://cache-1:6380/2").value();
  EXPECT_EQ(a.host, "cache-1");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 2);
  auto b = RemoteUrl::parse("redis://kiln:s%40cret@10.0.0.5:6379/0").value();
  EXPECT_EQ(b.user, "kiln");
  EXPECT_EQ(b.password, "s@cret");
  EXPECT_EQ(b.display(), "redis://kiln:***@10.0.0.5:6379/0");
  auto c = RemoteUrl::parse("unix:///run/redis/redis.sock?db=3").value();
  EXPECT_EQ(c.socket, "/run/redis/redis.sock");
  EXPECT_EQ(c.db, 3);
  auto d = RemoteUrl::parse("redis://[::1]:7000").value();
  EXPECT_EQ(d.host, "::1");
  EXPECT_EQ(d.port, 7000);
  EXPECT_EQ(RemoteUrl::parse("redis://h").value().port, 6379);
}

TEST(RemoteUrl, BadUrlsAreClearErrorsThatNeverShowThePassword) {
  for (const char* bad : {"", "http://h:1", "redis://", "redis://:hunter2secret@:6379", "redis://u:hunter2secret@h:0",
                          "redis://u:hunter2secret@h:99999", "redis://u:hunter2secret@h:1/x", "unix://relative.sock",
                          "rediss://u:hunter2secret@h:1", "redis://u:hunter2secret@h:1 /0", "redis://u:hunter2secret@h:"}) {
    auto r = RemoteUrl::parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().to_string().find("hunter2secret"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().to_string().find("remote cache URL"), std::string::npos);
  }
}

TEST(RemoteUrl, ConnectErrorsNeverShowThePassword) {
  RemoteOptions o = options_for(fmt::format("redis://kiln:hunter2secret@127.0.0.1:{}/0", test::free_port()));
  auto tier = RedisTier::open(o).value();
  Status s = tier->ping();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.to_string().find("hunter2secret"), std::string::npos) << s.to_string();
  EXPECT_EQ(tier->describe().find("hunter2secret"), std::string::npos);
}

// ---- the circuit breaker

TEST(CircuitBreaker, OpensAfterNFailuresStaysOpenForTheCooldownThenTriesOnce) {
  FakeClock clock;
  CircuitBreaker b(3, 30s, clock.fn());
  EXPECT_TRUE(b.allow());
  EXPECT_EQ(b.failure(), CircuitBreaker::Opened::kNo);
  EXPECT_EQ(b.failure(), CircuitBreaker::Opened::kNo);
  EXPECT_EQ(b.failure(), CircuitBreaker::Opened::kFirst);  // logged once
  EXPECT_EQ(b.state(), CircuitBreaker::State::kOpen);
  EXPECT_FALSE(b.allow());
  clock.advance(29s);
  EXPECT_FALSE(b.allow());
  clock.advance(1s);
  EXPECT_TRUE(b.allow());   // the one trial
  EXPECT_FALSE(b.allow());  // others wait for it
  EXPECT_EQ(b.failure(), CircuitBreaker::Opened::kAgain);  // not logged again
  EXPECT_FALSE(b.allow());
  clock.advance(30s);
  EXPECT_TRUE(b.allow());
  EXPECT_TRUE(b.success());  // closed again
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  EXPECT_TRUE(b.allow());
  EXPECT_EQ(b.times_opened(), 2u);
  EXPECT_EQ(b.failure(), CircuitBreaker::Opened::kNo);  // the count starts over
}

// ---- sealed values

TEST(Sealed, SignedValuesOpenAndEveryDamageIsRefusedWithItsReason) {
  const SigningKey a = key_a(), b = key_b();
  const Binary bin = fake_binary(7);
  const std::string slot = "kiln:f1:bin:sm_90:x";
  const std::string v = seal_binary(slot, bin, &a);
  Refusal why;
  auto ok = unseal_binary(slot, v, bin.key, SealPolicy{&a}, &why);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->cubin, bin.cubin);

  std::string tampered = v;
  tampered[tampered.size() / 2] ^= 1;
  EXPECT_FALSE(unseal_binary(slot, tampered, bin.key, SealPolicy{&a}, &why).ok());
  EXPECT_EQ(why, Refusal::kBadSignature);
  EXPECT_FALSE(unseal_binary(slot, v, bin.key, SealPolicy{&b}, &why).ok());
  EXPECT_EQ(why, Refusal::kBadSignature);
  EXPECT_FALSE(unseal_binary(slot, v.substr(0, v.size() - 10), bin.key, SealPolicy{&a}, &why).ok());
  EXPECT_EQ(why, Refusal::kMalformed);
  EXPECT_FALSE(unseal_binary("kiln:f1:bin:sm_90:y", v, bin.key, SealPolicy{&a}, &why).ok());  // moved to another slot
  EXPECT_EQ(why, Refusal::kBadSignature);
  const std::string unsigned_v = seal_binary(slot, bin, nullptr);
  EXPECT_FALSE(unseal_binary(slot, unsigned_v, bin.key, SealPolicy{&a}, &why).ok());
  EXPECT_EQ(why, Refusal::kUnsigned);
  EXPECT_FALSE(unseal_binary(slot, unsigned_v, bin.key, SealPolicy{}, &why).ok());  // no key: binaries refused
  EXPECT_EQ(why, Refusal::kUnsigned);
  EXPECT_TRUE(unseal_binary(slot, unsigned_v, bin.key, SealPolicy{nullptr, true}, &why).ok());  // opted in
  EXPECT_FALSE(unseal_binary(slot, "garbage", bin.key, SealPolicy{&a}, &why).ok());
  EXPECT_EQ(why, Refusal::kMalformed);
  // No message carries the secret.
  auto bad = unseal_binary(slot, v, bin.key, SealPolicy{&b}, &why);
  EXPECT_EQ(bad.status().to_string().find(std::string(40, 'b')), std::string::npos);
}

// ---- against a real Redis

TEST(Remote, WriteBehindThenReadThroughRoundTrip) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string problem = sample_problem(64).canonical();
  const Binary bin = fake_binary(1);
  {
    Machine build(options_for(redis.url()));
    ASSERT_TRUE(build.cache->record_binary(bin).ok());
    ASSERT_TRUE(build.cache->record_timing(sample_timing(problem, "a", 10)).ok());
    ASSERT_TRUE(build.cache->record_timing(sample_timing(problem, "b", 9)).ok());
    ASSERT_TRUE(build.cache->record_decision(sample_decision(problem, "b")).ok());
    ASSERT_TRUE(build.tier->drain(5s).ok());
    EXPECT_EQ(build.tier->counters().published, 4u);
  }
  EXPECT_EQ(redis.keys("kiln:f*:bin:sm_90:*").size(), 1u);
  EXPECT_EQ(redis.keys("kiln:f*:dec:sm_90:*").size(), 1u);

  Machine gpu(options_for(redis.url()), TuneMode::kUse);
  auto got = gpu.cache->lookup_binary(bin.key, "sm_90");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)->cubin, bin.cubin);
  auto d = gpu.cache->lookup_decision(problem);
  ASSERT_TRUE(d.ok() && *d);
  EXPECT_EQ((*d)->choice, "b");
  EXPECT_EQ(gpu.cache->timings(problem).size(), 2u);
  EXPECT_EQ(gpu.tier->counters().hits, 3u);
  // Stored locally: the store answers now, without the remote.
  EXPECT_TRUE(gpu.cache->store()->get_binary(bin.key).ok());
  EXPECT_NE(gpu.cache->store()->decision(problem), nullptr);
  EXPECT_EQ(gpu.cache->counters().remote_hits, 2u);
  redis.kill_now();
  EXPECT_TRUE(gpu.cache->lookup_binary(bin.key, "sm_90").ok());
  EXPECT_EQ(gpu.cache->counters().local_hits, 1u);
}

TEST(Remote, WithoutAKeyOnlyDecisionsAndTimingsTravel) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string problem = sample_problem(32).canonical();
  const Binary bin = fake_binary(2);
  {
    Machine build(options_for(redis.url(), std::nullopt));
    ASSERT_TRUE(build.cache->record_binary(bin).ok());
    ASSERT_TRUE(build.cache->record_decision(sample_decision(problem)).ok());
    ASSERT_TRUE(build.tier->drain(5s).ok());
    EXPECT_EQ(build.tier->counters().withheld, 1u);
  }
  EXPECT_TRUE(redis.keys("kiln:f*:bin:*").empty());
  Machine gpu(options_for(redis.url(), std::nullopt), TuneMode::kUse);
  EXPECT_TRUE(gpu.cache->lookup_decision(problem).value() != nullptr);
  EXPECT_FALSE(gpu.cache->lookup_binary(bin.key, "sm_90").ok());
}

// Writes `bin` signed with `key` straight into Redis, then lets `mutate` damage it there.
void plant(RedisServer& redis, const Binary& bin, const SigningKey* key,
           const std::function<std::string(std::string)>& mutate) {
  const std::string slot = remote_binary_key(bin.key, bin.arch);
  std::string v = mutate(seal_binary(slot, bin, key));
  freeReplyObject(redis.command({"SET", slot, v}));
}

TEST(Remote, TamperedOtherKeyAndTruncatedValuesAreRefusedCountedAndNeverLoaded) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const SigningKey a = key_a(), b = key_b();
  const Binary tampered = fake_binary(11), other = fake_binary(12), truncated = fake_binary(13), unsigned_b = fake_binary(14);
  plant(redis, tampered, &a, [](std::string v) { v[v.size() / 2] ^= 0x40; return v; });
  plant(redis, other, &b, [](std::string v) { return v; });
  plant(redis, truncated, &a, [](std::string v) { return v.substr(0, v.size() / 2); });
  plant(redis, unsigned_b, nullptr, [](std::string v) { return v; });

  Machine gpu(options_for(redis.url()));
  for (const Binary* bin : {&tampered, &other, &truncated, &unsigned_b}) {
    auto r = gpu.cache->lookup_binary(bin->key, "sm_90");
    EXPECT_FALSE(r.ok()) << bin->name;
    EXPECT_FALSE(gpu.cache->store()->get_binary(bin->key).ok()) << bin->name << " must not be stored locally";
  }
  RemoteCounters c = gpu.tier->counters();
  EXPECT_EQ(c.refused, 4u);
  EXPECT_EQ(c.refused_signature, 2u);
  EXPECT_EQ(c.refused_malformed, 1u);
  EXPECT_EQ(c.refused_unsigned, 1u);
  EXPECT_EQ(c.hits, 0u);
  EXPECT_EQ(c.last_error.find(std::string(40, 'a')), std::string::npos);
}

TEST(Remote, ADecisionOrTimingUnderAnotherProblemIsRefused) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const SigningKey a = key_a();
  const std::string p1 = sample_problem(1).canonical(), p2 = sample_problem(2).canonical();
  // A validly signed decision for p1, copied under p2's key: the slot is in the signature.
  std::string v = seal_decision(remote_decision_key(p1), sample_decision(p1), &a);
  freeReplyObject(redis.command({"SET", remote_decision_key(p2), v}));
  Machine gpu(options_for(redis.url()));
  EXPECT_EQ(gpu.cache->lookup_decision(p2).value(), nullptr);
  EXPECT_EQ(gpu.tier->counters().refused, 1u);
}

TEST(Remote, RedisKilledMidRunLeavesKilnWorkingLocally) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  FakeClock clock;
  RemoteOptions o = options_for(redis.url());
  o.clock = clock.fn();
  Machine m(o);
  const std::string problem = sample_problem(8).canonical();
  ASSERT_TRUE(m.cache->record_decision(sample_decision(problem)).ok());
  ASSERT_TRUE(m.tier->drain(5s).ok());
  EXPECT_EQ(m.tier->counters().published, 1u);

  redis.kill_now();
  // Lookups first: the writer's failures count for the breaker too, and would make the split below racy.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(m.cache->lookup_binary(fake_binary(100 + i).key, "sm_90").ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(m.cache->record_binary(fake_binary(100 + i)).ok());  // stored locally
  ASSERT_TRUE(m.tier->drain(5s).ok());
  RemoteCounters c = m.tier->counters();
  EXPECT_EQ(c.breaker, "open");
  EXPECT_EQ(c.breaker_opened, 1u);
  EXPECT_EQ(c.errors, 3u);   // three failed lookups opened the breaker
  EXPECT_EQ(c.skipped, 7u);  // the rest never tried
  EXPECT_EQ(c.write_errors, 10u);
  EXPECT_FALSE(c.last_error.empty());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(m.cache->store()->get_binary(fake_binary(100 + i).key).ok());
  EXPECT_NE(m.cache->lookup_decision(problem).value(), nullptr);
}

TEST(Remote, StoppedRedisTimesOutBoundedThenTheBreakerRecoversAfterTheCooldown) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  FakeClock clock;
  RemoteOptions o = options_for(redis.url());
  o.clock = clock.fn();
  o.read_timeout = 100ms;
  o.write_behind = false;
  Machine m(o);
  const std::string problem = sample_problem(16).canonical();
  {
    Machine writer(options_for(redis.url()));
    ASSERT_TRUE(writer.cache->record_decision(sample_decision(problem)).ok());
    ASSERT_TRUE(writer.tier->drain(5s).ok());
  }
  ASSERT_TRUE(m.tier->ping().ok());
  redis.pause();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(m.cache->lookup_binary(fake_binary(200 + i).key, "sm_90").ok());
  const auto took = std::chrono::steady_clock::now() - start;
  // Three reads time out (100 ms each), then the breaker skips: well under the 5 * 100 ms of no breaker.
  EXPECT_LT(took, 2s);
  RemoteCounters c = m.tier->counters();
  EXPECT_EQ(c.errors, 3u);
  EXPECT_EQ(c.skipped, 2u);
  EXPECT_EQ(c.breaker, "open");
  EXPECT_NE(c.last_error.find("within 100 ms"), std::string::npos) << c.last_error;

  redis.resume();
  EXPECT_EQ(m.cache->lookup_decision(problem).value(), nullptr);  // still open: not asked
  clock.advance(o.breaker_cooldown);
  EXPECT_NE(m.cache->lookup_decision(problem).value(), nullptr);  // the trial succeeds
  EXPECT_EQ(m.tier->counters().breaker, "closed");
}

TEST(Remote, ClosedPortIsAMissAndTheBreakerOpens) {
  const int port = test::free_port();
  FakeClock clock;
  RemoteOptions o = options_for(fmt::format("redis://127.0.0.1:{}/0", port));
  o.clock = clock.fn();
  Machine m(o);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(m.cache->lookup_decision(sample_problem(i + 1).canonical()).value(), nullptr);
  ASSERT_TRUE(m.cache->record_decision(sample_decision(sample_problem(1).canonical())).ok());
  ASSERT_TRUE(m.tier->drain(5s).ok());
  EXPECT_NE(m.cache->store()->decision(sample_problem(1).canonical()), nullptr);
  RemoteCounters c = m.tier->counters();
  EXPECT_EQ(c.errors, 3u);
  EXPECT_EQ(c.skipped, 2u);
  EXPECT_EQ(c.write_errors, 1u);
  EXPECT_NE(c.last_error.find("cannot connect"), std::string::npos) << c.last_error;
  EXPECT_FALSE(m.tier->ping().ok());
}

TEST(Remote, FullRedisRefusesWritesWhichAreCountedWhileReadsAndTheLocalCacheWork) {
  RedisServer redis({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  KILN_REQUIRE_REDIS(redis);
  Machine m(options_for(redis.url()));
  ASSERT_TRUE(m.cache->record_binary(fake_binary(300, 512 << 10)).ok());
  ASSERT_TRUE(m.tier->drain(10s).ok());
  ASSERT_EQ(m.tier->counters().published, 1u);
  // Seven more do not fit (their pipeline alone fills the query buffer past maxmemory).
  for (int i = 1; i < 8; ++i) ASSERT_TRUE(m.cache->record_binary(fake_binary(300 + i, 512 << 10)).ok());
  ASSERT_TRUE(m.tier->drain(10s).ok());
  RemoteCounters c = m.tier->counters();
  EXPECT_GT(c.write_errors, 0u);
  EXPECT_EQ(c.published + c.write_errors, 8u);
  EXPECT_NE(c.last_error.find("OOM"), std::string::npos) << c.last_error;
  EXPECT_EQ(c.breaker, "closed");  // a full Redis still answers: not an outage
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(m.cache->store()->get_binary(fake_binary(300 + i).key).ok());
  // What made it in is still read.
  Machine other(options_for(redis.url()), TuneMode::kUse);
  EXPECT_TRUE(other.cache->lookup_binary(fake_binary(300).key, "sm_90").ok());
}

TEST(Remote, AFullQueueDropsAndCountsWithoutBlocking) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  RemoteOptions o = options_for(redis.url());
  o.queue_entries = 2;
  o.read_timeout = 100ms;
  Machine m(o);
  redis.pause();  // the writer takes at most one batch (two entries) and waits on it
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(m.cache->record_timing(sample_timing(sample_problem(4).canonical(), fmt::format("c{}", i), i)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 90ms);  // no publish waited for the stopped Redis
  RemoteCounters c = m.tier->counters();
  EXPECT_GE(c.queue_drops, 6u);
  EXPECT_EQ(c.queue_drops + c.queued, 10u);
  redis.resume();
  EXPECT_EQ(m.cache->timings(sample_problem(4).canonical()).size(), 10u);  // all local
}

TEST(Remote, PushAndPullMoveEverythingSelected) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  const std::string p90 = sample_problem(128).canonical();
  ProblemKey k80 = sample_problem(128);
  k80.device = {"NVIDIA A100", 108, 8, 0};
  const std::string p80 = k80.canonical();
  TempDir src_dir;
  {
    auto store = Store::open(store_options(src_dir)).value();
    ASSERT_TRUE(store->put_decision(sample_decision(p90)).ok());
    ASSERT_TRUE(store->put_decision(sample_decision(p80)).ok());
    ASSERT_TRUE(store->put_timing(sample_timing(p90, "x", 3)).ok());
    ASSERT_TRUE(store->put_binary(fake_binary(400)).ok());
    ASSERT_TRUE(store->put_binary(fake_binary(401, 4096, "sm_80")).ok());
    RemoteOptions o = options_for(redis.url());
    o.write_behind = false;
    auto tier = RedisTier::open(o).value();
    auto r = push(*store, *tier).value();
    EXPECT_EQ(r.decisions, 2u);
    EXPECT_EQ(r.timings, 1u);
    EXPECT_EQ(r.binaries, 2u);
    EXPECT_EQ(r.failed, 0u);
  }
  TempDir dst_dir;
  auto store = Store::open(store_options(dst_dir)).value();
  RemoteOptions o = options_for(redis.url());
  o.write_behind = false;
  auto tier = RedisTier::open(o).value();
  SyncOptions only90;
  only90.arch = "sm_90";
  auto r = pull(*store, *tier, only90).value();
  EXPECT_EQ(r.decisions, 1u);
  EXPECT_EQ(r.timings, 1u);
  EXPECT_EQ(r.binaries, 1u);
  EXPECT_NE(store->decision(p90), nullptr);
  EXPECT_EQ(store->decision(p80), nullptr);
  SyncOptions decisions;
  decisions.decisions_only = true;
  r = pull(*store, *tier, decisions).value();
  EXPECT_EQ(r.decisions, 2u);
  EXPECT_EQ(r.binaries, 0u);
  auto s = summarize(*tier).value();
  EXPECT_EQ(s.binaries, 2u);
  EXPECT_EQ(s.decisions, 2u);
}

TEST(Remote, PushToAStoppedRedisFailsWithATimeout) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  TempDir dir;
  auto store = Store::open(store_options(dir)).value();
  ASSERT_TRUE(store->put_decision(sample_decision(sample_problem(3).canonical())).ok());
  RemoteOptions o = options_for(redis.url());
  o.read_timeout = 100ms;
  o.write_behind = false;
  auto tier = RedisTier::open(o).value();
  redis.pause();
  auto r = push(*store, *tier);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kTimeout) << r.status().to_string();
  redis.resume();
}

TEST(Remote, UnixSocketAndFromEnv) {
  RedisServer redis;
  KILN_REQUIRE_REDIS(redis);
  TempDir dir;
  const std::string key_file = dir.path() + "/fleet.key";
  std::ofstream(key_file) << std::string(48, 'k') << "\n";
  ::chmod(key_file.c_str(), 0600);
  ::setenv("KILN_REMOTE_CACHE", ("unix://" + redis.socket_path()).c_str(), 1);
  ::setenv("KILN_CACHE_KEY_FILE", key_file.c_str(), 1);
  ::setenv("KILN_REMOTE_READ_TIMEOUT_MS", "150", 1);
  auto o = RemoteOptions::from_env();
  ::unsetenv("KILN_REMOTE_CACHE");
  ::unsetenv("KILN_CACHE_KEY_FILE");
  ::unsetenv("KILN_REMOTE_READ_TIMEOUT_MS");
  ASSERT_TRUE(o.ok() && o->has_value()) << o.status().to_string();
  EXPECT_EQ((*o)->read_timeout, 150ms);
  auto tier = RedisTier::open(**o).value();
  EXPECT_TRUE(tier->signing());
  EXPECT_TRUE(tier->ping().ok());
  ::setenv("KILN_REMOTE_READ_TIMEOUT_MS", "soon", 1);
  ::setenv("KILN_REMOTE_CACHE", "redis://h:1", 1);
  EXPECT_FALSE(RemoteOptions::from_env().ok());
  ::unsetenv("KILN_REMOTE_READ_TIMEOUT_MS");
  ::unsetenv("KILN_REMOTE_CACHE");
  EXPECT_FALSE(RemoteOptions::from_env().value().has_value());
}

}  // namespace
}  // namespace kiln::cache
