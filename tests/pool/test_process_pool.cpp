// The process pool with real worker processes (build/bin/kiln-compile-worker) and injected faults: crashes,
// aborts, hangs past the timeout, cancellation, 1,000 jobs half cancelled, shutdown with jobs pending,
// recycling, a worker executable that cannot start, and the host killed while its workers are busy.
#include "kiln/pool/process_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "fakes.h"
#include "kiln/pool/gate.h"
#include "kiln_test.h"

extern char** environ;

namespace kiln {
namespace {

using pool_test::EventLog;
using testing::ScopedEnv;
using pool_test::FakeCompiler;
using pool_test::named;
using Kind = PoolEvent::Kind;

const Target kTarget{"sm_90"};

CompileJob echo(const std::string& name, Priority p = Priority::kNormal) {
  return CompileJob{named(name, {"-DKILN_WORKER_TEST=echo"}), kTarget, {}, p};
}
CompileJob fault(const std::string& name, const std::string& what) {
  return CompileJob{named(name, {"-DKILN_WORKER_TEST=" + what}), kTarget, {}, Priority::kNormal};
}
CompileJob real(const std::string& name) { return CompileJob{named(name), kTarget, {}, Priority::kNormal}; }

// A ready pool of `workers` workers with test faults enabled, observed by `log`.
std::unique_ptr<ProcessPool> ready_pool(EventLog& log, int workers, ProcessPoolOptions o = {}) {
  o.workers = workers;
  o.enable_test_faults = true;
  o.observer = log.observer();
  o.stderr_tail_bytes = 1 << 16;
  auto pool = ProcessPool::start(std::move(o));
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  EXPECT_TRUE((*pool)->wait_ready(std::chrono::seconds(60)));
  return std::move(pool).value();
}

// Hangs every worker of `pool` on a job of its own (<prefix>0, <prefix>1, ...) and waits until each job is
// sent, so whatever is submitted next stays queued until they are cancelled. Empty if one was never sent.
std::vector<Submission> hang_every_worker(Executor& pool, EventLog& log, int workers, const std::string& prefix) {
  std::vector<Submission> held;
  for (int i = 0; i < workers; ++i) held.push_back(pool.submit(fault(prefix + std::to_string(i), "hang")));
  for (const Submission& h : held) {
    if (log.wait_sent(h.id) == 0) return {};
  }
  return held;
}

bool process_gone(int pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

TEST(ProcessPool, CompilesARealKernelInAWorker) {
  EventLog log;
  auto pool = ready_pool(log, 2);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->kind(), "process");
  EXPECT_EQ(pool->worker_pids().size(), 2u);
  Submission s = pool->submit(real("in_worker"));
  KILN_ASSERT_OK_AND_ASSIGN(Binary b, s.future.get());
  EXPECT_FALSE(b.cubin.empty());
  EXPECT_EQ(b.key, make_key(named("in_worker"), kTarget));
  EXPECT_EQ(b.name, "in_worker");
  ProcessPoolStats st = pool->stats();
  EXPECT_EQ(st.jobs_in_workers, 1u);
  EXPECT_EQ(st.jobs_in_host, 0u);
  EXPECT_EQ(st.startup_seconds.size(), 2u);
  // The same kernel compiled in this process gives the same cubin.
  KILN_ASSERT_OK_AND_ASSIGN(Binary local, compile(named("in_worker"), kTarget));
  EXPECT_EQ(local.cubin, b.cubin);
}

// NVRTC's automatic PCH in a worker goes to a folder the host names (TMPDIR/kiln-pch-<host pid>-<n>) and removes
// when it reaps the worker, crashed or shut down: left to NVRTC, /tmp/__nvrtc_auto_pch_<pid>_0 (57 MB for a GEMM)
// outlived every worker. A pool that starts removes the folders of hosts that are gone, and no others.
TEST(ProcessPool, PchFoldersGoWithTheirWorkers) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::path(::testing::TempDir()) / fmt::format("pch_{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  auto folders = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  // A host that is gone (a child that has exited and been reaped) and one that is alive (this process).
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string orphan = fmt::format("kiln-pch-{}-1", gone), alive = fmt::format("kiln-pch-{}-99", ::getpid());
  for (const auto& d : {orphan, alive}) {
    fs::create_directories(tmp / d);
    std::ofstream(tmp / d / "left.pch") << "x";
  }
  {
    EventLog log;
    auto pool = ready_pool(log, 1);
    ASSERT_TRUE(pool);
    EXPECT_EQ(folders(), std::vector<std::string>{alive}) << "the orphan is removed, the live host's folder kept";
    KernelSource with_headers = named("with_pch");
    with_headers.source = "#include <cuda_fp16.h>\nextern \"C\" __global__ void k(__half* x) { x[0] = __float2half(1.f); }\n";
    CompileSettings pch;
    pch.use_pch = true;
    KILN_ASSERT_OK(pool->submit(CompileJob{with_headers, kTarget, pch, Priority::kNormal}).future.get());
    const std::string mine = fmt::format("kiln-pch-{}-1", ::getpid());
    ASSERT_EQ(folders(), (std::vector<std::string>{mine, alive}));
    bool has_pch = false;
    for (const auto& e : fs::directory_iterator(tmp / mine)) has_pch |= e.path().extension() == ".pch";
    EXPECT_TRUE(has_pch) << "NVRTC wrote its PCH into the worker's folder";
    // The worker crashes: its folder goes when it is reaped, before its job's failure is reported.
    EXPECT_FALSE(pool->submit(fault("crash", "segv")).future.get().ok());
    EXPECT_EQ(folders(), std::vector<std::string>{alive});
    // Its replacement compiles with PCH again, into a folder of its own, which shutdown removes.
    with_headers.name = "with_pch_again";
    KILN_ASSERT_OK(pool->submit(CompileJob{with_headers, kTarget, pch, Priority::kNormal}).future.get());
    EXPECT_EQ(folders(), (std::vector<std::string>{fmt::format("kiln-pch-{}-2", ::getpid()), alive}));
    pool->shutdown();
    EXPECT_EQ(folders(), std::vector<std::string>{alive});
  }
  if (old_tmpdir) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  fs::remove_all(tmp);
}

TEST(ProcessPool, CompileErrorsComeBackAsValues) {
  EventLog log;
  auto pool = ready_pool(log, 1);
  ASSERT_TRUE(pool);
  KernelSource bad = named("broken");
  bad.source = "extern \"C\" __global__ void k() { undeclared_thing(); }\n";
  Future<Binary> f = pool->submit(CompileJob{bad, kTarget, {}, Priority::kNormal}).future;
  const Result<Binary>& r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCompileError);
  EXPECT_NE(r.status().detail().find("undeclared_thing"), std::string::npos);
  EXPECT_EQ(pool->stats().crashes, 0u);
  KILN_EXPECT_OK(pool->submit(echo("after")).future.get());
}

TEST(ProcessPool, RunsInTheHostUntilTheWorkersAreReady) {
  // The workers hold their hello until this test writes to a FIFO: "not ready" is a state, not a race.
  std::string fifo = ::testing::TempDir() + "kiln_hello_gate_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  FakeCompiler host;
  EventLog log;
  ProcessPoolOptions o;
  o.workers = 2;
  o.enable_test_faults = true;
  o.observer = log.observer();
  o.host_compile = host.fn();
  o.worker_env = {"KILN_WORKER_TEST_HELLO_GATE=" + fifo};
  KILN_ASSERT_OK_AND_ASSIGN(auto pool, ProcessPool::start(o));
  EXPECT_FALSE(pool->ready());
  auto early = pool->submit(echo("early"));
  KILN_ASSERT_OK_AND_ASSIGN(Binary b, early.future.get());
  EXPECT_EQ(b.cubin, "cubin:early");  // the host's (fake) compiler, not a worker
  EXPECT_EQ(host.calls(), 1);
  int gate = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(gate, 0);
  ASSERT_EQ(::write(gate, "xx", 2), 2);
  ASSERT_TRUE(pool->wait_ready(std::chrono::seconds(60)));
  KILN_ASSERT_OK_AND_ASSIGN(Binary late, pool->submit(echo("late")).future.get());
  EXPECT_TRUE(late.cubin.empty());  // the worker's echo
  EXPECT_NE(late.log.find("received_ns="), std::string::npos);
  EXPECT_EQ(host.calls(), 1);
  EXPECT_EQ(pool->stats().jobs_in_host, 1u);
  pool.reset();
  ::close(gate);
  ::unlink(fifo.c_str());
}

// A crash of one worker fails its job only, with the kernel, the signal and the stderr tail in the error.
void expect_crash_isolated(const std::string& what, const std::string& expected_in_message) {
  EventLog log;
  auto pool = ready_pool(log, 2);
  ASSERT_TRUE(pool);
  std::vector<Future<Binary>> ok;
  for (int i = 0; i < 6; ++i) ok.push_back(pool->submit(echo("fine" + std::to_string(i))).future);
  auto crashing = pool->submit(fault("doomed_" + what, what)).future;
  for (int i = 6; i < 12; ++i) ok.push_back(pool->submit(echo("fine" + std::to_string(i))).future);
  const Result<Binary>& r = crashing.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kWorkerCrashed);
  const Status status = r.status();
  const std::string& msg = status.message();
  EXPECT_NE(msg.find("'doomed_" + what + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(expected_in_message), std::string::npos) << msg;
  EXPECT_NE(msg.find("injected fault '" + what + "'"), std::string::npos) << msg;  // stderr tail
  for (size_t i = 0; i < ok.size(); ++i) {
    KILN_ASSERT_OK_AND_ASSIGN(Binary b, ok[i].get());
    EXPECT_EQ(b.name, "fine" + std::to_string(i));
  }
  // Replaced, and serving: a real compile after the crash.
  ASSERT_TRUE(log.wait_count(Kind::kWorkerReady, 3));
  KILN_EXPECT_OK(pool->submit(real("after_" + what)).future.get());
  EXPECT_EQ(pool->stats().crashes, 1u);
  EXPECT_EQ(pool->worker_pids().size(), 2u);
}

// A pool made on demand (DeferredExecutor) gets its first jobs right after it starts: they wait for the
// workers' hello, once, instead of running in the host arena. The workers hold their hello until the test
// opens the gate, so the first submit is certain to come before they are ready.
TEST(ProcessPool, ADeferredPoolsFirstJobsWaitForItsWorkers) {
  std::string fifo = ::testing::TempDir() + "kiln_deferred_gate_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  FakeCompiler host;
  ProcessPool* made = nullptr;
  DeferredExecutor deferred([&]() -> Result<std::shared_ptr<Executor>> {
    ProcessPoolOptions o;
    o.workers = 2;
    o.enable_test_faults = true;
    o.host_compile = host.fn();
    o.worker_env = {"KILN_WORKER_TEST_HELLO_GATE=" + fifo};
    KILN_ASSIGN_OR_RETURN(auto pool, ProcessPool::start(o));
    made = pool.get();
    return std::shared_ptr<Executor>(std::move(pool));
  }, "lazy", 2);
  std::vector<Future<Binary>> futures(3);
  std::thread first([&] {
    for (int i = 0; i < 3; ++i) futures[i] = deferred.submit(echo("early" + std::to_string(i))).future;
  });
  int gate = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // a FIFO opened read-write does not block
  ASSERT_GE(gate, 0);
  ASSERT_EQ(::write(gate, "xx", 2), 2);
  first.join();
  for (auto& f : futures) {
    KILN_ASSERT_OK_AND_ASSIGN(Binary b, f.get());
    EXPECT_TRUE(b.cubin.empty()) << "compiled by the host, not a worker";
    EXPECT_NE(b.log.find("received_ns="), std::string::npos);
  }
  EXPECT_EQ(host.calls(), 0);
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(made->stats().jobs_in_host, 0u);
  deferred.shutdown();
  ::close(gate);
  ::unlink(fifo.c_str());
}

TEST(ProcessPool, SegfaultingWorkerFailsOnlyItsJob) { expect_crash_isolated("segv", "killed by signal 11"); }
TEST(ProcessPool, AbortingWorkerFailsOnlyItsJob) { expect_crash_isolated("abort", "killed by signal 6"); }
TEST(ProcessPool, ExitingWorkerFailsOnlyItsJob) { expect_crash_isolated("exit3", "exited with status 3"); }

TEST(ProcessPool, HangPastTheTimeoutIsKilledAndReported) {
  EventLog log;
  ProcessPoolOptions o;
  o.job_timeout = std::chrono::milliseconds(1500);  // far above an echo job, even under sanitizers and load
  auto pool = ready_pool(log, 2, o);
  ASSERT_TRUE(pool);
  auto hung = pool->submit(fault("stuck", "hang")).future;
  std::vector<Future<Binary>> ok;
  for (int i = 0; i < 20; ++i) ok.push_back(pool->submit(echo("e" + std::to_string(i))).future);
  const Result<Binary>& r = hung.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kTimeout);
  EXPECT_NE(r.status().message().find("'stuck' timed out"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("injected fault 'hang'"), std::string::npos) << r.status().message();
  for (auto& f : ok) KILN_EXPECT_OK(f.get());
  EXPECT_EQ(pool->stats().timeouts, 1u);
  EXPECT_EQ(pool->stats().crashes, 0u);
  KILN_EXPECT_OK(pool->submit(echo("after")).future.get());
}

TEST(ProcessPool, CancellingARunningJobKillsItsWorker) {
  EventLog log;
  auto pool = ready_pool(log, 1);
  ASSERT_TRUE(pool);
  Submission hung = pool->submit(fault("cancel_me", "hang"));
  int pid = log.wait_sent(hung.id);
  ASSERT_NE(pid, 0);
  hung.future.cancel();
  const Result<Binary>& r = hung.future.get();
  EXPECT_EQ(r.status().code(), ErrorCode::kCancelled);
  EXPECT_NE(r.status().message().find("'cancel_me'"), std::string::npos);
  EXPECT_TRUE(process_gone(pid));  // reaped before the future was failed
  KILN_EXPECT_OK(pool->submit(echo("after")).future.get());
  EXPECT_EQ(pool->stats().crashes, 0u);
}

// Queued jobs of one priority go out longest expected compile first (CompileJob::cost_hint), unhinted last.
TEST(ProcessPool, LongestExpectedCompileGoesFirst) {
  EventLog log;
  auto pool = ready_pool(log, 1);
  ASSERT_TRUE(pool);
  std::vector<Submission> held = hang_every_worker(*pool, log, 1, "hold");
  ASSERT_EQ(held.size(), 1u);
  std::vector<Submission> subs;
  for (double hint : {0.1, 0.0, 5.0, 1.0}) {
    CompileJob j = echo(fmt::format("hint_{}", hint));
    j.cost_hint = hint;
    subs.push_back(pool->submit(std::move(j)));
  }
  held[0].future.cancel();
  for (auto& s : subs) KILN_ASSERT_OK(s.future.get().status());
  std::vector<std::string> order;
  for (const auto& e : log.events()) {
    if (e.kind == Kind::kJobSent && e.kernel.rfind("hint_", 0) == 0) order.push_back(e.kernel);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"hint_5", "hint_1", "hint_0.1", "hint_0"}));
}

