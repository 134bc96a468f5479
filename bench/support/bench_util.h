// kiln_bench_support: the harness every bench/ program shares (and nothing else links): robust statistics and
// timers, a benchmark's handling of failures, the machine and commit a run was on, and the JSON/table output.
// The method: correct first, warm up, median of many runs, the reference measured side by side in the same
// run. It depends on kiln (kiln::jit); kiln and its CLI never depend on it.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/status.h"

namespace kiln::bench {

/// Order statistics and the mean of n samples, in the samples' unit.
struct Stats {
  double median = 0, min = 0, max = 0, p10 = 0, p90 = 0, mean = 0;
  size_t n = 0;
};
/// Statistics of `samples` (any unit). Empty input gives all zeros.
Stats stats(std::vector<double> samples);
nlohmann::json to_json(const Stats& s);

using Clock = std::chrono::steady_clock;
/// Time from `t0` to now on the steady clock.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline double us_since(Clock::time_point t0) { return seconds_since(t0) * 1e6; }

/// A benchmark cannot measure around a failed step, so it stops: prints "<program>: [<what>: ]<status and
/// its detail>" to stderr and exits 1. (Benchmarks are programs; kiln's library code never exits.)
[[noreturn]] void fail(const Status& s, std::string_view what = {});
/// fail()s if `s` (a Status or a Result) is an error.
template <class S>
void check(const S& s, std::string_view what = {}) {
  if (!s.ok()) fail(detail::as_status(s), what);
}
/// The value of `r`, or fail().
template <class T>
T must(Result<T> r, std::string_view what = {}) {
  if (!r.ok()) fail(r.status(), what);
  return std::move(r).value();
}

/// Where and when a run happened: host CPU count, device (if any), NVRTC and driver versions, kiln commit
/// (stamped in at build time, "-dirty" when built from uncommitted changes, or $KILN_COMMIT), UTC date. Goes at
/// the top of every results JSON.
nlohmann::json environment();

/// A simple aligned text table.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// Writes `j` (pretty) to `path`; returns false (and prints why) on failure.
bool write_json(const std::string& path, const nlohmann::json& j);

}  // namespace kiln::bench
