// Planted faults for the isolation tests: a private copy of the gemm op with user choices that fault, hang,
// crash the process that runs them, or compute the wrong thing. The GPU test registers it in the tuning process
// and test_isolation_worker registers the same op before becoming a bench worker, exactly as a program with its
// own ops would (kiln/runtime/isolation.h), so the worker rebuilds the planted choices by name and kernel key.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::runtime::planted {

inline constexpr const char* kOp = "gemm_isolation_planted";

inline UserLaunch elementwise_launch() {
  return [](const Kernel& k, const OpArgs& args, CUstream st) {
    const auto& a = std::get<KilnGemmArgs>(args);
    LaunchConfig cfg;
    cfg.block = {256};
    cfg.grid = {static_cast<unsigned>((a.m * a.n + 255) / 256)};
    cfg.stream = st;
    return k(cfg, a);
  };
}

inline KernelSource user_source(const std::string& name, const std::string& body) {
  KernelSource s;
  s.name = name;
  s.entry = "k";
  s.source = "#include <cuda_bf16.h>\n#include \"kiln/templates/kernel_args.h\"\n"
             "extern \"C\" __global__ void k(const KilnGemmArgs a) {" + body + "}\n";
  s.headers.push_back(kernel_abi_header());
  return s;
}

/// planted_illegal_address writes through a wild pointer, 1 TiB past the output (CUDA_ERROR_ILLEGAL_ADDRESS,
/// which poisons the context that ran it); planted_hang spins forever on a flag it never clears;
/// planted_abort's launch code aborts the process that runs it; planted_wrong_values writes ones.
inline Result<std::vector<ChoicePtr>> choices(const Problem&, const ChoiceContext& ctx) {
  std::vector<ChoicePtr> out;
  out.push_back(make_user_choice(
      "planted_illegal_address",
      user_source("planted_illegal_address",
                  " int* wild = reinterpret_cast<int*>(static_cast<char*>(a.d) + (1ull << 40));"
                  " wild[blockIdx.x * blockDim.x + threadIdx.x] = 1; "),
      ctx.target, elementwise_launch()));
  out.push_back(make_user_choice(
      "planted_hang",
      user_source("planted_hang",
                  " volatile int* flag = static_cast<volatile int*>(a.d);"
                  " if (blockIdx.x == 0 && threadIdx.x == 0) { flag[0] = 1; while (flag[0] != 0) { } } "),
      ctx.target, elementwise_launch()));
  const std::string ones =
      " int i = blockIdx.x * blockDim.x + threadIdx.x;"
      " if (i < a.m * a.n) static_cast<__nv_bfloat16*>(a.d)[i] = __float2bfloat16(1.0f); ";
  out.push_back(make_user_choice("planted_abort", user_source("planted_abort", ones), ctx.target,
                                 [](const Kernel&, const OpArgs&, CUstream) -> Status {
                                   std::fprintf(stderr, "planted_abort: its launch code aborts\n");
                                   std::fflush(stderr);
                                   std::abort();
                                 }));
  out.push_back(make_user_choice("planted_wrong_values", user_source("planted_wrong_values", ones), ctx.target,
                                 elementwise_launch()));
  return out;
}

/// Registers gemm's OpDef again under `name`: an op with gemm's problems and choices that tests may plant
/// choices in, or register in one process only.
inline Status add_gemm_copy(const std::string& name) {
  KILN_ASSIGN_OR_RETURN(auto gemm, default_ops().find("gemm"));
  OpDef def = *gemm;
  def.name = name;
  return default_ops().add(def);
}

/// Registers kOp (gemm's OpDef under another name, plus the planted choices) once per process.
inline Status register_ops() {
  if (default_ops().find(kOp).ok()) return Status();
  KILN_RETURN_IF_ERROR(add_gemm_copy(kOp));
  return default_ops().add_choices(kOp, choices);
}

}  // namespace kiln::runtime::planted