// A worker's next job is sent before the job it finished is completed: the future's notify() callbacks run
// on the pool's I/O thread when it completes the job, and by then the next request has gone out.
TEST(ProcessPool, TheNextJobIsSentBeforeTheFinishedOneCompletes) {
  EventLog log;
  auto pool = ready_pool(log, 1);
  ASSERT_TRUE(pool);
  std::vector<Submission> held = hang_every_worker(*pool, log, 1, "hold");
  ASSERT_EQ(held.size(), 1u);
  Submission first = pool->submit(echo("first"));
  Submission second = pool->submit(echo("second"));
  std::atomic<int> second_sent_at_completion{-1};
  first.future.notify([&] {
    int sent = 0;
    for (const auto& e : log.events()) sent += e.kind == Kind::kJobSent && e.job == second.id;
    second_sent_at_completion = sent;
  });
  held[0].future.cancel();
  KILN_ASSERT_OK(first.future.get().status());
  KILN_ASSERT_OK(second.future.get().status());
  EXPECT_EQ(second_sent_at_completion.load(), 1);
}

// The worker's CPU-bound test job (bench/pool's process-spin) answers after its work, compiling nothing.
TEST(ProcessPool, SpinJobAnswersWithoutCompiling) {
  EventLog log;
  auto pool = ready_pool(log, 1);
  ASSERT_TRUE(pool);
  KILN_ASSERT_OK_AND_ASSIGN(Binary b, pool->submit(fault("spinner", "spin:2")).future.get());
  EXPECT_EQ(b.name, "spinner");
  EXPECT_TRUE(b.cubin.empty());
  EXPECT_EQ(b.log.rfind("spin ", 0), 0u) << b.log;
}

