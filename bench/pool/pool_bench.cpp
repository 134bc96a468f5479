#include "pool_bench.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <map>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include <sys/mman.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/embedded.h"
#include "kiln/jit.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/process_pool.h"
#include "kiln/templates/registry.h"

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

// Every kernel of the run is a distinct key, so nothing but NVRTC's PCH is reused between compiles. The first
// variant differs per process: a second run of the bench on one machine (its PCH directory kept) rendered the same
// sources as the first and measured 0.07 s jobs that did not compile (nvidia-h200, 28 Nov).
std::atomic<uint64_t> g_variant{
    (static_cast<uint64_t>(getpid()) << 32) ^
    static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count() & 0xFFFFFFFF)};

// --kernel wgmma: rendered configurations of kiln's Hopper GEMM template, what a tune's pool compiles most. Its
// headers are a small part of a compile (NVRTC's PCH changed a compile of one by ~1% on the development
// machine), so these say what the pool does with kiln's own work rather than with the stand-in.
using namespace kiln::templates;

std::vector<KernelSource>& template_sources() {
  static std::vector<KernelSource> sources;
  return sources;
}
// The template's own compile-cost model per configuration name (TemplateDef::compile_cost): process-model's hints.
std::map<std::string, double>& template_costs() {
  static std::map<std::string, double> costs;
  return costs;
}

Status load_template_sources(const Target& target) {
  KILN_ASSIGN_OR_RETURN(std::vector<Rendered> sample, wgmma_sample(target));
  for (Rendered& r : sample) {
    template_costs()[r.config_name] = r.compile_cost;
    template_sources().push_back(std::move(r.source));
  }
  if (template_sources().empty()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("gemm_wgmma_sm90 has no configuration for {}", target.arch));
  }
  return Status();
}

// A job's configuration: its kernel name without the "_v<variant>" that makes every job a distinct key.
std::string configuration_of(const std::string& kernel) { return kernel.substr(0, kernel.rfind("_v")); }

// The executors that order the process pool's queue: measured against the plain pool's 1-worker rate (one
// worker has no order to choose).
constexpr std::array<const char*, 2> kOrderedExecutors = {"process-lpt", "process-model"};
bool is_ordered(const std::string& executor) {
  return std::find(kOrderedExecutors.begin(), kOrderedExecutors.end(), executor) != kOrderedExecutors.end();
}

double model_cost(const std::string& kernel) {
  auto it = template_costs().find(configuration_of(kernel));
  return it == template_costs().end() ? 0.0 : it->second;
}

KernelSource make_kernel(int index, bool params_in_source) {
  const uint64_t v = g_variant++;
  if (!template_sources().empty()) {
    KernelSource s = template_sources()[index % template_sources().size()];
    s.name = fmt::format("{}_v{}", s.name, v);
    s.source += fmt::format("\n// pool variant {}\n", v);  // a distinct key per job, the same work
    return s;
  }
  const Config& c = kConfigs[index % kNumConfigs];
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
  nlohmann::json breakdown;  // process pool: where the batch's time went (see Trace::summary)
};

std::vector<double> scaled(std::vector<double> v, double k) {
  for (double& x : v) x *= k;
  return v;
}

// ---- where a process-pool batch's time goes, from the pool's events and the workers' /proc counters

struct ProcCounters {
  double user_s = 0, system_s = 0;
  long long minor_faults = 0, major_faults = 0, involuntary_switches = 0;
};

// A worker's CPU time, page faults and involuntary context switches (it was runnable but descheduled) so far.
ProcCounters read_proc(int pid) {
  ProcCounters c;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name (which may hold spaces) start at the last ')'.
    std::istringstream in(line.substr(line.rfind(')') + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(in), {}};
    // f[0] is field 3 (state): minflt is field 10, majflt 12, utime 14, stime 15.
    if (f.size() > 13) {
      const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
      c.minor_faults = std::stoll(f[7]);
      c.major_faults = std::stoll(f[9]);
      c.user_s = std::stod(f[11]) / tick;
      c.system_s = std::stod(f[12]) / tick;
    }
  }
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  while (std::getline(status, line)) {
    if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) c.involuntary_switches = std::stoll(line.substr(27));
  }
  return c;
}

