// Communicators without a GPU: the NCCL loader (a missing library, the real one, unique ids) and
// run_local_group's supervision of its ranks (payloads, errors, crashes, hangs, timeouts, a dead parent) with
// nccl=false, and the crash trace. No sleeps: a rank that must hang blocks on a pipe nobody writes to, so the group's grace period
// or timeout is what ends it (a short one is fine there: the hang is real and unbounded, not a race), and a
// rank that must finish after the others waits for their bytes on a pipe.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/runtime/comm.h"
#include "kiln_test.h"
#include "nccl_api.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace kiln::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every rank of every group must have been reaped by run_local_group itself.
void expect_no_children() {
  int status = 0;
  errno = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1) << "a child process was left behind";
  EXPECT_EQ(errno, ECHILD);
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A pipe whose read end blocks forever in the ranks: each of them inherits the write end as well, so it never
// sees end-of-file.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int read_end() const { return fds[0]; }
  int write_end() const { return fds[1]; }
};

Result<std::string> block_forever(const Pipe& p) {
  char c;
  while (::read(p.read_end(), &c, 1) < 0 && errno == EINTR) {
  }
  return make_error(ErrorCode::kInternal, "the blocking pipe was written to");
}

// run_local_group(), and how long it took: the grace period and the timeout tests bound it from both sides.
struct TimedGroup {
  Result<std::vector<RankOutcome>> outcomes;
  Clock::duration elapsed;
};
TimedGroup run_timed(const GroupOptions& o, const RankFunction& fn) {
  const auto start = Clock::now();
  auto outcomes = run_local_group(o, fn);
  return {std::move(outcomes), Clock::now() - start};
}

GroupOptions process_group(int world) {
  GroupOptions o;
  o.world = world;
  o.nccl = false;
  // Long enough never to end a rank that is only slow to be scheduled; tests of the grace period and the
  // timeout set short ones where the rank can never finish.
  o.timeout = 10min;
  o.grace = 2min;
  return o;
}

// ---- the NCCL loader

TEST(NcclLoader, AMissingLibraryIsNoDriverNamingIt) {
  const std::string path = "/definitely/not/here/libnccl.so.2";
  auto api = detail::load_nccl(path);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::kNoDriver);
  EXPECT_TRUE(contains(api.status().message(), path)) << api.status().message();

  auto wrong = detail::load_nccl("libm.so.6");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), ErrorCode::kNoDriver);
  EXPECT_TRUE(contains(wrong.status().message(), "not an NCCL library")) << wrong.status().message();
}

TEST(NcclLoader, TheEnvironmentChoosesTheLibraryAndNvlsIsTurnedOff) {
  // The process-wide loader decides once per process, so each case runs in a rank of its own; a rank inherits
  // that decision though, so this process must not have made it yet.
  if (void* loaded = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD); loaded != nullptr) {
    ::dlclose(loaded);
    GTEST_SKIP() << "NCCL is already loaded in this process (an earlier test here loaded it); run this test alone";
  }
  auto outcomes = run_local_group(process_group(2), [](int rank, Communicator*) -> Result<std::string> {
    if (rank == 0) {
      ::setenv("KILN_NCCL_LIBRARY", "/nowhere/libnccl-bogus.so.2", 1);
      ::unsetenv("NCCL_NVLS_ENABLE");
    } else {
      ::unsetenv("KILN_NCCL_LIBRARY");
      ::setenv("NCCL_NVLS_ENABLE", "7", 1);  // a caller's own value must survive
    }
    auto version = nccl_version();
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    std::string v = version.ok() ? std::to_string(*version) : version.status().to_string();
    return fmt::format("{}|{}", nvls ? nvls : "(unset)", v);
  });
  KILN_ASSERT_OK(outcomes);
  for (const auto& o : *outcomes) KILN_ASSERT_OK(o.status);
  const std::string& bogus = (*outcomes)[0].result;
  EXPECT_TRUE(contains(bogus, "0|no CUDA driver: cannot load NCCL from /nowhere/libnccl-bogus.so.2")) << bogus;
  EXPECT_TRUE(contains((*outcomes)[1].result, "7|")) << (*outcomes)[1].result;
  expect_no_children();
}

