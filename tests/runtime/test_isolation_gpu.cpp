// Benchmark isolation on a GPU: planted kernels that fault (illegal address), hang and crash their process are
// tuned among gemm's real choices with Isolation::kIsolated; the tune completes, they are recorded (and cached)
// as failures with their reasons, a real choice wins and runs correctly in the host's context, the worker was
// replaced, and no worker is left behind. Also: an isolated tune agrees with an in-process one (and prints what
// isolation costs), and ops the worker cannot rebuild run in the host. Skipped without a GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "kiln/cache/tuning.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "isolation_event_log.h"
#include "kiln_test.h"
#include "reference_check.h"
#include "test_isolation_planted.h"
#include "tuning_dir.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;
using reference_check::expect_correct;
using Kind = IsolationEvent::Kind;

std::string next_to_me(const std::string& name) {
  return (fs::read_symlink("/proc/self/exe").parent_path() / name).string();
}

bool alive(int pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

Problem gemm(int64_t m, int64_t n, int64_t k) {
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  g.epilogue.out = DType::kBF16;
  return Problem::gemm(g);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double p90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 9 / 10)];
}

// The failed choices of a report and their error codes.
std::map<std::string, ErrorCode> failures(const TuneReport& r) {
  std::map<std::string, ErrorCode> out;
  for (const auto& c : r.choices) {
    if (!c.status.ok()) out[c.name] = c.status.code();
  }
  return out;
}

class IsolationGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    KILN_ASSERT_OK(planted::register_ops());
  }

  std::shared_ptr<cache::TuningCache> cache(const std::string& sub = "cache") {
    return dir_.open(cache::TuneMode::kTune, sub);
  }
  TuneOptions options(Isolation isolation, EventLog* log, const std::string& worker = "test_isolation_worker") {
    TuneOptions o;
    o.max_template_configs = 4;
    o.max_cublas_algos = 4;
    o.bench.budget_ms = 2;
    o.isolation = isolation;
    o.isolation_options.worker_path = worker.empty() ? "" : next_to_me(worker);
    if (log) o.isolation_options.observer = log->observer();
    return o;
  }
  std::unique_ptr<Tuner> tuner(TuneOptions o, const std::string& sub = "cache") {
    o.cache = cache(sub);
    auto t = make_tuner(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }

  // Every worker that was started has been reaped: none is left running.
  static void expect_no_worker_left(const EventLog& log) {
    auto spawned = log.of(Kind::kWorkerSpawned);
    EXPECT_GE(spawned.size(), 1u);
    EXPECT_EQ(log.count(Kind::kWorkerExited), static_cast<int>(spawned.size()));
    for (const auto& e : spawned) EXPECT_FALSE(alive(e.pid)) << "bench worker " << e.pid << " is still there";
  }

  TuningDir dir_{"kiln_isolation_gpu"};
};

