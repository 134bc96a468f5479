// Tuning speed (issue 16), each a phase of this program so that cold and warm runs can be separate processes:
//   suite    [--part i/N] [--shapes FILTER] [--deadline S] --json FILE
//            the public GEMM suite (bench/gemm suite_shapes) plus the Llama-3-8B workload's rmsnorm and softmax
//            problems, tuned at default and at exhaustive effort in the same process, each effort from its own
//            empty cache (compiles included; problems of one effort share that cache as `kiln tune` of a
//            workload does, with its PlanAhead: the planned kernels compile in the background while the first
//            problems tune, and the planning itself runs beside the tunes, inside the figures). Then
//            the two chosen kernels of every problem are re-timed side by side, interleaved, on the same buffers:
//            default_us / exhaustive_us. Per problem: problem, default_s, exhaustive_s, default_us,
//            exhaustive_us (+ choices, pruned, widenings).
//   merge    --out-dir bench/results PART.json...   joins the parts into
//            tuning-speed-<device>-<date>-<commit>.json with the summary (mean default_s, fraction within 1%,
//            max ratio) and prints the table.
//   gemm4096 --cache-dir EMPTY --json FILE          one cold 4096^3 bf16 tune at --effort (default: default).
//   workload --workload examples/llama3-8b.json --cache-dir D --json FILE
//            every problem of the workload at --effort as `kiln tune` does it: cold with an empty D, warm with
//            the D a previous run filled.
//   probe    --pair ID:NAME,NAME... [--allocations K] [--no-series]
//            a diagnostic of the timing method: the named choices of a suite problem timed after idle, after
//            warm-ups, and on K more sets of buffers placed elsewhere in device memory.
//   plan     [--part i/N] [--sample N] [--ms-per-choice MS]   no GPU: how many distinct kernels each effort
//            compiles for the suite part, an estimate of their NVRTC time from compiling a sample of them here,
//            and of the part's whole call on the device (compiles on 16 workers + measurements + generation).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "kiln/cache/tuning.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/workload.h"
#include "suite_shapes.h"

namespace {

using kiln::bench::Clock;
using kiln::bench::seconds_since;
using namespace kiln;
using namespace kiln::runtime;
using json = nlohmann::json;

struct Part {
  size_t index = 0, count = 1;
};

Part parse_part(const std::string& s) {
  Part p;
  if (s.empty()) return p;
  if (std::sscanf(s.c_str(), "%zu/%zu", &p.index, &p.count) != 2 || p.count == 0 || p.index >= p.count) {
    bench::fail(make_error(ErrorCode::kInvalidArgument, fmt::format("--part '{}': give i/N with 0 <= i < N", s)));
  }
  return p;
}

struct Named {
  std::string id;
  Problem problem;
};

// The suite's GEMMs and the workload's norms and softmax, in a fixed order; the part's share of them.
std::vector<Named> suite_problems(const std::string& filter, const std::string& workload, Part part) {
  std::vector<Named> all;
  for (const auto& s : bench::suite::filter_shapes(bench::suite::suite_shapes(), filter)) {
    GemmProblem g;
    g.m = s.m, g.n = s.n, g.k = s.k;
    g.a = g.b = s.dtype;
    g.b_layout = s.layout_b;
    g.epilogue.out = s.dtype;
    all.push_back({s.id(), Problem::gemm(g)});
  }
  auto w = bench::must(load_workload(workload), "the workload");
  for (size_t i = 0; i < w.problems.size(); ++i) {
    if (w.problems[i].op == "gemm") continue;
    all.push_back({w.labels[i] + " " + w.problems[i].describe(), w.problems[i]});
  }
  std::vector<Named> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i % part.count == part.index) out.push_back(std::move(all[i]));
  }
  return out;
}

std::shared_ptr<cache::TuningCache> fresh_cache(const std::string& dir) {
  std::filesystem::remove_all(dir);
  cache::StoreOptions store;
  store.dir = dir;
  return bench::must(cache::TuningCache::open(cache::TuneMode::kTune, store), "opening the cache");
}

// Waits for everything queued in the current context; a failure ends the bench naming the CUDA error.
void sync_context(const DriverApi* d) {
  bench::check(to_status(d->cuCtxSynchronize(), "cuCtxSynchronize", __FILE__, __LINE__));
}

// How every tuner and re-time of this run measures (the defaults, or --l2-flush-by-writing).
BenchmarkOptions g_measuring;

std::unique_ptr<Tuner> tuner_for(std::shared_ptr<cache::TuningCache> c, std::shared_ptr<Executor> executor, Effort effort,
                                 int configs = 0, bool defer_loads = true) {
  TuneOptions o;
  o.bench = g_measuring;
  o.defer_loads = defer_loads;
  o.cache = std::move(c);
  o.executor = std::move(executor);
  o.effort = effort;
  o.max_template_configs = configs;
  return bench::must(make_tuner(o), "make_tuner");
}

// The problems' Problem values, for PlanAhead.
std::vector<Problem> problems_of(const std::vector<Named>& named) {
  std::vector<Problem> out;
  for (const auto& n : named) out.push_back(n.problem);
  return out;
}

struct Tuned {
  double seconds = 0;
  // The choices planned ahead for this problem, and those of them still compiling when its tune began: with
  // each choice's wait_s in the report, they say whether a compile wait was for a kernel planned late in the
  // queue or for one no plan ahead named.
  std::vector<std::string> planned_ahead, pending_at_start;
  std::shared_ptr<Selection> selection;
  Status status;
};

// Re-times two selections of one problem side by side: `rounds` rounds of `runs` each, interleaved in ABBA order
// (so neither always runs right after the other). Each kernel is timed the way the tuner times it: as graph
// replays only when a short eager estimate is below graph_below_us (cuBLAS may run another kernel when it is
// captured without a workspace of its own, so forcing graphs on long externs compares something else). The same
// choice in both is one kernel: timed once, and both figures are that one.
// time_both: time a and b as two even when they are one kernel (the re-time's own noise floor: A against A).
// Both over kRetimePlacements sets of operands, each allocated apart, as the tuner times over its own
// (BenchmarkOptions::placements): an extern's time depends on where its operands lie. A kernel's figure is its
// placement-balanced median (placed_median: the mean of each set's median), as the tuner's is; `pooled` is the
// median of all its runs together, the re-time's figure before 1 Dec, kept to compare the two.
// Runs continue the rotation from round to round, so that each set gets as many. Eight sets instead of four
// (H200 suite, 1 Dec, 8934bf3-10203ad) read the same kernel against itself beyond 1% on 5-6 of 120 problems
// against 3 with four (ffad048).
constexpr int kRetimePlacements = 4;
constexpr int kRetimeRuns = 12;

struct SideBySide {
  double a = 0, b = 0;
  double a_pooled = 0, b_pooled = 0;
};

