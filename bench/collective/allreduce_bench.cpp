#include "allreduce_bench.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "bench_util.h"
#include "kiln/cache/tuning.h"
#include "kiln/runtime/collective.h"

namespace kiln::allreduce_bench {
namespace {

using runtime::AllReduce;
using runtime::CollectiveTiming;

nlohmann::json timings_json(const std::vector<CollectiveTiming>& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : t) j[c.name] = c.ok ? nlohmann::json(c.us) : nlohmann::json(c.error);
  return j;
}

// The fastest choice whose name starts with `prefix` in a tune report, or "".
std::string best_of(const std::vector<CollectiveTiming>& t, const std::string& prefix) {
  const CollectiveTiming* best = nullptr;
  for (const auto& c : t) {
    if (c.ok && c.name.find(prefix) != std::string::npos && (!best || c.us < best->us)) best = &c;
  }
  return best ? best->name : "";
}

// One rank's whole benchmark; rank 0's JSON is what the parent prints.
Result<std::string> rank_main(const Options& o, int rank, runtime::Communicator* comm) {
  runtime::AllReduceOptions ao;
  KILN_ASSIGN_OR_RETURN(ao.dtype, templates::parse_dtype(o.dtype));
  ao.max_bytes = o.max_bytes;
  ao.max_configs = o.max_configs;
  ao.graph = o.graph;
  ao.zero_copy = o.zero_copy;
  ao.in_place = o.in_place;
  if (!o.cache_dir.empty()) {
    cache::StoreOptions so;
    so.dir = o.cache_dir;
    KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(cache::TuneMode::kTune, so));
    ao.cache = std::move(c);
  }
  nlohmann::json out;
  if (rank == 0) out["environment"] = bench::environment();
  auto t0 = bench::Clock::now();
  KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, ao));
  const double create_s = bench::seconds_since(t0);
  std::vector<size_t> buckets;
  for (size_t b = o.min_bytes; b <= o.max_bytes; b *= 2) buckets.push_back(b);
  t0 = bench::Clock::now();
  KILN_ASSIGN_OR_RETURN(auto reports, ar->tune(buckets));
  out["create_seconds"] = create_s;
  out["tune_seconds"] = bench::seconds_since(t0);
  out["world"] = comm->world();
  out["graph_decisions"] = o.graph;
  out["zero_copy"] = o.zero_copy;
  out["in_place"] = o.in_place;
  const int eb = templates::dtype_bytes(ao.dtype);
  out["sizes"] = nlohmann::json::array();
  for (const auto& r : reports) {
    const int64_t count = static_cast<int64_t>(r.bytes / eb);
    std::vector<std::string> names{"dispatch", "nccl"};
    for (const auto& c : r.choices) {
      if (c.name == "nccl_symmetric") names.push_back(c.name);
    }
    for (const char* algo : {"_oneshot_", "_twoshot_", "_push_"}) {
      std::string b = best_of(r.choices, algo);
      if (!b.empty()) names.push_back(b);
    }
    KILN_ASSIGN_OR_RETURN(auto eager, ar->benchmark(names, count, false));
    KILN_ASSIGN_OR_RETURN(auto graph, ar->benchmark(names, count, true));
    nlohmann::json row{{"bytes", r.bytes}, {"chosen", r.chosen}, {"from_cache", r.from_cache},
                       {"tune", nlohmann::json::parse(r.json())["choices"]},
                       {"eager_us", timings_json(eager)}, {"graph_us", timings_json(graph)}};
    out["sizes"].push_back(std::move(row));
  }
  out["fused"] = nlohmann::json::array();
  for (int h : o.hidden) {
    std::vector<int64_t> rows(o.tokens.begin(), o.tokens.end());
    KILN_ASSIGN_OR_RETURN(auto fr, ar->tune_fused(h, rows));
    for (const auto& r : fr) {
      nlohmann::json row = nlohmann::json::parse(r.json());
      row["hidden"] = h;
      out["fused"].push_back(std::move(row));
    }
  }
  return out.dump();
}

