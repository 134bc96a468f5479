// kiln warmup: load every cached kernel for this device (or a workload's) and report how long it took.
#include <fmt/format.h>

#include <sstream>

#include "commands.h"
#include "kiln/cache/cache.h"
#include "kiln/input.h"

namespace kiln::cli {
namespace {

struct WarmupArgs {
  std::string dir;
  std::string problems_file;
  int device = 0;
  int threads = 0;
  bool no_load = false;
};

int run_warmup(const WarmupArgs& a) {
  cache::StoreOptions so;
  so.dir = a.dir;
  so.ingest_interval = std::chrono::milliseconds(0);
  auto t0 = std::chrono::steady_clock::now();
  auto store = cache::Store::open(so);
  if (!store.ok()) {
    fmt::print(stderr, "kiln warmup: {}\n", store.status().to_string());
    return 1;
  }
  double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cache::PreloadOptions po;
  po.device = a.device;
  po.threads = a.threads;
  po.load_modules = !a.no_load;
  // The command exits when done, so it loads eagerly: its report says how long making every kernel ready takes
  // (a serving process preloads lazily, the library's default; docs/cache.md).
  po.lazy = false;
  if (!a.problems_file.empty()) {
    // A list of problem keys: bounded as a workload file is (/dev/zero once read until memory ran out).
    auto text = read_file_limited(a.problems_file, InputLimit{"problems file", "KILN_MAX_WORKLOAD_BYTES", 16ull << 20});
    if (!text.ok()) {
      fmt::print(stderr, "kiln warmup: {}\n", text.status().to_string());
      return 1;
    }
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line[0] != '#') po.problems.push_back(line);
    }
  }
  auto loaded = cache::preload(**store, po);
  if (!loaded.ok()) {
    fmt::print(stderr, "kiln warmup: {}\n", loaded.status().to_string());
    return 1;
  }
  const auto& r = loaded->report();
  fmt::print("cache       {} ({} in {:.1f} ms)\n", (*store)->dir(), (*store)->is_writer() ? "writer" : "reader", open_s * 1e3);
  fmt::print("decisions   {} selected{}\n", r.decisions, a.problems_file.empty() ? " for this device" : " from " + a.problems_file);
  fmt::print("ready       {} kernels loaded and resolved in {:.1f} ms ({} threads)\n", r.loaded, r.load_seconds * 1e3, r.threads);
  if (r.verified) fmt::print("verified    {} binaries read and verified into memory, modules left to first use\n", r.verified);
  if (r.without_kernel) fmt::print("library     {} decisions name no compiled kernel\n", r.without_kernel);
  if (r.missing) fmt::print("missing     {} binaries not in the cache (compiled on first use)\n", r.missing);
  if (r.failed) fmt::print("failed      {} binaries the driver refused\n", r.failed);
  for (const auto& e : r.errors) fmt::print("  {}\n", e);
  fmt::print("total       {:.1f} ms\n", (open_s + r.total_seconds) * 1e3);
  return r.failed ? 1 : 0;
}

void add_warmup_command(CLI::App& app) {
  auto args = std::make_shared<WarmupArgs>();
  auto* cmd = app.add_subcommand("warmup", "Load every cached kernel for this device (or a workload) and make it ready");
  add_cache_dir_option(cmd, args->dir);
  cmd->add_option("--problems", args->problems_file, "A file of canonical problem keys, one a line (default: every "
                                                     "decision for the device)");
  cmd->add_option("--device", args->device, "Device ordinal (default 0)")->check(CLI::Range(0, 1023));
  cmd->add_option("--threads", args->threads, "Loader threads (default: chosen from measurements)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--no-load", args->no_load, "Only read and verify the binaries into memory; load modules at first use");
  on_run(cmd, args, run_warmup);
}

}  // namespace

KILN_REGISTER_COMMAND(add_warmup_command);

}  // namespace kiln::cli
