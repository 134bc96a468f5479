// Epilogue specs rendered into device snippets (see kiln/templates/epilogue.h).
#include "kiln/templates/epilogue.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln::templates {

std::string_view op_name(EpilogueOp op) {
  switch (op) {
    case EpilogueOp::kScale: return "scale";
    case EpilogueOp::kBias: return "bias";
    case EpilogueOp::kResidual: return "residual";
    case EpilogueOp::kRelu: return "relu";
    case EpilogueOp::kGelu: return "gelu";
    case EpilogueOp::kSilu: return "silu";
  }
  return "?";
}

bool EpilogueSpec::has(EpilogueOp op) const { return std::find(ops.begin(), ops.end(), op) != ops.end(); }

std::string EpilogueSpec::tag() const {
  std::string t;
  for (EpilogueOp op : ops) {
    if (!t.empty()) t += '_';
    t += op_name(op);
    // Tensor operands whose dtype differs from the output are named, so that two specs never share a tag.
    if (op == EpilogueOp::kBias && bias_dtype != out) t += dtype_name(bias_dtype);
    if (op == EpilogueOp::kResidual && residual_dtype != out) t += dtype_name(residual_dtype);
  }
  if (t.empty()) t = "none";
  return t + "_" + std::string(dtype_name(out));
}

Result<EpilogueSpec> parse_epilogue(std::string_view text, DType out) {
  EpilogueSpec spec;
  spec.out = spec.bias_dtype = spec.residual_dtype = out;
  if (text.empty() || text == "none") return spec;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find_first_of("+,_", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view name = text.substr(pos, end - pos);
    bool found = false;
    for (EpilogueOp op : {EpilogueOp::kScale, EpilogueOp::kBias, EpilogueOp::kResidual, EpilogueOp::kRelu,
                          EpilogueOp::kGelu, EpilogueOp::kSilu}) {
      if (name == op_name(op)) {
        spec.ops.push_back(op);
        found = true;
      }
    }
    if (!found) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("unknown epilogue op '{}' in '{}' (scale, bias, residual, relu, gelu, silu)", name, text));
    }
    pos = end + 1;
  }
  return spec;
}

std::string render_epilogue(const EpilogueSpec& spec) {
  std::string body;
  std::string desc;
  bool uses_rc = false;
  for (EpilogueOp op : spec.ops) {
    desc += (desc.empty() ? "" : " -> ") + std::string(op_name(op));
    switch (op) {
      case EpilogueOp::kScale: body += "  v *= ep.alpha;\n"; break;
      case EpilogueOp::kBias:
        body += fmt::format("  v += kiln_to_f32(static_cast<const {}*>(ep.bias)[col]);\n", dtype_cpp(spec.bias_dtype));
        uses_rc = true;
        break;
      case EpilogueOp::kResidual:
        body += fmt::format(
            "  v += ep.beta * kiln_to_f32(static_cast<const {}*>(ep.residual)[(long long)row * ep.ld_residual + col]);\n",
            dtype_cpp(spec.residual_dtype));
        uses_rc = true;
        break;
      case EpilogueOp::kRelu: body += "  v = kiln_relu(v);\n"; break;
      case EpilogueOp::kGelu: body += "  v = kiln_gelu_tanh(v);\n"; break;
      case EpilogueOp::kSilu: body += "  v = kiln_silu(v);\n"; break;
    }
  }
  if (desc.empty()) desc = "identity";
  return fmt::format(
      "// kiln epilogue '{tag}': {desc}, then cast to {out}\n"
      "typedef {cpp} kiln_epilogue_out_t;\n"
      "#define KILN_EPILOGUE_USES_ROW_COL {rc}\n"
      "__device__ __forceinline__ float kiln_epilogue(float v, int row, int col, const KilnEpilogueArgs& ep) {{\n"
      "  (void)row; (void)col; (void)ep;\n"
      "{body}"
      "  return v;\n"
      "}}\n"
      "__device__ __forceinline__ kiln_epilogue_out_t kiln_epilogue_cast(float v) {{\n"
      "  return kiln_from_f32<kiln_epilogue_out_t>(v);\n"
      "}}\n",
      fmt::arg("tag", spec.tag()), fmt::arg("desc", desc), fmt::arg("out", dtype_name(spec.out)),
      fmt::arg("cpp", dtype_cpp(spec.out)), fmt::arg("rc", uses_rc ? 1 : 0), fmt::arg("body", body));
}

Value epilogue_value(const EpilogueSpec& spec) { return Value::code(render_epilogue(spec), spec.tag()); }

std::vector<Value> epilogue_samples(DType out) {
  using Op = EpilogueOp;
  std::vector<std::vector<Op>> compositions = {
      {}, {Op::kBias, Op::kGelu}, {Op::kScale, Op::kBias, Op::kRelu}, {Op::kBias, Op::kSilu, Op::kResidual}};
  std::vector<Value> out_values;
  for (auto& ops : compositions) {
    EpilogueSpec s;
    s.ops = ops;
    s.out = s.bias_dtype = s.residual_dtype = out;
    out_values.push_back(epilogue_value(s));
  }
  return out_values;
}

}  // namespace kiln::templates
