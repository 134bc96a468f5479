// Benchmark isolation without a GPU: the bench worker protocol (golden header, round trips, corrupt frames) and
// the host's handling of worker crashes, hangs, poisoned contexts and start-up failures, driven through a fake
// worker (test_isolation_fake_worker.cpp) that does what each choice's name says. No sleeps: the fake blocks on a
// FIFO where a test needs the choice in flight, and every wait is bounded by the host's own timeouts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "isolation.h"
#include "isolation_event_log.h"
#include "isolation_wire.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;
namespace bw = detail::bench_wire;
using Kind = IsolationEvent::Kind;

std::string next_to_me(const std::string& name) {
  return (fs::read_symlink("/proc/self/exe").parent_path() / name).string();
}

bool alive(int pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

Problem small_gemm() {
  GemmProblem g;
  g.m = 16, g.n = 64, g.k = 32;
  g.epilogue.out = DType::kBF16;
  return Problem::gemm(g);
}

Binaries binaries_for(const std::string& name) {
  Binary b;
  b.name = name;
  b.entry = "k";
  b.arch = "sm_90";
  b.cubin = "not really a cubin";
  return {b};
}

// ---- the protocol

// A whole frame; the test fails if it cannot be encoded.
template <class Message>
std::string frame(const Message& m) {
  auto bytes = bw::encode(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  return bytes.ok() ? *bytes : std::string();
}

TEST(BenchWire, HeaderIsGoldenAndCorruptFramesFailCleanly) {
  bw::End e;
  e.seq = 0x0102030405060708ull;
  std::string bytes = frame(e);
  // magic "KBW1", version 9, type 6 (end), length 8, then the seq, all little-endian.
  EXPECT_EQ(bytes, std::string("KBW1\x09\x00\x06\x00\x08\x00\x00\x00\x08\x07\x06\x05\x04\x03\x02\x01", 20));
  KILN_ASSERT_OK_AND_ASSIGN(codec::FrameHeader h, codec::parse_header(bw::kProtocol, bytes));
  EXPECT_EQ(h.type, static_cast<uint16_t>(bw::Type::kEnd));
  EXPECT_EQ(h.length, 8u);

  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  EXPECT_EQ(codec::parse_header(bw::kProtocol, wrong_magic).status().code(), ErrorCode::kCorrupt);
  std::string wrong_version = bytes;
  wrong_version[4] = 1;
  EXPECT_NE(codec::parse_header(bw::kProtocol, wrong_version).status().message().find("version 1 (this build speaks 9)"),
            std::string::npos);
  std::string wrong_type = bytes;
  wrong_type[6] = 9;
  EXPECT_EQ(codec::parse_header(bw::kProtocol, wrong_type).status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(codec::parse_header(bw::kProtocol, bytes.substr(0, 5)).status().code(), ErrorCode::kCorrupt);
  // A compile worker's frame is not a bench frame.
  EXPECT_NE(codec::parse_header(bw::kProtocol, std::string("KPW1\x02\x00\x01\x00\x00\x00\x00\x00", 12))
                .status()
                .message()
                .find("magic"),
            std::string::npos);
  // Truncated and padded payloads.
  EXPECT_EQ(bw::decode<bw::End>(std::string_view(bytes).substr(12, 7)).status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(bw::decode<bw::End>(bytes.substr(12) + "x").status().code(), ErrorCode::kCorrupt);
}

TEST(BenchWire, EveryMessageRoundTrips) {
  bw::Begin b;
  b.seq = 7;
  b.session.problem = small_gemm();
  b.session.problem.op = "my_private_gemm";  // an alias of a built-in op keeps its name
  b.session.seed = 42;
  b.session.bench.budget_ms = 3.5;
  b.session.bench.fixed_reps = 9;
  b.session.bench.flush_l2 = false;
  b.session.bench.flush_l2_by_writing = true;
  b.session.bench.adaptive = false;
  b.session.bench.precision = 0.02;
  b.session.bench.placements = 5;
  b.session.bench.placement_bytes = size_t{3} << 33;
  b.session.bench.hold_on_host = true;
  b.session.max_template_configs = 5;
  b.session.split_k = false;
  b.session.reference = {"cublas_default", {}};
  b.session.reference_binaries = binaries_for("r");
  b.session.choices = {{"a", {KernelKey{1, 2}}}, {"b", {KernelKey{3, 4}, KernelKey{5, 6}}}};
  std::string f = frame(b);
  KILN_ASSERT_OK_AND_ASSIGN(bw::Begin b2, bw::decode<bw::Begin>(std::string_view(f).substr(12)));
  EXPECT_EQ(b2.seq, 7u);
  EXPECT_EQ(b2.session.problem, b.session.problem);
  EXPECT_EQ(b2.session.seed, 42u);
  EXPECT_EQ(b2.session.bench.budget_ms, 3.5);
  EXPECT_EQ(b2.session.bench.fixed_reps, 9);
  EXPECT_FALSE(b2.session.bench.flush_l2);
  EXPECT_TRUE(b2.session.bench.flush_l2_by_writing);
  EXPECT_EQ(b2.session.bench.placements, 5);
  EXPECT_EQ(b2.session.bench.placement_bytes, size_t{3} << 33);
  EXPECT_TRUE(b2.session.bench.hold_on_host);
  EXPECT_FALSE(b2.session.bench.adaptive);
  EXPECT_EQ(b2.session.bench.precision, 0.02);
  EXPECT_EQ(b2.session.max_template_configs, 5);
  EXPECT_FALSE(b2.session.split_k);
  EXPECT_EQ(b2.session.reference.name, "cublas_default");
  ASSERT_EQ(b2.session.reference_binaries.size(), 1u);
  EXPECT_EQ(b2.session.reference_binaries[0].cubin, "not really a cubin");
  ASSERT_EQ(b2.session.choices.size(), 2u);
  EXPECT_EQ(b2.session.choices[1].keys[1], (KernelKey{5, 6}));

  bw::Run r;
  r.seq = 8;
  r.name = "a";
  r.mode = bw::RunMode::kTimeRuns;
  r.binaries = binaries_for("a");
  r.n = 4;
  r.graph = true;
  f = frame(r);
  KILN_ASSERT_OK_AND_ASSIGN(bw::Run r2, bw::decode<bw::Run>(std::string_view(f).substr(12)));
  EXPECT_EQ(r2.mode, bw::RunMode::kTimeRuns);
  EXPECT_TRUE(r2.graph);
  EXPECT_EQ(r2.n, 4);
  EXPECT_EQ(r2.binaries->at(0).name, "a");

  bw::RunResult rr;
  rr.seq = 8;
  rr.status = make_error(ErrorCode::kCudaError, "CUDA_ERROR_ILLEGAL_ADDRESS").with_context("checking a");
  rr.poisoned = true;
  f = frame(rr);
  KILN_ASSERT_OK_AND_ASSIGN(bw::RunResult rr2, bw::decode<bw::RunResult>(std::string_view(f).substr(12)));
  EXPECT_EQ(rr2.status.to_string(), rr.status.to_string());
  EXPECT_TRUE(rr2.poisoned);
  rr.status = Status();
  rr.us = {1.5, 2.5};
  rr.placement = {0, 1};
  f = frame(rr);
  KILN_ASSERT_OK_AND_ASSIGN(rr2, bw::decode<bw::RunResult>(std::string_view(f).substr(12)));
  EXPECT_TRUE(rr2.status.ok());
  EXPECT_EQ(rr2.us, (std::vector<double>{1.5, 2.5}));
  EXPECT_EQ(rr2.placement, (std::vector<uint32_t>{0, 1}));

  bw::Begun g;
  g.seq = 7;
  g.unknown = {{"x", "why"}};
  f = frame(g);
  KILN_ASSERT_OK_AND_ASSIGN(bw::Begun g2, bw::decode<bw::Begun>(std::string_view(f).substr(12)));
  EXPECT_EQ(g2.unknown, g.unknown);

  bw::Hello hello;
  hello.pid = 12;
  hello.status = make_error(ErrorCode::kNoDevice, "none");
  f = frame(hello);
  KILN_ASSERT_OK_AND_ASSIGN(bw::Hello h2, bw::decode<bw::Hello>(std::string_view(f).substr(12)));
  EXPECT_EQ(h2.status.code(), ErrorCode::kNoDevice);
}

TEST(BenchWire, ProblemsOfEveryKindTravelUnchanged) {
  std::vector<Problem> problems = {small_gemm(), Problem::norm({.rows = 3, .cols = 7, .residual = true, .eps = 1e-5f}),
                                   Problem::norm({.layernorm = true, .rows = 2, .cols = 9, .bias = true}),
                                   Problem::softmax({.rows = 4, .cols = 100, .scale = 0.125f}),
                                   Problem::custom("mine", {{1, 2, 3}, {{"k", "v"}}})};
  GemmProblem with_epilogue;
  with_epilogue.m = 1, with_epilogue.n = 2, with_epilogue.k = 3;
  with_epilogue.epilogue = *templates::parse_epilogue("bias+gelu", DType::kF32);
  problems.push_back(Problem::gemm(with_epilogue));
  for (const Problem& p : problems) {
    KILN_ASSERT_OK_AND_ASSIGN(Problem back, bw::round_trip(p));
    EXPECT_EQ(back, p) << p.describe();
  }
  // Mixed input dtypes are not something the workload format describes: refused, not silently changed.
  GemmProblem mixed;
  mixed.m = mixed.n = mixed.k = 8;
  mixed.b = DType::kF16;
  EXPECT_EQ(bw::round_trip(Problem::gemm(mixed)).status().code(), ErrorCode::kInvalidArgument);
}

// ---- the host, with the fake worker

class IsolationHostTest : public ::testing::Test {
 public:
  std::unique_ptr<detail::IsolationHost> host(std::vector<std::string> env = {},
                                              std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    IsolationOptions o;
    o.worker_path = next_to_me("test_isolation_fake_worker");
    o.choice_timeout = timeout;
    o.worker_env = std::move(env);
    o.observer = log_.observer();
    auto h = detail::IsolationHost::create(o, 0);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return std::move(h).value();
  }
  detail::SessionSpec spec(std::vector<std::string> names, std::string op = "gemm") {
    detail::SessionSpec s;
    s.problem = small_gemm();
    s.problem.op = std::move(op);
    s.reference = {"ref", {}};
    for (auto& n : names) s.choices.push_back({n, {}});
    return s;
  }
  // Closes the host, then expects every worker it started to have been reaped.
  void close_and_expect_no_worker_left(std::unique_ptr<detail::IsolationHost>& h) {
    h.reset();
    expect_no_worker_left();
  }
  // Every worker the test started was reaped: none is left running.
  void expect_no_worker_left() {
    auto spawned = log_.of(Kind::kWorkerSpawned);
    EXPECT_EQ(log_.count(Kind::kWorkerExited), static_cast<int>(spawned.size()));
    for (const auto& e : spawned) EXPECT_FALSE(alive(e.pid)) << "worker " << e.pid << " is still there";
  }
  Result<Samples> measure(detail::IsolationHost& h, const std::string& name) {
    auto r = h.check_and_measure(name, binaries_for(name), 0);
    EXPECT_TRUE(r.ok()) << r.status().to_string();  // isolation itself must keep working
    if (!r.ok()) return r.status();
    return std::move(r)->samples;
  }

  EventLog log_;
};

TEST_F(IsolationHostTest, MeasuresInTheWorkerAndListsWhatItCannotRebuild) {
  auto h = host();
  KILN_ASSERT_OK_AND_ASSIGN(auto unknown, h->begin(spec({"alpha", "unknown_beta", "wrong"})));
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_EQ(unknown.begin()->first, "unknown_beta");
  KILN_ASSERT_OK_AND_ASSIGN(Samples s, measure(*h, "alpha"));
  EXPECT_EQ(s.us, (std::vector<double>{5, 6}));
  // An ordinary failure reported by the worker fails the choice and keeps the worker.
  auto wrong = measure(*h, "wrong");
  EXPECT_EQ(wrong.status().code(), ErrorCode::kWrongResult);
  // Near-tie re-measurement reuses what the worker prepared (no binaries resent: the fake would refuse).
  KILN_ASSERT_OK_AND_ASSIGN(auto again, h->time_runs("alpha", {}, 3, true));
  KILN_ASSERT_OK(again.samples);
  EXPECT_TRUE(again.samples->graph);
  EXPECT_EQ(log_.count(Kind::kWorkerSpawned), 1);
  EXPECT_EQ(h->stats().choices_run, 3u);
  h->end();
  close_and_expect_no_worker_left(h);
}

void expect_crash_costs_one_choice(IsolationHostTest& t, EventLog& log, const std::string& fault,
                                   const std::string& how) {
  auto h = t.host();
  KILN_ASSERT_OK(h->begin(t.spec({"first", fault, "after"})));
  KILN_ASSERT_OK(t.measure(*h, "first"));
  const int pid = h->worker_pid();
  auto failed = t.measure(*h, fault);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::kWorkerCrashed);
  const std::string msg = failed.status().message();
  EXPECT_NE(msg.find(how), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + fault + "'"), std::string::npos) << msg;              // names the choice
  EXPECT_NE(msg.find("fake worker: running " + fault), std::string::npos) << msg;  // the tail of its stderr
  EXPECT_FALSE(alive(pid));
  // The next choice gets a fresh worker, which is given the problem again and the binaries it lacks.
  KILN_ASSERT_OK_AND_ASSIGN(Samples s, t.measure(*h, "after"));
  EXPECT_EQ(s.us.front(), 5);
  EXPECT_NE(h->worker_pid(), pid);
  KILN_ASSERT_OK_AND_ASSIGN(auto tie, h->time_runs("first", binaries_for("first"), 3, false));
  KILN_EXPECT_OK(tie.samples);
  EXPECT_EQ(log.count(Kind::kWorkerSpawned), 2);
  EXPECT_EQ(log.count(Kind::kSessionBegun), 2);
  EXPECT_EQ(h->stats().crashes, 1u);
  h.reset();
}

TEST_F(IsolationHostTest, SegfaultCostsOneChoiceAndOneWorker) {
  expect_crash_costs_one_choice(*this, log_, "segv", "killed by signal 11");
  expect_no_worker_left();
}
TEST_F(IsolationHostTest, AbortCostsOneChoiceAndOneWorker) {
  expect_crash_costs_one_choice(*this, log_, "abort", "killed by signal 6");
  expect_no_worker_left();
}
TEST_F(IsolationHostTest, ExitCostsOneChoiceAndOneWorker) {
  expect_crash_costs_one_choice(*this, log_, "exit3", "exited with status 3");
  expect_no_worker_left();
}

TEST_F(IsolationHostTest, CrashAtASyncPointFailsTheChoiceInFlight) {
  const std::string fifo = (fs::temp_directory_path() / ("kiln_iso_gate_" + std::to_string(::getpid()))).string();
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto h = host({"FAKE_BENCH_GATE=" + fifo});
  KILN_ASSERT_OK(h->begin(spec({"segv", "after"})));
  Result<detail::IsolatedRun> in_flight = make_error(ErrorCode::kInternal, "not run");
  std::thread runner([&] { in_flight = h->check_and_measure("segv", binaries_for("segv"), 0); });
  // The choice is in the worker, which waits at the gate: alive, and nothing has failed yet.
  ASSERT_TRUE(log_.wait_count(Kind::kChoiceSent, 1));
  const int pid = log_.of(Kind::kChoiceSent).back().pid;
  EXPECT_TRUE(alive(pid));
  EXPECT_EQ(log_.count(Kind::kChoiceFailed), 0);
  { std::ofstream(fifo) << 'x'; }  // let it crash
  runner.join();
  ::unlink(fifo.c_str());
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().to_string();
  EXPECT_EQ(in_flight->samples.status().code(), ErrorCode::kWorkerCrashed);
  EXPECT_EQ(log_.count(Kind::kChoiceFailed), 1);
  EXPECT_EQ(log_.of(Kind::kWorkerExited).back().pid, pid);
  KILN_EXPECT_OK(measure(*h, "after"));
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, HangPastTheChoiceTimeoutIsKilledAndReplaced) {
  // Long enough for a sanitizer build's worker to prepare the next problem, short enough for a unit test.
  auto h = host({}, std::chrono::seconds(1));
  KILN_ASSERT_OK(h->begin(spec({"hang", "after"})));
  const int pid = h->worker_pid();
  auto hung = measure(*h, "hang");
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), ErrorCode::kTimeout);
  EXPECT_NE(hung.status().message().find("'hang' did not finish within 1 s"), std::string::npos)
      << hung.status().message();
  EXPECT_NE(hung.status().message().find("fake worker: running hang"), std::string::npos);
  EXPECT_FALSE(alive(pid));
  EXPECT_EQ(log_.of(Kind::kWorkerExited).back().detail, "killed by signal 9 (Killed)");
  KILN_EXPECT_OK(measure(*h, "after"));
  EXPECT_EQ(h->stats().timeouts, 1u);
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, PoisonedContextRetiresTheWorker) {
  auto h = host();
  KILN_ASSERT_OK(h->begin(spec({"poison", "after"})));
  const int pid = h->worker_pid();
  auto poisoned = measure(*h, "poison");
  EXPECT_EQ(poisoned.status().code(), ErrorCode::kCudaError);
  EXPECT_NE(poisoned.status().to_string().find("ILLEGAL_ADDRESS"), std::string::npos);
  EXPECT_NE(poisoned.status().to_string().find("the worker is replaced"), std::string::npos);
  EXPECT_FALSE(alive(pid));
  KILN_EXPECT_OK(measure(*h, "after"));
  EXPECT_NE(h->worker_pid(), pid);
  EXPECT_EQ(h->stats().poisoned, 1u);
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, AWorkerThatDiesWhileIdleIsReplacedWithoutBlame) {
  auto h = host();
  KILN_ASSERT_OK(h->begin(spec({"a", "b"})));
  KILN_ASSERT_OK(measure(*h, "a"));
  const int pid = h->worker_pid();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  // Wait until it has died (WNOWAIT: the host still reaps it), so its socket has hung up.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
  KILN_EXPECT_OK(measure(*h, "b"));  // no choice was in flight: none fails
  EXPECT_NE(h->worker_pid(), pid);
  EXPECT_EQ(log_.count(Kind::kChoiceFailed), 0);
  EXPECT_EQ(log_.of(Kind::kWorkerExited).front().detail, "killed by signal 9 (Killed)");
  EXPECT_EQ(h->stats().crashes, 1u);
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, AnOpTheWorkerDoesNotKnowIsNotFound) {
  auto h = host();
  auto r = h->begin(spec({"a"}, "no_such_op"));
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  // The session did not start; the worker is fine and serves the next problem.
  KILN_EXPECT_OK(h->begin(spec({"a"})));
  KILN_EXPECT_OK(measure(*h, "a"));
  EXPECT_EQ(log_.count(Kind::kWorkerSpawned), 1);
}

