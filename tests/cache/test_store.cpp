// Store: round trips through RocksDB, roles within one process (the writer, readers that stage, the
// hand-over), the newest-wins merge, integrity (corrupt, stale and foreign values are misses), pruning.
#include <gtest/gtest.h>

#include <rocksdb/db.h>

#include <fcntl.h>
#include <sys/file.h>
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <atomic>
#include <filesystem>
#include <thread>

#include "cache_test_util.h"
#include "format.h"
#include "raw_db.h"
#include "kiln/cache/store.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

using namespace testing;  // cache_test_util.h: TempDir, store_options, sample_problem, fake_binary, raw_put

TimingRecord timing(const std::string& problem, const std::string& choice, double us, int64_t at = 0) {
  TimingRecord t;
  t.problem = problem;
  t.choice = choice;
  t.median_us = us;
  t.min_us = us * 0.9;
  t.p90_us = us * 1.1;
  t.samples = 50;
  t.measured_at_ns = at;
  return t;
}

// Processes started together on an empty folder: one takes the writer role and is still creating the database
// when another opens. The second must wait for it (or take over the role), not fail with "no kiln cache".
TEST(Store, OpeningWhileTheWriterIsStillCreatingTheDatabaseWaits) {
  TempDir d;
  // Hold the writer role the way another process would: flock on a separate open of the lock file.
  int fd = ::open((d.path() + "/writer.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  std::mutex mu;
  std::condition_variable cv;
  bool waiting = false;
  StoreOptions o = store_options(d);
  o.sync_point = [&](std::string_view point) {
    if (point != "open:wait_for_writer") return;
    std::lock_guard lock(mu);
    waiting = true;
    cv.notify_all();
  };
  Result<std::unique_ptr<Store>> opened = make_error(ErrorCode::kInternal, "not run");
  std::thread opener([&] { opened = Store::open(o); });
  bool saw_wait = false;
  {
    std::unique_lock lock(mu);
    saw_wait = cv.wait_for(lock, std::chrono::seconds(20), [&] { return waiting; });
  }
  ::close(fd);  // the "writer" goes away before creating anything: the waiting process takes the role
  opener.join();
  EXPECT_TRUE(saw_wait) << "the opener should wait for the writer, not fail";
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_TRUE((*opened)->is_writer());
  KILN_EXPECT_OK((*opened)->put_timing(timing("p", "c", 1.0)));
}

Decision decision(const std::string& problem, const std::string& choice, int64_t at = 0) {
  Decision d;
  d.problem = problem;
  d.choice = choice;
  d.params = {{"tile_m", "128"}, {"stages", "3"}};
  d.kernel = KernelKey{1, 2};
  d.median_us = 12.5;
  d.decided_at_ns = at;
  return d;
}

TEST(Store, RoundTripSurvivesReopen) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  Binary bin = fake_binary(7, 100000);
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
    EXPECT_TRUE(store->is_writer());
    KILN_ASSERT_OK(store->put_binary(bin));
    KILN_ASSERT_OK(store->put_timing(timing(p, "mma_128x128", 10.0)));
    KILN_ASSERT_OK(store->put_timing(timing(p, "mma_64x64", 14.0)));
    KILN_ASSERT_OK(store->put_decision(decision(p, "mma_128x128")));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  KILN_ASSERT_OK_AND_ASSIGN(auto got, store->get_binary(bin.key, "sm_90"));
  EXPECT_EQ(got->cubin, bin.cubin);
  EXPECT_EQ(got->lowered_names, bin.lowered_names);
  EXPECT_EQ(got->name, bin.name);
  auto d = store->decision(p);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "mma_128x128");
  EXPECT_EQ(d->params, decision(p, "x").params);
  EXPECT_EQ(d->toolchain, Toolchain::current());
  auto ts = store->timings(p);
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].choice, "mma_128x128");  // by name
  EXPECT_EQ(ts[1].median_us, 14.0);
  EXPECT_FALSE(store->timing(p, "mma_256x128").has_value());
  EXPECT_EQ(store->decision(sample_problem(32).canonical()), nullptr);
  EXPECT_EQ(store->get_binary(KernelKey{9, 9}).status().code(), ErrorCode::kNotFound);
}