// Two workers, both hung on a job ("hold0", "hold1"): whatever a test submits stays queued until it cancels them.
class HungPool : public ::testing::Test {
 protected:
  void SetUp() override {
    pool = ready_pool(log, 2);
    ASSERT_TRUE(pool);
    held = hang_every_worker(*pool, log, 2, "hold");
    ASSERT_EQ(held.size(), 2u);
  }

  EventLog log;
  std::unique_ptr<ProcessPool> pool;
  std::vector<Submission> held;
};

TEST_F(HungPool, ThousandQueuedJobsHalfCancelled) {
  std::vector<Future<Binary>> fs;
  for (int i = 0; i < 1000; ++i) fs.push_back(pool->submit(echo("j" + std::to_string(i))).future);
  for (int i = 1; i < 1000; i += 2) {
    fs[i].cancel();
    ASSERT_TRUE(fs[i].ready());  // queued: failed at once
  }
  for (Submission& h : held) h.future.cancel();
  for (int i = 0; i < 1000; ++i) {
    const Result<Binary>& r = fs[i].get();
    if (i % 2) {
      EXPECT_EQ(r.status().code(), ErrorCode::kCancelled);
    } else {
      ASSERT_TRUE(r.ok()) << i << ": " << r.status().to_string();
      EXPECT_EQ(r->name, "j" + std::to_string(i));
    }
  }
  EXPECT_EQ(held[0].future.get().status().code(), ErrorCode::kCancelled);
  EXPECT_EQ(pool->stats().jobs_in_workers, 2u + 500u);
  KILN_EXPECT_OK(pool->submit(real("after")).future.get());
}

