#include "pool_bench.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "bench_util.h"
#include "kiln/embedded.h"
#include "kiln/jit.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/process_pool.h"

namespace kiln::pool_bench_kernels {
std::span<const kiln::EmbeddedFile> embedded_files();
}

namespace kiln::pool_bench {
namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Tile shapes of the stand-in GEMM (BM BN BK WM WN STAGES): a batch cycles through them, so every batch of
// a multiple of 8 kernels has the same mix.
struct Config {
  int bm, bn, bk, wm, wn, stages;
};
constexpr Config kConfigs[] = {
    {128, 128, 32, 64, 64, 3}, {128, 64, 32, 64, 32, 3}, {64, 128, 32, 32, 64, 4}, {64, 64, 64, 32, 32, 3},
    {128, 128, 32, 64, 32, 2}, {64, 64, 32, 32, 32, 4},  {128, 64, 64, 64, 32, 2}, {256, 64, 32, 64, 32, 3},
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

const std::string& gemm_text() {
  static const std::string text = [] {
    for (const auto& f : pool_bench_kernels::embedded_files()) {
      if (f.name == "pool_gemm.cu") return std::string(f.contents);
    }
    return std::string();
  }();
  return text;
}

// Every kernel of the run is a distinct key, so nothing but NVRTC's PCH is reused between compiles.
std::atomic<uint64_t> g_variant{1};

KernelSource make_kernel(int index, bool params_in_source) {
  const Config& c = kConfigs[index % kNumConfigs];
  const uint64_t v = g_variant++;
  KernelSource s;
  s.name = fmt::format("pool_gemm_{}x{}x{}_w{}x{}_s{}_v{}", c.bm, c.bn, c.bk, c.wm, c.wn, c.stages, v);
  s.entry = "pool_gemm";
  std::vector<std::pair<std::string, std::string>> defs = {
      {"BM", std::to_string(c.bm)}, {"BN", std::to_string(c.bn)}, {"BK", std::to_string(c.bk)},
      {"WM", std::to_string(c.wm)}, {"WN", std::to_string(c.wn)}, {"STAGES", std::to_string(c.stages)},
      {"POOL_VARIANT", std::to_string(v)}};
  s.source = gemm_text();
  if (params_in_source) {
    std::string rendered;
    for (const auto& [k, val] : defs) rendered += fmt::format("#define {} {}\n", k, val);
    size_t at = s.source.find("// @PARAMS@");
    s.source.replace(at, std::string_view("// @PARAMS@").size(), rendered);
  } else {
    for (const auto& [k, val] : defs) s.options.push_back(fmt::format("-D{}={}", k, val));
  }
  return s;
}

struct BatchResult {
  int kernels = 0;
  int workers = 0;
  double seconds = 0;
  double steady_kps = 0;  // (kernels - workers) / time until the last job started: the saturated rate
  int failures = 0;
  std::string first_error;
  double ready_seconds = -1;  // process pool: start() to ready
  std::vector<double> startup_seconds;
};

// Records when each timed job started; the latest start is when the queue ran dry.
struct StartLog {
  std::mutex mu;
  double t0 = 0;
  double last_start = 0;
  bool armed = false;
  void start() {
    double t = now_s();
    std::lock_guard lock(mu);
    if (armed) last_start = std::max(last_start, t);
  }
  void arm() {
    std::lock_guard lock(mu);
    armed = true;
    t0 = now_s();
    last_start = t0;
  }
};

void finish_batch(BatchResult& r, const std::vector<Future<Binary>>& fs, double t0, StartLog& log) {
  for (const auto& f : fs) {
    const Result<Binary>& b = f.get();
    if (!b.ok()) {
      if (r.failures++ == 0) r.first_error = b.status().to_string();
    }
  }
  r.seconds = now_s() - t0;
  double window = log.last_start - t0;
  if (r.kernels > r.workers && window > 0) r.steady_kps = (r.kernels - r.workers) / window;
}

CompileFn logged_compile(StartLog& log) {
  return [&log](const KernelSource& s, const Target& t, const CompileSettings& c) {
    log.start();
    return compile(s, t, c);
  };
}

BatchResult run_threads(int workers, int n, const Target& target, const CompileSettings& settings, bool in_source) {
  BatchResult r{n, workers};
  std::vector<KernelSource> warm, timed;
  for (int i = 0; i < workers; ++i) warm.push_back(make_kernel(i, in_source));
  for (int i = 0; i < n; ++i) timed.push_back(make_kernel(i, in_source));
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::string first_error;
  std::mutex err_mu;
  StartLog log;
  double t0 = 0;
  std::barrier sync(workers + 1);
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w) {
    ts.emplace_back([&, w] {
      (void)compile(warm[w], target, settings);
      sync.arrive_and_wait();  // warmed up
      sync.arrive_and_wait();  // go
      for (int i; (i = next++) < n;) {
        log.start();
        auto b = compile(timed[i], target, settings);
        if (!b.ok() && failures++ == 0) {
          std::lock_guard lock(err_mu);
          first_error = b.status().to_string();
        }
      }
    });
  }
  sync.arrive_and_wait();
  log.arm();
  t0 = log.t0;
  sync.arrive_and_wait();
  for (auto& t : ts) t.join();
  r.seconds = now_s() - t0;
  r.failures = failures;
  r.first_error = first_error;
  double window = log.last_start - t0;
  if (n > workers && window > 0) r.steady_kps = (n - workers) / window;
  return r;
}

BatchResult run_executor(const std::string& kind, int workers, int n, const Target& target,
                         const CompileSettings& settings, bool in_source) {
  BatchResult r{n, workers};
  StartLog log;
  std::shared_ptr<Executor> exec;
  ProcessPool* pool = nullptr;
  if (kind == "inline") {
    exec = make_inline_executor(logged_compile(log));
  } else if (kind == "arena") {
    exec = make_arena_executor({.threads = workers, .compile = logged_compile(log)});
  } else {
    ProcessPoolOptions o;
    o.workers = workers;
    o.observer = [&log](const PoolEvent& e) {
      if (e.kind == PoolEvent::Kind::kJobSent) log.start();
    };
    double t = now_s();
    auto p = ProcessPool::start(o);
    if (!p.ok()) {
      r.failures = n;
      r.first_error = p.status().to_string();
      return r;
    }
    if (!(*p)->wait_ready(std::chrono::seconds(30))) {
      r.failures = n;
      r.first_error = "the process pool did not become ready in 30 s";
      return r;
    }
    r.ready_seconds = now_s() - t;
    pool = p->get();
    exec = std::move(p).value();
  }
  auto submit_all = [&](const std::vector<KernelSource>& srcs) {
    std::vector<Future<Binary>> fs;
    for (const auto& s : srcs) fs.push_back(exec->submit({s, target, settings, Priority::kNormal}).future);
    return fs;
  };
  std::vector<KernelSource> warm, timed;
  for (int i = 0; i < workers; ++i) warm.push_back(make_kernel(i, in_source));
  for (int i = 0; i < n; ++i) timed.push_back(make_kernel(i, in_source));
  for (auto& f : submit_all(warm)) f.wait();
  log.arm();
  auto fs = submit_all(timed);
  finish_batch(r, fs, log.t0, log);
  if (pool) r.startup_seconds = pool->stats().startup_seconds;
  return r;
}

// The machine's own scaling: `units` fixed pieces of integer work on `workers` threads.
double cpu_unit_iterations() {
  static const double iters = [] {
    // Calibrated to ~0.1 s on one thread.
    volatile uint64_t sink = 0;
    uint64_t n = 1 << 20;
    while (true) {
      double t = now_s();
      uint64_t x = 88172645463325252ull;
      for (uint64_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x *= 0x9e3779b97f4a7c15ull;
      }
      sink = sink + x;
      double dt = now_s() - t;
      if (dt > 0.02) return static_cast<double>(n) * 0.1 / dt;
      n *= 2;
    }
  }();
  return iters;
}

BatchResult run_cpu(int workers, int units) {
  BatchResult r{units, workers};
  const uint64_t iters = static_cast<uint64_t>(cpu_unit_iterations());
  std::atomic<int> next{0};
  std::atomic<uint64_t> sink{0};
  StartLog log;
  std::barrier sync(workers + 1);
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w) {
    ts.emplace_back([&] {
      sync.arrive_and_wait();
      for (int i; (i = next++) < units;) {
        log.start();
        uint64_t x = 88172645463325252ull + static_cast<uint64_t>(i);
        for (uint64_t k = 0; k < iters; ++k) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          x *= 0x9e3779b97f4a7c15ull;
        }
        sink += x;
      }
    });
  }
  log.arm();
  double t0 = log.t0;
  sync.arrive_and_wait();
  for (auto& t : ts) t.join();
  r.seconds = now_s() - t0;
  double window = log.last_start - t0;
  if (units > workers && window > 0) r.steady_kps = (units - workers) / window;
  return r;
}

