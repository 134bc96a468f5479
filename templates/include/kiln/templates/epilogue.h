// Epilogues: what a GEMM (or the split-K reduction) applies to each fp32 accumulator before storing it.
//
// An EpilogueSpec is an ordered composition of ops applied left to right, then a cast to the output dtype.
// render_epilogue() turns it into a device-code snippet, passed to a template as a `code` parameter (its tag,
// e.g. "bias_gelu", names it in configuration names). The snippet needs "common/kiln_device.cuh" and
// "kiln/templates/kernel_args.h" to be included before it, and defines:
//
//   typedef <out C++ type> kiln_epilogue_out_t;
//   // v: the fp32 accumulator of output element (row, col); ep: the kernel's KilnEpilogueArgs.
//   __device__ __forceinline__ float kiln_epilogue(float v, int row, int col, const KilnEpilogueArgs& ep);
//   __device__ __forceinline__ kiln_epilogue_out_t kiln_epilogue_cast(float v);
//   #define KILN_EPILOGUE_USES_ROW_COL 0/1   // 0: the ops ignore row and col (no bias/residual)
//
// A store path does `out[i] = kiln_epilogue_cast(kiln_epilogue(acc, row, col, ep))`; with split-K the
// GEMM writes raw fp32 partials and the reduction applies the epilogue once, after summing.
#pragma once

#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/templates/template.h"

namespace kiln::templates {

enum class EpilogueOp : uint8_t {
  kScale,     // v *= ep.alpha
  kBias,      // v += bias[col]           (bias dtype: EpilogueSpec::bias_dtype)
  kResidual,  // v += ep.beta * residual[row * ep.ld_residual + col]   (residual dtype: residual_dtype)
  kRelu,      // v = max(v, 0)
  kGelu,      // gelu, tanh approximation: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
  kSilu,      // v / (1 + exp(-v))
};
/// "scale", "bias", "residual", "relu", "gelu", "silu".
std::string_view op_name(EpilogueOp op);

struct EpilogueSpec {
  std::vector<EpilogueOp> ops;         // applied in order; empty: the identity
  DType out = DType::kBF16;            // the output cast
  DType bias_dtype = DType::kBF16;     // used when ops has kBias
  DType residual_dtype = DType::kBF16; // used when ops has kResidual

  /// The ops joined by '_' ("bias_gelu"; "none" for no ops), plus "_<out>"; stable, used in names.
  std::string tag() const;
  bool has(EpilogueOp op) const;
  bool operator==(const EpilogueSpec&) const = default;
};

/// Parses "bias+gelu", "bias,gelu" or "bias_gelu" (op names in order; "" or "none": no ops) with the output
/// dtype given. kInvalidArgument naming an unknown op.
Result<EpilogueSpec> parse_epilogue(std::string_view ops, DType out);

/// The snippet for `spec` (see above). Deterministic.
std::string render_epilogue(const EpilogueSpec& spec);
/// The snippet as a template parameter value: Value::code(render_epilogue(spec), spec.tag()).
Value epilogue_value(const EpilogueSpec& spec);

/// Epilogue samples for grids, all with output `out`: none (cast only), bias+gelu, scale+bias+relu,
/// bias+silu+residual.
std::vector<Value> epilogue_samples(DType out);

}  // namespace kiln::templates