TEST_F(HungPool, ShutdownWithJobsPendingFailsThemAndLeavesNoProcess) {
  std::vector<Future<Binary>> fs = {held[0].future, held[1].future};
  for (int i = 0; i < 10; ++i) fs.push_back(pool->submit(echo("q" + std::to_string(i))).future);
  std::vector<int> pids = pool->worker_pids();
  ASSERT_EQ(pids.size(), 2u);
  pool->shutdown();
  for (auto& f : fs) {
    ASSERT_TRUE(f.ready());
    EXPECT_EQ(f.get().status().code(), ErrorCode::kShutdown);
    EXPECT_NE(f.get().status().message().find("pool shut down"), std::string::npos) << f.get().status().message();
  }
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << pid;
  EXPECT_TRUE(pool->worker_pids().empty());
  EXPECT_EQ(pool->submit(echo("late")).future.get().status().code(), ErrorCode::kShutdown);
}

TEST(ProcessPool, WorkersAreRecycledAfterTheirJobLimit) {
  EventLog log;
  ProcessPoolOptions o;
  o.max_jobs_per_worker = 3;
  auto pool = ready_pool(log, 1, o);
  ASSERT_TRUE(pool);
  std::set<int> pids;
  for (int i = 0; i < 10; ++i) {
    Submission s = pool->submit(echo("r" + std::to_string(i)));
    KILN_ASSERT_OK(s.future.get());
    pids.insert(log.wait_sent(s.id));
  }
  EXPECT_EQ(pids.size(), 4u);  // 3 + 3 + 3 + 1
  EXPECT_EQ(pool->stats().recycled, 3u);
  EXPECT_EQ(pool->stats().crashes, 0u);
}