TEST(Store, RolesInOneFolder) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(dir)));
  EXPECT_TRUE(writer->is_writer());
  auto second_writer = Store::open(store_options(dir, Role::kWriter));
  EXPECT_EQ(second_writer.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(second_writer.status().message().find("pid"), std::string::npos) << second_writer.status().message();
  KILN_ASSERT_OK_AND_ASSIGN(auto reader, Store::open(store_options(dir)));
  EXPECT_FALSE(reader->is_writer());
  TempDir empty;
  EXPECT_EQ(Store::open(store_options(empty, Role::kReader)).status().code(), ErrorCode::kNotFound);
}

TEST(Store, ReaderStagesAndWriterIngests) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(dir)));
  KILN_ASSERT_OK_AND_ASSIGN(auto reader, Store::open(store_options(dir)));
  ASSERT_FALSE(reader->is_writer());
  Binary bin = fake_binary(3);
  KILN_ASSERT_OK(reader->put_timing(timing(p, "a", 5.0)));
  KILN_ASSERT_OK(reader->put_decision(decision(p, "a")));
  KILN_ASSERT_OK(reader->put_binary(bin));
  // The reader sees its own writes at once; the writer after ingesting.
  EXPECT_NE(reader->decision(p), nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(auto st, writer->stats());
  EXPECT_EQ(st.staged_batches, 3u);
  EXPECT_EQ(writer->decision(p), nullptr);
  KILN_ASSERT_OK(writer->sync());
  ASSERT_NE(writer->decision(p), nullptr);
  EXPECT_EQ(writer->decision(p)->choice, "a");
  EXPECT_TRUE(writer->timing(p, "a").has_value());
  KILN_ASSERT_OK_AND_ASSIGN(auto got, writer->get_binary(bin.key));
  EXPECT_EQ(got->cubin, bin.cubin);
  KILN_ASSERT_OK_AND_ASSIGN(st, writer->stats());
  EXPECT_EQ(st.staged_batches, 0u);
  // And the writer's writes reach the reader when it refreshes.
  std::string q = sample_problem(32).canonical();
  KILN_ASSERT_OK(writer->put_decision(decision(q, "b")));
  EXPECT_EQ(reader->decision(q), nullptr);
  KILN_ASSERT_OK(reader->refresh());
  ASSERT_NE(reader->decision(q), nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(auto got2, reader->get_binary(bin.key));
  EXPECT_EQ(got2->cubin, bin.cubin);
}

TEST(Store, ReaderTakesOverWhenTheWriterLeaves) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  auto writer = Store::open(store_options(dir));
  KILN_ASSERT_OK(writer);
  KILN_ASSERT_OK_AND_ASSIGN(auto reader, Store::open(store_options(dir)));
  KILN_ASSERT_OK(reader->put_decision(decision(p, "staged_while_writer_lived")));
  writer->reset();  // closes: ingests the staged batch, releases the role
  EXPECT_FALSE(reader->is_writer());
  std::string q = sample_problem(64).canonical();
  KILN_ASSERT_OK(reader->put_decision(decision(q, "written_after")));
  EXPECT_TRUE(reader->is_writer());
  reader.reset();
  KILN_ASSERT_OK_AND_ASSIGN(auto again, Store::open(store_options(dir)));
  ASSERT_NE(again->decision(p), nullptr);
  ASSERT_NE(again->decision(q), nullptr);
  EXPECT_EQ(again->decision(q)->choice, "written_after");
}

