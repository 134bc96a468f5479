#include "suite_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

namespace kiln::bench::suite {

using nlohmann::json;

json shape_json(const SuiteShape& s) {
  return {{"m", s.m},
          {"n", s.n},
          {"k", s.k},
          {"dtype", std::string(templates::dtype_name(s.dtype))},
          {"layout_b", s.layout_b == templates::Layout::kColMajor ? "col" : "row"},
          {"model", s.model},
          {"layer", s.layer},
          {"id", s.id()}};
}

namespace {

double number(const json& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->is_number() ? it->get<double>() : 0.0;
}
long long integer(const json& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->is_number_integer() ? it->get<long long>() : 0;
}
std::string text(const json& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->is_string() ? it->get<std::string>() : "";
}
std::string pct(int a, int b) { return b ? fmt::format("{:.0f}%", 100.0 * a / b) : "-"; }

}  // namespace

Summary summarize(const std::vector<json>& records) {
  Summary s;
  double log_sum = 0;
  for (const json& r : records) {
    ++s.shapes;
    const double x = number(r, "speedup_vs_best_reference");
    if (x <= 0) continue;
    ++s.measured;
    log_sum += std::log(x);
    if (x >= 1.05) ++s.faster_105;
    if (x >= 1 / 1.05) ++s.within_105;
    if (const double plain = number(r, "kiln_template_no_pdl_us"); plain > 0 && number(r, "best_reference_us") > 0) {
      const double y = number(r, "best_reference_us") / plain;
      ++s.measured_no_pdl;
      if (y >= 1.05) ++s.faster_105_no_pdl;
      if (y >= 1 / 1.05) ++s.within_105_no_pdl;
    }
    if (integer(r, "m") == 4096 && integer(r, "n") == 4096 && integer(r, "k") == 4096 && text(r, "dtype") == "bf16" &&
        text(r, "layout_b") == "col") {
      s.square_vs_cublas = number(r, "speedup_vs_cublas");
    }
  }
  if (s.measured) s.geomean = std::exp(log_sum / s.measured);
  return s;
}

std::string summary_text(const Summary& s) {
  auto met = [](bool ok) { return ok ? "met" : "NOT met"; };
  std::string out;
  out += fmt::format("shapes: {} ({} measured against cuBLAS/cuBLASLt)\n", s.shapes, s.measured);
  out += fmt::format("kiln >= 1.05x faster than the best of cuBLAS and cuBLASLt: {} of {} ({}; target >= 25%: {})\n",
                     s.faster_105, s.shapes, pct(s.faster_105, s.shapes), met(s.shapes && s.faster_105 * 4 >= s.shapes));
  out += fmt::format("kiln within 1.05x (speed-up >= 0.952): {} of {} ({}; target >= 80%: {})\n", s.within_105,
                     s.shapes, pct(s.within_105, s.shapes), met(s.shapes && s.within_105 * 5 >= s.shapes * 4));
  out += fmt::format("4096^3 bf16: kiln at {:.3f}x of cuBLAS (target >= 0.95: {})\n", s.square_vs_cublas,
                     met(s.square_vs_cublas >= 0.95));
  out += fmt::format("geometric mean speed-up over the measured shapes: {:.3f}\n", s.geomean);
  if (s.measured_no_pdl) {
    out += fmt::format("the same kernels without programmatic dependent launch ({} shapes): >= 1.05x on {} ({}), "
                       "within 1.05x on {} ({})\n",
                       s.measured_no_pdl, s.faster_105_no_pdl, pct(s.faster_105_no_pdl, s.shapes),
                       s.within_105_no_pdl, pct(s.within_105_no_pdl, s.shapes));
  }
  return out;
}

std::string markdown(const std::vector<json>& records, const json& env) {
  std::string out = "# kiln GEMM templates vs cuBLAS / cuBLASLt: the public GEMM suite\n\n";
  out += fmt::format("Device: {} ({}), driver {}, NVRTC {}, kiln commit {}, {}.\n\n", env.value("device", "?"),
                     env.value("arch", "?"), env.value("driver", "?"), env.value("nvrtc", "?"), env.value("commit", "?"),
                     env.value("date", "?"));
  out += "Times are GPU microseconds per GEMM (CUDA graphs of many launches, inputs rotated past L2), from the final "
         "interleaved round; cuBLASLt is its fastest correct heuristic algorithm; kiln is the fastest correct "
         "configuration of its template families; speed-up = best of cuBLAS and cuBLASLt / kiln.\n\n";
  out += "```\n" + summary_text(summarize(records)) + "```\n\n";
  out += "kiln launches its Hopper kernels with programmatic dependent launch (each waits for the previous kernel before "
         "touching memory, so its launch and prologue overlap the previous kernel's tail; configurations named `_ts`/`_tt` "
         "let the next kernel launch at their start or after their last load, and `_e<n>` ones load the weights of their "
         "first n stages before the wait, which the suite allows since it never writes B); 'kiln no PDL' is the same "
         "kernel launched without it, in the same interleaved round.\n\n";
  out += "| # | model | layer | M | N | K | dtype | B | cuBLAS us | cuBLASLt us | kiln us | kiln no PDL us | kiln config | "
         "speed-up |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const json& r : records) {
    auto us = [&](const char* key) {
      const double v = number(r, key);
      return v > 0 ? fmt::format("{:.1f}", v) : "-";
    };
    const double x = number(r, "speedup_vs_best_reference");
    std::string config = text(r, "kiln_template_config");
    if (config.empty()) config = r.contains("error") ? "error: " + r["error"].dump() : "-";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | `{}` | {} |\n",
                       integer(r, "index"), text(r, "model"), text(r, "layer"), integer(r, "m"), integer(r, "n"),
                       integer(r, "k"), text(r, "dtype"), text(r, "layout_b"), us("cublas_us"), us("cublaslt_us"),
                       us("kiln_template_us"), us("kiln_template_no_pdl_us"), config,
                       x > 0 ? fmt::format("{}{:.2f}x{}", x >= 1.05 ? "**" : "", x, x >= 1.05 ? "**" : "") : "-");
  }
  return out;
}

