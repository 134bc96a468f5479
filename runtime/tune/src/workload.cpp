#include "kiln/runtime/workload.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::runtime {
namespace {

using json = nlohmann::json;

Status bad(const std::string& where, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("workload {}: {}", where, what));
}

Result<std::vector<int64_t>> sizes(const json& e, const char* field, const std::string& where, bool required,
                                   int64_t fallback = 0) {
  if (!e.contains(field)) {
    if (required) return bad(where, fmt::format("missing \"{}\"", field));
    return std::vector<int64_t>{fallback};
  }
  const json& v = e[field];
  std::vector<int64_t> out;
  // An unsigned value past int64's range would wrap to a negative one on conversion: clamp it instead.
  auto value = [](const json& x) {
    return x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : x.get<int64_t>();
  };
  if (v.is_number_integer()) out.push_back(value(v));
  else if (v.is_array()) {
    for (const auto& x : v) {
      if (!x.is_number_integer()) return bad(where, fmt::format("\"{}\" must hold integers", field));
      out.push_back(value(x));
    }
  } else {
    return bad(where, fmt::format("\"{}\" must be an integer or a list of integers", field));
  }
  if (out.empty()) return bad(where, fmt::format("\"{}\" is an empty list", field));
  for (int64_t s : out) {
    if (s <= 0 || s > kMaxWorkloadDim) {
      return bad(where, fmt::format("\"{}\" has {} (sizes are from 1 to {})", field, s, kMaxWorkloadDim));
    }
  }
  return out;
}

Result<DType> dtype_field(const json& e, const char* field, DType fallback, const std::string& where) {
  if (!e.contains(field)) return fallback;
  if (!e[field].is_string()) return bad(where, fmt::format("\"{}\" must be a dtype name", field));
  auto t = templates::parse_dtype(e[field].get<std::string>());
  if (!t.ok()) return bad(where, t.status().message());
  return *t;
}

Result<Layout> layout_field(const json& e, const char* field, const std::string& where) {
  if (!e.contains(field)) return Layout::kRowMajor;
  std::string s = e[field].is_string() ? e[field].get<std::string>() : "";
  if (s == "row") return Layout::kRowMajor;
  if (s == "col") return Layout::kColMajor;
  return bad(where, fmt::format("\"{}\" must be \"row\" or \"col\"", field));
}

template <class T>
Result<T> scalar(const json& e, const char* field, T fallback, const std::string& where) {
  if (!e.contains(field)) return fallback;
  const json& v = e[field];
  if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
    return bad(where, fmt::format("\"{}\" must be a string", field));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    return bad(where, fmt::format("\"{}\" must be true or false", field));
  } else {
    static_assert(std::is_same_v<T, double>, "numbers are read as double, then range-checked");
    if (!v.is_number()) return bad(where, fmt::format("\"{}\" must be a number", field));
    return v.get<double>();
  }
}

// A float field that must lie in (lo, hi), exclusive. The range is checked again after rounding to float: a
// value just inside it can round onto its edge (0.99999999 to 1, 1e-50 to 0), and the float is what a problem
// keeps and what problem_to_json writes back, so the check must hold for it or the written problem would not
// read again.
Result<float> number_in(const json& e, const char* field, float fallback, double lo, double hi,
                        const std::string& where) {
  KILN_ASSIGN_OR_RETURN(double v, scalar<double>(e, field, fallback, where));
  auto refuse = [&](double shown, const char* note) {
    return bad(where, fmt::format("\"{}\" is {}{} (must be between {} and {})", field, shown, note, lo, hi));
  };
  if (!(v > lo && v < hi)) return refuse(v, "");
  const float f = static_cast<float>(v);
  if (!(f > lo && f < hi)) return refuse(f, " as a float");
  return f;
}

// How many problems an entry's lists expand to, and whether an operand of r x c elements is too large.
uint64_t combinations(std::initializer_list<const std::vector<int64_t>*> lists) {
  uint64_t n = 1;
  for (const auto* l : lists) n = n > UINT64_MAX / l->size() ? UINT64_MAX : n * l->size();
  return n;
}

