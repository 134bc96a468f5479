// Several processes precompiling one workload into one empty cache: `kiln precompile` started once, then N
// times at once, each run on a fresh cache folder. With build claims (the default) the N processes should
// finish within 1.3x of the one (the target; it needs as many cores as one process uses) and compile
// every kernel exactly once between them; with --claims both, N processes without claims run too (today's
// behaviour before claims: each compiles everything) as the reference. Per process it prints wall time and
// how many kernels it compiled itself (kiln precompile --compiled-keys), per run the compiles per key, and it
// exits 1 when a run with claims compiled any key more than once (or a process failed). Writes JSON with --json.
//
//   bench_precompile_procs --procs 1,8 --workload examples/llama3-8b.json --arch sm_90a --json out.json
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"

namespace {

namespace fs = std::filesystem;
using kiln::bench::Clock;

struct Args {
  std::string kiln;
  std::string workload = "examples/llama3-8b.json";
  std::string arch = "sm_90a";
  std::vector<int> procs{1, 8};
  std::string claims = "on";  // on | off | both
  int configs = 0;            // 0: kiln precompile's default
  int workers = 0;            // KILN_COMPILE_WORKERS per process; 0: kiln's default (the cores)
  std::string work_dir;
  std::string json;
  bool keep = false;
};

struct ProcResult {
  int exit_code = -1;
  double wall_s = 0;
  std::vector<std::string> compiled;  // keys it compiled itself
  std::string summary;                // kiln precompile's summary line
};

struct RunResult {
  int procs = 0;
  bool claims = true;
  double wall_s = 0;
  std::vector<ProcResult> per_process;
  std::map<std::string, int> per_key;
  int duplicates = 0;  // keys compiled more than once
  int max_per_key = 0;
  bool ok = true;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string self_dir() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

RunResult run(const Args& a, int procs, bool claims, int index) {
  RunResult r;
  r.procs = procs;
  r.claims = claims;
  const fs::path root = fs::path(a.work_dir) / fmt::format("run{}-{}p-claims-{}", index, procs, claims ? "on" : "off");
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path cache = root / "cache";
  std::vector<pid_t> pids(procs);
  std::vector<Clock::time_point> started(procs);
  r.per_process.resize(procs);
  const auto t0 = Clock::now();
  for (int p = 0; p < procs; ++p) {
    std::vector<std::string> argv{a.kiln, "precompile", "--workload", a.workload, "--arch", a.arch, "--cache-dir",
                                  cache.string(), "--build-claims", claims ? "on" : "off", "--compiled-keys",
                                  (root / fmt::format("keys-{}.txt", p)).string()};
    if (a.configs > 0) {
      argv.push_back("--configs");
      argv.push_back(std::to_string(a.configs));
    }
    const std::string log = (root / fmt::format("log-{}.txt", p)).string();
    started[p] = Clock::now();
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      if (a.workers > 0) ::setenv("KILN_COMPILE_WORKERS", std::to_string(a.workers).c_str(), 1);
      std::vector<char*> cargv;
      for (auto& s : argv) cargv.push_back(s.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    pids[p] = pid;
  }
  for (int done = 0; done < procs; ++done) {
    int status = 0;
    pid_t pid = ::wait(&status);
    for (int p = 0; p < procs; ++p) {
      if (pids[p] != pid) continue;
      r.per_process[p].wall_s = kiln::bench::seconds_since(started[p]);
      r.per_process[p].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
  r.wall_s = kiln::bench::seconds_since(t0);
  for (int p = 0; p < procs; ++p) {
    ProcResult& pr = r.per_process[p];
    std::istringstream keys(read_file(root / fmt::format("keys-{}.txt", p)));
    for (std::string k; keys >> k;) {
      pr.compiled.push_back(k);
      ++r.per_key[k];
    }
    std::istringstream log(read_file(root / fmt::format("log-{}.txt", p)));
    for (std::string line; std::getline(log, line);) {
      if (line.find(" distinct: ") != std::string::npos) pr.summary = line;
    }
    if (pr.exit_code != 0) {
      r.ok = false;
      fmt::print(stderr, "process {} of the {}-process run exited {}; its log: {}\n", p, procs, pr.exit_code,
                 (root / fmt::format("log-{}.txt", p)).string());
    }
  }
  for (const auto& [k, n] : r.per_key) {
    r.max_per_key = std::max(r.max_per_key, n);
    if (n > 1) ++r.duplicates;
  }
  if (claims && r.duplicates > 0) r.ok = false;
  if (!a.keep) fs::remove_all(root / "cache");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"N processes precompiling one workload into one empty cache, with and without build claims"};
  app.add_option("--kiln", a.kiln, "The kiln CLI (default: kiln next to this program)");
  app.add_option("--workload", a.workload, "Workload JSON (default examples/llama3-8b.json)");
  app.add_option("--arch", a.arch, "Target arch (default sm_90a)");
  app.add_option("--procs", a.procs, "Process counts, each a run on a fresh cache (default 1,8)")->delimiter(',');
  app.add_option("--claims", a.claims, "on (default), off, or both: also run without build claims")
      ->check(CLI::IsMember({"on", "off", "both"}));
  app.add_option("--configs", a.configs, "Template configurations per template (default: kiln's)");
  app.add_option("--workers", a.workers, "KILN_COMPILE_WORKERS for every process (default: kiln's, the cores)");
  app.add_option("--work-dir", a.work_dir, "Where the caches and logs go (default: a temporary folder)");
  app.add_flag("--keep", a.keep, "Keep the caches");
  app.add_option("--json", a.json, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (a.kiln.empty()) a.kiln = (fs::path(self_dir()) / "kiln").string();
  if (!fs::exists(a.kiln)) {
    fmt::print(stderr, "no kiln CLI at '{}' (give --kiln)\n", a.kiln);
    return 2;
  }
  if (a.work_dir.empty()) {
    std::random_device rd;
    a.work_dir = (fs::temp_directory_path() / fmt::format("kiln-bench-procs-{:08x}", rd())).string();
  }
  std::vector<bool> modes;
  if (a.claims != "off") modes.push_back(true);
  if (a.claims != "on") modes.push_back(false);

  std::vector<RunResult> runs;
  int index = 0;
  for (bool claims : modes) {
    for (int n : a.procs) {
      if (n < 1) continue;
      if (n == 1 && !claims && modes.size() > 1) continue;  // one process is the same either way
      fmt::print(stderr, "running {} process{} {} build claims ...\n", n, n == 1 ? "" : "es", claims ? "with" : "without");
      runs.push_back(run(a, n, claims, index++));
    }
  }

  double one = 0;
  for (const auto& r : runs) {
    if (r.procs == 1) one = r.wall_s;
  }
  kiln::bench::Table table({"processes", "claims", "wall s", "x one process", "compiles", "distinct keys",
                            "max per key", "compiles per process"});
  nlohmann::json out{{"benchmark", "precompile_procs"}, {"environment", kiln::bench::environment()},
                     {"workload", a.workload}, {"arch", a.arch}, {"configs", a.configs}, {"workers", a.workers},
                     {"target_ratio", 1.3}, {"runs", nlohmann::json::array()}};
  bool ok = true;
  for (const auto& r : runs) {
    int total = 0;
    std::string per;
    nlohmann::json procs = nlohmann::json::array();
    for (const auto& p : r.per_process) {
      total += static_cast<int>(p.compiled.size());
      per += (per.empty() ? "" : " ") + std::to_string(p.compiled.size());
      procs.push_back({{"wall_s", p.wall_s}, {"compiled", p.compiled.size()}, {"exit_code", p.exit_code},
                       {"summary", p.summary}});
    }
    const double ratio = one > 0 ? r.wall_s / one : 0;
    table.add({std::to_string(r.procs), r.claims ? "on" : "off", fmt::format("{:.2f}", r.wall_s),
               one > 0 ? fmt::format("{:.2f}", ratio) : "-", std::to_string(total), std::to_string(r.per_key.size()),
               std::to_string(r.max_per_key), per});
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& [k, n] : r.per_key) keys[k] = n;
    out["runs"].push_back({{"processes", r.procs}, {"claims", r.claims}, {"wall_s", r.wall_s},
                           {"ratio_to_one_process", ratio}, {"compiles", total}, {"distinct_keys", r.per_key.size()},
                           {"max_compiles_per_key", r.max_per_key}, {"keys_compiled_more_than_once", r.duplicates},
                           {"each_key_compiled_once", r.duplicates == 0}, {"ok", r.ok}, {"per_process", procs},
                           {"compiles_per_key", keys}});
    ok = ok && r.ok;
  }
  fmt::print("{}", table.str());
  for (const auto& r : runs) {
    if (r.claims && r.duplicates > 0) fmt::print("FAIL: {} keys compiled more than once with claims on ({} processes)\n", r.duplicates, r.procs);
  }
  out["ok"] = ok;
  if (!a.json.empty() && !kiln::bench::write_json(a.json, out)) return 1;
  if (!a.keep) {
    std::error_code ec;
    fs::remove_all(a.work_dir, ec);
  }
  return ok ? 0 : 1;
}
