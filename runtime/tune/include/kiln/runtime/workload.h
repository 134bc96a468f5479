// Workload files: the problems a serving engine will run, for `kiln tune` and `kiln precompile`.
//
//   {"name": "llama3-8b",
//    "problems": [
//      {"op": "gemm", "name": "qkv", "m": [1, 16, 64], "n": 6144, "k": 4096, "dtype": "bf16",
//       "layout_a": "row", "layout_b": "row", "epilogue": "bias+gelu", "out": "bf16"},
//      {"op": "rmsnorm", "rows": [1, 16], "cols": 4096, "dtype": "bf16", "residual": true, "eps": 1e-5},
//      {"op": "layernorm", "rows": 64, "cols": 4096, "bias": true},
//      {"op": "softmax", "rows": [1, 16], "cols": 128256, "scale": 1.0}]}
//
// Any size may be a list: an entry stands for every combination of its lists. Defaults: dtype bf16, layouts
// row, no epilogue, out = dtype, residual/bias false, eps 1e-6, scale 1.
#pragma once

#include <string>
#include <vector>

#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

struct Workload {
  std::string name;
  std::vector<std::string> labels;  // per problem: the entry's "name" (or its op) for reports
  std::vector<Problem> problems;
};

/// Parses a workload from JSON text. kInvalidArgument naming the entry and field that is wrong.
Result<Workload> parse_workload(const std::string& json_text);
/// Reads and parses a workload file. kNotFound / kIoError for the file, then as parse_workload.
Result<Workload> load_workload(const std::string& path);

/// One problem as a workload entry (single sizes): what isolation workers and reports exchange.
std::string problem_to_json(const Problem& problem);
Result<Problem> problem_from_json(const std::string& json_text);

}  // namespace kiln::runtime
