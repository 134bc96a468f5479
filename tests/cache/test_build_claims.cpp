// Build claims (kiln/cache/build_claims.h): lease files that make one process the builder of a key. Every test
// drives time with a fake clock and process liveness with a fake table, except the last, which forks a real
// process and checks that its claim is taken over once it has exited.
#include "kiln/cache/build_claims.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cache_test_util.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using std::chrono::milliseconds;

KernelKey key_of(uint64_t i) { return KernelKey{0x1234, i + 1}; }

// A shared fake world: one clock, and which pids are alive.
struct World {
  std::atomic<int64_t> now{1'000'000};
  std::mutex mu;
  std::map<int64_t, bool> alive;

  ClaimOwner owner(int64_t pid, std::string host = "host-a/pid:[1]", std::string boot = "boot-1") {
    std::lock_guard lock(mu);
    alive[pid] = true;
    return ClaimOwner{std::move(host), std::move(boot), pid, uint64_t(pid) * 7};
  }
  void kill(int64_t pid) {
    std::lock_guard lock(mu);
    alive[pid] = false;
  }
  ClaimOptions options(const std::string& dir, ClaimOwner self) {
    ClaimOptions o;
    o.dir = dir;
    o.lease = milliseconds(30000);
    o.built_grace = milliseconds(10000);
    o.failure_ttl = milliseconds(60000);
    o.renew_thread = false;
    o.now_ms = [this] { return now.load(); };
    o.self = std::move(self);
    o.is_alive = [this](const ClaimOwner& who) {
      std::lock_guard lock(mu);
      auto it = alive.find(who.pid);
      return it != alive.end() && it->second;
    };
    return o;
  }
  std::unique_ptr<ClaimDir> open(const std::string& dir, ClaimOwner self) {
    auto d = ClaimDir::open(options(dir, std::move(self)));
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return std::move(d).value();
  }
};

ClaimState state_of(ClaimDir& d, const KernelKey& k) {
  auto a = d.claim(k);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? a->state : ClaimState::kMine;
}

TEST(BuildClaims, FirstClaimantBuildsTheOthersAreToldWho) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100));
  auto b = w.open(tmp.path(), w.owner(200));
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer first, a->claim(key_of(1)));
  EXPECT_EQ(first.state, ClaimState::kMine);
  EXPECT_FALSE(first.took_over);
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer second, b->claim(key_of(1)));
  EXPECT_EQ(second.state, ClaimState::kHeld);
  EXPECT_NE(second.holder.find("pid 100"), std::string::npos) << second.holder;
  EXPECT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);  // asking again for one's own claim
  EXPECT_EQ(state_of(*b, key_of(2)), ClaimState::kMine);  // other keys are free
  EXPECT_TRUE(fs::exists(fs::path(tmp.path()) / key_of(1).hex()));
}

TEST(BuildClaims, BuiltMarkerMakesOthersWaitForTheBinaryThenExpires) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100));
  auto b = w.open(tmp.path(), w.owner(200));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  KILN_ASSERT_OK(a->release(key_of(1), ClaimDir::Outcome::kBuilt));
  EXPECT_TRUE(a->held().empty());
  w.kill(100);  // a built marker does not depend on its builder staying alive
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kBuilt);
  w.now += 10001;  // the binary never became visible within the grace: b builds it
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer late, b->claim(key_of(1)));
  EXPECT_EQ(late.state, ClaimState::kMine);
  EXPECT_TRUE(late.took_over);
}