// ---- overhead of the pool itself: empty jobs, one at a time

struct Overhead {
  std::string executor;
  int workers = 0;
  bench::Stats submit_to_start_us;
  bench::Stats completion_us;
};

Overhead measure_in_process(const std::string& kind, int workers, int samples) {
  std::atomic<int64_t> start_ns{0}, end_ns{0};
  CompileFn empty = [&](const KernelSource& s, const Target&, const CompileSettings&) -> Result<Binary> {
    start_ns = now_ns();
    Binary b;
    b.name = s.name;
    end_ns = now_ns();
    return b;
  };
  std::unique_ptr<Executor> exec = kind == "inline" ? make_inline_executor(empty)
                                                    : make_arena_executor({.threads = workers, .compile = empty});
  KernelSource src;
  src.name = "empty";
  std::vector<double> s2s, done;
  for (int i = 0; i < samples + samples / 10; ++i) {
    int64_t t_submit = now_ns();
    Future<Binary> f = exec->submit({src, Target{"sm_90"}, {}, Priority::kNormal}).future;
    f.wait();
    int64_t t_wake = now_ns();
    if (i < samples / 10) continue;  // warm-up
    s2s.push_back((start_ns - t_submit) / 1e3);
    done.push_back((t_wake - end_ns) / 1e3);
  }
  return {kind, workers, bench::stats(s2s), bench::stats(done)};
}