// The pool's job events of one batch, timestamped on its I/O thread.
struct Trace {
  struct Event {
    bool sent;  // else done/failed
    int pid;
    JobId job;
    std::string kernel;
    double t;
  };
  std::mutex mu;
  std::vector<Event> events;
  bool armed = false;

  void record(const PoolEvent& e) {
    const bool sent = e.kind == PoolEvent::Kind::kJobSent;
    if (!sent && e.kind != PoolEvent::Kind::kJobDone && e.kind != PoolEvent::Kind::kJobFailed) return;
    double t = now_s();
    std::lock_guard lock(mu);
    if (armed) events.push_back({sent, e.pid, e.job, e.kernel, t});
  }

  // busy: per worker, the sum of its jobs' sent-to-reply times (the compile plus the socket round trip);
  // utilisation: all workers' busy time / (workers x batch time); tail: the batch's last reply minus the
  // first moment a worker finished its last job (then idle for good); dispatch gap: a worker's reply to the
  // next request the host sent it while jobs were queued (the host's own latency); job seconds: sent to
  // reply, whose growth against 1 worker is what running side by side costs each compile.
  nlohmann::json summary(double t0, int workers, const std::map<int, ProcCounters>& before,
                         const std::map<int, ProcCounters>& after) {
    std::lock_guard lock(mu);
    std::map<int, std::vector<const Event*>> by_worker;
    for (const auto& e : events) by_worker[e.pid].push_back(&e);
    double last_done = t0, first_sent = 1e300;
    std::vector<double> busy, last_end, gaps, jobs, first_dispatch;
    for (auto& [pid, evs] : by_worker) {
      double b = 0, sent_at = -1, done_at = -1, end = t0;
      for (const Event* e : evs) {
        if (e->sent) {
          if (done_at >= 0) gaps.push_back(e->t - done_at);
          if (sent_at < 0 && done_at < 0) first_dispatch.push_back(e->t - t0);
          first_sent = std::min(first_sent, e->t);
          sent_at = e->t;
        } else if (sent_at >= 0) {
          b += e->t - sent_at;
          jobs.push_back(e->t - sent_at);
          done_at = e->t;
          end = std::max(end, e->t);
          sent_at = -1;
        }
      }
      busy.push_back(b);
      last_end.push_back(end);
      last_done = std::max(last_done, end);
    }
    const double span = last_done - t0;
    double busy_sum = 0;
    for (double b : busy) busy_sum += b;
    nlohmann::json j;
    j["batch_seconds"] = span;
    j["workers_used"] = by_worker.size();
    j["busy_seconds_per_worker"] = busy;
    j["utilisation"] = span > 0 ? busy_sum / (workers * span) : 0;
    j["tail_seconds"] = last_end.empty() ? 0 : last_done - *std::min_element(last_end.begin(), last_end.end());
    j["dispatch_gap_us"] = bench::to_json(bench::stats(scaled(gaps, 1e6)));
    j["first_dispatch_ms"] = bench::to_json(bench::stats(scaled(first_dispatch, 1e3)));
    j["job_seconds"] = bench::to_json(bench::stats(jobs));
    double user = 0, sys = 0;
    long long minflt = 0, majflt = 0, inv = 0;
    for (const auto& [pid, a] : after) {
      auto b = before.find(pid);
      if (b == before.end()) continue;
      user += a.user_s - b->second.user_s;
      sys += a.system_s - b->second.system_s;
      minflt += a.minor_faults - b->second.minor_faults;
      majflt += a.major_faults - b->second.major_faults;
      inv += a.involuntary_switches - b->second.involuntary_switches;
    }
    const double n = std::max<size_t>(1, jobs.size());
    j["worker_user_seconds_per_job"] = user / n;
    j["worker_system_seconds_per_job"] = sys / n;
    j["worker_minor_faults_per_job"] = minflt / n;
    j["worker_major_faults"] = majflt;
    j["worker_involuntary_switches_per_job"] = inv / n;
    return j;
  }
};

