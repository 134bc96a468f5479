#include "bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "kiln/jit.h"
#include "kiln_bench_commit.h"

namespace kiln::bench {

namespace {
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double pos = p * (sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}
}  // namespace

Stats stats(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {.median = percentile(v, 0.5),
          .min = v.front(),
          .max = v.back(),
          .p10 = percentile(v, 0.1),
          .p90 = percentile(v, 0.9),
          .mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size(),
          .n = v.size()};
}

void fail(const Status& s, std::string_view what) {
  // program_invocation_short_name (glibc): the program's name without having every bench pass it in.
  fmt::print(stderr, "{}: {}{}{}\n", program_invocation_short_name, what, what.empty() ? "" : ": ",
             s.to_string_with_detail());
  std::exit(1);
}

nlohmann::json to_json(const Stats& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"p10", s.p10},
          {"p90", s.p90},       {"mean", s.mean}, {"n", s.n}};
}

nlohmann::json environment() {
  nlohmann::json j;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  j["host_cpus"] = std::thread::hardware_concurrency();
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["date"] = date;
  const char* env_commit = std::getenv("KILN_COMMIT");
  j["commit"] = env_commit && *env_commit ? env_commit : KILN_GIT_COMMIT;
  NvrtcVersion nv = nvrtc_version();
  j["nvrtc"] = fmt::format("{}.{}", nv.major, nv.minor);
  if (auto d = driver(); d.ok()) {
    j["driver"] = fmt::format("{}.{}", (*d)->driver_version / 1000, (*d)->driver_version % 1000 / 10);
    if (auto info = device_info(0); info.ok()) {
      j["device"] = info->name;
      j["arch"] = info->arch();
      j["sm_count"] = info->sm_count;
    }
  } else {
    j["device"] = "none";
    j["driver"] = d.status().to_string();
  }
  if (const char* kind = std::getenv("KILN_MACHINE"); kind && *kind) j["machine"] = kind;
  return j;
}

std::string Table::str() const {
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < width.size(); ++i) {
      std::string cell = i < r.size() ? r[i] : "";
      s += (i ? "  " : "") + cell + std::string(width[i] - std::min(width[i], cell.size()), ' ');
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = line(header_);
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  out += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
  for (const auto& r : rows_) out += line(r);
  return out;
}

bool write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace kiln::bench