Overhead measure_process(int workers, int samples, std::vector<double>& startups) {
  Overhead o{"process", workers, {}, {}};
  ProcessPoolOptions opt;
  opt.workers = workers;
  opt.enable_test_faults = true;  // for the "echo" job: the worker answers without compiling
  auto pool = ProcessPool::start(opt);
  if (!pool.ok() || !(*pool)->wait_ready(std::chrono::seconds(30))) return o;
  KernelSource src;
  src.name = "empty";
  src.entry = "k";
  src.source = "//";
  src.options = {"-DKILN_WORKER_TEST=echo"};
  std::vector<double> s2s, done;
  for (int i = 0; i < samples + samples / 10; ++i) {
    int64_t t_submit = now_ns();
    Future<Binary> f = (*pool)->submit({src, Target{"sm_90"}, {}, Priority::kNormal}).future;
    f.wait();
    int64_t t_wake = now_ns();
    if (i < samples / 10 || !f.get().ok()) continue;
    long long received = 0, replied = 0;
    if (std::sscanf(f.get()->log.c_str(), "received_ns=%lld replied_ns=%lld", &received, &replied) != 2) continue;
    s2s.push_back((received - t_submit) / 1e3);
    done.push_back((t_wake - replied) / 1e3);
  }
  o.submit_to_start_us = bench::stats(s2s);
  o.completion_us = bench::stats(done);
  auto st = (*pool)->stats().startup_seconds;
  startups.insert(startups.end(), st.begin(), st.end());
  return o;
}