std::string svg(const std::vector<json>& records) {
  std::vector<const json*> rs;
  for (const json& r : records) {
    if (number(r, "speedup_vs_best_reference") > 0) rs.push_back(&r);
  }
  const int bar = 14, left = 60, top = 40, plot_h = 360, label_h = 210;
  const int width = left + 20 + bar * static_cast<int>(std::max<size_t>(rs.size(), 1));
  const int height = top + plot_h + label_h;
  const double lo = std::log2(0.25), hi = std::log2(4.0);
  auto y_of = [&](double x) {
    const double l = std::clamp(std::log2(x), lo, hi);
    return top + plot_h * (hi - l) / (hi - lo);
  };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">best kiln template / best of cuBLAS and cuBLASLt (speed-up, log "
      "scale; green &gt;= 1.05, red &lt; 1/1.05)</text>\n",
      width, height, left);
  for (double g : {0.25, 0.5, 1 / 1.05, 1.0, 1.05, 2.0, 4.0}) {
    const double y = y_of(g);
    const bool main = g == 1.0;
    out += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-dasharray=\"{}\"/>\n",
                       left, width - 10, y, y, main ? "black" : "#bbb", main ? "" : "3,3");
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.2f}</text>\n", left - 4, y + 3, g);
  }
  const double y1 = y_of(1.0);
  for (size_t i = 0; i < rs.size(); ++i) {
    const json& r = *rs[i];
    const double x = number(r, "speedup_vs_best_reference");
    const double y = y_of(x);
    const int bx = left + 4 + bar * static_cast<int>(i);
    const char* color = x >= 1.05 ? "#2a9d4b" : (x >= 1 / 1.05 ? "#999" : "#d0453b");
    out += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"{}\"><title>{} {} {}: "
                       "{:.2f}x ({})</title></rect>\n",
                       bx, std::min(y, y1), bar - 3, std::abs(y - y1), color, text(r, "model"), text(r, "layer"),
                       text(r, "id"), x, text(r, "kiln_template_config"));
    const int lx = bx + bar / 2, ly = top + plot_h + 8;
    out += fmt::format("<text x=\"{}\" y=\"{}\" transform=\"rotate(60 {} {})\" font-size=\"9\">{}x{}x{} {}{}</text>\n",
                       lx, ly, lx, ly, integer(r, "m"), integer(r, "n"), integer(r, "k"), text(r, "dtype"),
                       text(r, "layout_b") == "row" ? " Brow" : "");
  }
  out += "</svg>\n";
  return out;
}

bool write_outputs(const std::string& prefix, const std::vector<json>& records, const json& env) {
  auto write = [](const std::string& path, const std::string& content) {
    std::ofstream f(path);
    f << content;
    if (!f) {
      fmt::print(stderr, "bench_gemm_suite: cannot write {}\n", path);
      return false;
    }
    return true;
  };
  const Summary s = summarize(records);
  json meta = env;
  meta["summary"] = {{"shapes", s.shapes},         {"measured", s.measured},
                     {"faster_105", s.faster_105}, {"within_105", s.within_105},
                     {"square_4096_bf16_vs_cublas", s.square_vs_cublas}, {"geomean_speedup", s.geomean},
                     {"measured_no_pdl", s.measured_no_pdl}, {"faster_105_no_pdl", s.faster_105_no_pdl},
                     {"within_105_no_pdl", s.within_105_no_pdl}};
  bool ok = write(prefix + ".json", json(records).dump(1) + "\n");
  ok &= write(prefix + ".meta.json", meta.dump(1) + "\n");
  ok &= write(prefix + ".md", markdown(records, env));
  ok &= write(prefix + ".svg", svg(records));
  return ok;
}

}  // namespace kiln::bench::suite