TEST(NcclLoader, TheRealLibraryLoads) {
  auto version = nccl_version();
  if (!version.ok() && version.status().code() == ErrorCode::kNoDriver) {
    GTEST_SKIP() << "NCCL is not installed here: " << version.status().to_string();
  }
  KILN_ASSERT_OK(version);
  EXPECT_GE(*version, 22700);
  KILN_ASSERT_OK_AND_ASSIGN(const detail::NcclApi* api, detail::nccl());
  EXPECT_EQ(api->version, *version);
  EXPECT_NE(api->ncclAllReduce, nullptr);
  // Symmetric memory arrived in NCCL 2.27; the optional entry points resolve whenever the library has them.
  EXPECT_EQ(api->has_symmetric_memory(), *version >= 22700);
}

TEST(NcclLoader, UniqueIdsNeedNoGpu) {
  if (auto v = nccl_version(); !v.ok()) GTEST_SKIP() << "NCCL is not installed here: " << v.status().to_string();
  // ncclGetUniqueId starts a bootstrap thread that lives until the ranks connect; a rank process keeps it out
  // of this test process.
  auto outcomes = run_local_group(process_group(1), [](int, Communicator*) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(NcclId a, nccl_unique_id());
    KILN_ASSIGN_OR_RETURN(NcclId b, nccl_unique_id());
    return std::string(a.data(), a.size()) + std::string(b.data(), b.size());
  });
  KILN_ASSERT_OK(outcomes);
  const RankOutcome& o = (*outcomes)[0];
  if (!o.status.ok() && o.status.code() == ErrorCode::kLibraryError && contains(o.status.message(), "interface")) {
    GTEST_SKIP() << "NCCL finds no network interface for its bootstrap here (it needs one even on one host): "
                 << o.status.to_string();
  }
  KILN_ASSERT_OK(o.status);
  ASSERT_EQ(o.result.size(), 2 * sizeof(NcclId));
  std::string a = o.result.substr(0, sizeof(NcclId)), b = o.result.substr(sizeof(NcclId));
  EXPECT_NE(a, std::string(sizeof(NcclId), '\0'));
  EXPECT_NE(a, b) << "two unique ids were equal";
  expect_no_children();
}

TEST(NcclLoader, KilnDtypesMapToNcclTypes) {
  EXPECT_EQ(*detail::nccl_dtype(templates::DType::kF16), ncclFloat16);
  EXPECT_EQ(*detail::nccl_dtype(templates::DType::kBF16), ncclBfloat16);
  EXPECT_EQ(*detail::nccl_dtype(templates::DType::kF32), ncclFloat32);
}

// ---- run_local_group

TEST(LocalGroup, EveryRankReturnsItsOwnPayloadFromItsOwnProcess) {
  const size_t fds_before = open_fds();
  auto outcomes = run_local_group(process_group(3), [](int rank, Communicator* comm) -> Result<std::string> {
    if (comm != nullptr) return make_error(ErrorCode::kInternal, "nccl=false gave a communicator");
    return fmt::format("{}:{}:{}", rank, rank * rank + 1, ::getpid());
  });
  KILN_ASSERT_OK(outcomes);
  ASSERT_EQ(outcomes->size(), 3u);
  std::set<std::string> pids;
  for (int r = 0; r < 3; ++r) {
    const RankOutcome& o = (*outcomes)[static_cast<size_t>(r)];
    EXPECT_EQ(o.rank, r);
    KILN_EXPECT_OK(o.status);
    std::string prefix = fmt::format("{}:{}:", r, r * r + 1);
    ASSERT_TRUE(contains(o.result, prefix)) << o.result;
    std::string pid = o.result.substr(prefix.size());
    EXPECT_NE(pid, std::to_string(::getpid())) << "rank " << r << " ran in the calling process";
    pids.insert(pid);
  }
  EXPECT_EQ(pids.size(), 3u) << "every rank runs in a process of its own";
  expect_no_children();
  EXPECT_EQ(open_fds(), fds_before) << "the group's sockets must all be closed";
}