// Expected compile seconds per tile configuration, learned from earlier batches of this run (the longest-first
// order's cost hints).
struct CostModel {
  std::mutex mu;
  std::map<std::string, std::pair<double, int>> seconds;  // configuration -> (sum, count)
  void add(const std::string& kernel, double s) {
    std::lock_guard lock(mu);
    auto& [sum, n] = seconds[configuration_of(kernel)];
    sum += s;
    ++n;
  }
  double hint(const std::string& kernel) {
    std::lock_guard lock(mu);
    auto it = seconds.find(configuration_of(kernel));
    return it == seconds.end() ? 0 : it->second.first / it->second.second;
  }
};
CostModel g_costs;

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

double cpu_unit_iterations();

BatchResult run_executor(const std::string& kind, int workers, int n, const Target& target,
                         const CompileSettings& settings, bool in_source) {
  BatchResult r{n, workers};
  StartLog log;
  Trace trace;
  std::shared_ptr<Executor> exec;
  ProcessPool* pool = nullptr;
  // "process-lpt": the process pool with cost hints (the configurations' compile times measured earlier in
  // this run), so that its queue starts the longest compiles first. "process-spin": the process pool running
  // fixed CPU-bound jobs instead of compiles (each ~10 units of the CPU reference, about a compile's length
  // without PCH): the pool's own scaling, apart from NVRTC's.
  // "process-model" (--kernel wgmma): hints from the template's compile-cost model instead, as kiln's tunes
  // give them (nothing measured first).
  const bool hints = kind == "process-lpt";
  const bool model_hints = kind == "process-model";
  const bool spin = kind == "process-spin";
  if (kind == "inline") {
    exec = make_inline_executor(logged_compile(log));
  } else if (kind == "arena") {
    exec = make_arena_executor({.threads = workers, .compile = logged_compile(log)});
  } else {
    ProcessPoolOptions o;
    o.workers = workers;
    o.enable_test_faults = spin;  // the worker's spin:N job
    o.observer = [&log, &trace](const PoolEvent& e) {
      if (e.kind == PoolEvent::Kind::kJobSent) log.start();
      trace.record(e);
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
    for (const auto& s : srcs) {
      fs.push_back(exec->submit({s, target, settings, Priority::kNormal, hints         ? g_costs.hint(s.name)
                                       : model_hints ? model_cost(s.name)
                                                     : 0.0}).future);
    }
    return fs;
  };
  std::vector<KernelSource> warm, timed;
  for (int i = 0; i < workers; ++i) warm.push_back(make_kernel(i, in_source));
  for (int i = 0; i < n; ++i) timed.push_back(make_kernel(i, in_source));
  if (spin) {
    const long steps = std::max(1L, std::lround(cpu_unit_iterations() * 10 / 1e6));
    for (auto* batch : {&warm, &timed}) {
      for (auto& k : *batch) k.options = {fmt::format("-DKILN_WORKER_TEST=spin:{}", batch == &warm ? 1 : steps)};
    }
  }
  for (auto& f : submit_all(warm)) f.wait();
  std::map<int, ProcCounters> before, after;
  if (pool) {
    for (int pid : pool->worker_pids()) before[pid] = read_proc(pid);
    std::lock_guard lock(trace.mu);
    trace.armed = true;
  }
  log.arm();
  auto fs = submit_all(timed);
  finish_batch(r, fs, log.t0, log);
  if (pool) {
    for (int pid : pool->worker_pids()) after[pid] = read_proc(pid);
    r.startup_seconds = pool->stats().startup_seconds;
    r.breakdown = trace.summary(log.t0, workers, before, after);
    std::lock_guard lock(trace.mu);
    // What each configuration costs, for later batches' hints (sent to reply, per job).
    std::map<JobId, double> sent;
    for (const auto& e : trace.events) {
      if (e.sent) {
        sent[e.job] = e.t;
      } else if (auto it = sent.find(e.job); it != sent.end()) {
        g_costs.add(e.kernel, e.t - it->second);
      }
    }
  }
  return r;
}

// A reference for memory-heavy work (a compiler's pattern: fresh memory, touched, freed): each unit maps
// 64 MiB, writes every page and line, reads it back and unmaps it. It shows how this machine scales page
// faults and memory bandwidth, which a pure-ALU loop does not.
BatchResult run_memory(int workers, int units) {
  BatchResult r{units, workers};
  constexpr size_t kBytes = 64u << 20;
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
        uint64_t acc = 0;
        for (int pass = 0; pass < 2; ++pass) {
          void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p == MAP_FAILED) continue;
          auto* q = static_cast<uint64_t*>(p);
          for (size_t k = 0; k < kBytes / 8; k += 8) q[k] = k ^ static_cast<uint64_t>(i);
          for (size_t k = 0; k < kBytes / 8; k += 8) acc += q[k];
          ::munmap(p, kBytes);
        }
        sink += acc;
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
  std::vector<nlohmann::json> breakdown;  // process pool: one per round
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
  j["kernel"] = {{"kind", o.kernel},
                 {"description", o.kernel == "wgmma"
                                     ? "kiln's gemm_wgmma_sm90 template, 8 sampled configurations, each compile a "
                                       "distinct key"
                                     : "bf16 mma.sync tiled GEMM stand-in (cp.async pipeline, ldmatrix, GELU "
                                       "epilogue); 8 tile configurations, each compile a distinct key"},
                 {"params", o.params},
                 {"arch", o.arch}};
  if (o.kernel == "wgmma") {
    j["kernel"]["configurations"] = nlohmann::json::array();
    for (const auto& s : template_sources()) j["kernel"]["configurations"].push_back(s.name);
  }
  j["method"] = "per (executor, workers, pch): a fresh executor, one warm-up kernel per worker, then a batch "
                "submitted at once; seconds = submit of the first to completion of the last; "
                "steady_kernels_per_second = (kernels - workers) / time until the last job started (all "
                "workers busy throughout); median over rounds; executors visited in a rotated order";
  // 1-worker rates per (executor, pch), for efficiency.
  std::map<std::pair<std::string, bool>, const Row*> one;
  for (const auto& r : rows) {
    if (r.workers == 1) one[{r.executor, r.pch}] = &r;
  }
  // The longest-first pool is measured against the plain pool's 1-worker rate (one worker has no order).
  for (bool pch : {false, true}) {
    for (const char* ordered : kOrderedExecutors) {
      if (!one.count({ordered, pch}) && one.count({"process", pch})) one[{ordered, pch}] = one[{"process", pch}];
    }
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
    if (!r.breakdown.empty()) x["breakdown"] = r.breakdown;
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

Result<std::vector<Rendered>> wgmma_sample(const Target& target) {
  KILN_ASSIGN_OR_RETURN(TemplatePtr t, find_template("gemm_wgmma_sm90"));
  KILN_ASSIGN_OR_RETURN(Grid grid, Grid::create(t));
  KILN_ASSIGN_OR_RETURN(DeviceLimits limits, DeviceLimits::for_target(target));
  std::vector<Params> picks = sample(grid, limits, kNumConfigs, /*seed=*/1);
  // sample() may return more to cover every parameter value; a batch of a multiple of 8 keeps the same mix.
  if (picks.size() > static_cast<size_t>(kNumConfigs)) picks.resize(kNumConfigs);
  std::vector<Rendered> out;
  for (const Params& p : picks) {
    KILN_ASSIGN_OR_RETURN(Rendered r, t->render(p));
    r.source.name = r.config_name;
    out.push_back(std::move(r));
  }
  return out;
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--executor", o.executors,
                 "Executors: inline, arena, process, process-lpt (longest expected compile first, from earlier "
                 "batches), process-model (longest first by the template's compile-cost model; --kernel wgmma), "
                 "process-spin (the process pool running CPU-bound jobs, no NVRTC), threads (reference)")
      ->delimiter(',');
  app.add_option("--workers", o.workers, "Worker counts, e.g. 1,2,4,8,16")->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("--kernels", o.kernels, "Kernels per batch (default: --per-worker x workers, at least 8)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--per-worker", o.per_worker, "Kernels per worker when --kernels is not given")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--pch", o.pch, "NVRTC automatic PCH: off, on or both")->check(CLI::IsMember({"off", "on", "both"}));
  app.add_option("--params", o.params, "Configuration as 'source' #defines after the headers, or 'define' (-D)")
      ->check(CLI::IsMember({"source", "define"}));
  app.add_option("--kernel", o.kernel,
                 "What is compiled: 'standin' (the embedded GEMM) or 'wgmma' (kiln's gemm_wgmma_sm90 template; "
                 "--arch sm_90a)")
      ->check(CLI::IsMember({"standin", "wgmma"}));
  app.add_option("--rounds", o.rounds, "Passes over the grid (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--arch", o.arch, "Target arch");
  app.add_option("--json", o.json, "Write results here");
  app.add_option("--overhead-samples", o.overhead_samples, "Empty jobs per overhead measurement (0: skip)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_flag("!--no-cpu-reference", o.cpu_reference, "Skip the CPU-bound scaling reference");
  app.add_option("--first", o.first, "Worker counts to measure first")->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("--deadline", o.deadline, "Start no new measurement after this many seconds (0: none)")
      ->check(CLI::Range(0.0, 1e9));
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
  if (o.kernel == "wgmma") {
    if (Status st = load_template_sources(*target); !st.ok()) {
      fmt::print(stderr, "kiln-bench pool: --kernel wgmma: {}\n", st.to_string());
      return 2;
    }
  }
  std::vector<bool> pch_modes;
  if (o.pch != "on") pch_modes.push_back(false);
  if (o.pch != "off") pch_modes.push_back(true);
  const bool in_source = o.params == "source";
  fmt::print("kiln-bench pool: {} cores available, kernel {} ({}), executors {}, workers {}, pch {}, params {}, {} round(s)\n",
             available_cores(), o.kernel, o.arch, fmt::join(o.executors, ","), fmt::join(o.workers, ","), o.pch,
             o.params, o.rounds);

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
          BatchResult m = run_memory(w, std::max(8, o.per_worker * w));
          Row& rm = row_for("memory-reference", w, false);
          rm.kernels = m.kernels;
          rm.seconds.push_back(m.seconds);
          rm.steady.push_back(m.steady_kps);
        }
        std::vector<std::string> execs = o.executors;
        // Executors alternate at each worker count; later rounds rotate their order.
        std::rotate(execs.begin(), execs.begin() + static_cast<std::ptrdiff_t>(round % execs.size()), execs.end());
        for (const auto& e : execs) {
          if (e == "inline" && w != 1) continue;
          if (is_ordered(e) && w == 1) continue;  // one worker has no order to choose
          if (e == "process-model" && o.kernel != "wgmma") continue;  // the stand-in has no cost model
          if (e == "process-spin" && pch != pch_modes.front()) continue;  // compiles nothing: PCH is moot
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
          if (!b.breakdown.is_null()) r.breakdown.push_back(b.breakdown);
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
  for (bool pch : {false, true}) {
    for (const char* ordered : kOrderedExecutors) {
      if (!one.count({ordered, pch}) && one.count({"process", pch})) {
        one[{ordered, pch}] = one[{"process", pch}];
        one_steady[{ordered, pch}] = one_steady[{"process", pch}];
      }
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
  {
    // The process pool's batches, taken apart (the last round's; every round is in the JSON).
    bench::Table bt({"executor", "pch", "workers", "batch s", "utilisation", "tail s", "dispatch gap us (med/max)",
                     "job s (median)", "user s/job", "sys s/job", "minor faults/job", "invol. switches/job"});
    for (const auto& r : rows) {
      if (r.breakdown.empty()) continue;
      const nlohmann::json& b = r.breakdown.back();
      bt.add({r.executor, pch_name(r.pch), std::to_string(r.workers), fmt::format("{:.2f}", b.value("batch_seconds", 0.0)),
              fmt::format("{:.0f}%", 100 * b.value("utilisation", 0.0)), fmt::format("{:.2f}", b.value("tail_seconds", 0.0)),
              fmt::format("{:.0f} / {:.0f}", b["dispatch_gap_us"].value("median", 0.0), b["dispatch_gap_us"].value("max", 0.0)),
              fmt::format("{:.3f}", b["job_seconds"].value("median", 0.0)),
              fmt::format("{:.3f}", b.value("worker_user_seconds_per_job", 0.0)),
              fmt::format("{:.3f}", b.value("worker_system_seconds_per_job", 0.0)),
              fmt::format("{:.0f}", b.value("worker_minor_faults_per_job", 0.0)),
              fmt::format("{:.1f}", b.value("worker_involuntary_switches_per_job", 0.0))});
    }
    fmt::print("\nprocess pool batches: utilisation = busy / (workers x batch); tail = last reply - first worker "
               "idle for good; job s grows with workers when compiles slow each other down\n{}", bt.str());
  }
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