SideBySide side_by_side(const Tuner& tuner, const Problem& problem, const Selection& a, const Selection& b, int rounds,
                        int runs = kRetimeRuns, bool time_both = false) {
  auto def = bench::must(tuner.ops().find(problem.op));
  OperandSets operands = bench::must(make_operand_sets(*def, problem, 1, kRetimePlacements, size_t{4} << 30), "buffers");
  const std::vector<const OpArgs*> sets = operands.args();
  auto d = bench::must(driver());
  sync_context(d);
  DeviceBuffer ws = bench::must(DeviceBuffer::allocate(std::max<size_t>({a.choice()->workspace_bytes(),
                                                                          b.choice()->workspace_bytes(), 256})));
  BenchmarkOptions o = g_measuring;
  o.adaptive = false;
  auto runner = bench::must(BenchRunner::create(o, tuner.context().device), "bench runner");
  const bool same = !time_both && a.choice()->name() == b.choice()->name();
  auto graphed = [&](const Selection& sel) {
    for (const OpArgs* args : sets) (void)sel.choice()->run(*args, ws.ptr(), runner->stream());
    auto est = runner->time_runs(*sel.choice(), sets, ws.ptr(), 4, false);
    return est.ok() && summarize(est->us).median < o.graph_below_us;
  };
  const bool graph_a = graphed(a), graph_b = same ? graph_a : graphed(b);
  Samples ta, tb;
  for (int r = 0; r < rounds; ++r) {
    const bool a_first = r % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool is_a = (k == 0) == a_first;
      if (same && !is_a) continue;
      Samples& into = is_a ? ta : tb;
      auto s = runner->time_runs(*(is_a ? a : b).choice(), sets, ws.ptr(), runs, is_a ? graph_a : graph_b, nullptr,
                                 into.us.size());
      if (s.ok()) into.append(*s);
    }
  }
  SideBySide out;
  out.a = summarize(ta).median;
  out.a_pooled = summarize(ta.us).median;
  out.b = same ? out.a : summarize(tb).median;
  out.b_pooled = same ? out.a_pooled : summarize(tb.us).median;
  return out;
}

// The tuner's own method (BenchRunner::measure: warm-up, estimate, adaptive rounds) on the re-time's fresh
// buffers, after the tunes: with side_by_side's A-against-A, what tells a re-time's disagreement with the tune
// apart from noise.
double measured_again(const Tuner& tuner, const Problem& problem, const Selection& s) {
  auto def = bench::must(tuner.ops().find(problem.op));
  OperandSets operands = bench::must(make_operand_sets(*def, problem, 1, g_measuring.placements,
                                                       g_measuring.placement_bytes), "buffers");
  auto d = bench::must(driver());
  sync_context(d);
  DeviceBuffer ws = bench::must(DeviceBuffer::allocate(std::max<size_t>(s.choice()->workspace_bytes(), 256)));
  auto runner = bench::must(BenchRunner::create(g_measuring, tuner.context().device), "bench runner");
  auto m = runner->measure(*s.choice(), operands.args(), ws.ptr(), 0);
  return m.ok() ? summarize(*m).median : 0;
}

// How the two efforts' figures are made, written into the JSON and printed with the table.
std::string suite_method(int exhaustive_configs, int retime_rounds) {
  return fmt::format(
      "each effort tunes this part's problems cold, in order, on its own empty cache shared across the part (a "
      "workload tune, as `kiln tune` runs one: a kernel compiles once per cache, then serves every problem of its "
      "dtype/layout, since sizes are run-time arguments); default_s and exhaustive_s are each problem's tune time "
      "in that workload. The exhaustive reference measures every generated choice (no model pruning) with the "
      "sample bounded to {} configurations per template (every parameter value covered, the seeds included). "
      "default_us / exhaustive_us re-time both chosen kernels side by side, {} rounds of {} runs interleaved in ABBA "
      "order, each as the tuner times it (graph replays below graph_below_us, L2 flushed before each run by {}), "
      "rotating over {} sets of operands allocated apart (the tuner times over {}); a kernel's figure is the mean of "
      "its medians on each set (default_pooled_us / exhaustive_pooled_us: the median of all its runs together, the "
      "figure before 1 Dec); where both efforts chose the same kernel it is timed once.",
      exhaustive_configs > 0 ? std::to_string(exhaustive_configs) : std::string("all"), retime_rounds,
      kRetimeRuns,
      g_measuring.flush_l2_by_writing ? "writing (a memset of twice its size)" : "reading a buffer of twice its size",
      kRetimePlacements, g_measuring.placements);
}

// How the suite runs. Experiments on the default effort: `default_only` skips the exhaustive reference (and the
// re-times); `plan_ahead` false leaves out the background compiles of every problem's planned choices (each tune
// compiles what it measures when it gets there).
struct SuiteOptions {
  bool default_only = false;
  bool plan_ahead = true;
  // Rounds of the side-by-side re-time (12 runs each; the self re-time's 10): 6 read one kernel against itself
  // beyond +-1% on 9-11 of 120 problems (H200, 29 Nov, 95bdbe2 and cfd5bc9), 12 on 1 (91b80e2) but on 4-7 in the
  // three runs of 1 Dec (520e023, 7af7bd2, ca414f2: four operand sets, power-capped hosts), 24 on 1 the same day
  // (ca414f2, ~5 s more per part).
  int retime_rounds = 24;
  // A second exhaustive tune on its own empty cache after the first, its pick re-timed against the first's and
  // the default's: how often the reference agrees with itself within 1% says how much of the default's
  // distance from it is the reference's own noise (an experiment: ~100 s more per part).
  bool second_reference = false;
  // The workload's plan ahead (PlanAhead::Options): how far ahead a tune re-plans, and whether what a widening
  // may reach compiles speculatively.
  PlanAhead::Options ahead;
};

// One tune of the suite's problems: the effort, its label in the JSON and the reports, and its sample bound.
struct Side {
  std::string label;
  Effort effort;
  int configs = 0;
};

