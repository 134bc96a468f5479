// bench_remote: the fleet tier (docs/fleet.md), each number beside its reference, against a redis-server this
// program starts itself (on a unix socket in a temporary folder) from --redis-server, $KILN_REDIS_SERVER or
// PATH, so the GPU image needs only that one binary.
//
//   latency    (no GPU) per-lookup latency through RedisTier of a remote hit (a signed 64 KiB binary, a
//              decision) and a miss, beside a raw GET of the same bytes on the same kind of connection; and a
//              TuningCache local miss answered by the remote (verify + store locally) beside a local hit.
//   coldstart  (GPU) the remote is filled with the workload's decisions, timings and binaries (from
//              --seed-cache DIR, else by tuning the workload here once); then a fresh process with an empty
//              local cache and KILN_REMOTE_CACHE set makes every problem of the workload ready (decision from
//              the remote, binary from the remote, module loaded). Reported: that process's wall time from
//              spawn to exit, and its own time from main() to "every kernel ready"; the same with a warm local
//              cache and no remote as the reference.
//   warm       (GPU) the warm path: Tuner::tune() of an already-selected problem and TuningCache's decision
//              lookup on a local hit, with the remote configured and without.
//
// Usage: bench_remote [latency|coldstart|warm|all] [--workload examples/llama3-8b.json] [--seed-cache DIR]
//                     [--configs 4] [--redis-server PATH] [--json FILE] [--reps 2000]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <random>
#include <thread>

#include "bench_util.h"
#include "kiln/cache/cache.h"
#include "kiln/cache/remote.h"
#include "kiln/cache/sealed.h"
#include "kiln/runtime.h"
#include "kiln/runtime/workload.h"
#include "redis_connection.h"

extern char** environ;

using namespace kiln;
using namespace kiln::cache;
using nlohmann::json;
namespace fs = std::filesystem;
using bench::Clock;
using bench::us_since;

