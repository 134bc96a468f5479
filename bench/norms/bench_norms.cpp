// bench_norms: the memory-bound templates (rmsnorm, layernorm, softmax; rmsnorm with the residual add) at
// 8192 rows x 4096 and 8192 cols in bf16, against cuMemcpyDtoD of the same bytes in the same run.
//
// For each problem: every configuration that passes the device's limits and keeps a row in registers
// (threads/rows_per_block * vec * items >= cols, less than twice cols) is compiled (in threads) and timed
// (median of --sweep-reps launches); then the best one and the copy are timed interleaved (median of --reps
// each). Bandwidth counts bytes read plus bytes written once (x and y; with residual also residual and
// residual_out; the weight row is negligible and not counted); the copy moves the same bytes (read + write).
// Inputs rotate over two buffer sets so that no repetition finds its data in L2.
//
// Long rows (issue 15): softmax over rows 1, 8, 24, 64 x cols 128256 and 152064 (vocabulary sizes), bf16, with
// the one-block-per-row softmax template and the split-row softmax_cluster template (every configuration that
// serves the shape), each checked against a float64 CPU softmax first; times are CUDA-graph replays of 50
// launches rotating inputs past L2 (median of 15), the same method as bench/norms/softmax_torch.py, whose JSON
// (--torch FILE) supplies torch.compile's times for the same shapes. copy_bw_fraction is the kernel's
// (read + write) bandwidth over the device's copy bandwidth (a 128 MiB cuMemcpyDtoD).
//
// --rows LIST (comma-separated, default 8192) measures the row problems at each of those row counts (decode
// sizes: 1, 16, 64 ...), each configuration compiled once for all of them.
//
// Usage: bench_norms [--json FILE] [--reps N] [--sweep-reps N] [--quick] [--torch FILE] [--only rows|long]
//                    [--rows LIST]
#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench_util.h"
#include "kiln/jit.h"
#include "kiln/jit/driver.h"
#include "kiln/templates/templates.h"

using namespace kiln;
using namespace kiln::templates;

namespace {

struct Problem {
  std::string label;     // "rmsnorm", "rmsnorm+residual", ...
  std::string tmpl;
  Params fixed;
  int tensors;           // tensors of rows x cols read or written once (x, y: 2; with residual: 4)
};

struct Timed {
  std::string config;
  double median_us = 0;
};

Status sync_ctx() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSynchronize());
  return Status();
}

// Median microseconds of `reps` timed calls of `fn` (each between two events on `stream`).
template <class Fn>
Result<double> time_us(Fn&& fn, int reps, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(Event a, Event::create());
  KILN_ASSIGN_OR_RETURN(Event b, Event::create());
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    KILN_RETURN_IF_ERROR(a.record(stream));
    KILN_RETURN_IF_ERROR(fn(i));
    KILN_RETURN_IF_ERROR(b.record(stream));
    KILN_RETURN_IF_ERROR(b.synchronize());
    KILN_ASSIGN_OR_RETURN(float ms, b.elapsed_ms_since(a));
    us.push_back(ms * 1e3);
  }
  return bench::stats(us).median;
}