int phase_suite(const std::string& part_text, const std::string& filter, const std::string& workload,
                const std::string& cache_root, int exhaustive_configs, const std::string& json_path, double deadline_s,
                const std::string& reports_path, SuiteOptions options) {
  bench::check(ensure_context(0).status(), "no GPU");
  const auto run_start = Clock::now();
  fmt::print(stderr, "run start: unix {:.3f} s\n",
             std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  const Part part = parse_part(part_text);
  const std::vector<Named> problems = suite_problems(filter, workload, part);
  auto executor = bench::must(make_executor(), "executor");
  fmt::print("tuning speed: {} problems (part {}/{}), default and exhaustive effort, {} compile workers ({})\n",
             problems.size(), part.index, part.count, executor->concurrency(), executor->kind());
  std::map<std::string, std::vector<Tuned>> tuned;
  std::map<std::string, std::unique_ptr<Tuner>> tuners;
  std::map<std::string, double> totals;
  std::map<std::string, json> gates;
  const std::string kDef = "default", kExh = "exhaustive", kExh2 = "exhaustive2";
  std::vector<Side> sides{{kDef, Effort::kDefault, 0}};
  if (!options.default_only) sides.push_back({kExh, Effort::kExhaustive, exhaustive_configs});
  if (!options.default_only && options.second_reference) sides.push_back({kExh2, Effort::kExhaustive, exhaustive_configs});
  for (const Side& side : sides) {
    const std::string& effort = side.label;
    const std::string dir = fmt::format("{}/{}-{}", cache_root, side.label, part.index);
    auto tuner = tuner_for(fresh_cache(dir), executor, side.effort, side.configs);
    const auto start = Clock::now();
    std::optional<PlanAhead> ahead;
    if (options.plan_ahead) ahead.emplace(*tuner, problems_of(problems), options.ahead);
    for (size_t i = 0; i < problems.size(); ++i) {
      const auto& p = problems[i];
      Tuned t;
      if (deadline_s > 0 && seconds_since(run_start) > deadline_s) {
        // Out of the call's time: the rest are reported as not run, so that what was measured comes back.
        t.status = make_error(ErrorCode::kTimeout, fmt::format("not run: past --deadline {} s", deadline_s));
        tuned[effort].push_back(std::move(t));
        continue;
      }
      if (ahead) {
        t.planned_ahead = ahead->requested(i);
        t.pending_at_start = ahead->pending(i);
      }
      const auto t0 = Clock::now();
      auto sel = tuner->tune(p.problem);
      if (ahead) ahead->tuned(i);
      t.seconds = seconds_since(t0);
      if (sel.ok()) t.selection = *sel;
      else t.status = sel.status();
      tuned[effort].push_back(std::move(t));
      // t= (seconds since the run began) lines the problem up with a clock/power log taken beside the run.
      fmt::print(stderr, "t={:.3f} {} {}: {:.3f} s{}\n", seconds_since(run_start), effort, p.id,
                 tuned[effort].back().seconds,
                 sel.ok() ? " " + (*sel)->choice_name() : " FAILED " + sel.status().to_string());
    }
    totals[effort] = seconds_since(start);
    // What the gate compiled for this effort (the default effort is compile-bound: how many of its compiles
    // were for choices it then measured says how much of the pool's time the background planning wasted).
    const GateCounters g = tuner->gate().counters();
    std::set<std::string> measured_names;
    for (const Tuned& t : tuned[effort]) {
      if (!t.selection) continue;
      for (const auto& c : t.selection->report().choices) {
        if (c.kind != ChoiceKind::kExtern && !c.from_cache && c.reps > 0) measured_names.insert(c.name);
      }
    }
    const int measured_kernels = static_cast<int>(measured_names.size());
    gates[effort] = json{{"requests", g.requests}, {"joined", g.joined},   {"repeats", g.repeats},
                         {"compiles", g.compiles}, {"compiled", g.compiled}, {"failed", g.failed},
                         {"withdrawn", g.withdrawn}, {"distinct_measured_choices", measured_kernels}};
    fmt::print(stderr, "{} gate: {} requests, {} compiles submitted ({} compiled, {} failed, {} withdrawn), {} distinct "
               "compiled choices measured\n", effort, g.requests, g.compiles, g.compiled, g.failed, g.withdrawn,
               measured_kernels);
    tuners[effort] = std::move(tuner);
  }
  json rows = json::array();
  bench::Table table({"problem", "default s", "exhaustive s", "default us", "exhaustive us", "ratio", "pruned", "chosen (default)"});
  for (size_t i = 0; options.default_only && i < problems.size(); ++i) {
    const Tuned& d = tuned[kDef][i];
    json row{{"problem", problems[i].id}, {"default_s", d.seconds}};
    if (d.selection) {
      row["default_choice"] = d.selection->report().chosen;
      row["default_compile_wait_s"] = d.selection->report().compile_wait_seconds;
    } else {
      row["error"] = d.status.to_string();
    }
    rows.push_back(row);
  }
  for (size_t i = 0; !options.default_only && i < problems.size(); ++i) {
    const Tuned& d = tuned[kDef][i];
    const Tuned& x = tuned[kExh][i];
    json row{{"problem", problems[i].id}, {"default_s", d.seconds}, {"exhaustive_s", x.seconds}};
    if (!d.selection || !x.selection) {
      row["error"] = (!d.selection ? d.status : x.status).to_string();
      rows.push_back(row);
      continue;
    }
    const SideBySide both = side_by_side(*tuners[kDef], problems[i].problem, *d.selection,
                                         *x.selection, options.retime_rounds);
    const double dus = both.a, xus = both.b;
    const TuneReport& dr = d.selection->report();
    const TuneReport& xr = x.selection->report();
    row["default_us"] = dus;
    row["exhaustive_us"] = xus;
    row["default_pooled_us"] = both.a_pooled;
    row["exhaustive_pooled_us"] = both.b_pooled;
    const SideBySide self = side_by_side(*tuners[kDef], problems[i].problem, *d.selection, *d.selection,
                                         options.retime_rounds, 10, true);
    row["default_self_us"] = {self.a, self.b};
    row["default_self_pooled_us"] = {self.a_pooled, self.b_pooled};
    row["default_measured_again_us"] = measured_again(*tuners[kDef], problems[i].problem, *d.selection);
    for (const auto& c : dr.choices) {
      if (c.name == dr.chosen) row["default_tuned_us"] = c.median_us;
    }
    row["default_choice"] = dr.chosen;
    row["exhaustive_choice"] = xr.chosen;
    row["default_candidates"] = dr.candidates;
    row["exhaustive_candidates"] = xr.candidates;
    row["default_pruned"] = dr.pruned;
    row["default_pruned_extern_first"] = dr.pruned_extern_first;
    row["default_best_extern_us"] = dr.best_extern_us;
    row["default_cached_candidates"] = dr.cached_candidates;
    row["default_widenings"] = dr.widenings;
    row["exhaustive_chosen_model_rank"] = xr.chosen_model_rank;
    if (options.second_reference) {
      const Tuned& y = tuned[kExh2][i];
      row["second_exhaustive_s"] = y.seconds;
      if (y.selection) {
        row["second_exhaustive_choice"] = y.selection->report().chosen;
        // [first, second] and [default, second]: each pair re-timed side by side like the main pair.
        const SideBySide refs = side_by_side(*tuners[kDef], problems[i].problem, *x.selection, *y.selection,
                                             options.retime_rounds);
        row["reference_pair_us"] = {refs.a, refs.b};
        const SideBySide def2 = side_by_side(*tuners[kDef], problems[i].problem, *d.selection, *y.selection,
                                             options.retime_rounds);
        row["default_vs_second_us"] = {def2.a, def2.b};
      } else {
        row["second_exhaustive_error"] = y.status.to_string();
      }
    }
    rows.push_back(row);
    table.add({problems[i].id.substr(0, 44), fmt::format("{:.3f}", d.seconds), fmt::format("{:.3f}", x.seconds),
               fmt::format("{:.2f}", dus), fmt::format("{:.2f}", xus), fmt::format("{:.3f}", dus / xus),
               std::to_string(dr.pruned), dr.chosen.substr(0, 40)});
  }
  if (!reports_path.empty()) {
    // Every choice's measured time and model estimate, per problem and effort: what a refit of the model's
    // calibration on this device reads (one JSON object per line).
    std::ofstream reports(reports_path);
    for (size_t i = 0; i < problems.size(); ++i) {
      for (const Side& side : sides) {
        const Tuned& t = tuned[side.label][i];
        if (!t.selection) continue;
        reports << json{{"problem", problems[i].id},
                        {"effort", side.label},
                        {"planned_ahead", t.planned_ahead},
                        {"pending_at_start", t.pending_at_start},
                        {"report", json::parse(t.selection->report().json())}}
                       .dump()
                << "\n";
      }
    }
    if (!reports) bench::fail(make_error(ErrorCode::kIoError, fmt::format("cannot write '{}'", reports_path)));
  }
  fmt::print("{}", table.str());
  fmt::print("part totals: default {:.1f} s, exhaustive {:.1f} s for {} problems\nmethod: {}\n", totals[kDef],
             totals[kExh], problems.size(), suite_method(exhaustive_configs, options.retime_rounds));
  json out{{"environment", bench::environment()}, {"part", fmt::format("{}/{}", part.index, part.count)},
           {"default_total_s", totals[kDef]}, {"exhaustive_total_s", totals[kExh]},
           {"exhaustive_configs", exhaustive_configs}, {"method", suite_method(exhaustive_configs, options.retime_rounds)},
           {"default_gate", gates[kDef]}, {"exhaustive_gate", gates[kExh]},
           {"second_exhaustive_total_s", totals[kExh2]},
           {"experiment", {{"default_only", options.default_only}, {"plan_ahead", options.plan_ahead},
                           {"second_reference", options.second_reference}}},
           {"problems", rows}};
  return json_path.empty() || bench::write_json(json_path, out) ? 0 : 1;
}

// How a choice's timing depends on what the GPU did just before (a diagnostic for the tuner's method, not a
// figure of merit). For each `ID:NAME,NAME...` pair: the named choices of the suite problem ID (each checked
// by the suite's tunes), compiled, then timed as the tuner times them (L2 flushed before each run): series of
// single runs after the GPU sat idle for 300 ms and right after that, medians after a warm-up of W ms of the
// same choice, and BenchRunner::measure after idle; with --allocations, medians on more sets of buffers, each
// placed elsewhere in device memory.
int phase_probe(const std::vector<std::string>& pairs, const std::string& workload, int allocations, bool series_too,
                const std::string& json_path) {
  // Every --pair is read and its problem found before the GPU is asked for: a typo fails at once, anywhere.
  const std::vector<Named> all = suite_problems("", workload, Part{});
  struct Probe {
    const Named* named;
    std::vector<std::string> names;
  };
  std::vector<Probe> probes;
  for (const std::string& pair : pairs) {
    const size_t colon = pair.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == pair.size()) {
      bench::fail(make_error(ErrorCode::kInvalidArgument, fmt::format("--pair '{}': give ID:NAME[,NAME...]", pair)));
    }
    const std::string id = pair.substr(0, colon);
    Probe p{nullptr, {}};
    for (size_t at = colon + 1; at <= pair.size();) {
      const size_t comma = std::min(pair.find(',', at), pair.size());
      if (comma == at) bench::fail(make_error(ErrorCode::kInvalidArgument, fmt::format("--pair '{}': an empty choice name", pair)));
      p.names.push_back(pair.substr(at, comma - at));
      at = comma + 1;
    }
    auto named = std::find_if(all.begin(), all.end(), [&](const Named& n) { return n.id == id; });
    if (named == all.end()) bench::fail(make_error(ErrorCode::kNotFound, fmt::format("--pair: no suite problem '{}'", id)));
    p.named = &*named;
    probes.push_back(std::move(p));
  }
  bench::check(ensure_context(0).status(), "no GPU");
  // The exhaustive sample (256 per template), where the exhaustive tunes found their picks.
  auto tuner = tuner_for(fresh_cache("/tmp/kiln-probe-cache"), nullptr, Effort::kExhaustive, 256);
  auto d = bench::must(driver());
  auto idle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  json out = json::array();
  for (const Probe& probe : probes) {
    const std::string& id = probe.named->id;
    const std::vector<std::string>& names = probe.names;
    const Problem& problem = probe.named->problem;
    auto def = bench::must(tuner->ops().find(problem.op));
    auto choices = bench::must(def->choices(problem, tuner->context()), "choices");
    OpBuffers buffers = bench::must(def->buffers(problem, 1), "buffers");
    sync_context(d);
    std::vector<ChoicePtr> picked;
    std::list<OpBuffers> held;
    size_t ws_bytes = 256;
    for (const auto& n : names) {
      auto it = std::find_if(choices.begin(), choices.end(), [&](const ChoicePtr& c) { return c->name() == n; });
      bench::check(it == choices.end() ? make_error(ErrorCode::kNotFound, id + " has no choice " + n) : Status());
      Binaries b = bench::must((*it)->precompile(tuner->gate(), Priority::kOnDemand).get(), "compile " + n);
      bench::check((*it)->prepare(b));
      picked.push_back(*it);
      ws_bytes = std::max(ws_bytes, (*it)->workspace_bytes());
    }
    DeviceBuffer ws = bench::must(DeviceBuffer::allocate(ws_bytes));
    // The host time of each choice's first runs after prepare(): what a tune's warm-up pays for it (1 Dec, bd19b73:
    // ~1.4 ms per extern choice and problem, nothing for templates).
    json first_runs = json::object();
    {
      std::string line = id + " first runs' host time, us:";
      for (const ChoicePtr& c : picked) {
        std::vector<double> host_us;
        for (int i = 0; i < 3; ++i) {
          const auto t0 = Clock::now();
          bench::check(c->run(buffers.args, ws.ptr(), nullptr));
          host_us.push_back(seconds_since(t0) * 1e6);
        }
        sync_context(d);
        first_runs[c->name()] = host_us;
        line += fmt::format(" {} {:.0f}/{:.0f}/{:.0f}", c->name(), host_us[0], host_us[1], host_us[2]);
      }
      fmt::print("{}\n", line);
    }
    BenchmarkOptions o = g_measuring;
    o.adaptive = false;
    o.max_reps = 128;
    auto runner = bench::must(BenchRunner::create(o, tuner->context().device), "bench runner");
    auto tuner_runner = bench::must(BenchRunner::create(g_measuring, tuner->context().device), "bench runner");
    json row{{"problem", id}, {"first_runs_host_us", first_runs}};
    // Placement: the same choices on `allocations` more sets of the problem's buffers (seed 1 each, all held,
    // so that each lands elsewhere in device memory; the last with seed 2), 64 runs each, interleaved.
    for (int a = 0; a < allocations; ++a) {
      OpBuffers& more = held.emplace_back(bench::must(def->buffers(problem, a + 1 == allocations ? 2 : 1), "buffers"));
      sync_context(d);
      std::string line = fmt::format("{} allocation {}{}:", id, a, a + 1 == allocations ? " (seed 2)" : "");
      json medians = json::object();
      for (int round = 0; round < 2; ++round) {
        for (const ChoicePtr& c : picked) {
          for (int i = 0; i < 2; ++i) bench::check(c->run(more.args, ws.ptr(), runner->stream()));
          const double est = summarize(bench::must(runner->time_runs(*c, more.args, ws.ptr(), 3, false)).us).median;
          const double m =
              summarize(bench::must(runner->time_runs(*c, more.args, ws.ptr(), 64, est < o.graph_below_us)).us).median;
          medians[c->name()].push_back(m);
          line += fmt::format(" {:.1f}", m);
        }
      }
      row["allocations"].push_back(medians);
      fmt::print("{}\n", line);
    }
    // Under sustained load (where a long compute-bound GEMM runs at the board's power cap): 2 s of the choices'
    // runs in turn, then six rounds of 64 runs of each, interleaved, with no idle between.
    if (series_too) {
      const auto t0 = Clock::now();
      while (seconds_since(t0) < 2.0) {
        for (const ChoicePtr& c : picked) (void)bench::must(runner->time_runs(*c, buffers.args, ws.ptr(), 32, false));
      }
      std::string line = id + " under sustained load, medians of 64 interleaved:";
      json loaded = json::object();
      for (int round = 0; round < 6; ++round) {
        for (const ChoicePtr& c : picked) {
          const double m = summarize(bench::must(runner->time_runs(*c, buffers.args, ws.ptr(), 64, false)).us).median;
          loaded[c->name()].push_back(m);
          line += fmt::format(" {:.1f}", m);
        }
        line += " |";
      }
      row["sustained_load_us"] = loaded;
      fmt::print("{}\n", line);
    }
    for (const ChoicePtr& c : picked) {
      if (!series_too) break;
      for (int i = 0; i < 2; ++i) bench::check(c->run(buffers.args, ws.ptr(), runner->stream()));
      const double est = summarize(bench::must(runner->time_runs(*c, buffers.args, ws.ptr(), 5, false)).us).median;
      const bool graph = est < o.graph_below_us;
      auto series = [&](int n) { return bench::must(runner->time_runs(*c, buffers.args, ws.ptr(), n, graph)).us; };
      auto group_medians = [](const std::vector<double>& us, size_t per) {
        std::vector<double> m;
        for (size_t i = 0; i + per <= us.size(); i += per) {
          m.push_back(summarize(std::vector<double>(us.begin() + i, us.begin() + i + per)).median);
        }
        return m;
      };
      json cj{{"estimate_us", est}, {"graph", graph}};
      idle();
      const auto cold = series(128);
      const auto hot = series(128);
      cj["after_idle_us"] = cold;
      cj["right_after_us"] = hot;
      json warm = json::object();
      for (int w_ms : {0, 1, 2, 5, 10, 20, 50, 100, 200, 1000, 3000}) {
        idle();
        const auto t0 = Clock::now();
        while (seconds_since(t0) * 1e3 < w_ms) (void)series(std::max(1, std::min(64, static_cast<int>(1e3 / est))));
        warm[std::to_string(w_ms)] = summarize(series(16)).median;
      }
      cj["warmed_ms_median_us"] = warm;
      std::vector<double> measured;
      for (int i = 0; i < 3; ++i) {
        idle();
        measured.push_back(summarize(bench::must(tuner_runner->measure(*c, buffers.args, ws.ptr(), 0)).us).median);
      }
      cj["measure_after_idle_us"] = measured;
      row[c->name()] = cj;
      std::string line;
      for (double v : group_medians(cold, 8)) line += fmt::format(" {:.1f}", v);
      std::string line_hot;
      for (double v : group_medians(hot, 8)) line_hot += fmt::format(" {:.1f}", v);
      std::string wl;
      for (const auto& [k, v] : warm.items()) wl += fmt::format(" {}ms:{:.1f}", k, v.get<double>());
      fmt::print("{} {}{}\n  after idle, medians of 8:{}\n  right after:{}\n  warmed:{}\n  measure() after idle: "
                 "{:.1f} {:.1f} {:.1f}\n", id, c->name(), graph ? " (graph)" : "", line, line_hot, wl, measured[0],
                 measured[1], measured[2]);
    }
    out.push_back(row);
  }
  return json_path.empty() || bench::write_json(json_path, json{{"environment", bench::environment()}, {"probe", out}})
             ? 0 : 1;
}

