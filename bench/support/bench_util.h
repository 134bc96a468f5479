// Shared benchmark helpers: robust statistics, the machine a run was on, and the JSON/table output every
// bench/ program writes. Method (see docs/benchmarking.md): correct first, warm up, median of many runs,
// reference measured side by side in the same run.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln::bench {

struct Stats {
  double median = 0;
  double min = 0;
  double max = 0;
  double p10 = 0;
  double p90 = 0;
  double mean = 0;
  size_t n = 0;
};
/// Statistics of `samples` (any unit). Empty input gives all zeros.
Stats stats(std::vector<double> samples);
nlohmann::json to_json(const Stats& s);

/// Where and when a run happened: host CPU count, device (if any), NVRTC and driver versions, kiln commit
/// (built in, or $KILN_COMMIT), UTC date. Goes at the top of every results JSON.
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