std::vector<int> measurement_order(const Options& o) {
  std::vector<int> out;
  for (int w : o.first) {
    if (std::find(o.workers.begin(), o.workers.end(), w) != o.workers.end()) out.push_back(w);
  }
  for (int w : o.workers) {
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  }
  return out;
}

struct Row {
  std::string executor;
  int workers;
  bool pch;
  int kernels = 0;
  std::vector<double> seconds, steady;  // one per round
  int failures = 0;
  std::string first_error;
  double ready_seconds = -1;
  double median_seconds() const { return bench::stats(seconds).median; }
  double kps() const { return kernels / median_seconds(); }
  double steady_kps() const { return bench::stats(steady).median; }
};

std::string pch_name(bool pch) { return pch ? "on" : "off"; }

nlohmann::json to_json(const std::vector<Row>& rows, const Options& o, const std::vector<Overhead>& overhead,
                       const std::vector<double>& startups, const std::vector<double>& ready, bool cut_off) {
  nlohmann::json j;
  j["bench"] = "pool";
  j["environment"] = bench::environment();
  j["environment"]["available_cores"] = available_cores();
  j["kernel"] = {{"description", "bf16 mma.sync tiled GEMM stand-in (cp.async pipeline, ldmatrix, GELU "
                                 "epilogue); 8 tile configurations, each compile a distinct key"},
                 {"params", o.params},
                 {"arch", o.arch}};
  j["method"] = "per (executor, workers, pch): a fresh executor, one warm-up kernel per worker, then a batch "
                "submitted at once; seconds = submit of the first to completion of the last; "
                "steady_kernels_per_second = (kernels - workers) / time until the last job started (all "
                "workers busy throughout); median over rounds; executors visited in a rotated order";
  // 1-worker rates per (executor, pch), for efficiency.
  std::map<std::pair<std::string, bool>, const Row*> one;
  for (const auto& r : rows) {
    if (r.workers == 1) one[{r.executor, r.pch}] = &r;
  }
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json x = {{"executor", r.executor},
                        {"workers", r.workers},
                        {"kernels", r.kernels},
                        {"seconds", r.median_seconds()},
                        {"kernels_per_second", r.kps()},
                        {"steady_kernels_per_second", r.steady_kps()},
                        {"pch", r.pch},
                        {"params", o.params},
                        {"failures", r.failures},
                        {"rounds", r.seconds.size()},
                        {"seconds_all", r.seconds}};
    if (r.ready_seconds >= 0) x["pool_ready_seconds"] = r.ready_seconds;
    if (!r.first_error.empty()) x["first_error"] = r.first_error;
    if (auto it = one.find({r.executor, r.pch}); it != one.end()) {
      x["efficiency"] = r.kps() / (r.workers * it->second->kps());
      if (it->second->steady_kps() > 0 && r.steady_kps() > 0) {
        x["steady_efficiency"] = r.steady_kps() / (r.workers * it->second->steady_kps());
      }
    }
    arr.push_back(x);
  }
  j["rows"] = arr;
  nlohmann::json ov = nlohmann::json::array();
  for (const auto& o2 : overhead) {
    ov.push_back({{"executor", o2.executor},
                  {"workers", o2.workers},
                  {"submit_to_start_us", bench::to_json(o2.submit_to_start_us)},
                  {"completion_us", bench::to_json(o2.completion_us)}});
  }
  j["overhead"] = ov;
  j["worker_startup_seconds"] = bench::to_json(bench::stats(startups));
  j["pool_ready_seconds"] = ready;
  j["cut_off_by_deadline"] = cut_off;
  return j;
}

}  // namespace