Status check_elements(const std::vector<int64_t>& rows, const std::vector<int64_t>& cols, const char* what,
                      const std::string& where) {
  const int64_t r = *std::max_element(rows.begin(), rows.end()), c = *std::max_element(cols.begin(), cols.end());
  if (r > kMaxWorkloadElements / c) {
    return bad(where, fmt::format("{} of {} x {} elements is larger than the limit of {}", what, r, c, kMaxWorkloadElements));
  }
  return Status();
}

// Expansion stops before it starts when an entry would pass the limit: a few lists of a thousand sizes each
// must not take the machine's memory.
Status reserve(Workload& out, uint64_t more, uint64_t limit, const std::string& where) {
  if (more > limit || out.problems.size() + more > limit) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("workload {}: expands to {}{} problems, more than the limit of {} (raise it with ${})",
                                  where, more == UINT64_MAX ? "over " : "", more == UINT64_MAX ? UINT64_MAX : more, limit,
                                  kWorkloadProblemsLimit.env));
  }
  out.problems.reserve(out.problems.size() + more);
  out.labels.reserve(out.labels.size() + more);
  return Status();
}

// A row op's problems: `p` at every rows x cols combination, each labelled `label`.
template <class RowProblem>
void add_row_problems(RowProblem p, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                      Problem (*make)(RowProblem), const std::string& label, Workload& out) {
  for (int64_t r : rows)
    for (int64_t c : cols) {
      p.rows = r, p.cols = c;
      out.problems.push_back(make(p));
      out.labels.push_back(label);
    }
}

Status expand(const json& e, const std::string& where, uint64_t limit, Workload& out) {
  if (!e.is_object() || !e.contains("op") || !e["op"].is_string()) return bad(where, "an entry needs an \"op\" string");
  const std::string op = e["op"].get<std::string>();
  const std::string label = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : op;
  KILN_ASSIGN_OR_RETURN(DType dtype, dtype_field(e, "dtype", DType::kBF16, where));
  if (op == "gemm") {
    KILN_ASSIGN_OR_RETURN(auto ms, sizes(e, "m", where, true));
    KILN_ASSIGN_OR_RETURN(auto ns, sizes(e, "n", where, true));
    KILN_ASSIGN_OR_RETURN(auto ks, sizes(e, "k", where, true));
    KILN_RETURN_IF_ERROR(check_elements(ms, ks, "operand A", where));
    KILN_RETURN_IF_ERROR(check_elements(ks, ns, "operand B", where));
    KILN_RETURN_IF_ERROR(check_elements(ms, ns, "the output", where));
    KILN_RETURN_IF_ERROR(reserve(out, combinations({&ms, &ns, &ks}), limit, where));
    GemmProblem g;
    g.a = g.b = dtype;
    KILN_ASSIGN_OR_RETURN(g.a_layout, layout_field(e, "layout_a", where));
    KILN_ASSIGN_OR_RETURN(g.b_layout, layout_field(e, "layout_b", where));
    KILN_ASSIGN_OR_RETURN(DType out_dtype, dtype_field(e, "out", dtype, where));
    KILN_ASSIGN_OR_RETURN(std::string ops, scalar<std::string>(e, "epilogue", "", where));
    auto spec = templates::parse_epilogue(ops, out_dtype);
    if (!spec.ok()) return bad(where, spec.status().message());
    g.epilogue = *spec;
    KILN_ASSIGN_OR_RETURN(g.epilogue.bias_dtype, dtype_field(e, "bias_dtype", out_dtype, where));
    KILN_ASSIGN_OR_RETURN(g.epilogue.residual_dtype, dtype_field(e, "residual_dtype", out_dtype, where));
    KILN_ASSIGN_OR_RETURN(g.b_constant, scalar<bool>(e, "b_constant", false, where));
    for (int64_t m : ms)
      for (int64_t n : ns)
        for (int64_t k : ks) {
          g.m = m, g.n = n, g.k = k;
          out.problems.push_back(Problem::gemm(g));
          out.labels.push_back(label);
        }
    return Status();
  }
  if (op == "rmsnorm" || op == "layernorm") {
    KILN_ASSIGN_OR_RETURN(auto rows, sizes(e, "rows", where, true));
    KILN_ASSIGN_OR_RETURN(auto cols, sizes(e, "cols", where, true));
    KILN_RETURN_IF_ERROR(check_elements(rows, cols, "the input", where));
    KILN_RETURN_IF_ERROR(reserve(out, combinations({&rows, &cols}), limit, where));
    NormProblem n;
    n.layernorm = op == "layernorm";
    n.dtype = dtype;
    KILN_ASSIGN_OR_RETURN(n.residual, scalar<bool>(e, "residual", false, where));
    KILN_ASSIGN_OR_RETURN(n.bias, scalar<bool>(e, "bias", false, where));
    KILN_ASSIGN_OR_RETURN(n.eps, number_in(e, "eps", 1e-6f, 0.0, 1.0, where));
    add_row_problems(n, rows, cols, Problem::norm, label, out);
    return Status();
  }
  if (op == "softmax") {
    KILN_ASSIGN_OR_RETURN(auto rows, sizes(e, "rows", where, true));
    KILN_ASSIGN_OR_RETURN(auto cols, sizes(e, "cols", where, true));
    KILN_RETURN_IF_ERROR(check_elements(rows, cols, "the input", where));
    KILN_RETURN_IF_ERROR(reserve(out, combinations({&rows, &cols}), limit, where));
    SoftmaxProblem s;
    s.dtype = dtype;
    KILN_ASSIGN_OR_RETURN(s.scale, number_in(e, "scale", 1.0f, -1e30, 1e30, where));
    add_row_problems(s, rows, cols, Problem::softmax, label, out);
    return Status();
  }
  return bad(where, fmt::format("unknown op \"{}\" (gemm, rmsnorm, layernorm, softmax)", op));
}

}  // namespace