// GPU microseconds per call of `fn(i)`: a CUDA graph of `launches` calls on `stream`, median of `samples`
// replays.
Result<double> graph_us(const std::function<Status(int)>& fn, int launches, int samples, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  KILN_CHECK(d->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  Status ran;
  for (int i = 0; i < launches && ran.ok(); ++i) ran = fn(i);
  CUresult end = d->cuStreamEndCapture(stream, &graph);
  KILN_RETURN_IF_ERROR(ran);
  KILN_CHECK(end);
  CUresult inst = d->cuGraphInstantiateWithFlags(&exec, graph, 0);
  d->cuGraphDestroy(graph);
  KILN_CHECK(inst);
  auto time = time_us(
      [&](int) -> Status {
        KILN_CHECK(d->cuGraphLaunch(exec, stream));
        return Status();
      },
      samples + 1, stream);
  d->cuGraphExecDestroy(exec);
  KILN_RETURN_IF_ERROR(time.status());
  return *time / launches;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 50, sweep_reps = 10;
  bool quick = false;
  std::string torch_path, only;
  std::vector<int64_t> row_counts = {8192};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--sweep-reps" && i + 1 < argc) sweep_reps = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--torch" && i + 1 < argc) torch_path = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--rows" && i + 1 < argc) {
      row_counts.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        char* end = nullptr;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > 65536) {
          fmt::print(stderr, "bench_norms: --rows takes row counts from 1 to 65536, comma-separated, not '{}'\n", item);
          return 2;
        }
        row_counts.push_back(v);
        at = comma + 1;
      }
    } else {
      fmt::print(stderr, "usage: bench_norms [--json FILE] [--reps N] [--sweep-reps N] [--quick] [--torch FILE] "
                         "[--only rows|long] [--rows LIST]\n");
      return 2;
    }
  }
  bench::check(ensure_context(0));
  auto info = device_info(0);
  bench::check(info.status());
  Target target{info->arch()};
  DeviceLimits limits = DeviceLimits::from_device(*info, target);
  auto stream = Stream::create();
  bench::check(stream.status());
  CUstream st = stream->get();
  const DriverApi* drv = *driver();

  const int64_t buffer_rows = std::max<int64_t>(8192, *std::max_element(row_counts.begin(), row_counts.end()));
  const std::vector<int64_t> col_sizes = {4096, 8192};
  const DType dt = DType::kBF16;
  std::vector<Problem> problems = {
      {"rmsnorm", "rmsnorm", {{"dtype", Value::dtype(dt)}, {"residual", Value::boolean(false)}}, 2},
      {"layernorm", "layernorm",
       {{"dtype", Value::dtype(dt)}, {"residual", Value::boolean(false)}, {"has_bias", Value::boolean(false)}}, 2},
      {"softmax", "softmax", {{"dtype", Value::dtype(dt)}}, 2},
      {"rmsnorm+residual", "rmsnorm", {{"dtype", Value::dtype(dt)}, {"residual", Value::boolean(true)}}, 4},
  };

  // Two sets of four rows x max-cols tensors (x, residual, y, residual_out), a weight and bias row.
  const int64_t max_cols = *std::max_element(col_sizes.begin(), col_sizes.end());
  const size_t tensor_bytes = buffer_rows * max_cols * dtype_bytes(dt);
  std::vector<DeviceBuffer> bufs;
  {
    std::vector<uint16_t> host(buffer_rows * max_cols);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    for (auto& h : host) store_element(dt, d(rng), &h);
    for (int i = 0; i < 8; ++i) {
      auto b = DeviceBuffer::allocate(tensor_bytes);
      bench::check(b.status());
      bench::check(b->copy_from_host(host.data(), tensor_bytes));
      bufs.push_back(std::move(*b));
    }
  }
  auto weight = DeviceBuffer::allocate(max_cols * 4);
  bench::check(weight.status());
  {
    uint16_t one;
    store_element(dt, 1.f, &one);
    std::vector<uint16_t> w(max_cols * 2, one);
    bench::check(weight->copy_from_host(w.data(), max_cols * 4));
  }
  auto p = [&](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(bufs[i].ptr())); };

  nlohmann::json out;
  out["environment"] = bench::environment();
  out["method"] = "bf16, rows as listed (--rows, default 8192); best of a sweep of configurations keeping a row in registers (median of "
                  "sweep_reps launches each), then best and cuMemcpyDtoD of the same bytes timed interleaved "
                  "(median of reps each); GB/s = (bytes read + bytes written) / time; inputs rotate over 2 sets";
  out["reps"] = reps;
  out["sweep_reps"] = sweep_reps;
  out["results"] = nlohmann::json::array();
  bench::Table table({"problem", "rows", "cols", "best configuration", "swept", "kernel us", "GB/s", "copy us", "copy GB/s",
                      "% of copy"});

  if (only == "long") problems.clear();
  for (const Problem& prob : problems) {
    auto t = find_template(prob.tmpl);
    bench::check(t.status());
    auto grid = Grid::create(*t, prob.fixed);
    bench::check(grid.status());
    auto configs = pruned(*grid, limits);
    for (int64_t cols : col_sizes) {
      Shape shape{buffer_rows, cols};
      std::vector<Params> cands;
      for (const Params& c : configs) {
        int64_t cap = get_int(c, "threads") / get_int(c, "rows_per_block") * get_int(c, "vec") * get_int(c, "items");
        if (cap < cols || cap >= 2 * cols || !(*t)->check_problem(c, shape).ok()) continue;
        if (quick && get_int(c, "vec") != 8) continue;
        cands.push_back(c);
      }
      // Compile in threads, load here.
      std::vector<Result<Binary>> bins(cands.size(), Result<Binary>(make_error(ErrorCode::kInternal, "")));
      std::vector<Rendered> rendered(cands.size());
      std::atomic<size_t> next{0};
      std::vector<std::thread> threads;
      for (unsigned w = 0; w < std::max(1u, std::thread::hardware_concurrency()); ++w) {
        threads.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < cands.size();) {
            auto r = (*t)->render(cands[i]);
            if (!r.ok()) {
              bins[i] = r.status();
              continue;
            }
            rendered[i] = *r;
            bins[i] = compile(r->source, target);
          }
        });
      }
      for (auto& th : threads) th.join();

      for (const int64_t rows : row_counts) {
        const Shape rows_shape{rows, cols};  // the launch's geometry (the grid follows the rows)
        const int sets = 2;
        auto args_for = [&](int set) {
          NormArgs a{};
          int base = set * 4;
          a.x = p(base);
          a.residual = p(base + 1);
          a.y = p(base + 2);
          a.residual_out = p(base + 3);
          a.weight = reinterpret_cast<void*>(static_cast<uintptr_t>(weight->ptr()));
          a.bias = a.weight;
          a.rows = static_cast<int>(rows);
          a.cols = static_cast<int>(cols);
          a.ld_x = a.ld_residual = a.ld_residual_out = a.ld_y = cols;
          a.eps = 1e-5f;
          if (prob.tmpl != "softmax" && !get_bool(prob.fixed, "residual")) a.residual = a.residual_out = nullptr;
          return a;
        };
        auto run = [&](const Kernel& k, const Launch& g, int set) -> Status {
          NormArgs a = args_for(set);
          if (prob.tmpl == "softmax") {
            SoftmaxArgs s{};
            s.x = a.x;
            s.y = a.y;
            s.rows = a.rows;
            s.cols = a.cols;
            s.ld_x = s.ld_y = cols;
            s.scale = 1.f;
            return launch(k, g, s, st);
          }
          return launch(k, g, a, st);
        };

        std::vector<Timed> timed;
        std::optional<Kernel> best_kernel;
        Launch best_geo;
        double best_us = 1e30;
        size_t failed = 0;
        for (size_t i = 0; i < cands.size(); ++i) {
          if (!bins[i].ok()) {
            fmt::print(stderr, "compile failed {}: {}\n", rendered[i].config_name, bins[i].status().to_string_with_detail());
            ++failed;
            continue;
          }
          auto k = load_kernel(*bins[i]);
          bench::check(k.status());
          auto geo = (*t)->geometry(cands[i], rows_shape);
          bench::check(geo.status());
          for (int w = 0; w < 3; ++w) bench::check(run(*k, *geo, w % sets));
          bench::check(sync_ctx());
          auto us = time_us([&](int r) { return run(*k, *geo, r % sets); }, sweep_reps, st);
          bench::check(us.status());
          timed.push_back({rendered[i].config_name, *us});
          if (*us < best_us) {
            best_us = *us;
            best_kernel.emplace(std::move(*k));
            best_geo = *geo;
          }
        }
        if (!best_kernel) {
          fmt::print(stderr, "bench_norms: no configuration ran for {} cols={}\n", prob.label, cols);
          return 1;
        }
        std::sort(timed.begin(), timed.end(), [](const Timed& a, const Timed& b) { return a.median_us < b.median_us; });

        // Best configuration and the copy, interleaved.
        const size_t tensor = static_cast<size_t>(rows) * cols * dtype_bytes(dt);
        const size_t bytes = tensor * prob.tensors / 2;  // read (and written) by the kernel and by the copy
        std::vector<double> k_us, c_us;
        for (int r = 0; r < reps; ++r) {
          auto ku = time_us([&](int) { return run(*best_kernel, best_geo, r % sets); }, 1, st);
          bench::check(ku.status());
          k_us.push_back(*ku);
          auto cu = time_us(
              [&](int) -> Status {
                // x -> y (and residual -> residual_out): the same tensors the kernel reads and writes.
                int base = (r % sets) * 4;
                for (int c = 0; c < prob.tensors / 2; ++c) {
                  KILN_CHECK(drv->cuMemcpyDtoDAsync(bufs[base + 2 + c].ptr(), bufs[base + c].ptr(), tensor, st));
                }
                return Status();
              },
              1, st);
          bench::check(cu.status());
          c_us.push_back(*cu);
        }
        auto ks = bench::stats(k_us), cs = bench::stats(c_us);
        const double moved = 2.0 * bytes;  // read + write
        double kgbs = moved / (ks.median * 1e-6) / 1e9, cgbs = moved / (cs.median * 1e-6) / 1e9;
        table.add({prob.label, std::to_string(rows), std::to_string(cols), timed.front().config,
                   std::to_string(timed.size()), fmt::format("{:.1f}", ks.median), fmt::format("{:.0f}", kgbs), fmt::format("{:.1f}", cs.median),
                   fmt::format("{:.0f}", cgbs), fmt::format("{:.1f}%", 100.0 * cs.median / ks.median)});
        nlohmann::json r;
        r["problem"] = prob.label;
        r["rows"] = rows;
        r["cols"] = cols;
        r["dtype"] = "bf16";
        r["bytes_moved"] = moved;
        r["best_config"] = timed.front().config;
        r["configs_swept"] = timed.size();
        r["compile_failures"] = failed;
        r["kernel_us"] = bench::to_json(ks);
        r["copy_us"] = bench::to_json(cs);
        r["kernel_gbps"] = kgbs;
        r["copy_gbps"] = cgbs;
        r["fraction_of_copy"] = cs.median / ks.median;
        nlohmann::json top = nlohmann::json::array();
        for (size_t i = 0; i < std::min<size_t>(timed.size(), 8); ++i) {
          top.push_back({{"config", timed[i].config}, {"median_us", timed[i].median_us}});
        }
        r["sweep_top"] = top;
        r["sweep_worst"] = {{"config", timed.back().config}, {"median_us", timed.back().median_us}};
        out["results"].push_back(r);
        fmt::print(stderr, "{} rows={} cols={}: {} configs, best {} {:.1f} us\n", prob.label, rows, cols,
                   timed.size(), timed.front().config, timed.front().median_us);
      }
    }
  }
  if (only != "long") {
    fmt::print("{}\n", table.str());
    fmt::print("device {}, {} SMs; kernel and copy move the same bytes (read + write), medians of {} interleaved runs\n",
               info->name, info->sm_count, reps);
  }

  // ---- long rows: softmax over vocabulary-sized rows, against torch.compile's (from --torch).
  if (only != "rows") {
    nlohmann::json torch = nlohmann::json::array();
    if (!torch_path.empty()) {
      std::ifstream in(torch_path);
      try {
        torch = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        fmt::print(stderr, "bench_norms: cannot read {}: {}\n", torch_path, e.what());
      }
    }
    auto torch_for = [&](int64_t r, int64_t c, const char* key) -> nlohmann::json {
      for (const auto& t : torch) {
        if (t.value("rows", 0) == r && t.value("cols", 0) == c && t.contains(key)) return t[key];
      }
      return nullptr;
    };
    const int launches = 50, samples = 15;
    // The device's copy bandwidth: 128 MiB device to device (read + write).
    const size_t big = std::min<size_t>(tensor_bytes, 128u << 20);
    auto big_us = graph_us(
        [&](int) -> Status {
          KILN_CHECK(drv->cuMemcpyDtoDAsync(bufs[1].ptr(), bufs[0].ptr(), big, st));
          return Status();
        },
        5, 5, st);
    bench::check(big_us.status());
    const double copy_gbps = 2.0 * big / (*big_us * 1e-6) / 1e9;
    fmt::print(stderr, "device copy bandwidth: {:.0f} GB/s (128 MiB cuMemcpyDtoD)\n", copy_gbps);
    out["device_copy_gbps"] = copy_gbps;
    std::vector<uint16_t> host_x;  // the values every buffer was filled with
    {
      host_x.resize(buffer_rows * max_cols);
      bench::check(bufs[0].copy_to_host(host_x.data(), host_x.size() * 2));
    }
    bench::Table long_table({"rows", "cols", "best kiln configuration", "kiln us", "GB/s", "of copy bw", "copy us",
                             "torch.compile us", "kiln vs torch.compile"});
    nlohmann::json long_out = nlohmann::json::array();
    for (int64_t cols : {int64_t{128256}, int64_t{152064}}) {
      for (int64_t lrows : {int64_t{1}, int64_t{8}, int64_t{24}, int64_t{64}}) {
        const Shape shape{lrows, cols};
        const size_t bytes = static_cast<size_t>(lrows * cols) * dtype_bytes(dt);
        const int lsets = static_cast<int>(std::clamp<double>(std::ceil(3.0 * info->l2_bytes / (2.0 * bytes)), 2,
                                                              std::min<double>(64, tensor_bytes / bytes)));
        struct Cand {
          TemplatePtr t;
          Params p;
          std::string name;
          Result<Binary> bin = make_error(ErrorCode::kInternal, "not compiled");
        };
        std::vector<Cand> cands;
        for (const char* name : {"softmax", "softmax_cluster"}) {
          auto t = find_template(name);
          bench::check(t.status());
          auto grid = Grid::create(*t, {{"dtype", Value::dtype(dt)}});
          bench::check(grid.status());
          for (const Params& c : pruned(*grid, limits)) {
            if (!(*t)->check_problem(c, shape).ok()) continue;
            // The one-block-per-row template runs long rows in its two-pass path: its rows and items do not matter.
            if (std::string(name) == "softmax" &&
                (get_int(c, "rows_per_block") != 1 || get_int(c, "items") != 1 || get_int(c, "vec") != 8)) {
              continue;
            }
            if (get_int(c, "vec") != 8) continue;  // 16-byte accesses: both column counts are multiples of 8

            cands.push_back({*t, c, *(*t)->config_name(c)});
          }
        }
        std::atomic<size_t> next{0};
        std::vector<std::thread> threads;
        for (unsigned w = 0; w < std::max(1u, std::thread::hardware_concurrency()); ++w) {
          threads.emplace_back([&] {
            for (size_t i; (i = next.fetch_add(1)) < cands.size();) {
              auto r = cands[i].t->render(cands[i].p);
              cands[i].bin = r.ok() ? compile(r->source, target) : Result<Binary>(r.status());
            }
          });
        }
        for (auto& th : threads) th.join();
        auto x_at = [&](int set) { return reinterpret_cast<void*>(static_cast<uintptr_t>(bufs[0].ptr() + set * bytes)); };
        auto y_at = [&](int set) { return reinterpret_cast<void*>(static_cast<uintptr_t>(bufs[2].ptr() + set * bytes)); };
        auto args_at = [&](int set) {
          SoftmaxArgs a{};
          a.x = x_at(set);
          a.y = y_at(set);
          a.rows = static_cast<int>(lrows);
          a.cols = static_cast<int>(cols);
          a.ld_x = a.ld_y = cols;
          a.scale = 1.f;
          return a;
        };
        // The float64 reference of set 0.
        std::vector<double> ref(static_cast<size_t>(lrows * cols));
        for (int64_t r = 0; r < lrows; ++r) {
          double m = -INFINITY, sum = 0;
          for (int64_t c = 0; c < cols; ++c) m = std::max<double>(m, load_element(dt, &host_x[r * cols + c]));
          for (int64_t c = 0; c < cols; ++c) sum += std::exp(load_element(dt, &host_x[r * cols + c]) - m);
          for (int64_t c = 0; c < cols; ++c) ref[r * cols + c] = std::exp(load_element(dt, &host_x[r * cols + c]) - m) / sum;
        }
        struct Best {
          double us = 1e30;
          std::string name;
          double err = 0;
        };
        std::map<std::string, Best> best_of;  // by template
        Best best;
        nlohmann::json swept = nlohmann::json::array();
        for (Cand& c : cands) {
          if (!c.bin.ok()) {
            swept.push_back({{"config", c.name}, {"error", c.bin.status().to_string()}});
            continue;
          }
          auto k = load_kernel(*c.bin);
          auto geo = c.t->geometry(c.p, shape);
          if (!k.ok() || !geo.ok()) {
            swept.push_back({{"config", c.name}, {"error", (k.ok() ? geo.status() : k.status()).to_string()}});
            continue;
          }
          bench::check(bufs[2].fill_bytes(0xFF, st));
          Status ran = launch(*k, *geo, args_at(0), st);
          if (ran.ok()) ran = sync_ctx();
          if (!ran.ok()) {
            // (A fault would leave the context unusable: the next step's check stops the program.)
            fmt::print(stderr, "bench_norms: {} failed: {}\n", c.name, ran.to_string());
            swept.push_back({{"config", c.name}, {"error", ran.to_string()}});
            continue;
          }
          std::vector<uint16_t> y(ref.size());
          bench::check(bufs[2].copy_to_host(y.data(), y.size() * 2));
          double num = 0, den = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            const double d = load_element(dt, &y[i]) - ref[i];
            num += d * d;
            den += ref[i] * ref[i];
          }
          const double err = std::sqrt(num / den);
          if (!(err <= 1e-2)) {
            swept.push_back({{"config", c.name}, {"error", fmt::format("wrong: relative error {}", err)}});
            continue;
          }
          auto us = graph_us([&](int i) { return launch(*k, *geo, args_at(i % lsets), st); }, launches, samples, st);
          bench::check(us.status());
          swept.push_back({{"config", c.name}, {"us", *us}, {"err", err}});
          if (*us < best.us) best = {*us, c.name, err};
          if (*us < best_of[c.t->name()].us) best_of[c.t->name()] = {*us, c.name, err};
        }
        auto copy_us = graph_us(
            [&](int i) -> Status {
              KILN_CHECK(drv->cuMemcpyDtoDAsync(bufs[2].ptr() + (i % lsets) * bytes, bufs[0].ptr() + (i % lsets) * bytes,
                                                bytes, st));
              return Status();
            },
            launches, samples, st);
        bench::check(copy_us.status());
        nlohmann::json r{{"problem", "softmax long rows"}, {"rows", lrows}, {"cols", cols}, {"dtype", "bf16"},
                         {"input_sets", lsets}, {"copy_us", *copy_us}, {"candidates", swept}};
        const nlohmann::json tc = torch_for(lrows, cols, "torch_compile_us");
        r["torch_compile_us"] = tc;
        r["torch_eager_us"] = torch_for(lrows, cols, "torch_eager_us");
        for (const auto& [name, b] : best_of) r["best_" + name] = {{"config", b.name}, {"us", b.us}};
        std::string vs = "-";
        if (!best.name.empty()) {
          const double gbps = 2.0 * bytes / (best.us * 1e-6) / 1e9;
          r["kiln_us"] = best.us;
          r["kiln_config"] = best.name;
          r["kiln_err"] = best.err;
          r["kernel_gbps"] = gbps;
          r["copy_bw_fraction"] = gbps / copy_gbps;
          if (tc.is_number()) {
            r["kiln_speedup_vs_torch_compile"] = tc.get<double>() / best.us;
            vs = fmt::format("{:.2f}x", tc.get<double>() / best.us);
          }
          long_table.add({std::to_string(lrows), std::to_string(cols), best.name, fmt::format("{:.1f}", best.us),
                          fmt::format("{:.0f}", gbps), fmt::format("{:.0f}%", 100 * gbps / copy_gbps),
                          fmt::format("{:.1f}", *copy_us), tc.is_number() ? fmt::format("{:.1f}", tc.get<double>()) : "-",
                          vs});
        } else {
          r["kiln_us"] = nullptr;
        }
        long_out.push_back(r);
        fmt::print(stderr, "softmax rows={} cols={}: {} configs, best {} {:.1f} us\n", lrows, cols, cands.size(),
                   best.name, best.us);
      }
    }
    out["long_rows"] = long_out;
    fmt::print("{}\n", long_table.str());
    fmt::print("long rows: CUDA-graph replays of {} launches, inputs rotated past L2; torch.compile from {}\n", launches,
               torch_path.empty() ? "(not given: --torch)" : torch_path);
  }
  if (!json_path.empty() && !bench::write_json(json_path, out)) return 1;
  return 0;
}
