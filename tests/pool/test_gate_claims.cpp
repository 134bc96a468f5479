// One builder per key across processes: precompile gates with build claims (kiln/pool/build_claims.h over the
// cache folder's lease files, runtime::GateClaims). Simulated processes are gates in this process, each with
// its own claim identity and fake compiler, sharing a claims folder and a fake store; real processes are
// forked children (inline executors, no TBB after fork) sharing a folder, a file-per-binary store and a compile
// log. Outcomes never depend on timing: each key compiled exactly once, failures reach waiters, a killed
// builder's key is completed by another process.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "fakes.h"
#include "kiln/cache/build_claims.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/build_claims.h"
#include "kiln_test.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using pool_test::FakeCompiler;
using pool_test::named;

const Target kTarget{"sm_90a"};

struct TempDir {
  TempDir() {
    std::random_device rd;
    path = (fs::temp_directory_path() / fmt::format("kiln-claims-test-{}-{:08x}", ::getpid(), rd())).string();
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// The cache the simulated processes share: binaries by key.
struct FakeStore {
  std::mutex mu;
  std::map<KernelKey, Binary> binaries;
  std::optional<Result<Binary>> lookup(const KernelKey& k) {
    std::lock_guard lock(mu);
    auto it = binaries.find(k);
    if (it == binaries.end()) return std::nullopt;
    return Result<Binary>(it->second);
  }
  void put(const Binary& b) {
    std::lock_guard lock(mu);
    binaries[b.key] = b;
  }
};

// One simulated process: its identity, claims, compiler and gate.
struct Peer {
  FakeCompiler compiler;
  std::shared_ptr<runtime::GateClaims> claims;
  std::unique_ptr<PrecompileGate> gate;
};

std::unique_ptr<Peer> make_peer(const std::string& dir, int64_t pid, FakeStore& store, int threads = 2,
                                std::function<bool(const cache::ClaimOwner&)> alive = {},
                                std::function<int64_t()> now_ms = {}) {
  auto p = std::make_unique<Peer>();
  cache::ClaimOptions o;
  o.dir = dir;
  o.self = cache::ClaimOwner{"host-a/pid:[1]", "boot-1", pid, 1};
  o.is_alive = alive ? alive : [](const cache::ClaimOwner&) { return true; };
  o.renew_thread = false;
  o.now_ms = std::move(now_ms);
  auto d = cache::ClaimDir::open(o);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  p->claims = std::make_shared<runtime::GateClaims>(std::shared_ptr<cache::ClaimDir>(std::move(*d)));
  GateOptions g;
  g.executor = make_arena_executor({.threads = threads, .compile = p->compiler.fn()});
  g.lookup = [&store](const KernelKey& k, std::string_view) { return store.lookup(k); };
  g.on_compiled = [&store](const Binary& b) { store.put(b); };
  g.claims = p->claims;
  g.claim_poll_min = std::chrono::milliseconds(1);
  g.claim_poll_max = std::chrono::milliseconds(5);
  auto gate = PrecompileGate::create(std::move(g));
  EXPECT_TRUE(gate.ok());
  p->gate = std::move(*gate);
  return p;
}

TEST(GateClaims, EightProcessesOverOneWorkloadCompileEachKeyOnce) {
  TempDir tmp;
  FakeStore store;
  constexpr int kPeers = 8, kKeys = 120;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int p = 0; p < kPeers; ++p) peers.push_back(make_peer(tmp.path, 100 + p, store));
  std::vector<std::vector<Future<Binary>>> futures(kPeers);
  std::vector<std::thread> threads;
  for (int p = 0; p < kPeers; ++p) {
    threads.emplace_back([&, p] {
      // The same workload in the same order, as `kiln precompile` runs it in every process.
      for (int i = 0; i < kKeys; ++i) futures[p].push_back(peers[p]->gate->precompile(named(fmt::format("k{}", i)), kTarget));
    });
  }
  for (auto& t : threads) t.join();
  std::map<std::string, int> compiles;
  uint64_t waits = 0, hits = 0;
  for (int p = 0; p < kPeers; ++p) {
    for (int i = 0; i < kKeys; ++i) {
      KILN_ASSERT_OK_AND_ASSIGN(Binary b, futures[p][i].get());
      EXPECT_EQ(b.cubin, fmt::format("cubin:k{}", i));
    }
    for (const auto& name : peers[p]->compiler.order()) ++compiles[name];
    GateCounters c = peers[p]->gate->counters();
    waits += c.claim_waits;
    hits += c.claim_hits;
    EXPECT_EQ(c.claim_failures, 0u);
  }
  ASSERT_EQ(compiles.size(), size_t(kKeys));
  for (const auto& [name, n] : compiles) EXPECT_EQ(n, 1) << name << " compiled " << n << " times";
  EXPECT_EQ(store.binaries.size(), size_t(kKeys));
  // Every request that did not compile either waited and found the binary, or found it at once.
  EXPECT_EQ(hits, waits);
  for (auto& p : peers) EXPECT_TRUE(p->claims->dir().held().empty());
}

TEST(GateClaims, FailedCompileReachesTheWaiterInsteadOfACompile) {
  TempDir tmp;
  FakeStore store;
  auto a = make_peer(tmp.path, 100, store);
  auto b = make_peer(tmp.path, 200, store);
  a->compiler.block("bad");
  a->compiler.fail("bad");
  Future<Binary> fa = a->gate->precompile(named("bad"), kTarget);
  a->compiler.wait_started("bad");
  Future<Binary> fb = b->gate->precompile(named("bad"), kTarget);  // a holds the claim: b waits
  EXPECT_FALSE(fb.ready());
  a->compiler.release("bad");
  EXPECT_EQ(fa.get().status().code(), ErrorCode::kCompileError);
  const Result<Binary>& rb = fb.get();
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.status().code(), ErrorCode::kCompileError);
  EXPECT_NE(rb.status().message().find("fake error in 'bad'"), std::string::npos) << rb.status().to_string();
  EXPECT_EQ(b->compiler.calls(), 0);
  EXPECT_EQ(b->gate->counters().claim_failures, 1u);
}

