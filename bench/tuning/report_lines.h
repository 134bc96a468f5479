// Reading the tune reports a suite run records (`bench_tuning_speed suite --reports`): one JSON object per line,
// {"problem", "effort", "report"}, in a file that may be xz-compressed as bench/results keeps them.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::bench {

// Every line of `path` (decompressed through xz when it ends in .xz), each a tune report whose "choices" is an
// array of objects; false with `err` naming the file when it cannot be read or holds a line that is no report.
inline bool read_report_lines(const std::string& path, std::vector<nlohmann::json>& lines, std::string& err) {
  // The path goes to the shell in single quotes: one that holds a quote itself is refused rather than quoted.
  if (path.find('\'') != std::string::npos) {
    err = path + ": a report path with a quote in it";
    return false;
  }
  const std::string cmd = (path.ends_with(".xz") ? "xz -dc '" : "cat '") + path + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    err = "cannot read " + path;
    return false;
  }
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  if (pclose(f) != 0 || text.empty()) {
    err = path + ": not a readable report file";
    return false;
  }
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    // Checked here once, so that readers may index a report's choices: a const json read at a key it lacks is
    // undefined behaviour, not an exception.
    const bool report = !j.is_discarded() && j.is_object() && j.contains("report") && j["report"].is_object() &&
                        j["report"].contains("choices") && j["report"]["choices"].is_array() &&
                        std::all_of(j["report"]["choices"].begin(), j["report"]["choices"].end(),
                                    [](const nlohmann::json& c) { return c.is_object(); });
    if (!report) {
      err = path + ": a line that is not a tuning report";
      return false;
    }
    lines.push_back(std::move(j));
  }
  return true;
}

}  // namespace kiln::bench