int phase_merge(const std::vector<std::string>& parts, const std::string& out_dir) {
  json merged = json::array();
  json env, method;
  double default_total = 0, exhaustive_total = 0;
  for (const auto& path : parts) {
    std::ifstream in(path);
    if (!in) bench::fail(make_error(ErrorCode::kNotFound, fmt::format("cannot read '{}'", path)));
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("problems") || !j["problems"].is_array()) {
      bench::fail(make_error(ErrorCode::kInvalidArgument,
                             fmt::format("'{}' is not a suite part (JSON with a \"problems\" list)", path)));
    }
    if (env.is_null()) env = j["environment"];
    if (j.contains("method")) method = j["method"];
    default_total += j.value("default_total_s", 0.0);
    exhaustive_total += j.value("exhaustive_total_s", 0.0);
    for (auto& r : j["problems"]) merged.push_back(r);
  }
  int n = 0, within1 = 0, within3 = 0, errors = 0, self_timed = 0, self_beyond1 = 0;
  // The same from the pooled medians (parts written before 1 Dec have only those, as default_us).
  int pooled_n = 0, pooled_within1 = 0, pooled_self_timed = 0, pooled_self_beyond1 = 0;
  // A [a, b] pair of times as a / b; nothing when it is not two positive finite numbers.
  auto pair_ratio = [](const json& pair) -> std::optional<double> {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number()) return std::nullopt;
    const double a = pair[0].get<double>(), b = pair[1].get<double>();
    if (!std::isfinite(a) || !std::isfinite(b) || a <= 0 || b <= 0) return std::nullopt;
    return a / b;
  };
  auto beyond1 = [&](const json& pair) -> std::optional<bool> {
    const auto r = pair_ratio(pair);
    return r ? std::optional<bool>(std::abs(*r - 1) > 0.01) : std::nullopt;
  };
  double sum_default = 0, max_ratio = 0;
  // With --second-reference: the reference against itself (each exhaustive pick judged against the other, as the
  // default's is against the first) and the default against the second.
  int refs_n = 0, second_within1 = 0, first_within1 = 0, default_within1_second = 0;
  auto ratio_of = [&](const json& r, const char* field) -> std::optional<double> {
    const auto it = r.find(field);
    return it == r.end() ? std::nullopt : pair_ratio(*it);
  };
  for (const auto& r : merged) {
    if (const auto ab = ratio_of(r, "reference_pair_us"), db = ratio_of(r, "default_vs_second_us"); ab && db) {
      ++refs_n;
      first_within1 += *ab <= 1.01;
      second_within1 += 1 / *ab <= 1.01;
      default_within1_second += *db <= 1.01;
    }
    if (!r.contains("default_us")) {
      ++errors;
      continue;
    }
    ++n;
    // The re-time's own noise floor: the default's pick timed against itself.
    if (const auto self = r.find("default_self_us"); self != r.end()) {
      if (const auto b = beyond1(*self)) ++self_timed, self_beyond1 += *b;
    }
    if (const auto self = r.find("default_self_pooled_us"); self != r.end()) {
      if (const auto b = beyond1(*self)) ++pooled_self_timed, pooled_self_beyond1 += *b;
    }
    if (const auto p = r.find("default_pooled_us"), q = r.find("exhaustive_pooled_us");
        p != r.end() && q != r.end() && p->is_number() && q->is_number() && p->get<double>() > 0 &&
        q->get<double>() > 0) {
      ++pooled_n;
      pooled_within1 += p->get<double>() / q->get<double>() <= 1.01;
    }
    // A tampered or broken part: a time that no run can produce is refused, naming the problem and the field.
    for (const char* field : {"default_s", "default_us", "exhaustive_us"}) {
      const double v = r[field].get<double>();
      const bool seconds = std::string_view(field) == "default_s";
      if (!std::isfinite(v) || v < 0 || (!seconds && v == 0)) {
        bench::fail(make_error(ErrorCode::kInvalidArgument,
                               fmt::format("merge: problem '{}' has {} = {} (a time must be finite and {})",
                                           r.value("problem", std::string("?")), field, v,
                                           seconds ? ">= 0" : "> 0")));
      }
    }
    sum_default += r["default_s"].get<double>();
    const double ratio = r["default_us"].get<double>() / r["exhaustive_us"].get<double>();
    max_ratio = std::max(max_ratio, ratio);
    within1 += ratio <= 1.01;
    within3 += ratio <= 1.03;
  }
  json summary{{"problems", n},
               {"errors", errors},
               {"mean_default_s", n ? sum_default / n : 0},
               {"default_total_s", default_total},
               {"exhaustive_total_s", exhaustive_total},
               {"fraction_within_1pct", n ? double(within1) / n : 0},
               {"fraction_within_3pct", n ? double(within3) / n : 0},
               {"max_ratio", max_ratio},
               {"self_retimed", self_timed},
               {"self_beyond_1pct", self_beyond1},
               {"pooled", {{"problems", pooled_n},
                           {"fraction_within_1pct", pooled_n ? double(pooled_within1) / pooled_n : 0},
                           {"self_retimed", pooled_self_timed},
                           {"self_beyond_1pct", pooled_self_beyond1}}},
               {"targets", {{"mean_default_s", 0.15}, {"fraction_within_1pct", 0.95}, {"max_ratio", 1.03}}}};
  if (refs_n > 0) {
    summary["second_reference"] = {{"problems", refs_n},
                                   {"second_within_1pct_of_first", double(second_within1) / refs_n},
                                   {"first_within_1pct_of_second", double(first_within1) / refs_n},
                                   {"default_within_1pct_of_second", double(default_within1_second) / refs_n}};
  }
  std::string device = env.value("machine", std::string());
  if (device.empty()) device = "device";
  std::string date = env.value("date", std::string("date"));
  date = date.substr(0, 10);
  const std::string commit = env.value("commit", std::string("commit")).substr(0, 7);
  const std::string path = fmt::format("{}/tuning-speed-{}-{}-{}.json", out_dir, device, date, commit);
  fmt::print("{} problems ({} errors): mean default {:.3f} s/problem (target 0.15), within 1% of exhaustive {:.1f}% "
             "(target 95%), within 3% {:.1f}%, max ratio {:.3f} (target 1.03)\n",
             n, errors, n ? sum_default / n : 0, n ? 100.0 * within1 / n : 0, n ? 100.0 * within3 / n : 0, max_ratio);
  if (self_timed > 0) {
    fmt::print("the re-time's noise floor: the default's pick against itself beyond +-1% on {} of {} problems\n",
               self_beyond1, self_timed);
  }
  if (pooled_n > 0) {
    fmt::print("by pooled medians (the figure before 1 Dec): within 1% {:.1f}%, the pick against itself beyond "
               "+-1% on {} of {}\n",
               100.0 * pooled_within1 / pooled_n, pooled_self_beyond1, pooled_self_timed);
  }
  if (refs_n > 0) {
    fmt::print("the reference against itself ({} problems): the second exhaustive pick within 1% of the first's on "
               "{:.1f}%, the first within 1% of the second's on {:.1f}%; the default within 1% of the second's on "
               "{:.1f}%\n",
               refs_n, 100.0 * second_within1 / refs_n, 100.0 * first_within1 / refs_n,
               100.0 * default_within1_second / refs_n);
  }
  json out{{"environment", env}, {"method", method}, {"summary", summary}, {"problems", merged}};
  return bench::write_json(path, out) ? (fmt::print("wrote {}\n", path), 0) : 1;
}