TEST(BuildClaims, RecordedFailureReachesWaitersUntilItExpires) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100));
  auto b = w.open(tmp.path(), w.owner(200));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  KILN_ASSERT_OK(a->release(key_of(1), ClaimDir::Outcome::kFailed,
                            make_error(ErrorCode::kCompileError, "error: identifier \"x\" is undefined", "line 1\nline 2\\")));
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer got, b->claim(key_of(1)));
  ASSERT_EQ(got.state, ClaimState::kFailed);
  EXPECT_EQ(got.failure.code(), ErrorCode::kCompileError);
  EXPECT_EQ(got.failure.message(), "error: identifier \"x\" is undefined");
  EXPECT_EQ(got.failure.detail(), "line 1\nline 2\\");
  EXPECT_EQ(b->counters().failures_read, 1u);
  w.now += 60001;
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kMine);  // retried once the record is old
}

TEST(BuildClaims, AbandonedClaimIsFreeAtOnce) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100));
  auto b = w.open(tmp.path(), w.owner(200));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  KILN_ASSERT_OK(a->release(key_of(1), ClaimDir::Outcome::kAbandoned));
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer got, b->claim(key_of(1)));
  EXPECT_EQ(got.state, ClaimState::kMine);
  EXPECT_FALSE(got.took_over);
}

TEST(BuildClaims, DeadOwnerOnThisHostIsTakenOverWithoutWaitingForTheLease) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100));
  auto b = w.open(tmp.path(), w.owner(200));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kHeld);
  w.kill(100);
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer got, b->claim(key_of(1)));
  EXPECT_EQ(got.state, ClaimState::kMine);
  EXPECT_TRUE(got.took_over);
  EXPECT_EQ(b->counters().took_over, 1u);
}

TEST(BuildClaims, RebootedHostsClaimsAreStale) {
  TempDir tmp;
  World w;
  auto before = w.open(tmp.path(), w.owner(100, "host-a/pid:[1]", "boot-1"));
  ASSERT_EQ(state_of(*before, key_of(1)), ClaimState::kMine);
  // Same pid after a reboot, and alive: the boot id tells the claim is from before.
  auto after = w.open(tmp.path(), w.owner(100, "host-a/pid:[1]", "boot-2"));
  EXPECT_EQ(state_of(*after, key_of(1)), ClaimState::kMine);
}

TEST(BuildClaims, OtherHostsClaimLastsItsLeasePlusTheSkew) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100, "host-a/pid:[1]"));
  ClaimOptions ob = w.options(tmp.path(), w.owner(100, "host-b/pid:[1]"));  // same pid number, other host
  ob.clock_skew = milliseconds(5000);
  KILN_ASSERT_OK_AND_ASSIGN(auto b, ClaimDir::open(ob));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  w.kill(100);  // liveness is never judged across hosts
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kHeld);
  w.now += 30000 + 5000;
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kHeld);
  w.now += 1;
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kMine);
}

TEST(BuildClaims, RenewalKeepsAClaimPastItsFirstLease) {
  TempDir tmp;
  World w;
  auto a = w.open(tmp.path(), w.owner(100, "host-a/pid:[1]"));
  auto b = w.open(tmp.path(), w.owner(200, "host-b/pid:[1]"));
  ASSERT_EQ(state_of(*a, key_of(1)), ClaimState::kMine);
  ASSERT_EQ(state_of(*a, key_of(2)), ClaimState::kMine);
  w.now += 9999;
  EXPECT_EQ(a->renew_due(), 0u);  // not due before a third of the lease
  w.now += 1;
  EXPECT_EQ(a->renew_due(), 2u);
  KILN_ASSERT_OK(a->release(key_of(2), ClaimDir::Outcome::kAbandoned));
  w.now += 25000;  // 35 s after the claim, 25 s after the renewal
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kHeld);
  w.now += 5001;   // the renewed lease ran out: a stopped or partitioned builder loses its claim
  EXPECT_EQ(state_of(*b, key_of(1)), ClaimState::kMine);
  // The old owner's late release must not touch the claim that is b's now.
  KILN_ASSERT_OK(a->release(key_of(1), ClaimDir::Outcome::kBuilt));
  auto c = w.open(tmp.path(), w.owner(300, "host-c/pid:[1]"));
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer seen, c->claim(key_of(1)));
  EXPECT_EQ(seen.state, ClaimState::kHeld);
  EXPECT_NE(seen.holder.find("pid 200"), std::string::npos) << seen.holder;
  // And the old owner's renewals stop: it no longer holds the key.
  w.now += 20000;
  EXPECT_EQ(a->renew_due(), 0u);
}