TEST(Store, NewestWinsInEveryOrder) {
  // Two readers stage conflicting decisions; the writer writes a third directly. Whatever the order of
  // ingestion, the newest stamp wins in the database and in every process's memory.
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(dir)));
  KILN_ASSERT_OK_AND_ASSIGN(auto r1, Store::open(store_options(dir)));
  KILN_ASSERT_OK_AND_ASSIGN(auto r2, Store::open(store_options(dir)));
  KILN_ASSERT_OK(r2->put_decision(decision(p, "newest", 3000)));   // staged first
  KILN_ASSERT_OK(r1->put_decision(decision(p, "oldest", 1000)));   // staged second: ingested last
  KILN_ASSERT_OK(writer->put_decision(decision(p, "middle", 2000)));
  KILN_ASSERT_OK(writer->sync());
  KILN_ASSERT_OK(r1->refresh());
  KILN_ASSERT_OK(r2->refresh());
  for (Store* s : {writer.get(), r1.get(), r2.get()}) {
    ASSERT_NE(s->decision(p), nullptr);
    EXPECT_EQ(s->decision(p)->choice, "newest");
  }
  writer.reset();
  r1.reset();
  r2.reset();
  KILN_ASSERT_OK_AND_ASSIGN(auto again, Store::open(store_options(dir)));
  EXPECT_EQ(again->decision(p)->choice, "newest");
}

TEST(Store, CorruptValuesAreMissesAndGetReplaced) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  Binary bin = fake_binary(5);
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
    KILN_ASSERT_OK(store->put_decision(decision(p, "good")));
  }
  std::string bad_decision = encode_decision(decision(p, "evil", 5));
  bad_decision[30] ^= 0x01;  // one bit: the checksum catches it
  raw_put(dir.path(), "decisions", p, bad_decision);
  std::string bad_binary = encode_binary(bin, 5);
  bad_binary[bad_binary.size() / 2] ^= 0x10;
  raw_put(dir.path(), "binaries", binary_key(bin.key), bad_binary);
  raw_put(dir.path(), "timings", timing_key(p, "x"), "not a value at all");
  // A valid value stored under the wrong key is refused too.
  raw_put(dir.path(), "decisions", sample_problem(8).canonical(), encode_decision(decision(p, "misplaced", 5)));
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
    EXPECT_EQ(store->decision(p), nullptr);
    EXPECT_EQ(store->decision(sample_problem(8).canonical()), nullptr);
    EXPECT_FALSE(store->timing(p, "x").has_value());
    EXPECT_EQ(store->get_binary(bin.key).status().code(), ErrorCode::kNotFound);
    KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
    EXPECT_EQ(st.invalid, 4u);
    // Replaced when written again: a valid value beats the invalid one whatever their stamps.
    KILN_ASSERT_OK(store->put_decision(decision(p, "fresh", 1)));
    KILN_ASSERT_OK(store->put_binary(bin));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  ASSERT_NE(store->decision(p), nullptr);
  EXPECT_EQ(store->decision(p)->choice, "fresh");
  KILN_EXPECT_OK(store->get_binary(bin.key));
  // Prune drops what still fails its checks.
  KILN_ASSERT_OK_AND_ASSIGN(auto report, store->prune({}));
  EXPECT_EQ(report.invalid, 2u);
  KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
  EXPECT_EQ(st.invalid, 0u);
}

TEST(Store, OtherToolchainIsAMissUntilRemeasured) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  Toolchain old_tc{12, 8, 12080, "0.0.9"};
  {
    StoreOptions o = store_options(dir);
    o.toolchain = old_tc;
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(o));
    TimingRecord failed = timing(p, "broken", 0);
    failed.ok = false;
    failed.error = ErrorCode::kCompileError;
    failed.reason = "ptxas: too many registers";
    KILN_ASSERT_OK(store->put_timing(failed));
    KILN_ASSERT_OK(store->put_timing(timing(p, "fine", 3)));
    KILN_ASSERT_OK(store->put_decision(decision(p, "fine")));
    ASSERT_TRUE(store->timing(p, "broken").has_value());
    EXPECT_FALSE(store->timing(p, "broken")->ok);
    EXPECT_EQ(store->timing(p, "broken")->reason, "ptxas: too many registers");
  }
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));  // today's toolchain
    EXPECT_FALSE(store->timing(p, "broken").has_value());
    EXPECT_FALSE(store->timing(p, "fine").has_value());
    EXPECT_EQ(store->decision(p), nullptr);
    EXPECT_TRUE(store->timings(p).empty());
    KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
    EXPECT_EQ(st.stale, 3u);
    KILN_ASSERT_OK_AND_ASSIGN(auto report, store->prune({.other_toolchains = true}));
    EXPECT_EQ(report.timings, 2u);
    EXPECT_EQ(report.decisions, 1u);
  }
  StoreOptions o = store_options(dir);
  o.toolchain = old_tc;
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(o));
  EXPECT_FALSE(store->timing(p, "fine").has_value());  // pruned
}