// The CPUs `pid` may run on.
std::set<int> cpus_of(int pid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> out;
  if (::sched_getaffinity(pid, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.insert(c);
  }
  return out;
}

TEST(ProcessPool, PinnedWorkersSpreadOverTheHostsCpus) {
  const std::set<int> host = cpus_of(0);
  ASSERT_FALSE(host.empty());
  const int workers = 3;
  EventLog log;
  ProcessPoolOptions o;
  o.pin_workers = true;
  auto pool = ready_pool(log, workers, o);
  ASSERT_TRUE(pool);
  const std::vector<int> pids = pool->worker_pids();
  ASSERT_EQ(pids.size(), static_cast<size_t>(workers));
  std::map<int, int> users;  // CPU -> workers pinned to it
  for (int pid : pids) {
    const std::set<int> mine = cpus_of(pid);
    ASSERT_EQ(mine.size(), 1u) << "worker " << pid << " is not pinned";
    EXPECT_TRUE(host.count(*mine.begin())) << "pinned outside the host's CPUs";
    ++users[*mine.begin()];
  }
  // As evenly as the host's CPUs allow: no CPU holds two workers while another holds none.
  const int most = std::max_element(users.begin(), users.end(), [](auto& a, auto& b) { return a.second < b.second; })->second;
  EXPECT_LE(most, (workers + static_cast<int>(host.size()) - 1) / static_cast<int>(host.size()));
}

TEST(ProcessPool, ReplacementWorkersArePinnedToo) {
  EventLog log;
  ProcessPoolOptions o;
  o.pin_workers = true;
  o.max_jobs_per_worker = 1;
  auto pool = ready_pool(log, 1, o);
  ASSERT_TRUE(pool);
  std::set<int> seen;
  for (int i = 0; i < 3; ++i) {
    Submission s = pool->submit(echo("replaced" + std::to_string(i)));
    KILN_ASSERT_OK(s.future.get());
    seen.insert(log.wait_sent(s.id));
    // Whatever workers are alive now (the retiring one may not be reaped yet) were pinned when they started.
    for (int pid : pool->worker_pids()) EXPECT_EQ(cpus_of(pid).size(), 1u) << "worker " << pid << " is not pinned";
  }
  EXPECT_EQ(seen.size(), 3u);  // each job ran in a fresh worker
  EXPECT_GE(pool->stats().recycled, 2u);
}

TEST(ProcessPool, UnpinnedWorkersKeepTheHostsCpus) {
  EventLog log;
  ProcessPoolOptions o;
  o.pin_workers = false;
  auto pool = ready_pool(log, 2, o);
  ASSERT_TRUE(pool);
  for (int pid : pool->worker_pids()) EXPECT_EQ(cpus_of(pid), cpus_of(0));
}

TEST(ProcessPool, ABadPinSettingIsAnError) {
  ScopedEnv pin("KILN_POOL_PIN", "yes");
  auto pool = ProcessPool::start({});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("KILN_POOL_PIN"), std::string::npos) << pool.status().to_string();
}