namespace {

const Clock::time_point g_start = Clock::now();

std::string fresh_dir(const std::string& name) {
  std::random_device rd;
  fs::path p = fs::temp_directory_path() / fmt::format("kiln-bench-{}-{:08x}", name, rd());
  fs::create_directories(p);
  return p.string();
}

std::string find_redis(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* e = std::getenv("KILN_REDIS_SERVER"); e && *e) return e;
  for (const char* c : {"/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(c, X_OK) == 0) return c;
  }
  return "";
}

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  env_store.insert(env_store.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  return pid;
}

// A redis-server on a unix socket in a temporary folder, up once it answers PING (polled, with a deadline).
struct Redis {
  std::string dir, socket;
  pid_t pid = -1;
  explicit Redis(const std::string& binary) {
    if (binary.empty()) bench::fail(make_error(ErrorCode::kNotFound, "no redis-server: give --redis-server PATH or KILN_REDIS_SERVER"));
    dir = fresh_dir("redis");
    socket = dir + "/redis.sock";
    pid = spawn({binary, "--port", "0", "--unixsocket", socket, "--unixsocketperm", "700", "--dir", dir, "--save", "",
                 "--appendonly", "no", "--logfile", dir + "/redis.log"});
    if (pid < 0) bench::fail(make_error(ErrorCode::kUnavailable, "cannot start " + binary));
    auto url = RemoteUrl::parse(this->url()).value();
    for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
      if (auto c = RedisConnection::connect(url, std::chrono::milliseconds(100), std::chrono::milliseconds(500)); c.ok()) {
        if (auto r = (*c)->command({"PING"}); r.ok() && r->str == "PONG") return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    bench::fail(make_error(ErrorCode::kTimeout, "redis-server did not answer PING within 20 s"));
  }
  ~Redis() {
    ::kill(pid, SIGKILL);
    int st;
    ::waitpid(pid, &st, 0);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string url() const { return "unix://" + socket; }
};

SigningKey bench_key() { return SigningKey::from_bytes(std::string(64, 'f'), "the bench's key").value(); }

RemoteOptions remote_options(const Redis& r) {
  RemoteOptions o;
  o.url = r.url();
  o.key = bench_key();
  return o;
}

Binary fake_binary(uint64_t seed, size_t bytes) {
  Binary b;
  b.key = {seed * 0x9e3779b97f4a7c15ull + 7, seed};
  b.name = fmt::format("k{}", seed);
  b.entry = "e";
  b.arch = "sm_90a";
  b.cubin.assign(bytes, 'x');
  b.cubin.replace(0, 4, "\x7f" "ELF");
  b.nvrtc_major = nvrtc_version().major;
  b.nvrtc_minor = nvrtc_version().minor;
  return b;
}

template <class F>
bench::Stats time_each(int reps, F&& f) {
  std::vector<double> us;
  us.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    auto t = Clock::now();
    f(i);
    us.push_back(us_since(t));
  }
  return bench::stats(std::move(us));
}

std::string row(const bench::Stats& s) { return fmt::format("{:.1f}", s.median); }

json phase_latency(const std::string& redis_bin, int reps) {
  Redis redis(redis_bin);
  auto tier = bench::must(RedisTier::open(remote_options(redis)), "open tier");
  const Binary bin = fake_binary(1, 64 << 10);
  const std::string problem = "p1;bench";
  Decision d;
  d.problem = problem;
  d.choice = "c";
  d.decided_at_ns = now_ns();
  d.toolchain = Toolchain::current();
  tier->publish_binary(bin);
  tier->publish_decision(d);
  bench::check(tier->drain(std::chrono::seconds(10)), "drain");
  auto conn = bench::must(RedisConnection::connect(RemoteUrl::parse(redis.url()).value(), std::chrono::milliseconds(50),
                                                   std::chrono::milliseconds(200)), "connect");
  const std::string slot = remote_binary_key(bin.key, bin.arch);
  for (int i = 0; i < 100; ++i) (void)tier->fetch_binary(bin.key, bin.arch);  // warm
  auto raw_get = time_each(reps, [&](int) { (void)conn->command({"GET", slot}); });
  auto bin_hit = time_each(reps, [&](int) {
    if (!tier->fetch_binary(bin.key, bin.arch)) bench::fail(make_error(ErrorCode::kInternal, "binary hit missed"));
  });
  auto bin_miss = time_each(reps, [&](int i) { (void)tier->fetch_binary(KernelKey{uint64_t(i) + 99, 3}, "sm_90a"); });
  auto dec_hit = time_each(reps, [&](int) { (void)tier->fetch_decision(problem); });
  auto dec_miss = time_each(reps, [&](int i) { (void)tier->fetch_decision(fmt::format("p1;none{}", i)); });
  // Through the tuning cache: a local miss the remote answers (verify + store locally), then a local hit.
  const int n = std::min(reps, 500);
  for (int i = 0; i < n; ++i) tier->publish_binary(fake_binary(1000 + i, 64 << 10));
  bench::check(tier->drain(std::chrono::seconds(30)), "drain");
  std::string dir = fresh_dir("latency");
  StoreOptions so;
  so.dir = dir;
  TuningCache tc(TuneMode::kUse, bench::must(Store::open(so), "store"), tier);
  auto read_through = time_each(n, [&](int i) { bench::check(tc.lookup_binary(fake_binary(1000 + i, 0).key, "sm_90a"), "read-through"); });
  auto local_hit = time_each(n, [&](int i) { bench::check(tc.lookup_binary(fake_binary(1000 + i, 0).key, "sm_90a"), "local hit"); });
  std::error_code ec;
  fs::remove_all(dir, ec);

  bench::Table t({"lookup (64 KiB binary, unix socket)", "median us", "p90 us"});
  auto add = [&](const char* name, const bench::Stats& s) { t.add({name, row(s), fmt::format("{:.1f}", s.p90)}); };
  add("raw GET of the same bytes (reference)", raw_get);
  add("RedisTier binary hit (GET + verify HMAC + decode)", bin_hit);
  add("RedisTier binary miss", bin_miss);
  add("RedisTier decision hit", dec_hit);
  add("RedisTier decision miss", dec_miss);
  add("TuningCache local miss -> remote hit -> stored locally", read_through);
  add("TuningCache local hit (reference)", local_hit);
  fmt::print("{}\n", t.str());
  return {{"raw_get_us", bench::to_json(raw_get)},       {"binary_hit_us", bench::to_json(bin_hit)},
          {"binary_miss_us", bench::to_json(bin_miss)},  {"decision_hit_us", bench::to_json(dec_hit)},
          {"decision_miss_us", bench::to_json(dec_miss)}, {"read_through_us", bench::to_json(read_through)},
          {"local_hit_us", bench::to_json(local_hit)},   {"binary_bytes", 64 << 10}, {"reps", reps}};
}

// The child of coldstart: every problem of the workload ready in this fresh process. Prints one JSON line.
int child_ready(const std::string& workload, const std::string& dir, bool with_remote) {
  auto w = bench::must(runtime::load_workload(workload), "workload");
  StoreOptions so;
  so.dir = dir;
  std::shared_ptr<RemoteTier> tier;
  if (with_remote) {
    auto o = bench::must(RemoteOptions::from_env(), "KILN_REMOTE_CACHE");
    if (!o) bench::fail(make_error(ErrorCode::kInvalidArgument, "KILN_REMOTE_CACHE unset"));
    tier = bench::must(RedisTier::open(*o), "tier");
  }
  auto cache = std::make_shared<TuningCache>(TuneMode::kUse, bench::must(Store::open(so), "store"), tier);
  runtime::TuneOptions opt;
  opt.cache = cache;
  auto tuner = bench::must(runtime::make_tuner(opt), "tuner");
  int from_cache = 0, errors = 0;
  for (const auto& p : w.problems) {
    auto sel = (*tuner).tune(p);
    if (!sel.ok()) {
      ++errors;
      fmt::print(stderr, "{}: {}\n", p.describe(), sel.status().to_string());
      continue;
    }
    from_cache += (*sel)->report().decision_from_cache;
  }
  const double ready_ms = us_since(g_start) / 1e3;
  auto c = cache->counters();
  json out{{"ready_ms_since_main", ready_ms}, {"problems", w.problems.size()}, {"decisions_from_cache", from_cache},
           {"errors", errors}, {"local_hits", c.local_hits}, {"local_misses", c.local_misses}, {"remote_hits", c.remote_hits}};
  fmt::print("CHILD {}\n", out.dump());
  return errors == 0 ? 0 : 1;
}

json run_child(const std::string& self, const std::string& workload, const std::string& dir, const std::string& url,
               bool with_remote) {
  std::vector<std::string> env;
  if (with_remote) env = {"KILN_REMOTE_CACHE=" + url};
  std::string out_file = dir + ".out";
  auto t0 = Clock::now();
  pid_t pid = spawn({"/bin/sh", "-c", fmt::format("'{}' child --workload '{}' --cache-dir '{}' {} > '{}'", self, workload,
                                                  dir, with_remote ? "--with-remote" : "", out_file)},
                    env);
  int st = 0;
  ::waitpid(pid, &st, 0);
  const double wall_ms = us_since(t0) / 1e3;
  std::ifstream in(out_file);
  std::string line, found;
  while (std::getline(in, line)) {
    if (line.rfind("CHILD ", 0) == 0) found = line.substr(6);
  }
  if (found.empty() || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    bench::fail(make_error(ErrorCode::kInternal, fmt::format("the fresh process failed (status {}); see {}", st, out_file)));
  }
  json j = json::parse(found);
  j["wall_ms"] = wall_ms;
  return j;
}

json phase_coldstart(const std::string& self, const std::string& redis_bin, const std::string& workload,
                     const std::string& seed_cache, int configs) {
  Redis redis(redis_bin);
  auto w = bench::must(runtime::load_workload(workload), "workload");
  std::string seed = seed_cache;
  if (seed.empty()) {
    seed = fresh_dir("seed");
    fmt::print("seeding: tuning {} problems of {} with --configs {} (once)...\n", w.problems.size(), workload, configs);
    StoreOptions so;
    so.dir = seed;
    runtime::TuneOptions opt;
    opt.cache = std::make_shared<TuningCache>(TuneMode::kTune, bench::must(Store::open(so), "seed store"));
    opt.max_template_configs = configs;
    auto tuner = bench::must(runtime::make_tuner(opt), "tuner");
    for (const auto& p : w.problems) bench::must((*tuner).tune(p), p.describe());
  }
  {
    StoreOptions so;
    so.dir = seed;
    auto store = bench::must(Store::open(so), "seed store");
    RemoteOptions o = remote_options(redis);
    o.write_behind = false;
    auto tier = bench::must(RedisTier::open(o), "tier");
    auto r = bench::must(push(*store, *tier), "push");
    fmt::print("remote filled: {} decisions, {} timings, {} binaries\n", r.decisions, r.timings, r.binaries);
  }
  // The key for the child: a file of mode 600.
  std::string key_dir = fresh_dir("key");
  std::string key_file = key_dir + "/fleet.key";
  { std::ofstream(key_file) << std::string(64, 'f'); }
  fs::permissions(key_file, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  ::setenv("KILN_CACHE_KEY_FILE", key_file.c_str(), 1);

  json runs = json::array();
  bench::Table t({"fresh process", "wall ms (spawn to exit)", "ms main() to all ready", "decisions cached", "remote hits"});
  for (int rep = 0; rep < 3; ++rep) {
    std::string empty = fresh_dir("cold");
    fs::remove_all(empty);
    json cold = run_child(self, workload, empty, redis.url(), true);
    // Reference: the same process with the warm local cache it just filled, and no remote.
    json warm = run_child(self, workload, empty, redis.url(), false);
    t.add({"empty local cache + full remote", fmt::format("{:.0f}", cold["wall_ms"].get<double>()),
           fmt::format("{:.0f}", cold["ready_ms_since_main"].get<double>()),
           fmt::format("{}/{}", cold["decisions_from_cache"].get<int>(), cold["problems"].get<int>()),
           std::to_string(cold["remote_hits"].get<uint64_t>())});
    t.add({"warm local cache, no remote (reference)", fmt::format("{:.0f}", warm["wall_ms"].get<double>()),
           fmt::format("{:.0f}", warm["ready_ms_since_main"].get<double>()),
           fmt::format("{}/{}", warm["decisions_from_cache"].get<int>(), warm["problems"].get<int>()), "-"});
    runs.push_back({{"cold_from_remote", cold}, {"warm_local", warm}});
    std::error_code ec;
    fs::remove_all(empty, ec);
  }
  fmt::print("{}\n", t.str());
  std::error_code ec;
  fs::remove_all(key_dir, ec);
  if (seed_cache.empty()) fs::remove_all(seed, ec);
  return {{"workload", workload}, {"runs", runs}};
}

json phase_warm(const std::string& redis_bin, const std::string& workload, int configs, int reps) {
  Redis redis(redis_bin);
  auto w = bench::must(runtime::load_workload(workload), "workload");
  const runtime::Problem& p = w.problems.front();
  std::string dir = fresh_dir("warm");
  StoreOptions so;
  so.dir = dir;
  auto store = std::shared_ptr<Store>(bench::must(Store::open(so), "store"));
  json out;
  bench::Table t({"warm path", "no remote: median us", "remote configured: median us"});
  bench::Stats tune_s[2], lookup_s[2];
  for (int with = 0; with < 2; ++with) {
    std::shared_ptr<RemoteTier> tier;
    if (with) tier = bench::must(RedisTier::open(remote_options(redis)), "tier");
    auto cache = std::make_shared<TuningCache>(TuneMode::kTune, store, tier);
    runtime::TuneOptions opt;
    opt.cache = cache;
    opt.max_template_configs = configs;
    auto tuner = bench::must(runtime::make_tuner(opt), "tuner");
    bench::must((*tuner).tune(p), "first tune");
    const std::string key = (*tuner).key(p);
    tune_s[with] = time_each(reps, [&](int) { bench::must((*tuner).tune(p), "warm tune"); });
    lookup_s[with] = time_each(reps, [&](int) { bench::must(cache->lookup_decision(key), "lookup"); });
  }
  t.add({"Tuner::tune() of a selected problem", fmt::format("{:.3f}", tune_s[0].median), fmt::format("{:.3f}", tune_s[1].median)});
  t.add({"TuningCache::lookup_decision, local hit", fmt::format("{:.3f}", lookup_s[0].median), fmt::format("{:.3f}", lookup_s[1].median)});
  fmt::print("{}\n", t.str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return {{"problem", p.describe()},
          {"tune_us", {{"no_remote", bench::to_json(tune_s[0])}, {"remote", bench::to_json(tune_s[1])}}},
          {"lookup_decision_us", {{"no_remote", bench::to_json(lookup_s[0])}, {"remote", bench::to_json(lookup_s[1])}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_remote: the fleet tier's cold start, lookup latency and warm-path overhead"};
  std::string phase = "all", workload = "examples/llama3-8b.json", seed, redis_bin, json_path, child_dir;
  int configs = 4, reps = 2000;
  bool with_remote = false;
  app.add_option("phase", phase, "latency | coldstart | warm | all (default all; coldstart and warm need a GPU)");
  app.add_option("--workload", workload, "Workload JSON (default examples/llama3-8b.json)");
  app.add_option("--seed-cache", seed, "A tuned cache to fill the remote from (default: tune the workload here once)");
  app.add_option("--configs", configs, "Template configurations per template when seeding (default 4)");
  app.add_option("--redis-server", redis_bin, "The redis-server binary (default $KILN_REDIS_SERVER, else /usr/bin)");
  app.add_option("--json", json_path, "Write the results here");
  app.add_option("--reps", reps, "Lookups per latency measurement (default 2000)");
  app.add_option("--cache-dir", child_dir, "(child) its cache folder");
  app.add_flag("--with-remote", with_remote, "(child) read through KILN_REMOTE_CACHE");
  CLI11_PARSE(app, argc, argv);
  if (phase == "child") return child_ready(workload, child_dir, with_remote);
  redis_bin = find_redis(redis_bin);
  const std::string self = fs::canonical("/proc/self/exe").string();
  json out{{"benchmark", "remote"}, {"environment", bench::environment()}, {"redis_server", redis_bin}};
  if (phase == "latency" || phase == "all") out["latency"] = phase_latency(redis_bin, reps);
  if (phase == "coldstart" || phase == "all") out["coldstart"] = phase_coldstart(self, redis_bin, workload, seed, configs);
  if (phase == "warm" || phase == "all") out["warm"] = phase_warm(redis_bin, workload, configs, reps);
  if (!json_path.empty() && !bench::write_json(json_path, out)) return 1;
  return 0;
}