Result<runtime::AllReduceCall> parse_call(const std::string& s) {
  if (s == "staged") return runtime::AllReduceCall::kStaged;
  if (s == "symmetric") return runtime::AllReduceCall::kSymmetric;
  if (s == "in-place") return runtime::AllReduceCall::kSymmetricInPlace;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("--calls: '{}' is not staged, symmetric or in-place", s));
}

// Heap mode: every kind of call tuned on its own (decisions on eager timings, or graph replays with --graph), then
// per size the dispatcher and NCCL measured in that kind of call, eager and graphed. The headline columns are the
// in-place symmetric call's (as NCCL's all_reduce(x) and PyTorch's two_shot_all_reduce_ are called), else the
// first kind measured.
Result<std::string> rank_main_heap(const Options& o, int rank, runtime::Communicator* comm) {
  runtime::AllReduceOptions ao;
  KILN_ASSIGN_OR_RETURN(ao.dtype, templates::parse_dtype(o.dtype));
  ao.max_bytes = o.max_bytes;
  ao.heap_bytes = o.max_bytes + (size_t{1} << 20);  // the measuring tensor of the largest size
  ao.max_configs = o.max_configs;
  ao.graph = o.graph;
  if (!o.cache_dir.empty()) {
    cache::StoreOptions so;
    so.dir = o.cache_dir;
    KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(cache::TuneMode::kTune, so));
    ao.cache = std::move(c);
  }
  std::vector<runtime::AllReduceCall> calls;
  for (const auto& c : o.calls) {
    KILN_ASSIGN_OR_RETURN(auto k, parse_call(c));
    calls.push_back(k);
  }
  if (calls.empty()) return make_error(ErrorCode::kInvalidArgument, "--calls is empty");
  nlohmann::json out;
  if (rank == 0) out["environment"] = bench::environment();
  auto t0 = bench::Clock::now();
  KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, ao));
  out["create_seconds"] = bench::seconds_since(t0);
  std::vector<size_t> buckets;
  for (size_t b = o.min_bytes; b <= o.max_bytes; b *= 2) buckets.push_back(b);
  std::vector<std::vector<runtime::CollectiveReport>> reports;
  t0 = bench::Clock::now();
  for (auto call : calls) {
    KILN_ASSIGN_OR_RETURN(auto r, ar->tune(call, buckets));
    reports.push_back(std::move(r));
  }
  out["tune_seconds"] = bench::seconds_since(t0);
  out["world"] = comm->world();
  out["mode"] = "heap";
  out["graph_decisions"] = o.graph;
  out["calls"] = o.calls;
  const auto headline = std::find(calls.begin(), calls.end(), runtime::AllReduceCall::kSymmetricInPlace) != calls.end()
                            ? runtime::AllReduceCall::kSymmetricInPlace
                            : calls.front();
  out["headline_call"] = runtime::call_name(headline);
  const int eb = templates::dtype_bytes(ao.dtype);
  out["sizes"] = nlohmann::json::array();
  for (size_t i = 0; i < buckets.size(); ++i) {
    const int64_t count = static_cast<int64_t>(buckets[i] / eb);
    nlohmann::json row{{"bytes", buckets[i]}};
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::vector<std::string> names{"dispatch", "nccl"};
      KILN_ASSIGN_OR_RETURN(auto eager, ar->benchmark(names, count, false, calls[k]));
      KILN_ASSIGN_OR_RETURN(auto graph, ar->benchmark(names, count, true, calls[k]));
      const auto& r = reports[k][i];
      row[runtime::call_name(calls[k])] = {{"chosen", r.chosen}, {"from_cache", r.from_cache},
                                           {"tune", nlohmann::json::parse(r.json())["choices"]},
                                           {"eager_us", timings_json(eager)}, {"graph_us", timings_json(graph)}};
      auto fig = [](const std::vector<CollectiveTiming>& t, const char* n) {
        for (const auto& c : t) {
          if (c.name == n && c.ok) return nlohmann::json(c.us);
        }
        return nlohmann::json();
      };
      if (calls[k] == runtime::AllReduceCall::kSymmetric) row["kiln_eager_out_of_place_us"] = fig(eager, "dispatch");
      if (calls[k] == runtime::AllReduceCall::kStaged) row["kiln_eager_staged_us"] = fig(eager, "dispatch");
      if (calls[k] == headline) {
        row["kiln_eager_us"] = fig(eager, "dispatch");
        row["nccl_eager_us"] = fig(eager, "nccl");
        row["kiln_graph_us"] = fig(graph, "dispatch");
        row["nccl_graph_us"] = fig(graph, "nccl");
        row["chosen"] = r.chosen;
      }
    }
    out["sizes"].push_back(std::move(row));
  }
  return out.dump();
}