TEST_F(IsolationGpu, PlantedFaultsCostWorkersNotTheHost) {
  EventLog log;
  TuneOptions o = options(Isolation::kIsolated, &log);
  // The hang is caught by this timeout; every real choice's check and measurement takes milliseconds.
  o.isolation_options.choice_timeout = std::chrono::seconds(5);
  Problem p = gemm(64, 256, 128);
  p.op = planted::kOp;
  std::string key;
  std::map<std::string, Status> failed;
  {
    auto t = tuner(o);
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    const TuneReport& r = sel->report();
    std::cout << r.table(3);
    key = r.key;
    for (const auto& c : r.choices) {
      if (!c.status.ok()) failed[c.name] = c.status;
    }
    ASSERT_EQ(failed.size(), 4u) << r.table(50);
    const Status& wild = failed["planted_illegal_address"];
    EXPECT_EQ(wild.code(), ErrorCode::kCudaError) << wild.to_string();
    EXPECT_NE(wild.to_string().find("ILLEGAL_ADDRESS"), std::string::npos) << wild.to_string();
    EXPECT_NE(wild.to_string().find("the worker is replaced"), std::string::npos) << wild.to_string();
    const Status& hang = failed["planted_hang"];
    EXPECT_EQ(hang.code(), ErrorCode::kTimeout) << hang.to_string();
    EXPECT_NE(hang.message().find("choice 'planted_hang' did not finish within 5 s"), std::string::npos)
        << hang.to_string();
    EXPECT_NE(hang.message().find("checking and measuring 'planted_hang'"), std::string::npos)  // worker's stderr
        << hang.to_string();
    const Status& crash = failed["planted_abort"];
    EXPECT_EQ(crash.code(), ErrorCode::kWorkerCrashed) << crash.to_string();
    EXPECT_NE(crash.message().find("killed by signal 6"), std::string::npos) << crash.to_string();
    EXPECT_NE(crash.message().find("while running choice 'planted_abort'"), std::string::npos) << crash.to_string();
    EXPECT_NE(crash.message().find("planted_abort: its launch code aborts"), std::string::npos) << crash.to_string();
    EXPECT_EQ(failed["planted_wrong_values"].code(), ErrorCode::kWrongResult);
    EXPECT_EQ(r.note, "");  // nothing stopped early: the host's context was never at risk
    // A real choice won, and it runs correctly in this process's context.
    EXPECT_EQ(sel->choice_name().rfind("planted", 0), std::string::npos);
    expect_correct(*sel);

    // Each fatal fault ran in a worker of its own: the worker was replaced after each.
    std::map<std::string, int> pid_of;
    for (const auto& e : log.of(Kind::kChoiceSent)) pid_of[e.choice] = e.pid;
    std::set<int> fatal = {pid_of["planted_illegal_address"], pid_of["planted_hang"], pid_of["planted_abort"]};
    EXPECT_EQ(fatal.size(), 3u);
    EXPECT_GE(log.count(Kind::kWorkerReady), 3);
    EXPECT_EQ(log.of(Kind::kChoiceFailed).size(), 3u);
    for (int pid : fatal) EXPECT_FALSE(alive(pid));
    // Every choice ran in a worker; none in this process.
    EXPECT_EQ(log.count(Kind::kInProcess), 0);

    // The same tuner goes on to the next problem with a fresh worker.
    KILN_ASSERT_OK_AND_ASSIGN(auto next, t->tune(gemm(32, 256, 128)));
    EXPECT_EQ(next->report().failures, 0) << next->report().table(50);
    expect_correct(*next);
  }
  expect_no_worker_left(log);
  // The failures are cached with their reasons: a new tuner does not try them again.
  auto again = tuner(options(Isolation::kIsolated, nullptr));
  for (const auto& [name, why] : failed) {
    EXPECT_FALSE(again->cache().should_measure(key, name)) << name;
    auto rec = again->cache().cached_timing(key, name);
    ASSERT_TRUE(rec.has_value()) << name;
    EXPECT_FALSE(rec->ok) << name;
  }
}