Result<Workload> parse_workload(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("workload: not JSON: {}", e.what()));
  }
  if (!j.is_object() || !j.contains("problems") || !j["problems"].is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "workload: expected {\"problems\": [...]}");
  }
  KILN_ASSIGN_OR_RETURN(uint64_t limit, limit_value(kWorkloadProblemsLimit));
  Workload w;
  w.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : "workload";
  for (size_t i = 0; i < j["problems"].size(); ++i) {
    KILN_RETURN_IF_ERROR(expand(j["problems"][i], fmt::format("entry {}", i), limit, w));
  }
  return w;
}

Result<Workload> load_workload(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file_limited(path, kWorkloadBytesLimit));
  auto w = parse_workload(text);
  if (!w.ok()) return std::move(w).status().with_context(fmt::format("reading {}", path));
  return w;
}

std::string problem_to_json(const Problem& problem) {
  json e;
  e["op"] = problem.op;
  std::visit(
      [&](const auto& d) {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmProblem>) {
          e["m"] = d.m, e["n"] = d.n, e["k"] = d.k;
          e["dtype"] = templates::dtype_name(d.a);
          e["layout_a"] = templates::layout_name(d.a_layout);
          e["layout_b"] = templates::layout_name(d.b_layout);
          std::string ops;
          for (auto op : d.epilogue.ops) ops += (ops.empty() ? "" : "+") + std::string(templates::op_name(op));
          e["epilogue"] = ops;
          e["out"] = templates::dtype_name(d.epilogue.out);
          e["bias_dtype"] = templates::dtype_name(d.epilogue.bias_dtype);
          e["residual_dtype"] = templates::dtype_name(d.epilogue.residual_dtype);
          if (d.b_constant) e["b_constant"] = true;
        } else if constexpr (std::is_same_v<T, NormProblem>) {
          e["rows"] = d.rows, e["cols"] = d.cols;
          e["dtype"] = templates::dtype_name(d.dtype);
          e["residual"] = d.residual, e["bias"] = d.bias, e["eps"] = d.eps;
        } else if constexpr (std::is_same_v<T, SoftmaxProblem>) {
          e["rows"] = d.rows, e["cols"] = d.cols;
          e["dtype"] = templates::dtype_name(d.dtype);
          e["scale"] = d.scale;
        } else {
          e["sizes"] = d.sizes;
          e["attributes"] = d.attributes;
        }
      },
      problem.desc);
  return e.dump();
}

Result<Problem> problem_from_json(const std::string& text) {
  KILN_ASSIGN_OR_RETURN(Workload w, parse_workload("{\"problems\": [" + text + "]}"));
  if (w.problems.size() != 1) return make_error(ErrorCode::kInvalidArgument, "expected exactly one problem");
  return w.problems.front();
}

}  // namespace kiln::runtime