int phase_gemm4096(const std::string& cache_dir, Effort effort, const std::string& json_path) {
  bench::check(ensure_context(0).status(), "no GPU");
  const auto start = Clock::now();
  auto tuner = tuner_for(fresh_cache(cache_dir), nullptr, effort);
  const double create_s = seconds_since(start);
  GemmProblem g;
  g.m = g.n = g.k = 4096;
  const auto t0 = Clock::now();
  auto sel = bench::must(tuner->tune(Problem::gemm(g)), "tune");
  const double tune_s = seconds_since(t0);
  const TuneReport& r = sel->report();
  fmt::print("{}", r.table(8));
  fmt::print("4096^3 bf16 cold at {} effort: tune {:.3f} s (target 0.3), + {:.3f} s making the tuner\n",
             effort_name(effort), tune_s, create_s);
  json out{{"environment", bench::environment()}, {"effort", effort_name(effort)}, {"tune_s", tune_s},
           {"create_s", create_s}, {"report", json::parse(r.json())}};
  return json_path.empty() || bench::write_json(json_path, out) ? 0 : 1;
}

int phase_workload(const std::string& workload, const std::string& cache_dir, Effort effort, bool eager_loads,
                   const std::string& json_path) {
  const auto start = Clock::now();
  // Where a warm run's time goes, step by step (the CUDA context is the process's, not kiln's; a serving
  // engine has made it before it asks kiln for anything).
  json steps;
  auto step = [&, t = Clock::now()](const char* name) mutable {
    steps[name] = seconds_since(t);
    t = Clock::now();
  };
  bench::check(ensure_context(0).status(), "no GPU");
  step("context_s");
  auto w = bench::must(load_workload(workload), "the workload");
  cache::StoreOptions store;
  store.dir = cache_dir;
  auto c = bench::must(cache::TuningCache::open(cache::TuneMode::kTune, store), "opening the cache");
  std::shared_ptr<cache::TuningCache> shared = std::move(c);
  step("open_cache_s");
  // The default executor, as a user's tuner has it: started when compiles are coming (never, warm).
  auto tuner = tuner_for(shared, nullptr, effort, 0, !eager_loads);
  step("make_tuner_s");
  const UndecidedProblems undecided = undecided_problems(*tuner, w.problems);
  PlanAhead ahead(*tuner, undecided.problems, PlanAhead::Options{});
  step("plan_s");
  int cached = 0, errors = 0;
  double compile_wait = 0, load = 0;
  // benchmark_seconds and where it goes (TuneReport), summed over the problems
  std::map<std::string, double> bench_parts{{"benchmark", 0}, {"setup", 0}, {"plan", 0}, {"generate", 0},
                                            {"prepare", 0}, {"check", 0}, {"measure", 0}, {"remeasure", 0}};
  json per_problem = json::array();
  std::vector<std::shared_ptr<Selection>> selections;
  for (size_t i = 0; i < w.problems.size(); ++i) {
    const auto t = Clock::now();
    auto sel = tuner->tune(w.problems[i]);
    const double tune_s = seconds_since(t);
    if (undecided.index[i] >= 0) ahead.tuned(static_cast<size_t>(undecided.index[i]));
    if (!sel.ok()) {
      ++errors;
      continue;
    }
    selections.push_back(*sel);
    const TuneReport& r = (*sel)->report();
    cached += r.decision_from_cache;
    compile_wait += r.compile_wait_seconds;
    load += r.load_seconds;
    const std::map<std::string, double> parts{
        {"benchmark", r.benchmark_seconds}, {"setup", r.setup_seconds},   {"plan", r.plan_seconds},
        {"generate", r.generate_seconds},   {"prepare", r.prepare_seconds}, {"check", r.check_seconds},
        {"measure", r.measure_seconds},     {"remeasure", r.remeasure_seconds}};
    for (const auto& [k, v] : parts) bench_parts[k] += v;
    per_problem.push_back({{"problem", w.labels[i]}, {"chosen", r.chosen},
                           {"kind", choice_kind_name((*sel)->choice()->kind())}, {"tune_s", tune_s},
                           {"compile_wait_s", r.compile_wait_seconds}, {"load_s", r.load_seconds},
                           {"benchmark_s", r.benchmark_seconds}, {"check_s", r.check_seconds},
                           {"measure_s", r.measure_seconds}, {"remeasure_s", r.remeasure_seconds}});
  }
  step("tune_s");
  // The slowest few, so that a warm run shows what its time is spent on.
  std::vector<const json*> slowest;
  for (const auto& p : per_problem) slowest.push_back(&p);
  std::sort(slowest.begin(), slowest.end(),
            [](const json* a, const json* b) { return (*a)["tune_s"].get<double>() > (*b)["tune_s"].get<double>(); });
  for (size_t i = 0; i < std::min<size_t>(slowest.size(), 6); ++i) {
    const json& p = *slowest[i];
    fmt::print("  {:<28} {:<9} {:<40} tune {:.4f} s (binaries {:.4f}, load {:.4f})\n", p["problem"].get<std::string>(),
               p["kind"].get<std::string>(), p["chosen"].get<std::string>().substr(0, 40), p["tune_s"].get<double>(),
               p["compile_wait_s"].get<double>(), p["load_s"].get<double>());
  }
  for (const auto& [k, v] : bench_parts) steps["tune_" + k + "_s"] = v;
  if (bench_parts["benchmark"] > 0) {
    fmt::print("  tunes' host time: generate {:.3f} s, plan {:.3f} s, setup {:.3f} s; benchmark {:.3f} s: prepare {:.3f}, "
               "check {:.3f}, measure {:.3f}, near-tie re-measure {:.3f} s\n",
               bench_parts["generate"], bench_parts["plan"], bench_parts["setup"], bench_parts["benchmark"],
               bench_parts["prepare"], bench_parts["check"], bench_parts["measure"], bench_parts["remeasure"]);
  }
  steps["tune_compile_wait_s"] = compile_wait;  // binary-cache reads (and compiles, cold)
  steps["tune_load_s"] = load;                  // prepare(): module loads, library handles
  bench::check(finish_cache_writes(*shared), "storing");
  step("finish_writes_s");
  const double secs = seconds_since(start);
  // Not part of the tune: each selection's first run, where a deferred module load lands (buffers made
  // outside the timed part), so that what deferring moves is measured too.
  double first_runs = 0;
  {
    auto stream = bench::must(Stream::create(), "a stream");
    for (const auto& sel : selections) {
      auto def = bench::must(default_ops().find(sel->problem().op), "the op");
      auto bufs = bench::must(def->buffers(sel->problem(), 7), "buffers");
      bench::check(sel->reserve_workspace(sel->choice()->workspace_bytes()), "workspace");
      const auto t = Clock::now();
      bench::check(sel->run(bufs.args, stream.get()), "a first run");
      bench::check(stream.synchronize(), "a first run");
      first_runs += seconds_since(t);
    }
  }
  steps["first_runs_s"] = first_runs;
  fmt::print("workload {} ({} problems) at {} effort, {} loads: {:.3f} s, {} from cached decisions, {} errors "
             "(targets: cold 10 s, warm 0.05 s)\n", w.name, w.problems.size(), effort_name(effort),
             eager_loads ? "eager" : "deferred", secs, cached, errors);
  fmt::print("  after the context: {:.3f} s; every selection's first run afterwards {:.3f} s\n",
             secs - steps["context_s"].get<double>(), first_runs);
  fmt::print("  context {:.3f} s, cache open {:.3f} s, tuner {:.3f} s, plan {:.3f} s, tunes {:.3f} s "
             "(binaries {:.3f} s, loads {:.3f} s), writes {:.3f} s\n", steps["context_s"].get<double>(),
             steps["open_cache_s"].get<double>(), steps["make_tuner_s"].get<double>(), steps["plan_s"].get<double>(), steps["tune_s"].get<double>(), compile_wait,
             load, steps["finish_writes_s"].get<double>());
  json out{{"environment", bench::environment()}, {"workload", w.name}, {"effort", effort_name(effort)},
           {"loads", eager_loads ? "eager" : "deferred"}, {"after_context_s", secs - steps["context_s"].get<double>()},
           {"problems", w.problems.size()}, {"seconds", secs}, {"cached_decisions", cached}, {"errors", errors},
           {"steps", steps}, {"per_problem", per_problem}};
  return json_path.empty() || bench::write_json(json_path, out) ? 0 : 1;
}

