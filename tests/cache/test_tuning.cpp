// Tune modes: what each measures, answers and writes; failures cached until the toolchain changes; a
// killed tune keeps what it finished; runs accumulate.
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "kiln/cache/tuning.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

using testing::sample_problem;
using testing::store_options;
using testing::TempDir;

// A fake autotuner step: measures what the policy asks for (times come from `us_of`), then decides.
struct FakeTuner {
  std::vector<std::string> measured;
  Status tune(TuningCache& tc, const std::string& problem, const std::vector<std::string>& choices,
              const std::function<double(const std::string&)>& us_of) {
    KILN_ASSIGN_OR_RETURN(auto cached, tc.lookup_decision(problem));
    bool new_choice = false;
    for (const auto& c : choices) {
      if (!tc.should_measure(problem, c)) continue;
      measured.push_back(c);
      new_choice = true;
      double us = us_of(c);
      if (us < 0) {
        KILN_RETURN_IF_ERROR(tc.record_failure(problem, c, make_error(ErrorCode::kCompileError, "too many registers")));
        continue;
      }
      TimingRecord t;
      t.problem = problem;
      t.choice = c;
      t.median_us = us;
      KILN_RETURN_IF_ERROR(tc.record_timing(t));
    }
    if (cached && !new_choice) return Status();
    const TimingRecord* best = nullptr;
    auto all = tc.timings(problem);
    for (const auto& t : all) {
      if (t.ok && (!best || t.median_us < best->median_us)) best = &t;
    }
    if (!best) return make_error(ErrorCode::kNotFound, "nothing ran");
    Decision d;
    d.problem = problem;
    d.choice = best->choice;
    d.median_us = best->median_us;
    return tc.record_decision(d);
  }
};

double times(const std::string& c) { return c == "a" ? 30 : c == "b" ? 20 : c == "c" ? 10 : c == "bad" ? -1 : 5; }

TEST(TuneModes, Names) {
  for (auto m : {TuneMode::kTune, TuneMode::kUse, TuneMode::kStrict, TuneMode::kOff}) {
    KILN_ASSERT_OK_AND_ASSIGN(auto back, parse_tune_mode(tune_mode_name(m)));
    EXPECT_EQ(back, m);
  }
  EXPECT_EQ(parse_tune_mode("fast").status().code(), ErrorCode::kInvalidArgument);
  ::setenv("KILN_TUNE_MODE", "strict", 1);
  EXPECT_EQ(*tune_mode_from_env(), TuneMode::kStrict);
  ::setenv("KILN_TUNE_MODE", "bogus", 1);
  EXPECT_FALSE(tune_mode_from_env().ok());
  ::unsetenv("KILN_TUNE_MODE");
  EXPECT_EQ(*tune_mode_from_env(TuneMode::kUse), TuneMode::kUse);
}

TEST(TuneModes, TuneMeasuresOnlyWhatIsMissingAndAccumulates) {
  TempDir dir;
  std::string p = sample_problem(16).canonical(), q = sample_problem(32).canonical();
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
    FakeTuner t;
    KILN_ASSERT_OK(t.tune(*tc, p, {"a", "b", "bad"}, times));
    EXPECT_EQ(t.measured, (std::vector<std::string>{"a", "b", "bad"}));
    EXPECT_EQ((*tc->lookup_decision(p))->choice, "b");
  }
  {
    // Second run: same problem with one new choice (only it is measured), plus a new problem.
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
    FakeTuner t;
    KILN_ASSERT_OK(t.tune(*tc, p, {"a", "b", "bad", "c"}, times));
    EXPECT_EQ(t.measured, (std::vector<std::string>{"c"}));  // the failure is cached, not retried
    EXPECT_EQ((*tc->lookup_decision(p))->choice, "c");
    KILN_ASSERT_OK(t.tune(*tc, q, {"a", "b"}, times));
    auto failed = tc->cached_timing(p, "bad");
    ASSERT_TRUE(failed.has_value());
    EXPECT_FALSE(failed->ok);
    EXPECT_EQ(failed->error, ErrorCode::kCompileError);
    EXPECT_NE(failed->reason.find("too many registers"), std::string::npos);
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kUse, store_options(dir)));
  EXPECT_EQ((*tc->lookup_decision(p))->choice, "c");
  EXPECT_EQ((*tc->lookup_decision(q))->choice, "b");
}

TEST(TuneModes, FailuresAreRetriedWhenTheToolchainChanges) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  {
    StoreOptions o = store_options(dir);
    o.toolchain = Toolchain{12, 9, 12090, "0.1.0"};
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, o));
    KILN_ASSERT_OK(tc->record_failure(p, "bad", make_error(ErrorCode::kCudaError, "illegal address")));
    EXPECT_FALSE(tc->should_measure(p, "bad"));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
  EXPECT_TRUE(tc->should_measure(p, "bad"));
}

TEST(TuneModes, UseAndStrictNeverMeasure) {
  TempDir dir;
  std::string p = sample_problem(16).canonical(), q = sample_problem(32).canonical();
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
    FakeTuner t;
    KILN_ASSERT_OK(t.tune(*tc, p, {"a", "b"}, times));
  }
  for (TuneMode m : {TuneMode::kUse, TuneMode::kStrict}) {
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(m, store_options(dir)));
    EXPECT_FALSE(tc->should_measure(q, "a"));
    EXPECT_FALSE(tc->should_measure(p, "new_choice"));
    EXPECT_EQ((*tc->lookup_decision(p))->choice, "b");
    auto missing = tc->lookup_decision(q);
    if (m == TuneMode::kUse) {
      KILN_ASSERT_OK(missing);
      EXPECT_EQ(*missing, nullptr);  // the caller takes its default choice
    } else {
      EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
      EXPECT_NE(missing.status().message().find(q), std::string::npos);
    }
    TimingRecord t;
    t.problem = q;
    t.choice = "a";
    EXPECT_EQ(tc->record_timing(t).code(), ErrorCode::kFailedPrecondition);
    KILN_EXPECT_OK(tc->record_binary(testing::fake_binary(1)));
  }
}

TEST(TuneModes, OffTunesInMemoryAndTouchesNoDisk) {
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kOff, store_options(dir)));
  EXPECT_EQ(tc->store(), nullptr);
  FakeTuner t;
  KILN_ASSERT_OK(t.tune(*tc, p, {"a", "b"}, times));
  EXPECT_EQ(t.measured.size(), 2u);
  EXPECT_EQ((*tc->lookup_decision(p))->choice, "b");
  EXPECT_FALSE(tc->should_measure(p, "a"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TuneModes, AKilledTuneKeepsWhatItFinished) {
  // "Killed" here is the process ending without any close or flush: each record is durable once written.
  // (The SIGKILL test in test_multiprocess kills real processes.)
  TempDir dir;
  std::string p = sample_problem(16).canonical();
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
    TimingRecord t;
    t.problem = p;
    t.choice = "a";
    t.median_us = 3;
    KILN_ASSERT_OK(tc->record_timing(t));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto tc, TuningCache::open(TuneMode::kTune, store_options(dir)));
  EXPECT_FALSE(tc->should_measure(p, "a"));
  EXPECT_TRUE(tc->should_measure(p, "b"));
}

}  // namespace
}  // namespace kiln::cache
