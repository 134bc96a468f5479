// Internals shared by the choice kinds and the built-in ops.
#pragma once

#include <memory>
#include <string>

#include "cublas_gemm.h"
#include "kiln/pool/future.h"
#include "kiln/runtime/choice.h"

namespace kiln::runtime::detail {

/// The one place the runtime calls the pool's precompile gate.
Future<Binary> gate_compile(PrecompileGate& gate, CompileRequest request, Priority priority);

/// The sizes of a call's arguments as templates see them; kInvalidArgument for custom arguments.
Result<templates::Shape> shape_of(const OpArgs& args);

/// cuBLAS's default GEMM (cublasGemmEx), plain D = AB: "cublas_default". For problems without an epilogue.
ChoicePtr make_cublas_default_choice(const GemmProblem& p);

/// One cuBLASLt algorithm, with the problem's epilogue fused (`fuse`) or a plain GEMM into `plain_out`.
/// prepare() rebuilds the algorithm from its name, so a decision cached by another process runs as measured.
ChoicePtr make_cublaslt_choice(const GemmProblem& p, bool fuse, DType plain_out, std::string algo_name);

/// An unfused pair: `gemm` (an extern choice computing a plain D into an fp32 intermediate) followed by the
/// "splitk_reduce" template with one slice applying the problem's epilogue. Named "unfused_<gemm>_<reduce>".
Result<ChoicePtr> make_unfused_choice(const GemmProblem& p, ChoicePtr plain_gemm, const Target& target);

}  // namespace kiln::runtime::detail
