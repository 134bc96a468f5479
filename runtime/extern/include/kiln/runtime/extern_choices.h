// Choices backed by vendor libraries (cuBLAS and cuBLASLt) for GEMM problems. The built-in GEMM op
// (runtime/builtin) offers them beside kiln's templates, and uses cuBLAS's default GEMM as the reference every
// other choice is checked against; an application's own op may offer them too. None needs a compile.
#pragma once

#include <string>
#include <vector>

#include "kiln/runtime/choice.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

/// cuBLAS's default GEMM (cublasGemmEx, CUBLAS_GEMM_DEFAULT: what torch.mm calls), plain D = AB in the
/// problem's output dtype: "cublas_default". For problems without an epilogue.
ChoicePtr make_cublas_default_choice(const GemmProblem& p);

/// The same computing a plain fp32 D: the first half of an unfused reference pair.
ChoicePtr make_cublas_default_choice_f32(const GemmProblem& p);

/// One cuBLASLt algorithm, named as cublaslt_algorithms() names it, with the problem's epilogue fused (`fuse`)
/// or a plain GEMM into `plain_out`. prepare() rebuilds the algorithm from its name, so a decision cached by
/// another process runs as measured.
ChoicePtr make_cublaslt_choice(const GemmProblem& p, bool fuse, DType plain_out, std::string algo_name);

/// The names of up to `max_algos` algorithms cuBLASLt's heuristic proposes for `p` (its favourite first), for
/// the epilogue fused (`fuse`) or a plain GEMM into `plain_out`. Needs a current context. kUnimplemented when
/// it proposes none.
Result<std::vector<std::string>> cublaslt_algorithms(const GemmProblem& p, bool fuse, DType plain_out, int max_algos);

/// Whether cuBLASLt can fuse `p`'s epilogue (bias, relu/gelu, scale, residual); `why_not` says why not.
bool cublaslt_can_fuse(const GemmProblem& p, std::string* why_not = nullptr);

/// An unfused pair: `plain_gemm` (an extern choice computing a plain fp32 D) followed by the "splitk_reduce"
/// template with one slice applying the problem's epilogue. Named "unfused_<gemm>_<reduce>".
Result<ChoicePtr> make_unfused_choice(const GemmProblem& p, ChoicePtr plain_gemm, const Target& target);

/// cuBLASLt's version as "130100": part of every cache key, since its algorithms change with it.
std::string cublas_version();

}  // namespace kiln::runtime
