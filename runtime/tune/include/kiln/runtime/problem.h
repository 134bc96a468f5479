// Problem: what the autotuner is asked to solve — an op with its shapes, dtypes, layouts and epilogue.
//
// Built-in ops have a typed description (GemmProblem, NormProblem, SoftmaxProblem); an op a user registers
// describes itself with a CustomProblem. Every problem has a canonical cache key (cache::ProblemKey) that names
// everything that can change which choice is fastest, and the buffers its choices run on (OpArgs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "kiln/cache/problem_key.h"
#include "kiln/status.h"
#include "kiln/templates/epilogue.h"
#include "kiln/templates/kernel_args.h"
#include "kiln/templates/template.h"

namespace kiln::runtime {

using templates::DType;
using templates::EpilogueSpec;
using templates::Layout;

/// D[M,N] = epilogue(A[M,K] . B[K,N]); A and B in their layouts, fp32 accumulation.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  DType a = DType::kBF16;
  DType b = DType::kBF16;
  Layout a_layout = Layout::kRowMajor;
  Layout b_layout = Layout::kRowMajor;
  EpilogueSpec epilogue;  // epilogue.out is D's dtype
  /// The caller's promise that B (typically a weight) is not written by the kernel before this one on the stream:
  /// the tune then also tries decode configurations that request B's first stages before waiting for that kernel
  /// (`early`), and runs every choice with KILN_GEMM_B_CONSTANT in KilnGemmArgs::flags. A call for such a problem
  /// must set that flag itself when it builds its own arguments (the C API and Python ops do).
  bool b_constant = false;

  bool operator==(const GemmProblem&) const = default;
};

/// RMSNorm or LayerNorm over each row of x[rows, cols] (see KilnNormArgs for the exact function).
struct NormProblem {
  bool layernorm = false;  // false: RMSNorm
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kBF16;
  bool residual = false;   // h = x + residual, also written to residual_out
  bool bias = false;       // LayerNorm only
  float eps = 1e-6f;

  bool operator==(const NormProblem&) const = default;
};

/// y = softmax(scale * x) over each row of x[rows, cols].
struct SoftmaxProblem {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kBF16;
  float scale = 1.0f;

  bool operator==(const SoftmaxProblem&) const = default;
};

/// A user-registered op: its own name, sizes and attributes (all part of the cache key).
struct CustomProblem {
  std::vector<int64_t> sizes;
  std::map<std::string, std::string> attributes;

  bool operator==(const CustomProblem&) const = default;
};

using ProblemDesc = std::variant<GemmProblem, NormProblem, SoftmaxProblem, CustomProblem>;

struct Problem {
  std::string op;    // "gemm", "rmsnorm", "layernorm", "softmax", or a registered op's name
  ProblemDesc desc;

  static Problem gemm(GemmProblem p) { return Problem{"gemm", p}; }
  static Problem norm(NormProblem p) { return Problem{p.layernorm ? "layernorm" : "rmsnorm", p}; }
  static Problem softmax(SoftmaxProblem p) { return Problem{"softmax", p}; }
  static Problem custom(std::string op, CustomProblem p) { return Problem{std::move(op), std::move(p)}; }

  /// "gemm 16x4096x4096 bf16·bf16→bf16 row·row +bias_gelu": for logs and reports.
  std::string describe() const;
  /// The size a deferred selection dispatches on: M for GEMM, rows for norms and softmax, sizes[0] for
  /// custom ops.
  int64_t dynamic_size() const;
  /// This problem with its dynamic size replaced by `size` (a size hint).
  Problem with_dynamic_size(int64_t size) const;
  /// kInvalidArgument naming the field when a size is not positive or does not fit a 32-bit kernel index.
  Status validate() const;

  /// The templates' view of the sizes.
  templates::Shape shape() const;
  /// The cache key on `device` with `versions` (the runtime fills in cuBLAS's version).
  cache::ProblemKey key(const cache::DeviceFingerprint& device, const cache::VersionStamp& versions) const;

  bool operator==(const Problem&) const = default;
};

/// The buffers one call of an op runs on: the family's kernel-argument struct (kiln/templates/kernel_args.h),
/// or for custom ops the raw kernel argument pointers.
struct CustomArgs {
  std::vector<CUdeviceptr> buffers;
  std::vector<int64_t> sizes;
  /// Variant ops (kiln/runtime/variants.h): the kernel's parameters as cuLaunchKernel takes them.
  void** params = nullptr;
};
using OpArgs = std::variant<KilnGemmArgs, KilnNormArgs, KilnSoftmaxArgs, CustomArgs>;

/// The size of the dynamic dimension in a call's arguments (the one Problem::dynamic_size names).
int64_t dynamic_size_of(const OpArgs& args);

}  // namespace kiln::runtime