// Bytes of anonymous read+execute mappings in process `pid`: where a worker's moved NVRTC code lives.
std::size_t anonymous_code_bytes(int pid) {
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  std::size_t total = 0;
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    unsigned long offset = 0;
    char dev[16] = {};
    unsigned long inode = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %lx %15s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) continue;
    if (perms[0] == 'r' && perms[2] == 'x' && inode == 0 && line.find('[') == std::string::npos) total += hi - lo;
  }
  return total;
}

bool thp_possible() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return !mode.empty() && mode.find("[never]") == std::string::npos;
}

// A worker asked to move NVRTC's code onto huge pages does (its code is in an anonymous mapping of whole 2 MiB
// pages) and compiles the same cubin as this process; one not asked leaves it in the file's mapping.
TEST(ProcessPool, HugeTextWorkersCompileTheSameCubin) {
  KILN_ASSERT_OK_AND_ASSIGN(Binary local, compile(named("huge_text"), kTarget));
  for (bool huge : {true, false}) {
    EventLog log;
    ProcessPoolOptions o;
    o.huge_text = huge;
    auto pool = ready_pool(log, 1, o);
    ASSERT_TRUE(pool);
    Submission s = pool->submit(real("huge_text"));
    KILN_ASSERT_OK_AND_ASSIGN(Binary b, s.future.get());
    EXPECT_EQ(b.cubin, local.cubin) << "huge_text=" << huge;
    const int pid = log.wait_sent(s.id);
    const std::size_t moved = anonymous_code_bytes(pid);
    if (!huge) {
      EXPECT_EQ(moved, 0u);
    } else if (thp_possible()) {
      EXPECT_GE(moved, std::size_t{32} << 20) << "NVRTC's code (~72 MB) should have moved";
      EXPECT_EQ(moved % (std::size_t{2} << 20), 0u);
    }
  }
}

TEST(ProcessPool, ABadHugeTextSettingIsAnError) {
  ScopedEnv huge("KILN_POOL_HUGE_TEXT", "on");
  auto pool = ProcessPool::start({});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("KILN_POOL_HUGE_TEXT"), std::string::npos) << pool.status().to_string();
}

// The nice value of process (main thread) `pid`.
int nice_of(int pid) {
  errno = 0;
  const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(pid));
  return errno == 0 ? n : -100;
}

TEST(ProcessPool, WorkersRunAtTheNiceValueAsked) {
  const int host = nice_of(0);
  if (host > 7) GTEST_SKIP() << "this process runs at nice " << host << ": a worker cannot go back to 7";
  EventLog log;
  ProcessPoolOptions o;
  o.worker_nice = 7;
  o.max_jobs_per_worker = 2;
  auto pool = ready_pool(log, 1, o);
  ASSERT_TRUE(pool);
  for (int pid : pool->worker_pids()) EXPECT_EQ(nice_of(pid), 7) << "worker " << pid;
  EXPECT_EQ(nice_of(0), host) << "the host's own priority must not change";
  // The third job runs in the replacement of the worker retired after two, which starts at the same priority
  // (and stays alive: it has done one job of two).
  std::vector<int> ran;
  for (int i = 0; i < 3; ++i) {
    Submission s = pool->submit(echo("renice" + std::to_string(i)));
    KILN_ASSERT_OK(s.future.get());
    ran.push_back(log.wait_sent(s.id));
  }
  ASSERT_EQ(ran[0], ran[1]);
  ASSERT_NE(ran[2], ran[0]) << "the third job should have gone to a fresh worker";
  EXPECT_EQ(nice_of(ran[2]), 7) << "replacement worker " << ran[2];
}

TEST(ProcessPool, NiceZeroKeepsTheHostsPriority) {
  ScopedEnv nice("KILN_POOL_NICE", "0");
  EventLog log;
  auto pool = ready_pool(log, 1, {});
  ASSERT_TRUE(pool);
  for (int pid : pool->worker_pids()) EXPECT_EQ(nice_of(pid), nice_of(0));
}