TEST(GateClaims, CancelledBuildIsTakenOverByTheWaiter) {
  TempDir tmp;
  FakeStore store;
  auto a = make_peer(tmp.path, 100, store);
  auto b = make_peer(tmp.path, 200, store);
  a->compiler.block("k");
  Future<Binary> fa = a->gate->precompile(named("k"), kTarget);
  a->compiler.wait_started("k");
  Future<Binary> fb = b->gate->precompile(named("k"), kTarget);
  fa.cancel();  // a gives up: its claim goes back and b builds the key itself, nothing lost
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, fb.get());
  EXPECT_EQ(bin.cubin, "cubin:k");
  EXPECT_EQ(b->compiler.calls(), 1);
  EXPECT_EQ(b->gate->counters().claim_waits, 1u);
}

TEST(GateClaims, DeadBuildersKeyIsTakenOver) {
  TempDir tmp;
  FakeStore store;
  std::atomic<bool> a_alive{true};
  auto alive = [&](const cache::ClaimOwner& o) { return o.pid != 100 || a_alive.load(); };
  auto a = make_peer(tmp.path, 100, store, 2, alive);
  auto b = make_peer(tmp.path, 200, store, 2, alive);
  a->compiler.block("k");
  Future<Binary> fa = a->gate->precompile(named("k"), kTarget);
  a->compiler.wait_started("k");
  Future<Binary> fb = b->gate->precompile(named("k"), kTarget);
  a_alive = false;  // as if a were SIGKILLed: its claim stays, its pid is gone
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, fb.get());
  EXPECT_EQ(bin.cubin, "cubin:k");
  EXPECT_EQ(b->gate->counters().took_over, 1u);
  a->compiler.release("k");
  (void)fa.get();
}