TEST(BuildClaims, LeftoversOfACrashedRunAreCleanedAtOpen) {
  TempDir tmp;
  World w;
  {
    auto crashed = w.open(tmp.path(), w.owner(100));
    ASSERT_EQ(state_of(*crashed, key_of(1)), ClaimState::kMine);
    ASSERT_EQ(state_of(*crashed, key_of(2)), ClaimState::kMine);
    auto live = w.open(tmp.path(), w.owner(200));
    ASSERT_EQ(state_of(*live, key_of(3)), ClaimState::kMine);
    // Leave the claims as a SIGKILL would: the objects are never destroyed, so their claims are never released.
    // Kept reachable from a static (no renewal thread runs in these options), so LeakSanitizer does not count
    // them as leaks.
    w.kill(100);
    static auto* killed = new std::vector<ClaimDir*>();  // never destroyed: still reachable at exit
    killed->push_back(crashed.release());
    killed->push_back(live.release());
  }
  // A half-written temporary file from an hour ago, and a claim file that is no claim.
  const fs::path junk_tmp = fs::path(tmp.path()) / ".tmp-100-dead-0";
  std::ofstream(junk_tmp) << "kiln-claim 1\nstate buil";
  struct utimbuf old_times{::time(nullptr) - 3600, ::time(nullptr) - 3600};
  ASSERT_EQ(::utime(junk_tmp.c_str(), &old_times), 0);
  std::ofstream(fs::path(tmp.path()) / key_of(4).hex()) << "not a claim";
  const fs::path fresh_tmp = fs::path(tmp.path()) / ".tmp-200-live-0";  // a live writer's, just made
  std::ofstream(fresh_tmp) << "x";

  auto next = w.open(tmp.path(), w.owner(300));
  EXPECT_EQ(next->counters().cleaned, 4u);  // keys 1, 2 (dead owner), key 4 (junk), the old temporary file
  EXPECT_FALSE(fs::exists(fs::path(tmp.path()) / key_of(1).hex()));
  EXPECT_FALSE(fs::exists(fs::path(tmp.path()) / key_of(2).hex()));
  EXPECT_FALSE(fs::exists(fs::path(tmp.path()) / key_of(4).hex()));
  EXPECT_FALSE(fs::exists(junk_tmp));
  EXPECT_TRUE(fs::exists(fresh_tmp));
  EXPECT_TRUE(fs::exists(fs::path(tmp.path()) / key_of(3).hex()));  // pid 200 lives
  EXPECT_EQ(state_of(*next, key_of(3)), ClaimState::kHeld);
}

TEST(BuildClaims, UnusableFolderIsAnErrorNamingIt) {
  TempDir tmp;
  World w;
  const fs::path file = fs::path(tmp.path()) / "a-file";
  std::ofstream(file) << "x";
  auto d = ClaimDir::open(w.options((file / "claims").string(), w.owner(100)));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kIoError);
  EXPECT_NE(d.status().message().find("a-file"), std::string::npos) << d.status().to_string();
  // A folder that goes away under a running process: claims fail as values.
  auto ok = w.open((fs::path(tmp.path()) / "claims").string(), w.owner(100));
  fs::remove_all(fs::path(tmp.path()) / "claims");
  std::ofstream(fs::path(tmp.path()) / "claims") << "now a file";
  EXPECT_EQ(ok->claim(key_of(1)).status().code(), ErrorCode::kIoError);
}

