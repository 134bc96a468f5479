// A test's own folder for tuning caches: named after the test (and the process) under the temp dir, empty
// when the test starts and removed when it ends.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kiln/cache/tuning.h"

namespace kiln::runtime {

class TuningDir {
 public:
  explicit TuningDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() /
              (prefix + "_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(path_);
  }
  ~TuningDir() { std::filesystem::remove_all(path_); }
  TuningDir(const TuningDir&) = delete;
  TuningDir& operator=(const TuningDir&) = delete;

  /// A tuning cache in `sub` (or the folder itself), opened in `mode`.
  std::shared_ptr<cache::TuningCache> open(cache::TuneMode mode, const std::string& sub = "") const {
    cache::StoreOptions store;
    store.dir = (sub.empty() ? path_ : path_ / sub).string();
    auto c = cache::TuningCache::open(mode, store);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return std::shared_ptr<cache::TuningCache>(std::move(c).value());
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln::runtime