TEST(GateClaims, BuiltBinaryThatNeverShowsUpIsBuiltAgainAfterTheGrace) {
  TempDir tmp;
  FakeStore lost, seen;  // a's binary goes where b never looks (a writer that died before applying it)
  std::atomic<int64_t> now{1'000'000};
  auto clock = [&] { return now.load(); };
  auto a = make_peer(tmp.path, 100, lost, 2, {}, clock);
  auto b = make_peer(tmp.path, 200, seen, 2, {}, clock);
  KILN_ASSERT_OK(a->gate->precompile(named("k"), kTarget).get().status());
  Future<Binary> fb = b->gate->precompile(named("k"), kTarget);  // "built": b waits for the binary
  EXPECT_EQ(b->gate->counters().claim_waits, 1u);
  now += 10001;  // the grace ran out with no binary: b builds it
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, fb.get());
  EXPECT_EQ(bin.cubin, "cubin:k");
  EXPECT_EQ(b->compiler.calls(), 1);
  EXPECT_EQ(b->gate->counters().took_over, 1u);
}

TEST(GateClaims, ShutdownEndsWaitsWithoutHanging) {
  TempDir tmp;
  FakeStore store;
  auto a = make_peer(tmp.path, 100, store);
  auto b = make_peer(tmp.path, 200, store);
  a->compiler.block("k");
  Future<Binary> fa = a->gate->precompile(named("k"), kTarget);
  a->compiler.wait_started("k");
  Future<Binary> fb = b->gate->precompile(named("k"), kTarget);
  b->gate.reset();
  EXPECT_EQ(fb.get().status().code(), ErrorCode::kShutdown);
  a->compiler.release("k");
  KILN_EXPECT_OK(fa.get().status());
}

TEST(GateClaims, ClaimsFolderThatFailsFallsBackToCompilingHere) {
  TempDir tmp;
  FakeStore store;
  const std::string dir = (fs::path(tmp.path) / "claims").string();
  auto a = make_peer(dir, 100, store);
  fs::remove_all(dir);
  std::ofstream(dir) << "a file where the claims folder was";
  std::vector<Future<Binary>> fs_;
  for (int i = 0; i < 5; ++i) fs_.push_back(a->gate->precompile(named(fmt::format("k{}", i)), kTarget));
  for (auto& f : fs_) KILN_EXPECT_OK(f.get().status());
  EXPECT_EQ(a->compiler.calls(), 5);
  EXPECT_EQ(a->claims->errors(), 5u);  // one warning logged, every key compiled
}

// ---- Real processes (fork). A child uses only what it creates after the fork: an inline executor, an
// inline callback runner, its own claims (real identity and liveness) and a store of one file per binary.

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Appends one line atomically (O_APPEND) to the compile log shared by the children.
void log_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

