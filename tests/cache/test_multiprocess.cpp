// Many processes, one cache: 8 processes tune overlapping entries at once and converge on the same
// content; writers and readers killed with SIGKILL mid-write leave a database that reopens with every
// acknowledged entry intact and every stored value valid. The test decides each kill point from the
// worker's own output lines (pipes), never from timing.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "cache_test_util.h"
#include "kiln/cache/store.h"
#include "kiln_test.h"
#include "worker_entries.h"

extern char** environ;

namespace kiln::cache {
namespace {

using testing::store_options;
using testing::TempDir;

// A child process with its stdin and stdout on pipes; killed and reaped if still running at destruction.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill_now();
      (void)wait();
    }
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  bool send(const std::string& line) {
    std::string s = line + "\n";
    return ::write(to_, s.data(), s.size()) == ssize_t(s.size());
  }
  /// The next line, or nullopt at end of output. Waits at most a minute, so a broken worker fails the test
  /// instead of hanging it (this bounds a failure; no outcome depends on it).
  std::optional<std::string> line() {
    while (true) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, 60000) <= 0) return std::nullopt;
      char chunk[4096];
      ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buf_.append(chunk, size_t(n));
    }
  }
  void kill_now() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }
  /// The exit code, or 128 + the signal.
  int wait() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buf_;
};

TEST(MultiProcess, EightProcessesTuneOneCacheAndConverge) {
  constexpr int kProcs = 8, kProblems = 24, kChoices = 3;
  TempDir dir;
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < kProcs; ++i) {
    workers.push_back(std::make_unique<Child>(std::vector<std::string>{
        KILN_CACHE_WORKER, "tune", dir.path(), std::to_string(i), std::to_string(kProblems), std::to_string(kChoices)}));
    ASSERT_TRUE(workers.back()->started());
  }
  int writers = 0;
  for (auto& w : workers) {
    auto l = w->line();
    ASSERT_TRUE(l && l->rfind("ready", 0) == 0) << l.value_or("(no output)");
    writers += *l == "ready writer";
  }
  EXPECT_EQ(writers, 1);
  for (auto& w : workers) ASSERT_TRUE(w->send("go"));  // all tune at once
  // Each process writes what it measured and a decision per problem. What it finds already measured by another
  // (the writer ingests the readers' entries every 100 ms, so a slow run sees some) it does not measure again:
  // written + found covers every entry, and every problem gets its decision.
  for (auto& w : workers) {
    auto l = w->line();
    ASSERT_TRUE(l && l->rfind("done ", 0) == 0) << l.value_or("(no output)");
    int written = -1, found = -1;
    ASSERT_EQ(std::sscanf(l->c_str(), "done %d %d", &written, &found), 2) << *l;
    EXPECT_EQ(written + found, kProblems * (2 * kChoices + 1)) << *l;
    EXPECT_GE(written, kProblems) << *l;
  }
  for (auto& w : workers) ASSERT_TRUE(w->send("sync"));
  for (auto& w : workers) {
    auto l = w->line();
    ASSERT_EQ(l.value_or("(no output)"), "synced");
  }
  for (auto& w : workers) ASSERT_TRUE(w->send("report"));
  std::set<std::string> reports;
  for (auto& w : workers) {
    auto l = w->line();
    ASSERT_TRUE(l && l->rfind("report", 0) == 0) << l.value_or("(no output)");
    reports.insert(*l);
  }
  ASSERT_EQ(reports.size(), 1u) << "processes ended with different decisions";
  std::istringstream fields(*reports.begin());
  std::string word, hash;
  int decisions = 0, timings = 0, binaries = 0, invalid = -1;
  fields >> word >> hash >> decisions >> timings >> binaries >> invalid;
  EXPECT_EQ(decisions, kProblems);
  EXPECT_EQ(timings, kProblems * kChoices);
  EXPECT_EQ(binaries, kProblems * kChoices);
  EXPECT_EQ(invalid, 0);
  for (auto& w : workers) ASSERT_TRUE(w->send("exit"));
  for (auto& w : workers) EXPECT_EQ(w->wait(), 0);

  // After everyone left, a fresh process sees the same content, and nothing is left staged.
  StoreOptions o;
  o.dir = dir.path();
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(o));
  auto s = test_worker::summarize(*store, kProblems, kChoices);
  EXPECT_EQ(fmt::format("{:016x}", s.hash), hash);
  EXPECT_EQ(s.decisions, kProblems);
  EXPECT_EQ(s.timings, kProblems * kChoices);
  EXPECT_EQ(s.binaries_ok, kProblems * kChoices);
  KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
  EXPECT_EQ(st.staged_batches, 0u);
  EXPECT_EQ(st.invalid, 0u);
}

