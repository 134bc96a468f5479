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
//
// Checked before use: the file's size (16 MiB, $KILN_MAX_WORKLOAD_BYTES), every field's type, sizes from 1 to
// 2^31 - 1 with at most 2^40 elements in any operand, eps in (0, 1), a finite scale, and the number of problems
// the lists expand to (100000, $KILN_MAX_WORKLOAD_PROBLEMS), counted before anything is expanded.
#pragma once

#include <string>
#include <vector>

#include "kiln/input.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

inline constexpr InputLimit kWorkloadBytesLimit{"workload file", "KILN_MAX_WORKLOAD_BYTES", 16ull << 20};
inline constexpr InputLimit kWorkloadProblemsLimit{"problems per workload", "KILN_MAX_WORKLOAD_PROBLEMS", 100000};
/// The largest size of any dimension, and of any operand (elements), a workload may name.
inline constexpr int64_t kMaxWorkloadDim = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxWorkloadElements = int64_t{1} << 40;

struct Workload {
  std::string name;
  std::vector<std::string> labels;  // per problem: the entry's "name" (or its op) for reports
  std::vector<Problem> problems;
};

/// Parses a workload from JSON text. kInvalidArgument naming the entry and field that is wrong; kOutOfRange
/// when it expands to more problems than kWorkloadProblemsLimit allows.
Result<Workload> parse_workload(const std::string& json_text);
/// Reads and parses a workload file. kNotFound / kIoError / kOutOfRange (over kWorkloadBytesLimit) for the
/// file, then as parse_workload; every error names the file.
Result<Workload> load_workload(const std::string& path);

/// One problem as a workload entry (single sizes): what isolation workers and reports exchange.
std::string problem_to_json(const Problem& problem);
Result<Problem> problem_from_json(const std::string& json_text);

}  // namespace kiln::runtime
