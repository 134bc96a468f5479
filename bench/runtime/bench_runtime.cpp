// The autotuner's targets (issue 6), each a phase of this program so that cold and warm runs are separate
// processes:
//   tune      --problem gemm:M,N,K[:epilogue] --cache-dir D [--mode tune|off]
//             one tune in this process: make_tuner, tune(), the report (cold with an empty D, warm with a
//             filled one); cuBLAS's default is among the choices, measured in the same run.
//   stability --problem ... --runs 20     spawns `tune --mode off` in fresh processes and counts the choices.
//   dispatch  --problem ...                host cost of Dispatcher::run and Selection::run against a raw
//             cuLaunchKernel of the same compiled kernel.
// Each phase prints a table and, with --json FILE, writes JSON.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "kiln/cache/tuning.h"
#include "kiln/jit/driver.h"
#include "kiln/runtime.h"

extern char** environ;

namespace {

using kiln::bench::Clock;
using kiln::bench::seconds_since;
using namespace kiln;
using namespace kiln::runtime;

Result<Problem> parse_problem(const std::string& spec) {
  // gemm:M,N,K[:epilogue]
  int64_t m = 0, n = 0, k = 0;
  char epi[64] = {};
  int got = std::sscanf(spec.c_str(), "gemm:%ld,%ld,%ld:%63s", &m, &n, &k, epi);
  if (got < 3) return make_error(ErrorCode::kInvalidArgument, "expected --problem gemm:M,N,K[:epilogue]");
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  KILN_ASSIGN_OR_RETURN(g.epilogue, templates::parse_epilogue(got == 4 ? epi : "", DType::kBF16));
  return Problem::gemm(g);
}

Result<std::unique_ptr<Tuner>> make_tuner(const std::string& dir, const std::string& mode_name, int configs) {
  KILN_ASSIGN_OR_RETURN(cache::TuneMode mode, cache::parse_tune_mode(mode_name));
  cache::StoreOptions store;
  store.dir = dir;
  KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(mode, store));
  TuneOptions o;
  o.cache = std::move(c);
  o.max_template_configs = configs;
  return make_tuner(o);
}

int phase_tune(const Problem& p, const std::string& dir, const std::string& mode, int configs, const std::string& json) {
  auto ctx = ensure_context(0);  // the serving engine's context exists before kiln is asked anything
  if (!ctx.ok()) {
    fmt::print(stderr, "{}\n", ctx.status().to_string());
    return 1;
  }
  const auto t0 = Clock::now();
  auto tuner = make_tuner(dir, mode, configs);
  if (!tuner.ok()) {
    fmt::print(stderr, "{}\n", tuner.status().to_string());
    return 1;
  }
  const double create_s = seconds_since(t0);
  const auto t1 = Clock::now();
  auto sel = (*tuner)->tune(p);
  const double tune_s = seconds_since(t1);
  if (!sel.ok()) {
    fmt::print(stderr, "{}\n", sel.status().to_string());
    return 1;
  }
  // The first launch of the ready kernel, synchronised: nothing may be left to set up at this point.
  double first_launch_s = 0;
  {
    auto def = default_ops().find(p.op);
    auto bufs = (*def)->buffers(p, 9);
    auto d = driver();
    if (bufs.ok() && d.ok()) {
      (void)(*d)->cuCtxSynchronize();
      const auto t2 = Clock::now();
      Status ran = (*sel)->run(bufs->args, nullptr);
      (void)(*d)->cuCtxSynchronize();
      first_launch_s = seconds_since(t2);
      if (!ran.ok()) fmt::print(stderr, "first launch: {}\n", ran.to_string());
    }
  }
  const TuneReport& r = (*sel)->report();
  double chosen_us = 0, cublas_us = 0, second_us = 0;
  for (const auto& c : r.choices) {
    if (!c.status.ok() || c.partial) continue;
    if (c.name == r.chosen) chosen_us = c.median_us;
    else if (second_us == 0) second_us = c.median_us;
    if (c.name == "cublas_default" || c.name == r.reference) cublas_us = c.median_us;
  }
  fmt::print("{}", r.table(6));
  fmt::print("RESULT create_s={:.4f} tune_s={:.4f} total_s={:.4f} first_launch_s={:.4f} choices={} chosen={} chosen_us={:.2f} second_us={:.2f} "
             "reference_us={:.2f} cached={}\n",
             create_s, tune_s, create_s + tune_s, first_launch_s, r.candidates, r.chosen, chosen_us, second_us, cublas_us,
             r.decision_from_cache ? 1 : 0);
  if (!json.empty()) {
    nlohmann::json j{{"benchmark", "tune"}, {"environment", bench::environment()}, {"problem", r.problem},
                     {"mode", mode}, {"create_seconds", create_s}, {"tune_seconds", tune_s},
                     {"total_seconds", create_s + tune_s}, {"first_launch_seconds", first_launch_s}, {"choices", r.candidates}, {"chosen", r.chosen},
                     {"chosen_us", chosen_us}, {"second_us", second_us}, {"reference", r.reference},
                     {"reference_us", cublas_us}, {"decision_from_cache", r.decision_from_cache},
                     {"report", nlohmann::json::parse(r.json())}};
    bench::write_json(json, j);
  }
  return 0;
}

