// Host time of choice generation (no GPU): for every problem of the Llama-3-8B workload and 4096^3 bf16, how long
// default_ops().choices() takes for sm_90a at default effort's sample size, and how long hashing every choice's
// kernel key takes (what the compile gate does next). Measured twice in one run, the same binary:
//   uncached: templates::set_generation_cache(false), every problem renders and samples afresh (the reference);
//   cached:   the memo on, emptied first, so the first problem of each template/dtype/layout is cold and later
//             ones reuse its renders and samples.
// Each mode runs the whole sequence --rounds times (the memo emptied before each cached round); per problem the
// median is reported. It also checks that both modes generate the same choices (names, kernel keys), and times
// what a cached decision costs instead (`rebuild ms`: one decided choice rebuilt from its stored parameters with
// the memo empty, as in a new process; the median over the problem's kernel choices).
//
//   bench_choice_gen [--workload examples/llama3-8b.json] [--rounds 3] [--json FILE]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "kiln/jit/key.h"
#include "kiln/runtime.h"
#include "kiln/runtime/workload.h"
#include "kiln/templates/registry.h"

using namespace kiln;
using namespace kiln::runtime;
using json = nlohmann::json;

namespace {

struct Named {
  std::string label;
  Problem problem;
};

struct Sample {
  double gen_ms = 0, keys_ms = 0;
  size_t choices = 0;
  uint64_t renders = 0, samples = 0;  // work done (memo misses)
  std::vector<std::string> signature;  // name and kernel keys of every choice
};

Sample generate(const Named& n, const ChoiceContext& ctx) {
  Sample s;
  const auto before = templates::generation_stats();
  const auto t0 = bench::Clock::now();
  auto choices = bench::must(default_ops().choices(n.problem, ctx), n.label);
  s.gen_ms = bench::seconds_since(t0) * 1e3;
  const auto after = templates::generation_stats();
  s.renders = after.renders - before.renders;
  s.samples = after.samples - before.samples;
  s.choices = choices.size();
  const auto t1 = bench::Clock::now();
  for (const auto& c : choices) {
    std::string sig = c->name();
    for (const auto& k : c->kernels()) sig += " " + make_key(k.source, k.target).hex();
    s.signature.push_back(std::move(sig));
  }
  s.keys_ms = bench::seconds_since(t1) * 1e3;
  return s;
}

double median(std::vector<double> v) { return bench::stats(std::move(v)).median; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"host time of choice generation, memo off and on, side by side"};
  std::string workload = std::string(KILN_SOURCE_DIR) + "/examples/llama3-8b.json";
  std::string json_path;
  int rounds = 3;
  app.add_option("--workload", workload, "workload JSON");
  app.add_option("--rounds", rounds, "runs of the whole sequence per mode")->check(CLI::Range(1, 100));
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);

  auto w = bench::must(load_workload(workload), "the workload");
  std::vector<Named> problems;
  for (size_t i = 0; i < w.problems.size(); ++i) problems.push_back({w.labels[i] + " " + w.problems[i].describe(), w.problems[i]});
  GemmProblem g;
  g.m = g.n = g.k = 4096;
  problems.push_back({"4096^3 " + Problem::gemm(g).describe(), Problem::gemm(g)});

  ChoiceContext ctx = bench::must(choice_context_for_arch(Target{"sm_90a"}), "sm_90a");
  ctx.max_template_configs = effort_policy(Effort::kDefault).sample_per_template;

  // [mode][problem][round]
  std::vector<std::vector<std::vector<Sample>>> runs(2, std::vector<std::vector<Sample>>(problems.size()));
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 2; ++mode) {
      templates::set_generation_cache(mode == 1);
      templates::clear_generation_cache();
      for (size_t i = 0; i < problems.size(); ++i) runs[mode][i].push_back(generate(problems[i], ctx));
    }
  }
  templates::set_generation_cache(true);

  // A warm start's share: rebuilding one decided choice from its stored parameters in a new process (the memo
  // empty), against generating every choice. Median over the problem's template and subgraph choices.
  std::vector<double> rebuild_ms(problems.size(), 0);
  for (size_t i = 0; i < problems.size(); ++i) {
    auto def = bench::must(default_ops().find(problems[i].problem.op), "op");
    auto choices = bench::must(default_ops().choices(problems[i].problem, ctx), problems[i].label);
    std::vector<double> times;
    for (const auto& c : choices) {
      if (c->kernels().empty()) continue;
      auto params = c->parameters();
      std::vector<std::pair<std::string, std::string>> stored(params.begin(), params.end());
      templates::clear_generation_cache();
      const auto t0 = bench::Clock::now();
      auto again = def->rebuild(problems[i].problem, c->name(), stored, ctx);
      times.push_back(bench::seconds_since(t0) * 1e3);
      bench::check(again.status(), c->name());
    }
    rebuild_ms[i] = median(times);
  }

  bench::Table table({"problem", "choices", "uncached ms", "cached ms", "speedup", "memo", "renders", "samples",
                      "keys ms", "rebuild ms", "same"});
  json rows = json::array();
  double total_uncached = 0, total_cached = 0, warm_uncached = 0, warm_cached = 0;
  int warm_n = 0, mismatches = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    std::vector<double> u, c, ku, kc;
    for (const auto& s : runs[0][i]) u.push_back(s.gen_ms), ku.push_back(s.keys_ms);
    for (const auto& s : runs[1][i]) c.push_back(s.gen_ms), kc.push_back(s.keys_ms);
    const Sample& first_cached = runs[1][i].front();
    // Cold: this problem walked a grid (the first of its template/dtype/layout); warm: it reused every sample.
    const bool cold = first_cached.samples > 0;
    bool same = true;
    for (int r = 0; r < rounds; ++r) same &= runs[0][i][r].signature == runs[1][i][r].signature;
    mismatches += !same;
    const double mu = median(u), mc = median(c);
    total_uncached += mu, total_cached += mc;
    if (!cold) warm_uncached += mu, warm_cached += mc, ++warm_n;
    table.add({problems[i].label, std::to_string(first_cached.choices), fmt::format("{:.2f}", mu), fmt::format("{:.2f}", mc),
               fmt::format("{:.1f}x", mu / mc), cold ? "cold" : "warm", std::to_string(first_cached.renders),
               std::to_string(first_cached.samples), fmt::format("{:.2f}", median(kc)), fmt::format("{:.2f}", rebuild_ms[i]), same ? "yes" : "NO"});
    rows.push_back({{"problem", problems[i].label}, {"choices", first_cached.choices}, {"uncached_ms", mu},
                    {"cached_ms", mc}, {"memo", cold ? "cold" : "warm"}, {"renders", first_cached.renders},
                    {"samples", first_cached.samples}, {"uncached_renders", runs[0][i].front().renders},
                    {"keys_uncached_ms", median(ku)}, {"keys_cached_ms", median(kc)}, {"rebuild_ms", rebuild_ms[i]},
                    {"same_choices", same}});
  }
  fmt::print("{}", table.str());
  const double warm_speedup = warm_n ? warm_uncached / warm_cached : 0;
  fmt::print("{} problems, {} rounds: uncached {:.1f} ms in all, cached {:.1f} ms; warm problems ({}): {:.2f} -> {:.3f} "
             "ms each, {:.0f}x (target >= 10x); choices differ on {} problems\n",
             problems.size(), rounds, total_uncached, total_cached, warm_n, warm_n ? warm_uncached / warm_n : 0,
             warm_n ? warm_cached / warm_n : 0, warm_speedup, mismatches);
  json out{{"environment", bench::environment()}, {"arch", "sm_90a"}, {"sample_per_template", ctx.max_template_configs},
           {"rounds", rounds}, {"problems", rows}, {"total_uncached_ms", total_uncached}, {"total_cached_ms", total_cached},
           {"warm_problems", warm_n}, {"warm_uncached_ms_mean", warm_n ? warm_uncached / warm_n : 0},
           {"warm_cached_ms_mean", warm_n ? warm_cached / warm_n : 0}, {"warm_speedup", warm_speedup},
           {"mismatches", mismatches}};
  if (!json_path.empty() && !bench::write_json(json_path, out)) return 1;
  return mismatches == 0 ? 0 : 1;
}