TEST(Store, BinaryForAnotherArchOrNvrtcIsAMiss) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  Binary b = fake_binary(11, 2048, "sm_80");
  KILN_ASSERT_OK(store->put_binary(b));
  EXPECT_EQ(store->get_binary(b.key, "sm_90").status().code(), ErrorCode::kNotFound);
  KILN_EXPECT_OK(store->get_binary(b.key, "sm_80"));
  Binary old = fake_binary(12);
  old.nvrtc_major = 11;
  KILN_ASSERT_OK(store->put_binary(old));
  store.reset();
  KILN_ASSERT_OK_AND_ASSIGN(store, Store::open(store_options(dir)));
  auto miss = store->get_binary(old.key);
  EXPECT_EQ(miss.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(miss.status().message().find("NVRTC 11"), std::string::npos) << miss.status().message();
}

TEST(Store, PruneByArchAgeAndSize) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  for (uint64_t i = 0; i < 10; ++i) KILN_ASSERT_OK(store->put_binary(fake_binary(100 + i, 10000, i < 2 ? "sm_80" : "sm_90")));
  // Binaries 102 and 103 were used recently: the size bound drops others first.
  KILN_ASSERT_OK(store->touch({fake_binary(102).key, fake_binary(103).key}));
  KILN_ASSERT_OK_AND_ASSIGN(auto dry, store->prune({.arch = "sm_80", .dry_run = true}));
  EXPECT_EQ(dry.binaries, 2u);
  KILN_EXPECT_OK(store->get_binary(fake_binary(100).key));
  KILN_ASSERT_OK_AND_ASSIGN(auto by_arch, store->prune({.arch = "sm_80"}));
  EXPECT_EQ(by_arch.binaries, 2u);
  EXPECT_EQ(store->get_binary(fake_binary(100).key).status().code(), ErrorCode::kNotFound);
  uint64_t one = encode_binary(fake_binary(102, 10000), 0).size();
  KILN_ASSERT_OK_AND_ASSIGN(auto by_size, store->prune({.max_binary_bytes = 3 * one}));
  EXPECT_EQ(by_size.binaries, 5u);
  KILN_EXPECT_OK(store->get_binary(fake_binary(102).key));
  KILN_EXPECT_OK(store->get_binary(fake_binary(103).key));
  KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
  EXPECT_EQ(st.binaries, 3u);
  KILN_ASSERT_OK_AND_ASSIGN(auto by_age, store->prune({.older_than = std::chrono::seconds(3600)}));
  EXPECT_EQ(by_age.binaries, 0u);
  KILN_ASSERT_OK(store->clear());
  KILN_ASSERT_OK_AND_ASSIGN(st, store->stats());
  EXPECT_EQ(st.binaries, 0u);
}

TEST(Store, ReaderCannotPruneOrClear) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(dir)));
  KILN_ASSERT_OK_AND_ASSIGN(auto reader, Store::open(store_options(dir)));
  EXPECT_EQ(reader->prune({}).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(reader->clear().code(), ErrorCode::kFailedPrecondition);
}