// Runs in a forked child: precompiles kernels k0..k{n-1}; returns the exit code (0: all ok).
// `hang_on`: a kernel whose compile reports itself on `ready_fd` and then never returns (to be SIGKILLed).
int child_precompile(const std::string& root, int n, const std::string& hang_on = {}, int ready_fd = -1) {
  const fs::path bins = fs::path(root) / "bins";
  const std::string log = (fs::path(root) / "compiles.log").string();
  cache::ClaimOptions o;
  o.dir = (fs::path(root) / "claims").string();
  auto dir = cache::ClaimDir::open(o);
  if (!dir.ok()) return 3;
  CompileFn compile = [&](const KernelSource& s, const Target& t, const CompileSettings&) -> Result<Binary> {
    log_line(log, fmt::format("{} {}\n", s.name, ::getpid()));
    if (s.name == hang_on) {
      char c = 1;
      (void)!::write(ready_fd, &c, 1);
      for (;;) ::pause();
    }
    Binary b;
    b.key = make_key(s, t);
    b.name = s.name;
    b.arch = t.arch;
    b.cubin = "cubin:" + s.name;
    return b;
  };
  GateOptions g;
  g.executor = make_inline_executor(compile);
  g.callbacks = make_inline_runner();
  g.lookup = [&](const KernelKey& k, std::string_view) -> std::optional<Result<Binary>> {
    const std::string text = read_file(bins / k.hex());
    if (text.empty()) return std::nullopt;
    Binary b;
    b.key = k;
    b.cubin = text;
    return Result<Binary>(b);
  };
  g.on_compiled = [&](const Binary& b) {  // written aside and renamed: a reader sees all of it or nothing
    const fs::path tmp = bins / fmt::format(".{}-{}", b.key.hex(), ::getpid());
    std::ofstream(tmp) << b.cubin;
    fs::rename(tmp, bins / b.key.hex());
  };
  g.claims = std::make_shared<runtime::GateClaims>(std::shared_ptr<cache::ClaimDir>(std::move(*dir)));
  g.claim_poll_min = std::chrono::milliseconds(1);
  g.claim_poll_max = std::chrono::milliseconds(10);
  auto gate = PrecompileGate::create(std::move(g));
  if (!gate.ok()) return 4;
  std::vector<Future<Binary>> futures;
  for (int i = 0; i < n; ++i) futures.push_back((*gate)->precompile(named(fmt::format("k{}", i)), kTarget));
  for (int i = 0; i < n; ++i) {
    const Result<Binary>& r = futures[i].get();
    if (!r.ok() || r->cubin != fmt::format("cubin:k{}", i)) return 5;
  }
  return 0;
}

pid_t spawn(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

std::map<std::string, int> compile_counts(const std::string& root) {
  std::map<std::string, int> out;
  std::istringstream in(read_file(fs::path(root) / "compiles.log"));
  std::string name, pid;
  while (in >> name >> pid) ++out[name];
  return out;
}

TEST(GateClaimsProcesses, SixForkedProcessesCompileEachKeyOnce) {
  TempDir tmp;
  fs::create_directories(fs::path(tmp.path) / "bins");
  constexpr int kProcs = 6, kKeys = 80;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) kids.push_back(spawn([&] { return child_precompile(tmp.path, kKeys); }));
  for (pid_t k : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(k, &status, 0), k);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  auto counts = compile_counts(tmp.path);
  ASSERT_EQ(counts.size(), size_t(kKeys));
  for (const auto& [name, n] : counts) EXPECT_EQ(n, 1) << name;
  // Nothing is left claimed: built markers only (they expire), no "building" claims.
  for (const auto& e : fs::directory_iterator(fs::path(tmp.path) / "claims")) {
    const std::string text = read_file(e.path());
    EXPECT_EQ(text.find("state building"), std::string::npos) << e.path();
  }
}

TEST(GateClaimsProcesses, KilledBuilderHoldingAClaimIsCompletedByAnotherProcess) {
  TempDir tmp;
  fs::create_directories(fs::path(tmp.path) / "bins");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  // The builder claims k0 and hangs inside its compile.
  pid_t builder = spawn([&] { return child_precompile(tmp.path, 1, "k0", ready[1]); });
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string claim = read_file(fs::path(tmp.path) / "claims" / make_key(named("k0"), kTarget).hex());
  EXPECT_NE(claim.find(fmt::format("pid {}", builder)), std::string::npos) << claim;
  EXPECT_NE(claim.find("state building"), std::string::npos) << claim;
  ASSERT_EQ(::kill(builder, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(builder, &status, 0), builder);
  EXPECT_TRUE(WIFSIGNALED(status));
  // Another process needs k0..k3: it sees the dead owner's claim, takes it over and completes the key.
  pid_t next = spawn([&] { return child_precompile(tmp.path, 4); });
  ASSERT_EQ(::waitpid(next, &status, 0), next);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto counts = compile_counts(tmp.path);
  EXPECT_EQ(counts["k0"], 2);  // the killed attempt and the completed one
  EXPECT_EQ(counts["k1"], 1);
  EXPECT_TRUE(fs::exists(fs::path(tmp.path) / "bins" / make_key(named("k0"), kTarget).hex()));
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace kiln