void add_options(CLI::App& app, Options& o) {
  app.add_option("--executor", o.executors, "Executors: inline, arena, process, threads (reference)")
      ->delimiter(',');
  app.add_option("--workers", o.workers, "Worker counts, e.g. 1,2,4,8,16")->delimiter(',');
  app.add_option("--kernels", o.kernels, "Kernels per batch (default: --per-worker x workers, at least 8)");
  app.add_option("--per-worker", o.per_worker, "Kernels per worker when --kernels is not given");
  app.add_option("--pch", o.pch, "NVRTC automatic PCH: off, on or both")->check(CLI::IsMember({"off", "on", "both"}));
  app.add_option("--params", o.params, "Configuration as 'source' #defines after the headers, or 'define' (-D)")
      ->check(CLI::IsMember({"source", "define"}));
  app.add_option("--rounds", o.rounds, "Passes over the grid (median reported)");
  app.add_option("--arch", o.arch, "Target arch");
  app.add_option("--json", o.json, "Write results here");
  app.add_option("--overhead-samples", o.overhead_samples, "Empty jobs per overhead measurement (0: skip)");
  app.add_flag("!--no-cpu-reference", o.cpu_reference, "Skip the CPU-bound scaling reference");
  app.add_option("--first", o.first, "Worker counts to measure first")->delimiter(',');
  app.add_option("--deadline", o.deadline, "Start no new measurement after this many seconds (0: none)");
}

