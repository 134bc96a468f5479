// cuBLASLt as kiln's extern GEMM: the algorithms its heuristic returns for a problem, each with a stable name
// from which it can be rebuilt in another process (cublasLtMatmulAlgoInit + its config attributes), and the
// call itself for kiln's row-major GemmArgs, with the epilogues cuBLASLt can fuse.
#pragma once

#include <cublasLt.h>
#include <cuda.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln {
/// KILN_CHECK support for cuBLAS results.
Status to_status(cublasStatus_t result, const char* expr, const char* file, int line);
}  // namespace kiln

namespace kiln::runtime::detail {

/// cuBLASLt's version as "130100", for cache keys.
std::string cublas_version();

/// The handle and workspace cuBLASLt uses in the current context: created on first use in each context and
/// kept for the life of the process (creating a handle costs milliseconds). Thread-safe.
struct LtContext {
  cublasLtHandle_t handle = nullptr;
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = 0;
};
Result<const LtContext*> lt_context();
/// Whether the current context's handle exists now. Never blocks: false while one is being made.
bool lt_context_ready();
/// Starts making the current context's handle on a background thread and returns at once (nothing when it
/// exists or is being made). cuBLASLt's first handle costs ~70 ms (measured on an H200: the library's own
/// start-up), which a warm start must not wait for; lt_context() waits for it. `with_cublas`: the cuBLAS
/// handle too (cublas_ready()), which the default-GEMM choice needs.
void start_lt_context(bool with_cublas = false);
/// Runs `task` on the thread start_lt_context() uses, in the current context, after what it has queued
/// already (the handles first): start-up work that must not hold up a warm start. Nothing without a context.
void run_in_lt_start(std::function<void()> task);

/// One cuBLASLt algorithm for a problem.
struct LtAlgo {
  std::string name;            // "cublaslt_a21_t20_s8_k1_r0_w0_c0_i0_cl0"
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
};

/// How a GemmProblem's epilogue maps onto cuBLASLt: fused (D = act(alpha·AB + beta·C + bias)) or not at all.
struct LtEpilogue {
  bool fusable = false;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool scale = false;     // alpha from the args
  bool residual = false;  // C = residual with beta from the args
  std::string why_not;    // when not fusable
};
LtEpilogue lt_epilogue(const GemmProblem& p);

/// A GEMM problem bound to cuBLASLt: its descriptors are built once; run() refreshes only what a call
/// changes (sizes, leading dimensions, the bias pointer). With `fuse` and a fusable epilogue, D = epilogue(AB)
/// in the problem's output dtype; otherwise D = AB plainly in dtype `plain_out`.
class LtGemm {
 public:
  /// Errors: kFailedPrecondition without a current context, kLibraryError from cuBLASLt.
  static Result<std::unique_ptr<LtGemm>> create(const GemmProblem& p, bool fuse, DType plain_out);
  ~LtGemm();

  bool fused() const { return fused_; }
  /// Up to `max_algos` algorithms the heuristic proposes for the problem's own sizes, first = its favourite.
  /// kUnimplemented when it proposes none (e.g. an unsupported dtype or epilogue combination).
  Result<std::vector<LtAlgo>> algorithms(int max_algos) const;
  /// Rebuilds the algorithm named `name` (as LtAlgo::name). kInvalidArgument for a malformed name, kNotFound
  /// when cuBLASLt refuses it for this problem.
  Result<LtAlgo> algorithm(const std::string& name) const;
  /// Runs with `algo` (nullptr: cuBLASLt's heuristic favourite) on kiln's row-major args. Thread-safe (calls
  /// are serialised: the descriptors are shared).
  Status run(const LtAlgo* algo, const KilnGemmArgs& args, CUstream stream) const;

 private:
  struct State;
  LtGemm(std::unique_ptr<State> s, bool fused);
  std::unique_ptr<State> state_;
  bool fused_;
};

/// Makes sure cuBLAS's handle for the current context exists (creating one costs milliseconds).
Status cublas_ready();
/// Whether it exists now. Never blocks: false while one is being made or used.
bool cublas_handle_ready();

/// cuBLAS's default GEMM (cublasGemmEx, CUBLAS_GEMM_DEFAULT: what torch.mm calls), plain D = AB into `out`.
Status cublas_default_gemm(const GemmProblem& p, DType out, const KilnGemmArgs& args, CUstream stream);

}  // namespace kiln::runtime::detail