TEST(ProcessPool, ABadNiceSettingIsAnError) {
  for (const char* bad : {"high", "20", "-1", "5x", ""}) {
    ScopedEnv nice("KILN_POOL_NICE", bad);
    auto pool = ProcessPool::start({});
    if (std::string_view(bad).empty()) {  // unset in effect: the default
      EXPECT_TRUE(pool.ok()) << pool.status().to_string();
      continue;
    }
    ASSERT_FALSE(pool.ok()) << "KILN_POOL_NICE=" << bad;
    EXPECT_EQ(pool.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(pool.status().message().find("KILN_POOL_NICE"), std::string::npos) << pool.status().to_string();
  }
  ProcessPoolOptions o;
  o.worker_nice = 25;
  auto pool = ProcessPool::start(o);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("worker_nice"), std::string::npos) << pool.status().to_string();
}

TEST(ProcessPool, MissingWorkerExecutableIsAnError) {
  ProcessPoolOptions o;
  o.worker_path = "/nonexistent/kiln-compile-worker";
  auto pool = ProcessPool::start(o);
  EXPECT_EQ(pool.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(pool.status().message().find("/nonexistent/kiln-compile-worker"), std::string::npos);
}

TEST(ProcessPool, AWorkerThatCannotStartCostsSpeedNotWork) {
  // /bin/false exits at once: after three failed starts the pool stops trying and compiles in the host.
  FakeCompiler host;
  EventLog log;
  ProcessPoolOptions o;
  o.workers = 1;
  o.worker_path = "/bin/false";
  o.observer = log.observer();
  o.host_compile = host.fn();
  KILN_ASSERT_OK_AND_ASSIGN(auto pool, ProcessPool::start(o));
  ASSERT_TRUE(log.wait_count(Kind::kWorkerExited, 3));
  for (int i = 0; i < 5; ++i) KILN_EXPECT_OK(pool->submit(echo("h" + std::to_string(i))).future.get());
  EXPECT_FALSE(pool->ready());
  EXPECT_EQ(host.calls(), 5);
  EXPECT_EQ(pool->stats().workers_spawned, 3u);
  EXPECT_NE(pool->stats().gave_up.find("could not start"), std::string::npos) << pool->stats().gave_up;
}

// An executable shell script in a fresh folder (removed with the object).
struct Script {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln_worker_" + std::to_string(::getpid()));
  std::string path;
  explicit Script(const std::string& body) {
    std::filesystem::create_directories(dir);
    path = (dir / "worker.sh").string();
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
  }
  ~Script() { std::filesystem::remove_all(dir); }
};

TEST(ProcessPool, HandshakeAcceptsTheRealWorker) {
  KILN_ASSERT_OK_AND_ASSIGN(std::string path, find_worker_executable());
  KILN_EXPECT_OK(check_compile_worker(path, std::chrono::seconds(60)));
}

TEST(ProcessPool, HandshakeNamesWhatABogusWorkerDid) {
  Script exits("exit 3");
  Status s = check_compile_worker(exits.path, std::chrono::seconds(60));
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(exits.path), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("exited with status 3"), std::string::npos) << s.to_string();

  // Anything but a hello frame (here: text, as a web server would answer) is a malformed message, and the
  // worker is killed at once rather than at the timeout.
  Script talks("printf 'HTTP/1.1 200 OK, and more than a frame header' >&3\nexec sleep 600");
  s = check_compile_worker(talks.path, std::chrono::seconds(60));
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("malformed"), std::string::npos) << s.to_string();
}

TEST(ProcessPool, HandshakeTimesOutOnASilentWorker) {
  Script silent("exec sleep 600");
  Status s = check_compile_worker(silent.path, std::chrono::milliseconds(300));
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no hello within"), std::string::npos) << s.to_string();
}

TEST(ProcessPool, ShutdownIsBoundedWhenAWorkerLeavesChildrenHoldingItsStderr) {
  // sh forks sleep, which inherits the stderr pipe: killing sh alone left the pipe open, and the reap that
  // read it to EOF waited as long as sleep ran. The pool kills the worker's process group instead.
  Script stubborn("sleep 600\nexit 0");
  EventLog log;
  ProcessPoolOptions o;
  o.workers = 1;
  o.worker_path = stubborn.path;
  o.observer = log.observer();
  KILN_ASSERT_OK_AND_ASSIGN(auto pool, ProcessPool::start(o));
  ASSERT_TRUE(log.wait_count(Kind::kWorkerSpawned, 1));
  const auto start = std::chrono::steady_clock::now();
  pool->shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(log.count(Kind::kWorkerExited), 1u);
}