int print_heap(const Options& o, const nlohmann::json& j) {
  fmt::print("all-reduce, {} GPUs, {}, heap tensors: created in {:.2f} s, tuned {} kinds x {} sizes in {:.2f} s ({} "
             "decisions); headline: {}\n",
             o.gpus, o.dtype, j["create_seconds"].get<double>(), o.calls.size(), j["sizes"].size(),
             j["tune_seconds"].get<double>(), o.graph ? "graph" : "eager", j["headline_call"].get<std::string>());
  std::vector<std::string> head{"bytes"};
  for (const auto& c : o.calls) {
    for (const char* col : {" kiln", " NCCL", " kiln graph", " NCCL graph"}) head.push_back(c + col);
  }
  head.push_back("headline chosen");
  bench::Table t(head);
  auto num = [](const nlohmann::json& m, const char* n) {
    return m.contains(n) && m[n].is_number() ? fmt::format("{:.1f}", m[n].get<double>()) : std::string("-");
  };
  for (const auto& row : j["sizes"]) {
    std::vector<std::string> cells{std::to_string(row["bytes"].get<size_t>())};
    for (const auto& c : o.calls) {
      auto k = parse_call(c);
      const auto& m = row[runtime::call_name(*k)];
      cells.push_back(num(m["eager_us"], "dispatch"));
      cells.push_back(num(m["eager_us"], "nccl"));
      cells.push_back(num(m["graph_us"], "dispatch"));
      cells.push_back(num(m["graph_us"], "nccl"));
    }
    cells.push_back(row.value("chosen", std::string("-")).substr(0, 40));
    t.add(cells);
  }
  fmt::print("{}\n", t.str());
  if (!o.json.empty() && !bench::write_json(o.json, j)) return 1;
  return 0;
}

std::string us(const nlohmann::json& m, const std::string& name) {
  if (!m.contains(name) || !m[name].is_number()) return "-";
  return fmt::format("{:.1f}", m[name].get<double>());
}

}  // namespace

void add_options(CLI::App& app, Options& o) {
  app.add_option("--gpus", o.gpus, "GPUs (one process each)")->check(CLI::Range(2, 8));
  app.add_flag("--graph", o.graph, "Tune the decisions on CUDA-graph replays instead of eager calls");
  app.add_flag("--zero-copy", o.zero_copy, "Inputs already in kiln's peer-mapped buffer (no copy-in per call)");
  app.add_flag("--in-place", o.in_place, "Reduce kiln's peer-mapped buffer in place (input and output there)");
  app.add_flag("--heap", o.heap,
               "Measure each kind of call (staged, symmetric heap tensors out of place and in place) with its own "
               "tuned table, against NCCL on the same tensors");
  app.add_option("--calls", o.calls, "With --heap: the kinds of call (staged, symmetric, in-place)");
  app.add_option("--dtype", o.dtype, "bf16, f16 or f32");
  app.add_option("--min-bytes", o.min_bytes, "Smallest message");
  app.add_option("--max-bytes", o.max_bytes, "Largest message (also the staging buffers' size)");
  app.add_option("--configs", o.max_configs, "Template configurations per algorithm");
  app.add_option("--hidden", o.hidden, "Hidden sizes of the fused all-reduce + residual + RMSNorm");
  app.add_option("--tokens", o.tokens, "Token counts (rows) of the fused step");
  app.add_option("--cache-dir", o.cache_dir, "Store and reuse decisions here (default: none, always tune)");
  app.add_option("--json", o.json, "Write the results here");
}