// No GPU: distinct kernels per effort for the part, and their compile time estimated from a sample here.
int phase_plan(const std::string& part_text, const std::string& filter, const std::string& workload, int sample,
               int exhaustive_configs, double ms_per_choice) {
  double part_estimate_s = 0;
  const Part part = parse_part(part_text);
  const std::vector<Named> problems = suite_problems(filter, workload, part);
  const Target target{"sm_90a"};
  const DevicePeaks peaks = DevicePeaks::for_arch(target.arch);
  for (Effort effort : {Effort::kQuick, Effort::kDefault, Effort::kExhaustive}) {
    ChoiceContext ctx = bench::must(choice_context_for_arch(target));
    TuneOptions o;
    o.max_template_configs = effort == Effort::kExhaustive ? exhaustive_configs : 0;
    ctx.max_template_configs = template_sample(o, effort);
    std::unordered_map<KernelKey, CompileRequest> kernels;
    size_t choices = 0, planned = 0;
    const auto t0 = Clock::now();
    for (const auto& p : problems) {
      auto all = bench::must(default_ops().choices(p.problem, ctx), p.id);
      choices += all.size();
      auto kept = bench::must(precompile_plan(default_ops(), p.problem, std::move(all), effort, {peaks}));
      planned += kept.size();
      for (const auto& c : kept) {
        for (auto& k : c->kernels()) kernels.emplace(make_key(k.source, k.target), k);
      }
    }
    const double plan_s = seconds_since(t0);
    std::vector<double> compile_s;
    int n = 0;
    for (const auto& [key, k] : kernels) {
      if (n++ >= sample) break;
      const auto c0 = Clock::now();
      auto b = compile(k.source, k.target);
      if (b.ok()) compile_s.push_back(seconds_since(c0));
    }
    const double mean = compile_s.empty() ? 0 : bench::stats(compile_s).mean;
    // The call's time for this effort on the device: its distinct kernels once (one cache shared across the
    // part) on 16 workers, every planned choice measured (an upper bound at default, where extern-first
    // pruning cuts most), and the host's choice generation (timed here; the device's host is not slower).
    const double effort_s = mean * kernels.size() / 16 + planned * ms_per_choice / 1e3 + plan_s;
    if (effort != Effort::kQuick) part_estimate_s += effort_s;
    fmt::print("{:<10} {} problems: {} choices generated, {} planned (compiled ahead), {} distinct kernels; "
               "planning {:.2f} s; NVRTC {:.2f} s/kernel here (sample {}) -> ~{:.0f} s on 1 core, ~{:.0f} s on 16; "
               "with {} ms a measured choice: ~{:.0f} s on the device\n",
               effort_name(effort), problems.size(), choices, planned, kernels.size(), plan_s, mean, compile_s.size(),
               mean * kernels.size(), mean * kernels.size() / 16, ms_per_choice, effort_s);
  }
  fmt::print("suite part {}/{}: default + exhaustive ~{:.0f} s in one call (limit 590 s; the side-by-side re-timing "
             "adds ~0.05 s a problem)\n", part.index, part.count, part_estimate_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln tuning speed: default vs exhaustive effort, cold and warm"};
  app.require_subcommand(1);
  std::string part, filter, json_path, reports_path, cache_dir = "/tmp/kiln-tuning-speed", out_dir = "bench/results";
  std::string workload = std::string(KILN_SOURCE_DIR) + "/examples/llama3-8b.json";
  std::string effort_text = "default";
  int exhaustive_configs = 0, sample = 4;
  double deadline_s = 0, ms_per_choice = 5;
  std::vector<std::string> parts;
  auto* suite = app.add_subcommand("suite", "default vs exhaustive over the suite (a part of it)");
  auto* merge = app.add_subcommand("merge", "join suite parts into bench/results/tuning-speed-...json");
  auto* g4096 = app.add_subcommand("gemm4096", "one cold 4096^3 tune");
  auto* work = app.add_subcommand("workload", "a workload as kiln tune runs it (cold or warm)");
  auto* probe = app.add_subcommand("probe", "diagnostic: how choices time after idle and after warm-ups");
  std::vector<std::string> pairs;
  probe->add_option("--pair", pairs, "ID:NAME,NAME... (a suite problem and its choices)")->required();
  probe->add_option("--workload", workload, "the workload whose norms and softmax join the suite");
  probe->add_option("--json", json_path, "write JSON here");
  int probe_allocations = 0;
  bool probe_no_series = false;
  probe->add_option("--allocations", probe_allocations, "time the choices on this many more sets of buffers, each "
                                                        "placed elsewhere (the last with other values)")
      ->check(CLI::Range(0, 64));
  probe->add_flag("--no-series", probe_no_series, "skip the idle / warm-up series");
  auto* plan = app.add_subcommand("plan", "no GPU: kernels per effort and their estimated compile time");
  for (auto* s : {suite, plan}) {
    s->add_option("--part", part, "i/N: every N-th problem from the i-th");
    s->add_option("--shapes", filter, "suite filter (bench/gemm suite_shapes.h)");
    s->add_option("--workload", workload, "the workload whose norms and softmax join the suite");
    s->add_option("--exhaustive-configs", exhaustive_configs, "exhaustive's sample per template (default: all)");
  }
  suite->add_option("--cache-root", cache_dir, "where the empty caches go");
  suite->add_option("--reports", reports_path, "write every problem's tune reports (both efforts) here, one JSON per line");
  suite->add_option("--deadline", deadline_s, "seconds: tune no new problem past this (0: none); the rest are "
                                              "reported as not run");
  SuiteOptions options;
  suite->add_flag("--default-only", options.default_only, "tune the default effort only (no exhaustive reference, "
                                                             "no re-times): an experiment on its tune time");
  suite->add_flag("--second-reference", options.second_reference,
                  "tune the exhaustive effort twice (own caches) and re-time the two picks side by side, and the "
                  "default's against the second: the reference's agreement with itself");
  suite->add_option("--retime-rounds", options.retime_rounds, "rounds of 12 runs in the side-by-side re-time of "
                                                                 "both efforts' picks (default 24)")
      ->check(CLI::Range(1, 1000));
  suite->add_flag("--l2-flush-by-writing", g_measuring.flush_l2_by_writing,
                  "flush L2 between timed runs with a memset, as kiln did before 29 Nov 2026 (leaves dirty lines)");
  suite->add_option("--placements", g_measuring.placements, "operand sets the tuners time over (BenchmarkOptions::"
                                                             "placements; 1: one, as before 30 Nov 2026)")
      ->check(CLI::Range(1, 16));
  suite->add_flag("--hold-on-host", g_measuring.hold_on_host,
                  "hold each batch of timed runs with a host function, as kiln did until 1 Dec 2026 (BenchmarkOptions::"
                  "hold_on_host)");
  suite->add_option("--replan-ahead", options.ahead.replan,
                    "after each tune, plan the problem K places on again and compile what it adds (default 4; 0: "
                    "never)")
      ->check(CLI::Range(0, 64));
  suite->add_option("--promote-ahead", options.ahead.promote,
                    "raise the queued compiles of the next K problems to normal priority, in problem order (default "
                    "4; 0: never)")
      ->check(CLI::Range(0, 64));
  bool no_speculate = false;
  suite->add_flag("--no-speculate", no_speculate, "do not compile what the tunes' first widenings may reach "
                                                  "speculatively");
  bool no_plan_ahead = false;
  suite->add_flag("--no-plan-ahead", no_plan_ahead, "do not compile every problem's planned choices in the "
                                                    "background from the start (each tune compiles what it needs)");
  plan->add_option("--sample", sample, "kernels to compile here for the estimate");
  plan->add_option("--ms-per-choice", ms_per_choice, "device milliseconds to check and measure one choice (the "
                                                     "4096^3 headline: 0.133 s for 21 choices, ~6 ms)");
  merge->add_option("parts", parts, "part JSON files")->required();
  merge->add_option("--out-dir", out_dir, "results folder");
  for (auto* s : {g4096, work}) {
    s->add_option("--cache-dir", cache_dir, "the cache (empty for a cold run)");
    s->add_option("--effort", effort_text, "none | quick | default | exhaustive")->check([](const std::string& e) {
      auto p = parse_effort(e);
      return p.ok() ? std::string() : p.status().message();
    });
  }
  work->add_option("--workload", workload, "workload JSON");
  bool eager_loads = false;
  work->add_flag("--eager-loads", eager_loads, "load cached decisions' modules in tune() (TuneOptions::defer_loads off)");
  for (auto* s : {suite, g4096, work}) s->add_option("--json", json_path, "write JSON here");
  CLI11_PARSE(app, argc, argv);
  const Effort effort = bench::must(parse_effort(effort_text));
  options.plan_ahead = !no_plan_ahead;
  options.ahead.speculate = !no_speculate;
  if (suite->parsed()) {
    return phase_suite(part, filter, workload, cache_dir, exhaustive_configs, json_path, deadline_s, reports_path,
                       options);
  }
  if (merge->parsed()) {
    try {
      return phase_merge(parts, out_dir);
    } catch (const json::exception& e) {  // a part whose fields have the wrong types
      bench::fail(make_error(ErrorCode::kInvalidArgument, fmt::format("merge: a part's fields: {}", e.what())));
    }
  }
  if (probe->parsed()) return phase_probe(pairs, workload, probe_allocations, !probe_no_series, json_path);
  if (g4096->parsed()) return phase_gemm4096(cache_dir, effort, json_path);
  if (work->parsed()) return phase_workload(workload, cache_dir, effort, eager_loads, json_path);
  return phase_plan(part, filter, workload, sample, exhaustive_configs, ms_per_choice);
}
