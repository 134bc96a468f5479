// bench_text_pages: NVRTC compiles side by side with the library's code on the file's 4 KiB pages, on huge pages
// copied per process, or on huge pages shared by every process (moved once, then inherited through fork).
//
// The process pool gives each worker its own copy (pool/src/huge_text.h): workers are spawned, not forked, so
// each maps libnvrtc.so at its own address. A copy per process holds the hot code once per process in the shared
// last-level cache; one copy shared through fork holds it once. This measures whether that difference matters
// before the pool is built around it: `--mode small|private|shared --procs N --per-proc K`, one measurement per
// run (a moved text cannot be moved back), kiln's gemm_wgmma_sm90 configurations of `kiln-bench pool --kernel
// wgmma`, each compile a distinct source. bench/pool/text_pages_ab.sh alternates the modes on the GPU machine.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "huge_text.h"
#include "kiln/jit/compiler.h"
#include "pool_bench.h"

namespace {

using namespace kiln;

struct Sample {
  double seconds = 0;
  int ok = 0;
};

// One child: `warm_up` untimed compiles (a process's first compile also loads NVRTC's builtins and faults its
// pages in, as a pool worker's does once in its life), then `per_proc` distinct sources, a Sample for each to `fd`.
// Each child closes `ready` once warmed up, then waits at `start` (a pipe the parent closes when every child is
// ready), so that every timed compile runs beside the others.
[[noreturn]] void child(const std::vector<templates::Rendered>& sample, const Target& target, int per_proc,
                        int warm_up, int index, bool move_here, int fd, int ready, int start) {
  if (move_here) {
    auto moved = pool_detail::move_text_to_huge_pages("libnvrtc.so");
    if (!moved.ok()) std::fprintf(stderr, "child %d: %s\n", index, moved.status().to_string().c_str());
  }
  auto one = [&](int i, const char* what) {
    KernelSource s = sample[static_cast<size_t>(index + i) % sample.size()].source;
    s.source += fmt::format("\n// text pages {} {} {} {}\n", what, ::getpid(), index, i);
    return compile(s, target).ok();
  };
  for (int i = 0; i < warm_up; ++i) (void)one(i, "warm-up");
  ::close(ready);
  char byte;
  (void)::read(start, &byte, 1);  // EOF once the parent has closed it
  for (int i = 0; i < per_proc; ++i) {
    const auto t0 = bench::Clock::now();
    const bool ok = one(i, "timed");
    Sample out{bench::seconds_since(t0), ok ? 1 : 0};
    if (::write(fd, &out, sizeof out) != static_cast<ssize_t>(sizeof out)) ::_exit(3);
  }
  ::_exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVRTC compiles side by side with libnvrtc's code on small, per-process huge or shared huge pages"};
  std::string mode = "small", arch = "sm_90a", json;
  int procs = 1, per_proc = 6, warm_up = 1;
  app.add_option("--mode", mode, "small, private (each process moves its code) or shared (moved before fork)")
      ->check(CLI::IsMember({"small", "private", "shared"}));
  app.add_option("--procs", procs, "Processes compiling side by side")->check(CLI::Range(1, 1024));
  app.add_option("--per-proc", per_proc, "Compiles per process")->check(CLI::Range(1, 1000));
  app.add_option("--warm-up", warm_up, "Untimed compiles per process first (0: none; the 2 Dec 2026 run had none and "
                                       "timed the forks too)")->check(CLI::Range(0, 100));
  app.add_option("--arch", arch, "Target arch");
  app.add_option("--json", json, "Write the run here");
  CLI11_PARSE(app, argc, argv);

  const Target target{arch};
  auto sample = bench::must(pool_bench::wgmma_sample(target), "rendering gemm_wgmma_sm90");
  (void)nvrtc_version();  // NVRTC loaded and its code mapped before anything moves or forks
  nlohmann::json moved_json;
  if (mode == "shared") {
    auto moved = bench::must(pool_detail::move_text_to_huge_pages("libnvrtc.so"), "moving NVRTC's code");
    moved_json = {{"bytes_moved", moved.bytes_moved}, {"huge_bytes", moved.huge_bytes}};
  }
  int fds[2], start[2], ready[2];
  if (::pipe(fds) != 0 || ::pipe(start) != 0 || ::pipe(ready) != 0) {
    bench::fail(make_error(ErrorCode::kIoError, std::strerror(errno)), "pipe");
  }
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    const pid_t pid = ::fork();
    if (pid < 0) bench::fail(make_error(ErrorCode::kIoError, std::strerror(errno)), "fork");
    if (pid == 0) {
      ::close(fds[0]);
      ::close(start[1]);
      ::close(ready[0]);
      child(sample, target, per_proc, warm_up, p, mode == "private", fds[1], ready[1], start[0]);
    }
    kids.push_back(pid);
  }
  ::close(fds[1]);
  ::close(start[0]);
  ::close(ready[1]);
  char byte;
  (void)::read(ready[0], &byte, 1);  // EOF once every child has closed its end: all warmed up
  const auto t0 = bench::Clock::now();
  ::close(start[1]);  // every child starts its timed compiles now
  std::vector<double> seconds;
  int failed = 0;
  Sample s;
  while (::read(fds[0], &s, sizeof s) == static_cast<ssize_t>(sizeof s)) {
    seconds.push_back(s.seconds);
    failed += s.ok ? 0 : 1;
  }
  int bad_exits = 0;
  for (pid_t k : kids) {
    int status = 0;
    if (::waitpid(k, &status, 0) != k || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++bad_exits;
  }
  const double wall = bench::seconds_since(t0);
  const bench::Stats st = bench::stats(seconds);
  const double rate = static_cast<double>(seconds.size()) / wall;
  bench::Table t({"mode", "procs", "compiles", "wall s", "kernels/s", "job s (median)", "job s (p90)", "failed"});
  t.add({mode, std::to_string(procs), std::to_string(seconds.size()), fmt::format("{:.2f}", wall),
         fmt::format("{:.2f}", rate), fmt::format("{:.3f}", st.median), fmt::format("{:.3f}", st.p90),
         std::to_string(failed + bad_exits)});
  std::fputs(t.str().c_str(), stdout);
  if (!json.empty()) {
    nlohmann::json j = {{"environment", bench::environment()}, {"mode", mode}, {"procs", procs},
                        {"per_proc", per_proc}, {"warm_up", warm_up}, {"compiles", seconds.size()}, {"wall_s", wall},
                        {"kernels_per_second", rate}, {"job_seconds", bench::to_json(st)},
                        {"failed", failed + bad_exits}, {"moved", moved_json}};
    if (!bench::write_json(json, j)) return 1;
  }
  return failed + bad_exits == 0 && static_cast<int>(seconds.size()) == procs * per_proc ? 0 : 1;
}
