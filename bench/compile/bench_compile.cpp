// NVRTC compile time through kiln's JIT core: a small and a larger kernel, with and without automatic
// precompiled headers (-pch). Each timed compile is a distinct program (a variant constant differs after the
// headers, as rendered template configurations do), so nothing but PCH is reused between compiles.
// Prints a table and writes JSON.
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "kiln/embedded.h"
#include "kiln/jit.h"

namespace kiln::bench_kernels {
std::span<const kiln::EmbeddedFile> embedded_files();
}

namespace {

struct Case {
  std::string name;
  kiln::KernelSource (*make)(int variant);
};

kiln::KernelSource small_kernel(int variant) {
  kiln::KernelSource s;
  s.name = "small_axpy";
  s.entry = "axpy";
  s.source = fmt::format(
      "#include <cuda_fp16.h>\n"
      "extern \"C\" __global__ void axpy(int n, float a, const __half* x, __half* y) {{\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]) + {}.0f);\n"
      "}}\n",
      variant);
  return s;
}

kiln::KernelSource large_kernel(int variant) {
  kiln::KernelSource s;
  s.name = "large_tile_gemm";
  for (const auto& f : kiln::bench_kernels::embedded_files()) {
    if (f.name == "tile_gemm.cu") s.source = std::string(f.contents);
  }
  // The variant goes after the headers and the first declaration: NVRTC reuses an automatic PCH only when the
  // preprocessing preamble is identical, so a #define above the #includes would force a new PCH every time.
  const std::string anchor = "namespace bench {";
  const size_t at = s.source.find(anchor);
  s.source.insert(at + anchor.size(), fmt::format("\n#define KILN_VARIANT_SCALE (1.0f + {}.0f / 1024)\n", variant));
  s.name_expressions = {"bench::gemm<128, 128, 32, 64, 64, 3>", "bench::gemm<64, 128, 32, 32, 64, 4>"};
  s.entry = s.name_expressions.front();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVRTC compile time through kiln, with and without -pch"};
  int reps = 8;
  std::string arch = "sm_90";
  std::string json_path;
  app.add_option("--reps", reps, "Timed compiles per (kernel, pch)");
  app.add_option("--arch", arch, "Target arch");
  app.add_option("--json", json_path, "Write results here");
  CLI11_PARSE(app, argc, argv);

  auto target = kiln::Target::parse(arch);
  if (!target.ok()) {
    fmt::print(stderr, "{}\n", target.status().to_string());
    return 2;
  }
  std::string pch_dir = (std::filesystem::temp_directory_path() / fmt::format("kiln_bench_pch_{}", ::getpid())).string();
  std::filesystem::create_directories(pch_dir);

  const std::vector<Case> cases = {{"small (axpy, cuda_fp16.h)", small_kernel},
                                   {"large (tile GEMM, 2 instantiations, bf16/fp16/cuda::std)", large_kernel}};
  nlohmann::json rows = nlohmann::json::array();
  kiln::bench::Table table({"kernel", "pch", "first (ms)", "median (ms)", "p10", "p90", "n", "cubin"});
  int variant = 0;
  for (const auto& c : cases) {
    // The first compile in the process pays NVRTC's one-time start-up; it is reported separately.
    std::vector<double> first(2, 0), samples[2];
    size_t cubin_size = 0;
    for (int rep = -1; rep < reps; ++rep) {
      for (int pch = 0; pch < 2; ++pch) {  // interleaved, so drift hits both alike
        kiln::CompileSettings settings;
        settings.use_pch = pch == 1;
        settings.pch_dir = pch_dir;
        auto bin = kiln::compile(c.make(++variant), *target, settings);
        if (!bin.ok()) {
          fmt::print(stderr, "{}\n", bin.status().to_string_with_detail());
          return 1;
        }
        cubin_size = bin->cubin.size();
        if (rep < 0) first[pch] = bin->compile_seconds * 1e3;
        else samples[pch].push_back(bin->compile_seconds * 1e3);
      }
    }
    for (int pch = 0; pch < 2; ++pch) {
      auto s = kiln::bench::stats(samples[pch]);
      table.add({c.name, pch ? "on" : "off", fmt::format("{:.1f}", first[pch]), fmt::format("{:.1f}", s.median),
                 fmt::format("{:.1f}", s.p10), fmt::format("{:.1f}", s.p90), std::to_string(s.n),
                 std::to_string(cubin_size)});
      rows.push_back({{"kernel", c.name}, {"pch", pch == 1}, {"first_ms", first[pch]},
                      {"compile_ms", kiln::bench::to_json(s)}, {"cubin_bytes", cubin_size}});
    }
  }
  std::filesystem::remove_all(pch_dir);
  nlohmann::json out = {{"benchmark", "compile"}, {"arch", arch}, {"environment", kiln::bench::environment()},
                        {"rows", rows}};
  fmt::print("NVRTC compile time through kiln ({}), median of {} after one untimed-in-median first compile\n{}",
             arch, reps, table.str());
  if (!json_path.empty() && !kiln::bench::write_json(json_path, out)) return 1;
  return 0;
}
