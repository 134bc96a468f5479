// Calling template kernels generically, and subgraphs (several kernels run in sequence, e.g. split-K).
//
// Every template of a family takes that family's argument struct (kiln/templates/kernel_args.h) by value as
// its only kernel parameter, so the runtime can launch any configuration of any template of the family with
// `launch(kernel, launch_geometry, args, stream)`, where the geometry comes from Template::geometry().
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "kiln/jit/module.h"
#include "kiln/status.h"
#include "kiln/templates/epilogue.h"
#include "kiln/templates/kernel_args.h"
#include "kiln/templates/template.h"

namespace kiln::templates {

using GemmArgs = KilnGemmArgs;
using NormArgs = KilnNormArgs;
using SoftmaxArgs = KilnSoftmaxArgs;
using SplitKReduceArgs = KilnSplitKReduceArgs;
using EpilogueArgs = KilnEpilogueArgs;

/// An EpilogueArgs with alpha = beta = 1 and no tensors.
EpilogueArgs default_epilogue_args();

/// Launches `kernel` (a compiled configuration of a template of the family) with its arguments on `stream`.
/// kInvalidArgument for sizes that do not fit the ABI (negative, >= 2^31) or a null required pointer; launch
/// errors are returned, faults inside the kernel show at the next synchronisation.
Status launch(const Kernel& kernel, const Launch& geometry, const GemmArgs& args, CUstream stream);
Status launch(const Kernel& kernel, const Launch& geometry, const NormArgs& args, CUstream stream);
Status launch(const Kernel& kernel, const Launch& geometry, const SoftmaxArgs& args, CUstream stream);
Status launch(const Kernel& kernel, const Launch& geometry, const SplitKReduceArgs& args, CUstream stream);

// ------------------------------------------------------------------------------------------------ subgraphs

/// How a subgraph step's kernel arguments are made from the subgraph's arguments (the user's GemmArgs and a
/// workspace the runtime allocates, at least Subgraph::workspace_bytes).
enum class Binding : uint8_t {
  kGemm,              // the user's GemmArgs as they are
  kGemmPartials,      // the user's GemmArgs with workspace set, split_k/k_per_split from the step, no epilogue
  kSplitKReduce,      // SplitKReduceArgs{workspace, user.d, m, n, slices, m*n, user.ldd, user.ep}
};
std::string_view binding_name(Binding b);

struct SubgraphStep {
  TemplatePtr tmpl;
  Rendered kernel;      // configuration name, complete params, KernelSource
  Launch geometry;      // for the subgraph's shape
  Binding binding = Binding::kGemm;
  int split_k = 1;      // kGemmPartials, kSplitKReduce: the number of K slices
  int k_per_split = 0;  // kGemmPartials: K per slice
};

/// An ordered list of kernels that together solve one problem. The runtime precompiles every step's
/// KernelSource, then run() launches them in order on one stream.
struct Subgraph {
  std::string name;             // "splitk4_<gemm config>_<reduce config>"
  std::vector<SubgraphStep> steps;
  size_t workspace_bytes = 0;   // device memory run() needs as `workspace`
};

/// Split-K GEMM: `gemm` rendered with `gemm_params` plus partials=true (its template must declare a bool
/// problem parameter "partials"; any epilogue parameter it has is ignored in partials mode), writing `slices`
/// fp32 partials for shape {m, n, k}; then "splitk_reduce" rendered with `reduce_params` (tunables) and the
/// epilogue of `epilogue`. k_per_split = ceil(k / slices) rounded up to a multiple of 128; the real slice count
/// is ceil(k / k_per_split) (it can be lower than asked). kInvalidArgument for slices < 1 or a bad parameter.
Result<Subgraph> make_splitk_gemm(const TemplatePtr& gemm, const Params& gemm_params, const Params& reduce_params,
                                  const EpilogueSpec& epilogue, const Shape& shape, int slices);

/// Runs the subgraph: GEMM steps go through their template's TemplateDef::gemm_launch when it has one (TMA
/// configurations), else through launch(). `kernels[i]` is the compiled kernel of `graph.steps[i]`; `args` are the problem's
/// GemmArgs (a, b, d, sizes, leading dimensions, epilogue args); `workspace` holds at least
/// graph.workspace_bytes. Launches in order on `stream`; returns the first launch error.
Status run(const Subgraph& graph, const std::vector<const Kernel*>& kernels, const GemmArgs& args,
           CUdeviceptr workspace, CUstream stream);

}  // namespace kiln::templates