int phase_stability(const std::string& self, const std::string& spec, int runs, int configs, const std::string& json) {
  std::map<std::string, int> counts;
  std::vector<double> gaps;
  for (int i = 0; i < runs; ++i) {
    std::string dir = fmt::format("/tmp/kiln_stability_{}_{}", ::getpid(), i);
    std::vector<std::string> args = {self, "tune", "--problem", spec, "--cache-dir", dir, "--mode", "off",
                                     "--configs", std::to_string(configs)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return 1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid;
    if (posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ) != 0) return 1;
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    auto pos = out.find("RESULT ");
    if (pos == std::string::npos) {
      fmt::print("run {}: no result\n{}\n", i, out);
      continue;
    }
    std::string line = out.substr(pos, out.find('\n', pos) - pos);
    auto field = [&](const std::string& name) {
      auto p = line.find(" " + name + "=");
      if (p == std::string::npos) return std::string();
      p += name.size() + 2;
      return line.substr(p, line.find(' ', p) - p);
    };
    counts[field("chosen")]++;
    double chosen = std::stod(field("chosen_us")), second = std::stod(field("second_us"));
    gaps.push_back(second > 0 ? (second - chosen) / chosen : 0);
    fmt::print("run {:2}: {} ({} us; next best +{:.1f}%)\n", i, field("chosen"), field("chosen_us"), 100 * gaps.back());
  }
  int top = 0;
  std::string top_name;
  for (const auto& [name, n] : counts) {
    if (n > top) top = n, top_name = name;
  }
  auto g = bench::stats(gaps);
  fmt::print("STABILITY {} of {} fresh processes chose {}; median gap to the next best {:.1f}%\n", top, runs, top_name,
             100 * g.median);
  if (!json.empty()) {
    nlohmann::json j{{"benchmark", "stability"}, {"environment", bench::environment()}, {"problem", spec},
                     {"runs", runs}, {"counts", counts}, {"most_common", top_name}, {"most_common_count", top},
                     {"gap_to_second", bench::to_json(g)}};
    bench::write_json(json, j);
  }
  return 0;
}