int run(const Options& o) {
  runtime::install_crash_trace();
  runtime::GroupOptions g;
  g.world = o.gpus;
  g.timeout = std::chrono::minutes(9);
  auto outcomes = runtime::run_local_group(g, [&](int rank, runtime::Communicator* comm) -> Result<std::string> {
    return o.heap ? rank_main_heap(o, rank, comm) : rank_main(o, rank, comm);
  });
  if (!outcomes.ok()) {
    fmt::print(stderr, "kiln-bench allreduce: {}\n", outcomes.status().to_string());
    return 1;
  }
  int failed = 0;
  for (const auto& r : *outcomes) {
    if (!r.status.ok()) {
      fmt::print(stderr, "rank {}: {}\n", r.rank, r.status.to_string());
      ++failed;
    }
  }
  if (failed) return 1;
  nlohmann::json j = nlohmann::json::parse((*outcomes)[0].result);
  j["benchmark"] = "allreduce";
  if (o.heap) return print_heap(o, j);
  fmt::print("all-reduce, {} GPUs, {}{}: created in {:.2f} s, tuned {} sizes in {:.2f} s ({} decisions)\n", o.gpus,
             o.dtype, o.in_place ? ", in place" : o.zero_copy ? ", zero-copy input" : "", j["create_seconds"].get<double>(), j["sizes"].size(), j["tune_seconds"].get<double>(),
             o.graph ? "graph" : "eager");
  bench::Table t({"bytes", "chosen", "dispatch", "NCCL", "NCCL symm", "1-shot", "2-shot", "push", "dispatch graph",
                  "NCCL graph", "NCCL symm graph", "1-shot graph", "2-shot graph", "push graph", "busbw GB/s"});
  for (const auto& row : j["sizes"]) {
    const auto& e = row["eager_us"];
    const auto& g2 = row["graph_us"];
    std::string one, two, push;
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key().find("_oneshot_") != std::string::npos) one = it.key();
      if (it.key().find("_twoshot_") != std::string::npos) two = it.key();
      if (it.key().find("_push_") != std::string::npos) push = it.key();
    }
    const size_t bytes = row["bytes"].get<size_t>();
    std::string bw = "-";
    if (e.contains("dispatch") && e["dispatch"].is_number()) {
      bw = fmt::format("{:.0f}", bytes * 2.0 * (o.gpus - 1) / o.gpus / (e["dispatch"].get<double>() * 1e3));
    }
    t.add({std::to_string(bytes), row["chosen"].get<std::string>().substr(0, 40), us(e, "dispatch"), us(e, "nccl"),
           us(e, "nccl_symmetric"), us(e, one), us(e, two), us(e, push), us(g2, "dispatch"), us(g2, "nccl"),
           us(g2, "nccl_symmetric"), us(g2, one), us(g2, two), us(g2, push), bw});
  }
  fmt::print("{}\n", t.str());
  bench::Table f({"hidden", "tokens", "chosen", "chosen us", "best fused us", "best unfused us", "fused speedup"});
  for (const auto& row : j["fused"]) {
    double best_fused = 0, best_unfused = 0, chosen = 0;
    for (const auto& c : row["choices"]) {
      if (!c["ok"].get<bool>()) continue;
      const double v = c["us"].get<double>();
      const bool unf = c["name"].get<std::string>().rfind("unfused:", 0) == 0;
      double& slot = unf ? best_unfused : best_fused;
      if (slot == 0 || v < slot) slot = v;
      if (c["name"] == row["chosen"]) chosen = v;
    }
    f.add({std::to_string(row["hidden"].get<int>()), std::to_string(row["rows"].get<int64_t>()),
           row["chosen"].get<std::string>().substr(0, 48), fmt::format("{:.1f}", chosen),
           fmt::format("{:.1f}", best_fused), fmt::format("{:.1f}", best_unfused),
           best_fused > 0 ? fmt::format("{:.2f}x", best_unfused / best_fused) : "-"});
  }
  fmt::print("{}\n", f.str());
  if (!o.json.empty() && !bench::write_json(o.json, j)) return 1;
  return 0;
}

}  // namespace kiln::allreduce_bench