TEST(LocalGroup, ResultsLargerThanASocketBufferArriveWhole) {
  auto outcomes = run_local_group(process_group(2), [](int rank, Communicator*) -> Result<std::string> {
    std::string big(3 << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 31 + static_cast<size_t>(rank)) & 0xff);
    return big;
  });
  KILN_ASSERT_OK(outcomes);
  for (int r = 0; r < 2; ++r) {
    const RankOutcome& o = (*outcomes)[static_cast<size_t>(r)];
    KILN_ASSERT_OK(o.status);
    ASSERT_EQ(o.result.size(), size_t{3} << 20);
    bool same = true;
    for (size_t i = 0; i < o.result.size() && same; ++i) {
      same = o.result[i] == static_cast<char>((i * 31 + static_cast<size_t>(r)) & 0xff);
    }
    EXPECT_TRUE(same) << "rank " << r << "'s result was corrupted in transit";
  }
  expect_no_children();
}

TEST(LocalGroup, AnErrorStaysWithItsRankAndTheOthersStillSucceed) {
  // Rank 1 fails only after the others have sent their byte, i.e. after their work is done: their success
  // cannot depend on how quickly they are scheduled against the grace period.
  Pipe done;
  auto outcomes = run_local_group(process_group(3), [&](int rank, Communicator*) -> Result<std::string> {
    if (rank != 1) {
      if (::write(done.write_end(), "x", 1) != 1) return make_error(ErrorCode::kIoError, "write");
      return fmt::format("fine {}", rank);
    }
    char buf[2];
    for (size_t got = 0; got < 2;) {
      ssize_t n = ::read(done.read_end(), buf, 2 - got);
      if (n > 0) got += static_cast<size_t>(n);
    }
    Status st = make_error(ErrorCode::kWrongResult, "rank 1 disagrees", "a long detail\nover lines");
    st.with_context("while checking");
    return st;
  });
  KILN_ASSERT_OK(outcomes);
  const Status& failed = (*outcomes)[1].status;
  EXPECT_EQ(failed.code(), ErrorCode::kWrongResult);
  EXPECT_EQ(failed.message(), "rank 1 disagrees");
  EXPECT_EQ(failed.detail(), "a long detail\nover lines");
  EXPECT_EQ(failed.context(), std::vector<std::string>{"while checking"});
  EXPECT_TRUE((*outcomes)[1].result.empty());
  for (int r : {0, 2}) {
    KILN_EXPECT_OK((*outcomes)[static_cast<size_t>(r)].status);
    EXPECT_EQ((*outcomes)[static_cast<size_t>(r)].result, fmt::format("fine {}", r));
  }
  expect_no_children();
}

TEST(LocalGroup, ACrashIsReportedWithItsSignalAndBlockedRanksAreKilledAfterTheGrace) {
  Pipe never;
  GroupOptions o = process_group(3);
  o.grace = 300ms;
  auto [outcomes, elapsed] = run_timed(o, [&](int rank, Communicator*) -> Result<std::string> {
    if (rank == 1) {
      ::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the signal into an exit status
      ::raise(SIGSEGV);
    }
    return block_forever(never);
  });
  KILN_ASSERT_OK(outcomes);
  const Status& crashed = (*outcomes)[1].status;
  EXPECT_EQ(crashed.code(), ErrorCode::kWorkerCrashed);
  EXPECT_TRUE(contains(crashed.message(), "rank 1 killed by signal 11")) << crashed.to_string();
  for (int r : {0, 2}) {
    const Status& killed = (*outcomes)[static_cast<size_t>(r)].status;
    EXPECT_EQ(killed.code(), ErrorCode::kCancelled) << killed.to_string();
    EXPECT_TRUE(contains(killed.message(), "killed: rank 1 failed first (")) << killed.message();
    EXPECT_TRUE(contains(killed.message(), "signal 11")) << killed.message();
  }
  EXPECT_GE(elapsed, o.grace) << "the blocked ranks were killed before their grace period ended";
  EXPECT_LT(elapsed, o.timeout);
  expect_no_children();
}

TEST(LocalGroup, AnErrorStartsTheGracePeriodToo) {
  Pipe never;
  GroupOptions o = process_group(2);
  o.grace = 200ms;
  auto outcomes = run_local_group(o, [&](int rank, Communicator*) -> Result<std::string> {
    if (rank == 0) return make_error(ErrorCode::kUnavailable, "no luck");
    return block_forever(never);
  });
  KILN_ASSERT_OK(outcomes);
  EXPECT_EQ((*outcomes)[0].status.code(), ErrorCode::kUnavailable);
  const Status& killed = (*outcomes)[1].status;
  EXPECT_EQ(killed.code(), ErrorCode::kCancelled);
  EXPECT_EQ(killed.message(), "killed: rank 0 failed first (unavailable: no luck)");
  expect_no_children();
}