TEST(ProcessPool, MakeExecutorRefusesANamedWorkerThatIsNotOne) {
  Script exits("exit 3");
  auto opts = std::make_shared<ProcessPoolOptions>();
  opts->worker_path = exits.path;
  auto exec = make_executor({.process = opts});
  EXPECT_EQ(exec.status().code(), ErrorCode::kFailedPrecondition) << exec.status().to_string();
  opts->worker_path = "/nonexistent/kiln-compile-worker";
  exec = make_executor({.process = opts});
  EXPECT_EQ(exec.status().code(), ErrorCode::kNotFound) << exec.status().to_string();
}

TEST(ProcessPool, ChosenThroughMakeExecutor) {
  auto opts = std::make_shared<ProcessPoolOptions>();
  opts->enable_test_faults = true;
  KILN_ASSERT_OK_AND_ASSIGN(auto exec, make_executor({.kind = ExecutorKind::kProcess, .workers = 2, .process = opts}));
  EXPECT_EQ(exec->kind(), "process");
  EXPECT_EQ(exec->concurrency(), 2);
  auto* pool = dynamic_cast<ProcessPool*>(exec.get());
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->wait_ready(std::chrono::seconds(60)));
  KILN_EXPECT_OK(exec->submit(echo("via_make_executor")).future.get());
}

TEST(ProcessPool, GateOverTheProcessPool) {
  EventLog log;
  std::shared_ptr<Executor> pool = ready_pool(log, 2);
  ASSERT_TRUE(pool);
  auto gate = PrecompileGate::create({.executor = pool});
  ASSERT_TRUE(gate.ok());
  // Both workers busy, so the gate's requests provably overlap the one compile they share.
  std::vector<Submission> held = hang_every_worker(*pool, log, 2, "hold");
  ASSERT_EQ(held.size(), 2u);
  std::vector<Future<Binary>> fs;
  for (int i = 0; i < 8; ++i) fs.push_back((*gate)->precompile(named("same"), kTarget));
  for (Submission& h : held) h.future.cancel();
  for (auto& f : fs) {
    KILN_ASSERT_OK_AND_ASSIGN(Binary b, f.get());
    EXPECT_FALSE(b.cubin.empty());
  }
  EXPECT_EQ((*gate)->counters().compiles, 1u);
  EXPECT_EQ((*gate)->counters().joined, 7u);
}

// The test process adopts orphans (PR_SET_CHILD_SUBREAPER), so the workers of a killed host become its
// children and can be waited for: no sleeps, no reliance on the container's init reaping them.
TEST(ProcessPool, KillingTheHostLeavesNoWorkerBehind) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::string helper = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "pool_orphan_helper").string();
  ASSERT_EQ(::access(helper.c_str(), X_OK), 0) << helper;
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, report[1], 3);
  std::vector<char*> argv = {helper.data(), nullptr};
  pid_t host = -1;
  ASSERT_EQ(::posix_spawn(&host, helper.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(report[1]);

  // The helper writes "pid pid\n" once both of its workers are busy with hanging jobs.
  std::string line;
  char c;
  while (::read(report[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(report[0]);
  int w0 = 0, w1 = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "%d %d", &w0, &w1), 2) << "helper said: " << line;
  // pidfds taken while the workers are certainly alive (busy), so they name these processes and no others.
  int fd0 = static_cast<int>(::syscall(SYS_pidfd_open, w0, 0));
  int fd1 = static_cast<int>(::syscall(SYS_pidfd_open, w1, 0));
  ASSERT_GE(fd0, 0);
  ASSERT_GE(fd1, 0);

  ASSERT_EQ(::kill(host, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(host, &status, 0), host);
  ASSERT_TRUE(WIFSIGNALED(status));

  // A pidfd is readable once its process has exited. Bounded: 20 s, far above the milliseconds it takes.
  pollfd fds[2] = {{fd0, POLLIN, 0}, {fd1, POLLIN, 0}};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int exited = 0;
  while (exited < 2 && std::chrono::steady_clock::now() < deadline) {
    int n = ::poll(fds, 2, 1000);
    if (n < 0 && errno != EINTR) break;
    exited = (fds[0].revents != 0) + (fds[1].revents != 0);
  }
  EXPECT_EQ(exited, 2) << "workers " << w0 << " and " << w1 << " outlived their host";
  for (int pid : {w0, w1}) {
    // Now our children: reap them (or, if the test is failing, kill them so nothing is left behind).
    if (::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
    EXPECT_TRUE(process_gone(pid)) << pid;
  }
  ::close(fd0);
  ::close(fd1);
}

}  // namespace
}  // namespace kiln