TEST_F(IsolationGpu, IsolatedTuneAgreesWithInProcessAndReportsItsCost) {
  const Problem p = gemm(64, 1024, 1024);
  TuneOptions in_process = options(Isolation::kInProcess, nullptr);
  in_process.max_template_configs = 8;
  auto t1 = tuner(in_process, "in_process");
  KILN_ASSERT_OK_AND_ASSIGN(auto s1, t1->tune(p));
  const TuneReport& r1 = s1->report();

  EventLog log;
  TuneOptions isolated = options(Isolation::kIsolated, &log, "kiln-bench-worker");  // the shipped worker
  isolated.max_template_configs = 8;
  auto t2 = tuner(isolated, "isolated");
  KILN_ASSERT_OK_AND_ASSIGN(auto s2, t2->tune(p));
  const TuneReport& r2 = s2->report();
  std::cout << r2.table(5);
  // The same choices fail (e.g. configurations that do not compile) for the same reasons, and nothing fails
  // because of isolation itself.
  EXPECT_EQ(failures(r2), failures(r1)) << r2.table(50);
  EXPECT_EQ(r2.candidates, r1.candidates);
  EXPECT_EQ(log.count(Kind::kInProcess), 0);
  // Every measured choice (and any near-tie measured again) ran in the worker. Not every candidate: the
  // model prunes some (their count is the report's, not the worker's), so counting candidates here failed
  // whenever fewer near-ties were measured again than the model had pruned.
  EXPECT_GE(log.count(Kind::kChoiceDone), static_cast<int>(r2.choices.size())) << r2.table(50);
  EXPECT_EQ(r2.choices.size() + static_cast<size_t>(r2.pruned), static_cast<size_t>(r2.candidates)) << r2.table(50);
  expect_correct(*s2);
  // The winner's median measured in the worker and in this process agree (same GPU, same inputs, same code):
  // loosely, since only gross errors (timing the wrong thing) matter here.
  double in_worker_us = 0, here_us = 0;
  for (const auto& c : r2.choices) {
    if (c.name == r2.chosen) in_worker_us = c.median_us;
  }
  for (const auto& c : r1.choices) {
    if (c.name == r2.chosen) here_us = c.median_us;
  }
  std::cout << fmt::format("[isolation] winner {}: {:.2f} us in the worker, {:.2f} us in process\n", r2.chosen,
                           in_worker_us, here_us);
  EXPECT_GT(in_worker_us, 0);
  if (here_us > 0) {
    EXPECT_LT(in_worker_us, 1.5 * here_us);
    EXPECT_LT(here_us, 1.5 * in_worker_us);
  }
  // A second problem on the warm worker: only the problem's begin and the per-choice round trips remain.
  KILN_ASSERT_OK_AND_ASSIGN(auto s3, t2->tune(gemm(16, 1024, 1024)));
  for (const auto& [name, code] : failures(s3->report())) {
    EXPECT_NE(code, ErrorCode::kWorkerCrashed) << name;
    EXPECT_NE(code, ErrorCode::kTimeout) << name;
  }

  auto ready = log.of(Kind::kWorkerReady);
  auto begun = log.of(Kind::kSessionBegun);
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_EQ(begun.size(), 2u);
  std::vector<double> overhead_ms, rtt_ms;
  for (const auto& e : log.of(Kind::kChoiceDone)) {
    overhead_ms.push_back((e.seconds - e.worker_seconds) * 1e3);
    rtt_ms.push_back(e.seconds * 1e3);
  }
  std::cout << fmt::format(
      "[isolation] device {}; {} choices of {}\n"
      "[isolation] in-process: benchmark {:.3f} s, total {:.3f} s (compile wait {:.3f} s)\n"
      "[isolation] isolated:   benchmark {:.3f} s, total {:.3f} s (compile wait {:.3f} s)\n"
      "[isolation] worker start (spawn to hello) {:.1f} ms, of which context creation {:.1f} ms\n"
      "[isolation] problem begin in the worker: {:.1f} ms cold, {:.1f} ms warm (buffers + reference run)\n"
      "[isolation] per choice: round trip median {:.2f} ms; overhead (round trip - worker time) median {:.3f} ms, "
      "p90 {:.3f} ms over {} requests\n",
      ready[0].detail, r2.candidates, r2.problem, r1.benchmark_seconds, r1.total_seconds, r1.compile_wait_seconds,
      r2.benchmark_seconds, r2.total_seconds, r2.compile_wait_seconds, ready[0].seconds * 1e3,
      ready[0].worker_seconds * 1e3, begun[0].seconds * 1e3, begun[1].seconds * 1e3, median(rtt_ms),
      median(overhead_ms), p90(overhead_ms), overhead_ms.size());
  t2.reset();
  expect_no_worker_left(log);
}

TEST_F(IsolationGpu, OpsTheWorkerCannotRebuildRunInTheHost) {
  // Registered in this process only: the worker does not know the op, so every choice runs here.
  KILN_ASSERT_OK(planted::add_gemm_copy("gemm_host_only"));
  EventLog log;
  auto t = tuner(options(Isolation::kIsolated, &log));
  Problem p = gemm(32, 512, 256);
  p.op = "gemm_host_only";
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
  EXPECT_EQ(sel->report().failures, 0) << sel->report().table(50);
  auto in_process = log.of(Kind::kInProcess);
  EXPECT_EQ(static_cast<int>(in_process.size()), sel->report().candidates);
  ASSERT_FALSE(in_process.empty());
  EXPECT_NE(in_process[0].detail.find("no op 'gemm_host_only'"), std::string::npos) << in_process[0].detail;
  EXPECT_EQ(log.count(Kind::kChoiceSent), 0);
  expect_correct(*sel);
}

TEST_F(IsolationGpu, NormsAndSoftmaxAreIsolatedToo) {
  EventLog log;
  auto t = tuner(options(Isolation::kIsolated, &log, "kiln-bench-worker"));
  for (const Problem& p : {Problem::norm({.rows = 17, .cols = 4096, .residual = true}),
                           Problem::norm({.layernorm = true, .rows = 7, .cols = 1000, .bias = true}),
                           Problem::softmax({.rows = 33, .cols = 5000})}) {
    KILN_ASSERT_OK_AND_ASSIGN(auto sel, t->tune(p));
    EXPECT_EQ(sel->report().failures, 0) << sel->report().table(50);
    expect_correct(*sel);
  }
  EXPECT_EQ(log.count(Kind::kInProcess), 0);
  EXPECT_EQ(log.count(Kind::kSessionBegun), 3);
  EXPECT_EQ(log.count(Kind::kWorkerSpawned), 1);
}

}  // namespace
}  // namespace kiln::runtime