TEST(LocalGroup, ExitingWithoutAnOutcomeOrThrowingIsAFailure) {
  auto outcomes = run_local_group(process_group(3), [](int rank, Communicator*) -> Result<std::string> {
    if (rank == 0) ::_exit(7);
    if (rank == 1) throw std::runtime_error("boom");
    return std::string("ok");
  });
  KILN_ASSERT_OK(outcomes);
  const Status& exited = (*outcomes)[0].status;
  EXPECT_EQ(exited.code(), ErrorCode::kWorkerCrashed);
  EXPECT_TRUE(contains(exited.message(), "rank 0 exited with status 7 before reporting an outcome"))
      << exited.to_string();
  const Status& threw = (*outcomes)[1].status;
  EXPECT_EQ(threw.code(), ErrorCode::kInternal);
  EXPECT_TRUE(contains(threw.message(), "threw: boom")) << threw.to_string();
  KILN_EXPECT_OK((*outcomes)[2].status);
  EXPECT_EQ((*outcomes)[2].result, "ok");
  expect_no_children();
}

TEST(LocalGroup, RanksStillRunningAtTheTimeoutAreKilled) {
  Pipe never;
  GroupOptions o = process_group(2);
  o.timeout = 300ms;
  auto [outcomes, elapsed] = run_timed(o, [&](int, Communicator*) { return block_forever(never); });
  KILN_ASSERT_OK(outcomes);
  for (const RankOutcome& out : *outcomes) {
    EXPECT_EQ(out.status.code(), ErrorCode::kTimeout) << out.status.to_string();
    EXPECT_EQ(out.status.message(), "timed out after 300 ms");
  }
  EXPECT_GE(elapsed, o.timeout);
  expect_no_children();
}

TEST(LocalGroup, TheCrashTracePrintsACrashingRanksStackOnlyWhenAskedFor) {
  // Each rank's stderr goes to a pipe of its own; rank 0 has $KILN_CRASH_TRACE, rank 1 not. Both crash.
  Pipe err[2];
  auto outcomes = run_local_group(process_group(2), [&](int rank, Communicator*) -> Result<std::string> {
    if (rank == 0) ::setenv("KILN_CRASH_TRACE", "1", 1);
    else ::unsetenv("KILN_CRASH_TRACE");
    ::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the signal into an exit status
    install_crash_trace();
    if (::dup2(err[rank].write_end(), 2) < 0) return make_error(ErrorCode::kIoError, "dup2");
    ::raise(SIGSEGV);
    return make_error(ErrorCode::kInternal, "survived SIGSEGV");
  });
  KILN_ASSERT_OK(outcomes);
  std::string printed[2];
  for (int r = 0; r < 2; ++r) {
    // The traced rank still dies of its signal: the handler restores the default action and raises again.
    const Status& crashed = (*outcomes)[static_cast<size_t>(r)].status;
    EXPECT_EQ(crashed.code(), ErrorCode::kWorkerCrashed) << crashed.to_string();
    EXPECT_TRUE(contains(crashed.message(), fmt::format("rank {} killed by signal 11", r))) << crashed.to_string();
    ::close(err[r].fds[1]);
    err[r].fds[1] = -1;
    char buf[4096];
    for (ssize_t n; (n = ::read(err[r].read_end(), buf, sizeof buf)) > 0;) printed[r].append(buf, static_cast<size_t>(n));
  }
  const std::string expected = "kiln crash trace: signal 11 in pid ";
  EXPECT_TRUE(contains(printed[0], expected)) << printed[0];
  EXPECT_TRUE(contains(printed[0], "  #0 ")) << printed[0];
  EXPECT_FALSE(contains(printed[1], expected)) << printed[1];
  expect_no_children();
}

TEST(LocalGroup, AnUnboundedTimeoutAndGraceAreAccepted) {
  GroupOptions o = process_group(2);
  o.timeout = std::chrono::milliseconds::max();
  o.grace = std::chrono::milliseconds::max();
  auto outcomes = run_local_group(o, [](int rank, Communicator*) -> Result<std::string> {
    if (rank == 1) return make_error(ErrorCode::kUnavailable, "fails at once");
    return std::string("done");
  });
  KILN_ASSERT_OK(outcomes);
  KILN_EXPECT_OK((*outcomes)[0].status);
  EXPECT_EQ((*outcomes)[1].status.code(), ErrorCode::kUnavailable);
  expect_no_children();
}