TEST(BuildClaims, EightClaimantsRacingOverTwoHundredKeysGiveEachKeyOneBuilder) {
  TempDir tmp;
  World w;
  constexpr int kProcs = 8, kKeys = 200;
  std::vector<std::unique_ptr<ClaimDir>> dirs;
  for (int p = 0; p < kProcs; ++p) dirs.push_back(w.open(tmp.path(), w.owner(100 + p)));
  std::vector<std::atomic<int>> builders(kKeys);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int p = 0; p < kProcs; ++p) {
    threads.emplace_back([&, p] {
      std::vector<int> order(kKeys);
      for (int i = 0; i < kKeys; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937(p));
      for (int i : order) {
        auto a = dirs[p]->claim(key_of(i));
        if (!a.ok()) failed = true;
        else if (a->state == ClaimState::kMine) ++builders[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(failed);
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(builders[i].load(), 1) << "key " << i;
}

TEST(BuildClaims, EnvironmentSwitchAndLease) {
  ::unsetenv("KILN_BUILD_CLAIMS");
  EXPECT_TRUE(*build_claims_from_env());
  ::setenv("KILN_BUILD_CLAIMS", "off", 1);
  EXPECT_FALSE(*build_claims_from_env());
  ::setenv("KILN_BUILD_CLAIMS", "sometimes", 1);
  EXPECT_EQ(build_claims_from_env().status().code(), ErrorCode::kInvalidArgument);
  ::unsetenv("KILN_BUILD_CLAIMS");
  ::setenv("KILN_BUILD_CLAIM_LEASE", "120", 1);
  ::setenv("KILN_BUILD_CLAIM_SKEW", "2.5", 1);
  KILN_ASSERT_OK_AND_ASSIGN(ClaimOptions o, claim_options_from_env("/x/cache"));
  EXPECT_EQ(o.dir, "/x/cache/claims");
  EXPECT_EQ(o.lease, milliseconds(120000));
  EXPECT_EQ(o.clock_skew, milliseconds(2500));
  ::setenv("KILN_BUILD_CLAIM_LEASE", "soon", 1);
  EXPECT_EQ(claim_options_from_env("/x").status().code(), ErrorCode::kInvalidArgument);
  ::unsetenv("KILN_BUILD_CLAIM_LEASE");
  ::unsetenv("KILN_BUILD_CLAIM_SKEW");
}

// Real liveness (no fake): a claim written by a forked process that has exited is taken over at once.
TEST(BuildClaims, ClaimOfAnExitedProcessIsTakenOverWithRealLiveness) {
  TempDir tmp;
  ClaimOptions o;
  o.dir = tmp.path();
  o.renew_thread = false;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto d = ClaimDir::open(o);
    int ok = d.ok() && d.value()->claim(key_of(1)).ok() ? 1 : 0;
    (void)!::write(ready[1], &ok, sizeof ok);
    ::_exit(0);  // no destructor: the claim stays behind, as after a crash
  }
  int ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, sizeof ok), static_cast<ssize_t>(sizeof ok));
  ASSERT_EQ(ok, 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(ready[0]);
  ::close(ready[1]);
  KILN_ASSERT_OK_AND_ASSIGN(auto mine, ClaimDir::open(o));  // open cleans it up already
  EXPECT_EQ(mine->counters().cleaned, 1u);
  KILN_ASSERT_OK_AND_ASSIGN(ClaimAnswer a, mine->claim(key_of(1)));
  EXPECT_EQ(a.state, ClaimState::kMine);
  // This process itself is alive to a second ClaimDir in another process's eyes: a live claim is held.
  ClaimOptions other = o;
  ClaimOwner me = ClaimOwner::current();
  me.pid = 1;  // pretend to be another (live) process on this host: pid 1 always exists
  me.start_time = 0;
  other.self = me;
  KILN_ASSERT_OK_AND_ASSIGN(auto watcher, ClaimDir::open(other));
  EXPECT_EQ(state_of(*watcher, key_of(1)), ClaimState::kHeld);
}

}  // namespace
}  // namespace kiln::cache