int phase_dispatch(const Problem& p, const std::string& dir, int configs, const std::string& json) {
  auto tuner = make_tuner(dir, "tune", configs);
  if (!tuner.ok()) {
    fmt::print(stderr, "{}\n", tuner.status().to_string());
    return 1;
  }
  // A template kernel serves every bucket, so the dispatcher's cost is measured on a kernel also launched raw.
  auto deferred = (*tuner)->defer(p);
  if (!deferred.ok()) return 1;
  auto dispatcher = (*deferred)->finalize({1, 16, 64});
  if (!dispatcher.ok()) {
    fmt::print(stderr, "{}\n", dispatcher.status().to_string());
    return 1;
  }
  auto def = default_ops().find(p.op);
  auto buffers = (*def)->buffers(p.with_dynamic_size(1), 3);
  auto d = driver();
  auto stream = Stream::create();
  if (!buffers.ok() || !d.ok() || !stream.ok()) return 1;
  // The raw launch: a trivial kernel with one by-value argument struct, launched the way kiln launches.
  KernelSource tiny;
  tiny.name = "tiny";
  tiny.entry = "tiny";
  tiny.headers = {kernel_abi_header()};
  tiny.source = "#include \"kiln/templates/kernel_args.h\"\nextern \"C\" __global__ void tiny(const KilnGemmArgs a) "
                "{ if (a.m < 0) static_cast<float*>(a.d)[0] = 1; }\n";
  auto bin = compile(tiny, Target{(*tuner)->context().target});
  auto kernel = bin.ok() ? load_kernel(*bin) : Result<Kernel>(bin.status());
  if (!kernel.ok()) return 1;
  const KilnGemmArgs& args = std::get<KilnGemmArgs>(buffers->args);
  // The dispatched choice for M=1, run through the dispatcher with the tiny kernel's cost as the floor.
  constexpr int kCalls = 20000;
  auto time_calls = [&](auto&& call) {
    std::vector<double> per_call;
    for (int rep = 0; rep < 7; ++rep) {
      (void)(*d)->cuStreamSynchronize(stream->get());
      auto t = Clock::now();
      for (int i = 0; i < kCalls; ++i) call();
      per_call.push_back(seconds_since(t) / kCalls * 1e6);
      (void)(*d)->cuStreamSynchronize(stream->get());
    }
    return bench::stats(per_call);
  };
  LaunchConfig cfg;
  cfg.block = {32};
  cfg.stream = stream->get();
  void* raw_args[] = {const_cast<KilnGemmArgs*>(&args)};
  auto raw = time_calls([&] { (*d)->cuLaunchKernel(kernel->get(), 1, 1, 1, 32, 1, 1, 0, stream->get(), raw_args, nullptr); });
  auto via_kernel = time_calls([&] { (void)kernel->launch(cfg, raw_args); });
  // The dispatcher in front of a choice that launches this same tiny kernel: the difference is kiln's.
  auto tiny_choice = make_user_choice("tiny", tiny, Target{(*tuner)->context().target},
                                      [](const Kernel& k, const OpArgs& a, CUstream s) {
                                        LaunchConfig c;
                                        c.block = {32};
                                        c.stream = s;
                                        void* ptrs[] = {const_cast<KilnGemmArgs*>(&std::get<KilnGemmArgs>(a))};
                                        return k.launch(c, ptrs);
                                      });
  (void)tiny_choice->prepare({*bin});
  std::vector<std::shared_ptr<Selection>> sels;
  for (int i = 0; i < 3; ++i) sels.push_back(std::make_shared<Selection>(p, tiny_choice, TuneReport{}));
  auto tiny_dispatcher = Dispatcher::create({1, 16, 64}, sels);
  OpArgs op_args = args;
  auto via_dispatch = time_calls([&] { (void)(*tiny_dispatcher)->run(op_args, stream->get()); });
  // And the real tuned dispatcher (its chosen kernels do real work: GPU-bound, shown for reference only).
  kiln::bench::Table table({"launch path", "host us/call (median)", "p10", "p90", "over raw"});
  auto row = [&](const char* name, const bench::Stats& s) {
    table.add({name, fmt::format("{:.3f}", s.median), fmt::format("{:.3f}", s.p10), fmt::format("{:.3f}", s.p90),
               fmt::format("{:+.3f}", s.median - raw.median)});
  };
  row("raw cuLaunchKernel", raw);
  row("kiln::Kernel::launch", via_kernel);
  row("Dispatcher::run (3 buckets)", via_dispatch);
  fmt::print("{}", table.str());
  fmt::print("DISPATCH overhead {:.3f} us over raw cuLaunchKernel ({:.3f} us)\n", via_dispatch.median - raw.median, raw.median);
  if (!json.empty()) {
    nlohmann::json j{{"benchmark", "dispatch"}, {"environment", bench::environment()}, {"calls", kCalls},
                     {"raw_us", bench::to_json(raw)}, {"kernel_launch_us", bench::to_json(via_kernel)},
                     {"dispatcher_us", bench::to_json(via_dispatch)},
                     {"tuned_choices", {(*dispatcher)->selections()[0]->choice_name(),
                                        (*dispatcher)->selections()[1]->choice_name(),
                                        (*dispatcher)->selections()[2]->choice_name()}}};
    bench::write_json(json, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln autotuner benchmarks"};
  app.require_subcommand(1);
  std::string problem = "gemm:4096,4096,4096", dir = "/tmp/kiln_bench_cache", mode = "tune", json;
  int runs = 20, configs = 24;
  for (auto* sub : {app.add_subcommand("tune", "One tune in this process"),
                    app.add_subcommand("stability", "Tune in fresh processes and count the choices"),
                    app.add_subcommand("dispatch", "Host cost of dispatching")}) {
    sub->add_option("--problem", problem, "gemm:M,N,K[:epilogue]");
    sub->add_option("--cache-dir", dir, "Cache folder");
    sub->add_option("--mode", mode, "tune | use | strict | off");
    sub->add_option("--runs", runs, "Processes (stability)");
    sub->add_option("--configs", configs, "Template configurations per template");
    sub->add_option("--json", json, "Write results here");
  }
  CLI11_PARSE(app, argc, argv);
  auto p = parse_problem(problem);
  if (!p.ok()) {
    fmt::print(stderr, "{}\n", p.status().to_string());
    return 2;
  }
  const std::string which = app.get_subcommands().front()->get_name();
  if (which == "tune") return phase_tune(*p, dir, mode, configs, json);
  if (which == "stability") {
    char self[4096] = {};
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    return phase_stability(self, problem, runs, configs, json);
  }
  return phase_dispatch(*p, dir, configs, json);
}
