// The op registry: what the autotuner knows how to tune. Each op maps a Problem to its choices, names the
// reference choice every other choice is checked against, and says how to make random inputs for it.
// kiln's own ops (gemm, rmsnorm, layernorm, softmax) are in default_ops() (kiln/runtime/builtin.h); a DSL or
// serving engine registers its own ops there, or adds choices to a built-in op.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"
#include "kiln/templates/template.h"

namespace kiln::runtime {

/// A region of device memory a choice writes: poisoned before a checked run and compared with the reference.
struct OutputRegion {
  CUdeviceptr ptr = 0;
  DType dtype = DType::kBF16;
  int64_t rows = 0, cols = 0, ld = 0;  // row-major, ld in elements
  std::string name;                    // "d", "y", "residual_out"
  /// The choices also read it (an in-place update such as y = a * x + y): before each checked run it gets back
  /// the content it had before the reference ran, instead of poison, which every choice would read and fail on.
  bool restore = false;
};

/// Inputs and outputs of one problem on the device, filled with random data (never zeros).
struct OpBuffers {
  OpArgs args;
  std::vector<OutputRegion> outputs;
  std::vector<DeviceBuffer> storage;  // owns every buffer `args` points into
  std::shared_ptr<void> owner;        // owns anything else `args` points into (a variant op's parameters)
};

/// What choice generators may use.
struct ChoiceContext {
  DeviceInfo device;                     // the device tuned for (empty when there is none)
  bool has_device = false;               // false for kiln precompile on a machine without a GPU
  Target target;                         // "sm_90" (plain) for the device
  Target arch_target;                    // "sm_90a" where the device has arch-specific features, else = target
  templates::DeviceLimits limits;        // for `target`
  templates::DeviceLimits arch_limits;   // for `arch_target`
  int max_template_configs = 24;         // per template, after pruning (a deterministic sample)
  int max_cublas_algos = 8;              // cuBLASLt heuristic results
  bool split_k = true;                   // add split-K subgraph choices where they may help
  /// Templates tried even where another supersedes them (TemplateDef::superseded_by: gemm_mma_sm80 on sm_90a);
  /// "all" keeps every superseded template.
  std::vector<std::string> families;
};

struct OpDef {
  std::string name;
  /// The choices for a problem of this op. Errors mean the op cannot be tuned at all (a bad problem).
  std::function<Result<std::vector<ChoicePtr>>(const Problem&, const ChoiceContext&)> choices;
  /// The name of the choice others are checked against (it must be among choices()). Its output is the
  /// reference; it is also the default choice in `use` mode and when every choice fails.
  std::function<std::string(const Problem&)> reference;
  /// Allocates the problem's buffers with random inputs (seeded: the same problem and seed give the same
  /// data). Needs a current context.
  std::function<Result<OpBuffers>(const Problem&, uint32_t seed)> buffers;
  /// Relative-norm error a choice may have against the reference for each output dtype.
  std::function<double(DType)> tolerance;
  /// Optional: rebuilds the choice `name` from the parameters a cached decision stored for it, without
  /// generating every choice (the fast path of a warm start). kNotFound when it cannot; the tuner then
  /// generates the choices and looks the name up.
  std::function<Result<ChoicePtr>(const Problem&, const std::string& name,
                                  const std::vector<std::pair<std::string, std::string>>& params,
                                  const ChoiceContext&)>
      rebuild;
  /// Optional: the op's own check of a choice's outputs after its checked run (the stream synchronised),
  /// besides the comparison of OpBuffers::outputs with the reference's. An error fails the choice with it.
  std::function<Status(const Problem&, const OpArgs&, CUstream)> verify;
};

/// Thread-safe.
class OpRegistry {
 public:
  /// An empty registry.
  OpRegistry() = default;
  /// Adds or replaces an op. kInvalidArgument for a def missing a function.
  Status add(OpDef def);
  /// Adds choices to an existing op (called after its own generator). kNotFound for an unknown op.
  Status add_choices(const std::string& op,
                     std::function<Result<std::vector<ChoicePtr>>(const Problem&, const ChoiceContext&)> extra);
  /// kNotFound naming the known ops.
  Result<std::shared_ptr<const OpDef>> find(const std::string& op) const;
  /// Every choice for `problem`: the op's own and any added. Names are unique (a duplicate is an error).
  Result<std::vector<ChoicePtr>> choices(const Problem& problem, const ChoiceContext& ctx) const;
  std::vector<std::string> ops() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const OpDef>> ops_;
  std::map<std::string, std::vector<std::function<Result<std::vector<ChoicePtr>>(const Problem&, const ChoiceContext&)>>> extra_;
};

/// The ChoiceContext for device `ordinal` (its arch, limits, and the sm_90a variant on Hopper).
Result<ChoiceContext> choice_context(int ordinal);
/// The ChoiceContext for compiling for `arch` with no GPU at hand (kiln precompile on a build machine).
Result<ChoiceContext> choice_context_for_arch(const Target& arch);

}  // namespace kiln::runtime