int run(const Options& o) {
  auto target = Target::parse(o.arch);
  if (!target.ok()) {
    fmt::print(stderr, "kiln-bench pool: {}\n", target.status().to_string());
    return 2;
  }
  if (gemm_text().empty()) {
    fmt::print(stderr, "kiln-bench pool: the embedded kernel is missing\n");
    return 1;
  }
  std::vector<bool> pch_modes;
  if (o.pch != "on") pch_modes.push_back(false);
  if (o.pch != "off") pch_modes.push_back(true);
  const bool in_source = o.params == "source";
  fmt::print("kiln-bench pool: {} cores available, executors {}, workers {}, pch {}, params {}, {} round(s)\n",
             available_cores(), fmt::join(o.executors, ","), fmt::join(o.workers, ","), o.pch, o.params, o.rounds);

  std::vector<Row> rows;
  std::vector<double> startups, ready;
  std::vector<Overhead> overhead;
  const double started = now_s();
  bool cut_off = false;
  auto out_of_time = [&] {
    if (o.deadline > 0 && now_s() - started > o.deadline) cut_off = true;
    return cut_off;
  };
  // First, as it is quick: a run cut off by its deadline still has it.
  if (o.overhead_samples > 0) {
    overhead.push_back(measure_in_process("inline", 1, o.overhead_samples));
    overhead.push_back(measure_in_process("arena", 1, o.overhead_samples));
    overhead.push_back(measure_in_process("arena", available_cores(), o.overhead_samples));
    overhead.push_back(measure_process(1, o.overhead_samples, startups));
    overhead.push_back(measure_process(std::min(4, available_cores()), o.overhead_samples, startups));
  }
  auto row_for = [&](const std::string& e, int w, bool pch) -> Row& {
    for (auto& r : rows) {
      if (r.executor == e && r.workers == w && r.pch == pch) return r;
    }
    rows.push_back(Row{e, w, pch});
    return rows.back();
  };
  auto save = [&] {
    if (!o.json.empty()) bench::write_json(o.json, to_json(rows, o, overhead, startups, ready, cut_off));
  };

  const std::vector<int> order = measurement_order(o);
  for (int round = 0; round < o.rounds; ++round) {
    for (bool pch : pch_modes) {
      CompileSettings settings;
      settings.use_pch = pch;
      for (const int w : order) {
        const int n = o.kernels > 0 ? o.kernels : std::max(8, o.per_worker * w);
        if (o.cpu_reference && pch == pch_modes.front() && round == 0 && !out_of_time()) {
          // Cheap, so measured before the compiles: the machine's own ceiling at this many threads.
          BatchResult b = run_cpu(w, std::max(8, o.per_worker * w));
          Row& r = row_for("cpu-reference", w, false);
          r.kernels = b.kernels;
          r.seconds.push_back(b.seconds);
          r.steady.push_back(b.steady_kps);
        }
        std::vector<std::string> execs = o.executors;
        // Executors alternate at each worker count; later rounds rotate their order.
        std::rotate(execs.begin(), execs.begin() + static_cast<std::ptrdiff_t>(round % execs.size()), execs.end());
        for (const auto& e : execs) {
          if (e == "inline" && w != 1) continue;
          if (out_of_time()) break;
          BatchResult b = e == "threads" ? run_threads(w, n, *target, settings, in_source)
                                         : run_executor(e, w, n, *target, settings, in_source);
          Row& r = row_for(e, w, pch);
          r.kernels = n;
          r.seconds.push_back(b.seconds);
          r.steady.push_back(b.steady_kps);
          r.failures += b.failures;
          if (r.first_error.empty()) r.first_error = b.first_error;
          if (b.ready_seconds >= 0) {
            r.ready_seconds = b.ready_seconds;
            ready.push_back(b.ready_seconds);
          }
          startups.insert(startups.end(), b.startup_seconds.begin(), b.startup_seconds.end());
          fmt::print("  round {} pch {:3} {:8} x{:<2} {:3} kernels {:7.2f} s  {:6.2f} kernels/s  steady {:6.2f}{}\n",
                     round, pch_name(pch), e, w, n, b.seconds, n / b.seconds, b.steady_kps,
                     b.failures ? fmt::format("  {} FAILED: {}", b.failures, b.first_error) : "");
          std::fflush(stdout);
          save();
        }
      }
    }
  }

  if (cut_off) fmt::print("\n(deadline of {:.0f} s reached: the grid is incomplete)\n", o.deadline);

  std::map<std::pair<std::string, bool>, double> one, one_steady;
  for (const auto& r : rows) {
    if (r.workers == 1) {
      one[{r.executor, r.pch}] = r.kps();
      one_steady[{r.executor, r.pch}] = r.steady_kps();
    }
  }
  bench::Table t({"executor", "pch", "workers", "kernels", "seconds", "kernels/s", "efficiency", "steady k/s",
                  "steady eff", "failures"});
  for (const auto& r : rows) {
    double e1 = one.count({r.executor, r.pch}) ? one[{r.executor, r.pch}] : 0;
    double s1 = one_steady.count({r.executor, r.pch}) ? one_steady[{r.executor, r.pch}] : 0;
    t.add({r.executor, r.executor == "cpu-reference" ? "-" : pch_name(r.pch), std::to_string(r.workers),
           std::to_string(r.kernels), fmt::format("{:.2f}", r.median_seconds()), fmt::format("{:.2f}", r.kps()),
           e1 > 0 ? fmt::format("{:.0f}%", 100 * r.kps() / (r.workers * e1)) : "-",
           fmt::format("{:.2f}", r.steady_kps()),
           s1 > 0 && r.steady_kps() > 0 ? fmt::format("{:.0f}%", 100 * r.steady_kps() / (r.workers * s1)) : "-",
           std::to_string(r.failures)});
  }
  fmt::print("\nkernels per second ({} cores; efficiency = rate / (workers x 1-worker rate))\n{}", available_cores(),
             t.str());
  if (!overhead.empty()) {
    bench::Table ot({"executor", "workers", "submit->start median us", "p90", "completion median us", "p90"});
    for (const auto& x : overhead) {
      ot.add({x.executor, std::to_string(x.workers), fmt::format("{:.1f}", x.submit_to_start_us.median),
              fmt::format("{:.1f}", x.submit_to_start_us.p90), fmt::format("{:.1f}", x.completion_us.median),
              fmt::format("{:.1f}", x.completion_us.p90)});
    }
    fmt::print("\npool overhead, empty jobs one at a time (targets: arena < 20 us, process < 200 us)\n{}", ot.str());
  }
  if (!startups.empty()) {
    bench::Stats s = bench::stats(startups);
    fmt::print("\nworker start-up (spawn to hello): median {:.1f} ms, p90 {:.1f} ms over {} workers\n",
               s.median * 1e3, s.p90 * 1e3, s.n);
  }
  save();
  if (!o.json.empty()) fmt::print("wrote {}\n", o.json);
  for (const auto& r : rows) {
    if (r.failures > 0) return 1;
  }
  return 0;
}

}  // namespace kiln::pool_bench
