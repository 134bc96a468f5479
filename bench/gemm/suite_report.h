// The GEMM suite's outputs from its per-shape records (bench_gemm_suite.cpp): the JSON list, a Markdown table
// with the acceptance summary, and an SVG plot of the best kiln template's speed-up over the best of cuBLAS
// and cuBLASLt per shape. Pure (no GPU): the suite's CPU test feeds it records.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "suite_shapes.h"

namespace kiln::bench::suite {

/// The shape's identity fields of a record: m, n, k, dtype, layout_b ("row"/"col"), model, layer, id.
nlohmann::json shape_json(const SuiteShape& s);

struct Summary {
  int shapes = 0;          // records
  int measured = 0;        // with both a kiln time and a reference time
  int faster_105 = 0;      // speedup_vs_best_reference >= 1.05
  int within_105 = 0;      // speedup_vs_best_reference >= 1 / 1.05
  double square_vs_cublas = 0;  // 4096^3 bf16 (B col-major): cuBLAS time / kiln time; 0 when not measured
  double geomean = 0;      // geometric mean of the speed-ups measured
  // The same kernels launched without programmatic dependent launch (kiln_template_no_pdl_us), where measured.
  int measured_no_pdl = 0;
  int faster_105_no_pdl = 0;
  int within_105_no_pdl = 0;
};
Summary summarize(const std::vector<nlohmann::json>& records);
/// The summary as lines of text, with the acceptance thresholds (25% >= 1.05x, 80% within 1.05x,
/// 4096^3 >= 0.95x of cuBLAS) marked met or not.
std::string summary_text(const Summary& s);

/// The Markdown report: summary, then one row per shape.
std::string markdown(const std::vector<nlohmann::json>& records, const nlohmann::json& env);
/// The speed-up plot: one bar per measured shape (log scale, 1.0 and 1.05 marked), shapes in suite order.
std::string svg(const std::vector<nlohmann::json>& records);

/// Writes PREFIX.json (the records: a list), PREFIX.meta.json (env + summary), PREFIX.md and PREFIX.svg.
/// False (after printing why) when a file cannot be written.
bool write_outputs(const std::string& prefix, const std::vector<nlohmann::json>& records, const nlohmann::json& env);

}  // namespace kiln::bench::suite
