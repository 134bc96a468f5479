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
// Usage: bench_norms [--json FILE] [--reps N] [--sweep-reps N] [--quick]
#include <algorithm>
#include <atomic>
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

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 50, sweep_reps = 10;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--sweep-reps" && i + 1 < argc) sweep_reps = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else {
      fmt::print(stderr, "usage: bench_norms [--json FILE] [--reps N] [--sweep-reps N] [--quick]\n");
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

  const int64_t rows = 8192;
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
  const size_t tensor_bytes = rows * max_cols * dtype_bytes(dt);
  std::vector<DeviceBuffer> bufs;
  {
    std::vector<uint16_t> host(rows * max_cols);
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
  out["method"] = "bf16, rows=8192; best of a sweep of configurations keeping a row in registers (median of "
                  "sweep_reps launches each), then best and cuMemcpyDtoD of the same bytes timed interleaved "
                  "(median of reps each); GB/s = (bytes read + bytes written) / time; inputs rotate over 2 sets";
  out["reps"] = reps;
  out["sweep_reps"] = sweep_reps;
  out["results"] = nlohmann::json::array();
  bench::Table table({"problem", "cols", "best configuration", "swept", "kernel us", "GB/s", "copy us", "copy GB/s",
                      "% of copy"});

  for (const Problem& prob : problems) {
    auto t = find_template(prob.tmpl);
    bench::check(t.status());
    auto grid = Grid::create(*t, prob.fixed);
    bench::check(grid.status());
    auto configs = pruned(*grid, limits);
    for (int64_t cols : col_sizes) {
      Shape shape{rows, cols};
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
        auto geo = (*t)->geometry(cands[i], shape);
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
      table.add({prob.label, std::to_string(cols), timed.front().config, std::to_string(timed.size()),
                 fmt::format("{:.1f}", ks.median), fmt::format("{:.0f}", kgbs), fmt::format("{:.1f}", cs.median),
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
      fmt::print(stderr, "{} cols={}: {} configs, best {} {:.1f} us\n", prob.label, cols, timed.size(),
                 timed.front().config, timed.front().median_us);
    }
  }
  fmt::print("{}\n", table.str());
  fmt::print("device {}, {} SMs; kernel and copy move the same bytes (read + write), medians of {} interleaved runs\n",
             info->name, info->sm_count, reps);
  if (!json_path.empty() && !bench::write_json(json_path, out)) return 1;
  return 0;
}