TEST(LocalGroup, BadOptionsAreRejectedBeforeAnythingStarts) {
  auto fn = [](int, Communicator*) -> Result<std::string> { return std::string(); };
  GroupOptions none = process_group(0);
  EXPECT_EQ(run_local_group(none, fn).status().code(), ErrorCode::kInvalidArgument);
  GroupOptions devices = process_group(2);
  devices.devices = {0};
  EXPECT_EQ(run_local_group(devices, fn).status().code(), ErrorCode::kInvalidArgument);
  GroupOptions zero_timeout = process_group(1);
  zero_timeout.timeout = 0ms;
  EXPECT_EQ(run_local_group(zero_timeout, fn).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(run_local_group(process_group(1), RankFunction()).status().code(), ErrorCode::kInvalidArgument);
  expect_no_children();
}

TEST(LocalGroup, RanksDieWithTheirParent) {
  // An intermediate process runs a group whose rank reports its pid and blocks; killing the intermediate
  // must take the rank with it. The rank is watched through a pidfd opened while it is known to be alive.
  Pipe pids;
  Pipe never;
  pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    (void)run_local_group(process_group(1), [&](int, Communicator*) -> Result<std::string> {
      pid_t me = ::getpid();
      if (::write(pids.write_end(), &me, sizeof me) != sizeof me) return make_error(ErrorCode::kIoError, "write");
      return block_forever(never);
    });
    ::_exit(0);
  }
  pid_t rank_pid = 0;
  ASSERT_EQ(::read(pids.read_end(), &rank_pid, sizeof rank_pid), static_cast<ssize_t>(sizeof rank_pid));
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, rank_pid, 0));
  if (pidfd < 0) {
    ::kill(middle, SIGKILL);
    ::waitpid(middle, nullptr, 0);
    GTEST_SKIP() << "pidfd_open is unavailable here (" << std::strerror(errno) << "); cannot watch a grandchild";
  }
  ASSERT_EQ(::kill(middle, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);
  // Bounded by a minute only so that a failure cannot hang the suite; the rank dies at once when it works.
  pollfd p{pidfd, POLLIN, 0};
  int ready = ::poll(&p, 1, 60'000);
  ::close(pidfd);
  EXPECT_EQ(ready, 1) << "rank " << rank_pid << " outlived its parent";
  if (ready != 1) ::kill(rank_pid, SIGKILL);
  expect_no_children();
}

TEST(LocalGroup, WithNcclButNoDriverEveryRankSaysWhy) {
  // Whether this machine has a usable GPU is asked in a rank, never here: CUDA initialised in this process
  // would be unusable in the ranks forked after it.
  auto probe = run_local_group(process_group(1), [](int, Communicator*) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(int n, device_count());
    return std::to_string(n);
  });
  KILN_ASSERT_OK(probe);
  if ((*probe)[0].status.ok()) GTEST_SKIP() << "this machine has a GPU; test_runtime_comm_gpu covers it";
  auto nccl_present = nccl_version();

  GroupOptions o = process_group(3);
  o.nccl = true;
  auto outcomes = run_local_group(o, [](int, Communicator*) -> Result<std::string> {
    return make_error(ErrorCode::kInternal, "the function ran without a communicator");
  });
  KILN_ASSERT_OK(outcomes);
  const Status& first = (*outcomes)[0].status;
  if (first.code() == ErrorCode::kLibraryError && contains(first.message(), "interface")) {
    GTEST_SKIP() << "NCCL finds no network interface for its bootstrap here: " << first.to_string();
  }
  for (const RankOutcome& out : *outcomes) {
    ASSERT_FALSE(out.status.ok()) << "rank " << out.rank;
    EXPECT_NE(out.status.message(), "the function ran without a communicator");
    if (nccl_present.ok()) {
      // Rank 0 made the id and every rank received it: each one stopped at the missing CUDA driver.
      EXPECT_EQ(out.status.code(), ErrorCode::kNoDriver) << out.status.to_string();
      EXPECT_TRUE(contains(out.status.message(), "libcuda")) << out.status.to_string();
    }
  }
  expect_no_children();
}

}  // namespace
}  // namespace kiln::runtime
