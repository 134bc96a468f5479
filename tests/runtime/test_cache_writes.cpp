// finish_cache_writes: what `kiln precompile` and `kiln tune` check before they report success. Writes that fail
// (here a full disk, injected through the cache's file system) are logged and the work goes on; before this the
// tools flushed, ignored the result and exited 0 having stored nothing.
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "fault_fs.h"
#include "kiln/cache/tuning.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

using cache::testing::FullDiskFs;
using cache::testing::TempDir;

struct Precompiled {
  PrecompileReport report;
  Status stored;
};

// Precompiles one small problem through a cache on `disk` (full from just after the open when `full`), then
// asks finish_cache_writes.
Precompiled precompile_on(const TempDir& dir, const std::shared_ptr<FullDiskFs>& disk, bool full) {
  cache::StoreOptions o = cache::testing::store_options(dir);
  o.env = FullDiskFs::env(disk);
  auto opened = cache::TuningCache::open(cache::TuneMode::kTune, o);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  if (!opened.ok()) return {};
  std::shared_ptr<cache::TuningCache> c(std::move(*opened));
  if (full) disk->fill_after(0);
  auto gate = make_cached_gate(c, make_inline_executor());
  EXPECT_TRUE(gate.ok()) << gate.status().to_string();
  if (!gate.ok()) return {};
  TuneOptions options;
  options.max_template_configs = 2;
  auto r = precompile_problem(default_ops(), Problem::norm({.rows = 8, .cols = 4096}), Target{"sm_90a"}, **gate,
                              options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return {r.ok() ? *r : PrecompileReport{}, finish_cache_writes(*c)};
}

TEST(CacheWrites, AllStoredIsOk) {
  TempDir dir;
  auto disk = std::make_shared<FullDiskFs>();
  Precompiled p = precompile_on(dir, disk, false);
  EXPECT_GT(p.report.kernels, 0);
  EXPECT_EQ(p.report.failed, 0);
  KILN_EXPECT_OK(p.stored);
  EXPECT_EQ(disk->failed_writes(), 0u);
}

TEST(CacheWrites, AFullDiskIsAnErrorNamingTheCacheAndTheCause) {
  TempDir dir;
  auto disk = std::make_shared<FullDiskFs>();
  Precompiled p = precompile_on(dir, disk, true);
  // The compiles themselves succeeded: their binaries are usable in memory, only not stored.
  EXPECT_GT(p.report.kernels, 0);
  EXPECT_EQ(p.report.failed, 0) << (p.report.failures.empty() ? "" : p.report.failures.front());
  ASSERT_FALSE(p.stored.ok()) << "a precompile whose every write failed reported its results stored";
  EXPECT_EQ(p.stored.code(), ErrorCode::kIoError) << p.stored.to_string();
  EXPECT_NE(p.stored.to_string().find("the cache '" + dir.path() + "' could not store all of this run's results"),
            std::string::npos)
      << p.stored.to_string();
  EXPECT_NE(p.stored.to_string().find("No space left"), std::string::npos) << p.stored.to_string();
  EXPECT_GT(disk->failed_writes(), 0u);
}

TEST(CacheWrites, NoCacheIsNothingToStore) {
  KILN_ASSERT_OK_AND_ASSIGN(auto off, cache::TuningCache::open(cache::TuneMode::kOff, {}));
  KILN_EXPECT_OK(finish_cache_writes(*off));
}

}  // namespace
}  // namespace kiln::runtime