TEST(Store, ManyThreadsReadAndWrite) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(store_options(dir)));
  std::vector<std::jthread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::string p = sample_problem(i).canonical();
        std::string choice = "c" + std::to_string(t);
        if (!store->put_timing(timing(p, choice, t + i)).ok()) errors++;
        if (!store->put_decision(decision(p, choice)).ok()) errors++;
        if (!store->timing(p, choice) || !store->decision(p)) errors++;
        if (!store->put_binary(fake_binary(t * 1000 + i, 512)).ok()) errors++;
        if (!store->get_binary(fake_binary(t * 1000 + i, 512).key).ok()) errors++;
      }
    });
  }
  threads.clear();
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(store->all_timings().size(), 8u * 50u);
  EXPECT_EQ(store->decisions().size(), 50u);
}

TEST(Store, DefaultDirFollowsTheEnvironment) {
  const char* home = std::getenv("HOME");
  std::string saved_home = home ? home : "";
  ::setenv("KILN_CACHE_DIR", "/tmp/kiln-x", 1);
  EXPECT_EQ(default_cache_dir(), "/tmp/kiln-x");
  ::unsetenv("KILN_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(default_cache_dir(), "/tmp/xdg/kiln");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(default_cache_dir(), "/home/someone/.cache/kiln");
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace
}  // namespace kiln::cache

namespace kiln::cache {
namespace {

// The batched read preloading uses: one MultiGet, each entry what get_binary() would say, in the keys' order.
TEST(Store, GetBinariesIsGetBinaryForMany) {
  TempDir dir;
  std::vector<Binary> bins;
  for (uint64_t i = 0; i < 40; ++i) bins.push_back(testing::fake_binary(500 + i, 3000 + 100 * i, i == 7 ? "sm_80" : "sm_90"));
  // Built by another NVRTC: a stored value that fails get_binary's checks, so a miss that says why.
  Binary bad = testing::fake_binary(999);
  bad.nvrtc_major = 11;
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(testing::store_options(dir)));
    for (const auto& b : bins) KILN_ASSERT_OK(store->put_binary(b));
    KILN_ASSERT_OK(store->put_binary(bad));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(testing::store_options(dir)));
  std::vector<KernelKey> keys;
  for (const auto& b : bins) keys.push_back(b.key);
  keys.push_back(KernelKey{1, 2});  // never stored
  keys.push_back(bad.key);
  std::reverse(keys.begin(), keys.end());  // any order; results follow it
  Store::BinaryReadTimes times;
  auto got = store->get_binaries(keys, "sm_90", /*remember=*/false, &times);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto one = store->get_binary(keys[i], "sm_90", false);
    ASSERT_EQ(got[i].ok(), one.ok()) << i << ": " << got[i].status().to_string();
    if (one.ok()) {
      EXPECT_EQ((*got[i])->key, keys[i]);
      EXPECT_EQ((*got[i])->cubin, (*one)->cubin);
    } else {
      EXPECT_EQ(got[i].status().code(), ErrorCode::kNotFound);
      EXPECT_EQ(got[i].status().code(), one.status().code());
    }
  }
  EXPECT_FALSE(got[0].ok());                // built by NVRTC 11
  EXPECT_NE(got[0].status().message().find("NVRTC 11"), std::string::npos) << got[0].status().to_string();
  EXPECT_FALSE(got[1].ok());                // the one never stored
  EXPECT_FALSE(got[keys.size() - 8].ok());  // bins[7], built for sm_80
  EXPECT_GT(times.read_seconds, 0);
  EXPECT_GT(times.decode_seconds, 0);
  // remember = true keeps them in memory: a second batch reads nothing from RocksDB.
  std::vector<KernelKey> good = {bins[0].key, bins[1].key};
  for (const auto& r : store->get_binaries(good, {}, /*remember=*/true)) KILN_ASSERT_OK(r.status());
  Store::BinaryReadTimes again;
  auto cached = store->get_binaries(good, {}, true, &again);
  KILN_ASSERT_OK(cached[0].status());
  EXPECT_EQ(again.read_seconds, 0);  // served from memory: no MultiGet at all
  EXPECT_TRUE(store->get_binaries({}).empty());
}

}  // namespace
}  // namespace kiln::cache
