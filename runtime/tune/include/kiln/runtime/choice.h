// Choice: one way to compute a problem — a rendered template configuration, a cuBLASLt algorithm, a subgraph
// of several kernels, or a user's own kernel — behind one interface the autotuner compiles, checks, times and
// runs.
//
// Life of a choice: kernels() says what it needs compiled; precompile() sends that through the pool's
// precompile gate and returns a future of the binaries (ready at once for choices with nothing to compile);
// prepare() loads them into the current context; run() launches on a stream. No choice compiles lazily inside
// benchmarking.
#pragma once

#include <cuda.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/jit/lazy_kernel.h"
#include "kiln/jit/module.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/future.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"
#include "kiln/templates/launch.h"
#include "kiln/templates/template.h"

namespace kiln {
class PrecompileGate;
}

namespace kiln::runtime {

enum class ChoiceKind { kTemplate, kExtern, kSubgraph, kUser };
/// "template", "extern", "subgraph", "user".
std::string_view choice_kind_name(ChoiceKind kind);

/// One kernel a choice needs compiled.
struct CompileRequest {
  KernelSource source;
  Target target;
  /// Expected compile seconds (templates::Rendered::compile_cost; 0 unknown): the pool starts longer ones first.
  double cost = 0;
};

/// How a choice's compiles queue among the pool's other jobs of their priority. kSubmission: in the order asked
/// (a workload's plan ahead, where the next problem's kernels must come first: ordered by expected length
/// instead, the H200 suite's first problems waited behind later problems' long compiles, 1 Dec, a2f7cdc).
/// kLongestFirst: by CompileRequest::cost, longest first (a set wanted whole: a tune's own candidates, a
/// precompile), so the set does not end with one long compile on one worker.
enum class QueueOrder { kSubmission, kLongestFirst };

/// The compiled kernels of a choice, in the order of its kernels().
using Binaries = std::vector<Binary>;

class Choice {
 public:
  virtual ~Choice() = default;

  /// Stable and unique among the choices of one problem; what the cache stores timings and decisions under.
  /// Template configurations use their configuration name, cuBLASLt algorithms "cublaslt_a.._t.._s..".
  virtual const std::string& name() const = 0;
  virtual ChoiceKind kind() const = 0;
  /// The kernels to compile before the choice can run; empty for an extern choice.
  virtual std::vector<CompileRequest> kernels() const { return {}; }
  /// Loads `binaries` (one per kernels() entry) into the current context and makes the choice runnable.
  /// Called once, before the first run(). Not thread-safe with run().
  virtual Status prepare(const Binaries& binaries) = 0;
  /// As prepare(), with each module's load left to the first run() that needs it (the binaries are kept in
  /// memory; a load that fails then is that run's error). What a warm start uses for cached decisions: a
  /// module load costs the driver milliseconds, and a process may never run some of its decisions. Default:
  /// prepare() (choices with nothing to load).
  virtual Status prepare_deferred(const Binaries& binaries) { return prepare(binaries); }
  /// Computes the problem on `args` on `stream`. `workspace` holds at least workspace_bytes(). Thread-safe
  /// after prepare(). Launch errors are returned; faults show at the next synchronisation.
  virtual Status run(const OpArgs& args, CUdeviceptr workspace, CUstream stream) const = 0;
  /// Device memory run() needs besides the op's buffers (split-K partials, an unfused intermediate).
  virtual size_t workspace_bytes() const { return 0; }
  /// Whether workspace_bytes() grows with the problem's dynamic size (a dispatcher scales it for larger calls):
  /// true for partials of the output's size; false for a fixed need (stream-K's per-SM slots).
  virtual bool workspace_scales() const { return true; }
  /// What the choice is, for reports and decisions: template parameters, an algorithm's fields.
  virtual std::map<std::string, std::string> parameters() const { return {}; }
  /// Ties within measurement noise go to the lower rank: templates first, then externs, subgraphs and user
  /// kernels. Templates before externs since 30 Nov 2026: an extern's tune reading is the optimistic one (on
  /// the H200 suite a chosen cuBLAS(Lt) kernel read a median 1.8% slower after its tune, a template 0.4%;
  /// cuBLAS's kernels time up to 16% apart by where their operands lie, kiln's within 0.5%), and at 3x4096x14336
  /// a tie handed to cuBLAS (32.45 against 32.26 us) was 3.8% slower in the re-time. Before, externs came first:
  /// they need no compile and one is the reference. Templates and externs alike (the faster wins) was tried on
  /// 30 Nov (f0f0019): within 1% of the exhaustive effort's choice 89.2%, within 3% 96.7% (against 90.8-91.7%
  /// and 98.3-100% over four runs with templates first); the ties it settled the other way missed as often.
  virtual int tie_rank() const;
  static constexpr int kTemplateTieRank = 0;
  static constexpr int kExternTieRank = 1;

  /// The precompile gate: sends kernels() through `gate` at `priority` and returns a future of the binaries
  /// (every kernel of a subgraph; a ready future when there is nothing to compile). `order`: how they queue
  /// among the pool's other jobs of their priority (QueueOrder). `keys` (when given) gets each kernel's key, so
  /// that a caller who later moves the compiles (PrecompileGate::raise) does not render them again.
  Future<Binaries> precompile(PrecompileGate& gate, Priority priority, QueueOrder order = QueueOrder::kSubmission,
                              std::vector<KernelKey>* keys = nullptr) const;
};

using ChoicePtr = std::shared_ptr<Choice>;

/// A choice's kernel for prepare() (`defer` false: loaded now, a load error returned now) or
/// prepare_deferred() (`defer` true: loaded into the current context at its first get()).
Result<LazyKernel> prepare_kernel(const Binary& binary, bool defer);

/// A rendered template configuration of one kernel, launched through its family's argument struct.
ChoicePtr make_template_choice(templates::TemplatePtr tmpl, templates::Rendered rendered, Target target,
                               templates::Shape shape);

/// A templates::Subgraph (e.g. split-K: partial GEMM + reduction) as one choice.
ChoicePtr make_subgraph_choice(templates::Subgraph graph, Target target, templates::Shape shape);

/// The in-memory header "kiln/templates/kernel_args.h" (KilnGemmArgs, KilnNormArgs, ...): add it to a user
/// kernel's KernelSource::headers to take the same arguments as kiln's templates.
Header kernel_abi_header();

/// A user's own kernel. `launch` launches the compiled kernel for the op's arguments (it chooses the grid).
using UserLaunch = std::function<Status(const Kernel& kernel, const OpArgs& args, CUstream stream)>;
ChoicePtr make_user_choice(std::string name, KernelSource source, Target target, UserLaunch launch);

}  // namespace kiln::runtime