// Reads the worker's lines after a kill: the acknowledged entries and the last one begun.
struct Progress {
  std::set<int> acked;
  int last_begun = -1;
  void see(const std::string& l) {
    if (l.rfind("ack ", 0) == 0) acked.insert(std::stoi(l.substr(4)));
    if (l.rfind("begin ", 0) == 0) last_begun = std::stoi(l.substr(6));
  }
};

// Runs one `write` worker from entry `first`, kills it after `kill_after` lines, and returns what it said.
Progress run_and_kill(const std::string& dir, int first, int kill_after, bool expect_writer) {
  Child w({KILN_CACHE_WORKER, "write", dir, std::to_string(first), expect_writer ? "writer" : "auto"});
  Progress progress;
  auto ready = w.line();
  EXPECT_EQ(ready.value_or("(no output)"), expect_writer ? "ready writer" : "ready reader");
  for (int i = 0; i < kill_after; ++i) {
    auto l = w.line();
    if (!l) break;
    EXPECT_EQ(l->rfind("error", 0), std::string::npos) << *l;
    progress.see(*l);
  }
  w.kill_now();
  EXPECT_EQ(w.wait(), 128 + SIGKILL);
  // What it printed before dying is still in the pipe.
  while (auto l = w.line()) progress.see(*l);
  return progress;
}

void expect_intact(Store& store, const Progress& p, int first) {
  for (int k : p.acked) EXPECT_TRUE(test_worker::entry_complete(store, k)) << "acknowledged entry " << k << " lost";
  // Entries before the one in flight are all complete; the one in flight may be partly there.
  for (int k = first; k < p.last_begun; ++k) EXPECT_TRUE(test_worker::entry_complete(store, k)) << k;
  auto st = store.stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->invalid, 0u) << "a stored value fails its checks";
}

TEST(MultiProcess, WriterKilledMidWrite50Times) {
  TempDir dir;
  int first = 0;
  std::set<int> all_acked;
  for (int i = 0; i < 50; ++i) {
    // Kill points walk through every phase: before, inside and after a put, and inside a flush.
    int kill_after = 1 + (i * 7) % 17;
    Progress p = run_and_kill(dir.path(), first, kill_after, true);
    all_acked.insert(p.acked.begin(), p.acked.end());
    StoreOptions o;
    o.dir = dir.path();
    o.role = Role::kWriter;
    auto store = Store::open(o);
    ASSERT_TRUE(store.ok()) << "iteration " << i << ": " << store.status().to_string();
    expect_intact(**store, p, first);
    if (::testing::Test::HasFailure()) return;
    first = std::max(first, p.last_begun + 1);
  }
  // Everything acknowledged across all 50 runs is still there.
  StoreOptions o;
  o.dir = dir.path();
  KILN_ASSERT_OK_AND_ASSIGN(auto store, Store::open(o));
  for (int k : all_acked) EXPECT_TRUE(test_worker::entry_complete(*store, k)) << k;
  EXPECT_GT(all_acked.size(), 50u);
}

TEST(MultiProcess, ReaderKilledMidStageLeavesNoDebris) {
  TempDir dir;
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(dir)));
  ASSERT_TRUE(writer->is_writer());
  int first = 0;
  for (int i = 0; i < 10; ++i) {
    Progress p = run_and_kill(dir.path(), first, 1 + (i * 5) % 11, false);
    KILN_ASSERT_OK(writer->sync());  // ingests what the dead reader published; removes what it did not
    expect_intact(*writer, p, first);
    for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/staging")) {
      ADD_FAILURE() << "left in staging: " << e.path().filename();
    }
    if (::testing::Test::HasFailure()) return;
    first = std::max(first, p.last_begun + 1);
  }
}

}  // namespace
}  // namespace kiln::cache