TEST_F(IsolationHostTest, ACrashWhilePreparingFailsTheBegin) {
  auto h = host();
  auto r = h->begin(spec({"a"}, "crash_in_begin"));
  EXPECT_EQ(r.status().code(), ErrorCode::kWorkerCrashed);
  EXPECT_NE(r.status().message().find("killed by signal 11"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("while preparing gemm"), std::string::npos) << r.status().message();
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, AWorkerWithoutADeviceFailsWithItsReason) {
  auto h = host({"FAKE_BENCH_HELLO=error"});
  auto r = h->begin(spec({"a"}));
  EXPECT_EQ(r.status().code(), ErrorCode::kNoDevice);
  EXPECT_NE(r.status().to_string().find("no device here"), std::string::npos);
  close_and_expect_no_worker_left(h);
}

TEST_F(IsolationHostTest, AWorkerThatDiesBeforeHelloIsReported) {
  IsolationOptions o;
  o.worker_path = "/bin/false";
  o.observer = log_.observer();
  KILN_ASSERT_OK_AND_ASSIGN(auto h, detail::IsolationHost::create(o, 0));
  auto r = h->begin(spec({"a"}));
  EXPECT_EQ(r.status().code(), ErrorCode::kWorkerCrashed);
  EXPECT_NE(r.status().message().find("ended before it was ready (exited with status 1)"), std::string::npos)
      << r.status().message();
  close_and_expect_no_worker_left(h);
}

TEST(IsolationHost, MissingWorkerExecutableIsAnError) {
  IsolationOptions o;
  o.worker_path = "/nonexistent/kiln-bench-worker";
  auto h = detail::IsolationHost::create(o, 0);
  EXPECT_EQ(h.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(h.status().message().find("/nonexistent/kiln-bench-worker"), std::string::npos);
}

}  // namespace
}  // namespace kiln::runtime
