// kiln's template engine: a Template is a CUDA C++ text built into kiln::templates plus the declarations
// that make it tunable (its parameters, constraints, launch geometry and configuration names). Rendering a
// Template with a parameter set gives a deterministic KernelSource for kiln::compile.
//
// Text syntax (kiln's own, deliberately tiny so that every mistake is an error naming what is wrong; a
// general-purpose engine such as ctemplate or mustache renders an unknown or missing name as a blank):
//   ${name}          the value of parameter `name` (see Value for how each kind renders)
//   ${name.attr}     an attribute of the value: dtype .name .bytes .is_f32; layout .name .row .col;
//                    code .tag (its short name); int, bool and enum have none
//   ${if name} A ${else} B ${endif}   A when bool parameter `name` is true, else B (${else} optional,
//                    ${if !name} negates; blocks nest). A directive alone on its line takes the whole
//                    line with it; one inside a line of text leaves the text around it alone.
//   $$               a literal '$'
// Every placeholder must name a declared parameter: this is checked when the registry is built (so a typo in a
// template fails every test), and a parameter set that is missing, adds or mistypes a parameter is refused
// before anything renders. Rendering is pure: the same template and parameters give byte-identical text.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/jit/module.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"
#include "kiln/templates/kernel_args.h"

namespace kiln {
struct DeviceInfo;
}

namespace kiln::templates {

// ------------------------------------------------------------------------------------------------ values

enum class DType : uint8_t { kF16, kBF16, kF32 };
/// "f16", "bf16", "f32".
std::string_view dtype_name(DType t);
/// "__half", "__nv_bfloat16", "float".
std::string_view dtype_cpp(DType t);
int dtype_bytes(DType t);
/// Host-side element conversions (inputs and checks prepared on the CPU): the float nearest to the element at
/// `p`, and `v` rounded to nearest-even into the dtype's dtype_bytes() at `p`.
float load_element(DType t, const void* p);
void store_element(DType t, float v, void* p);
/// Parses "f16"/"fp16"/"half", "bf16", "f32"/"fp32"/"float".
Result<DType> parse_dtype(std::string_view s);

enum class Layout : uint8_t { kRowMajor, kColMajor };
/// "row", "col".
std::string_view layout_name(Layout l);

enum class ParamKind : uint8_t { kInt, kBool, kDType, kLayout, kEnum, kCode };
/// "int", "bool", "dtype", "layout", "enum", "code".
std::string_view kind_name(ParamKind k);

/// One parameter value. How `${name}` renders it:
///   int -> decimal ("128"); bool -> "true"/"false"; dtype -> the C++ type ("__nv_bfloat16");
///   layout -> "0" (row) / "1" (col); enum -> its choice, which is an identifier ("swizzle2");
///   code -> the snippet text. A code value also carries a short tag used in configuration names.
class Value {
 public:
  static Value integer(int64_t v);
  static Value boolean(bool v);
  static Value dtype(DType t);
  static Value layout(Layout l);
  static Value enumeration(std::string choice);
  /// A code snippet; `tag` ([a-z0-9_]+, e.g. "bias_gelu") names it in configuration names.
  static Value code(std::string text, std::string tag);

  ParamKind kind() const { return kind_; }
  /// The payloads; calling the accessor of another kind is a caller bug (asserts; returns a zero value).
  int64_t as_int() const;
  bool as_bool() const;
  DType as_dtype() const;
  Layout as_layout() const;
  const std::string& as_enum() const;
  const std::string& as_code() const;
  const std::string& code_tag() const;

  /// For names and logs: "128", "true", "bf16", "row", the choice, or the code's tag.
  std::string short_text() const;
  bool operator==(const Value& o) const;

 private:
  ParamKind kind_ = ParamKind::kInt;
  int64_t i_ = 0;
  std::string s_;    // enum choice, or code tag
  std::shared_ptr<const std::string> code_;  // code text, shared: grids copy parameter sets a lot
};

/// A parameter set: name -> value, ordered by name (so iteration and printing are deterministic).
using Params = std::map<std::string, Value, std::less<>>;
/// "name=value name=value" using short_text(), for logs and errors.
std::string to_string(const Params& p);

// ------------------------------------------------------------------------------------------------ declarations

enum class ParamRole : uint8_t {
  kTunable,  // an axis of the search space (tile sizes, threads, vector width): the autotuner picks it
  kProblem,  // fixed by the problem (dtypes, layouts, epilogue, residual on/off): the caller gives it
  kDerived,  // computed by the template's `derive` from the others; the caller must not give it
};

struct ParamSpec {
  std::string name;         // [a-z_][a-z0-9_]*
  ParamKind kind = ParamKind::kInt;
  ParamRole role = ParamRole::kTunable;
  /// The values the grid enumerates (tunables and problem parameters; empty for derived). For kEnum this is
  /// also the set of legal choices. Problem ints/dtypes/codes may take values outside it; tunables outside it
  /// are accepted too (constraints decide), so a tuner may try extra points.
  std::vector<Value> values;
  std::string abbrev;       // short prefix in generated configuration names ("t" -> "t256"); "" omits it
  std::string doc;
  /// Tunables only: the value a parameter set that omits this parameter gets. For a tunable added to a template
  /// after configurations of it were stored or written down: those stay valid and mean what they meant (the
  /// default must be the behaviour the template had before). The grid still enumerates every value.
  std::optional<Value> default_value;
};

/// Where kernels will run: what constraints are checked against.
struct DeviceLimits {
  std::string arch;                   // "sm_90a"
  int cc = 0;                         // 90
  bool arch_specific = false;         // an "a" target: wgmma, setmaxnreg
  int sm_count = 0;
  int smem_per_block_optin = 0;       // bytes of dynamic+static shared memory a block may use after opting in
  int smem_per_sm = 0;
  int regs_per_sm = 65536;
  int max_regs_per_thread = 255;
  int max_threads_per_block = 1024;
  bool measured = false;              // true when taken from a DeviceInfo, false for known defaults

  /// Documented defaults for a target with no GPU at hand (the figures of the flagship part of each arch):
  ///   sm_80 (A100):            108 SMs, 163 KiB opt-in shared memory per block, 164 KiB per SM
  ///   sm_86 / sm_89 (GA10x/AD10x): 84 / 128 SMs, 99 KiB opt-in, 100 KiB per SM
  ///   sm_87 (Orin):             16 SMs, 163 KiB, 164 KiB
  ///   sm_90 (H100/H200 SXM):   132 SMs, 227 KiB opt-in, 228 KiB per SM
  ///   sm_100 / sm_103 (B200/B300): 148 SMs, 227 KiB, 228 KiB;  sm_120 (RTX 50): 170 SMs, 99 KiB, 100 KiB
  /// kInvalidArgument for an arch not listed (pass limits from a device instead).
  static Result<DeviceLimits> for_target(const Target& target);
  /// The device's own figures, compiled for `target` (normally Target{info.arch()}, or its "a" variant).
  static DeviceLimits from_device(const DeviceInfo& info, const Target& target);
};

/// A problem's sizes, as launch geometry and problem constraints see them. GEMM: m, n, k (and `splits` K
/// slices for split-K partials). Norms and softmax: rows = m, cols = n. Split-K reduce: m, n, splits.
struct Shape {
  int64_t m = 1;
  int64_t n = 1;
  int64_t k = 1;
  int64_t batch = 1;
  int splits = 1;
};

/// A kernel's launch geometry for one problem.
struct Launch {
  Dim3 grid;
  Dim3 block;
  unsigned shared_bytes = 0;  // dynamic shared memory
  Dim3 cluster;               // {1,1,1}: no clusters
  /// What the configuration's vector accesses need of the arguments: every tensor pointer aligned to
  /// align_bytes and every leading dimension a multiple of align_elems. The family launch helpers
  /// (kiln/templates/launch.h) refuse arguments that break this with kInvalidArgument naming the argument.
  unsigned align_bytes = 1;
  unsigned align_elems = 1;
  /// Launch with programmatic dependent launch (LaunchConfig::programmatic): set by the families whose kernels wait
  /// for the previous grid before touching memory (kiln_wait_prior_grid), when programmatic_launch_enabled().
  bool programmatic = false;
  LaunchConfig config(CUstream stream) const {
    return LaunchConfig{grid, block, shared_bytes, stream, cluster, programmatic};
  }
};

/// Whether the Hopper families launch with programmatic dependent launch: the next kernel of a stream is scheduled
/// while the previous one finishes, which hides part of the launch latency between back-to-back kernels (a median
/// 1.5-2% of GEMMs under 40 us on an H200). On by default; KILN_PDL=0 turns it off for the process. Geometry computed
/// before a change keeps what it had.
bool programmatic_launch_enabled();
/// Turns it on or off (benchmarks measure both in one run).
void set_programmatic_launch(bool on);

/// What a family supplies to define one template. Only name, problem, file, entry and params are required.
struct TemplateDef {
  std::string name;         // unique: "rmsnorm", "gemm_mma_sm80"
  std::string problem;      // what it solves: "gemm", "rmsnorm", "layernorm", "softmax", "splitk_reduce"
  std::string description;  // one line
  std::string file;         // the embedded template text, e.g. "norms/rmsnorm.cu"
  /// Embedded files handed to NVRTC as in-memory headers under the same name (e.g. "common/kiln_device.cuh",
  /// included as `#include "common/kiln_device.cuh"`). "kiln/templates/kernel_args.h" is always added.
  std::vector<std::string> headers;
  std::string entry;        // the extern "C" kernel name (may contain placeholders, e.g. "gemm_${bm}")
  std::vector<std::string> options;  // extra NVRTC options; kiln adds "-std=c++17"
  int min_cc = 80;                   // lowest compute capability it compiles for
  bool needs_arch_specific = false;  // only for "a" targets (sm_90a)
  /// A template of the same problem that beats this one wherever it can run (measured: gemm_mma_sm80 runs 3-12x
  /// slower than gemm_wgmma_sm90 on an H200). Choice generation leaves this one out on such devices unless it is
  /// asked for by name (see superseded_on in kiln/templates/registry.h). "" (the default): never superseded.
  std::string superseded_by;
  std::vector<ParamSpec> params;
  /// Notes a reader needs, e.g. "specialises on K" (sizes are run-time arguments unless a template says so).
  std::string specialization_note;

  /// Computes the kDerived parameters from the others (given complete, validated params). Optional.
  std::function<Result<Params>(const Params&)> derive;
  /// Compile-time constraints against the device (shared memory vs the opt-in limit, register estimates,
  /// divisibility between parameters, arch). Return an error (kOutOfRange, kFailedPrecondition or
  /// kInvalidArgument) whose message says why. Optional (the arch checks above always run).
  std::function<Status(const Params&, const DeviceLimits&)> constraints;
  /// Whether a configuration can serve a problem (divisibility and alignment against the sizes). Optional.
  std::function<Status(const Params&, const Shape&)> problem_constraints;
  /// Launch geometry for a problem. Required.
  std::function<Result<Launch>(const Params&, const Shape&)> geometry;
  /// The configuration's name. Optional: by default `<name>` then, for each non-derived parameter in
  /// declaration order, "_<abbrev><value>" (a bool adds "_<abbrev>" when true and nothing when false; a
  /// parameter with an empty abbrev adds "_<value>").
  std::function<std::string(const Params&)> config_name;
  /// GEMM templates whose kernels need more than the KilnGemmArgs struct at launch (e.g. TMA descriptors
  /// encoded from the args): launches a compiled configuration (`params` complete). Subgraphs (launch.h
  /// run()) call it for their GEMM steps when set; otherwise they use launch(kernel, geometry, args, stream).
  /// The last argument is launch_gemm()'s lowered_flags.
  std::function<Status(const Kernel&, const Params&, const Launch&, const KilnGemmArgs&, CUstream, CUdeviceptr)>
      gemm_launch;
  /// Device memory a configuration needs at launch beyond its arguments (GEMM: passed as KilnGemmArgs::workspace),
  /// for the current device; at most this much for any problem size. Optional: none.
  std::function<size_t(const Params&)> workspace_bytes;
  /// A configuration's expected compile time in seconds (only its ratio to others' matters), so that a pool
  /// compiling many kernels starts the longest first and does not end a batch with one long compile on one
  /// worker (CompileJob::cost_hint). Optional: without it, 0 (unknown: after the hinted ones, in order).
  std::function<double(const Params&)> compile_cost;
};

/// A rendered configuration: everything needed to compile it and name it.
struct Rendered {
  std::string config_name;  // "rmsnorm_bf16_t256_r1_v8_i4"
  Params params;            // complete: given + derived
  KernelSource source;
  double compile_cost = 0;  // TemplateDef::compile_cost of params; 0 when the template has none
};

namespace detail {
struct ParsedText;
struct GenerationMemo;
}

/// A validated template: its text is parsed once and every placeholder checked against its parameters.
/// Immutable and thread-safe.
class Template {
 public:
  /// Validates `def` (names, kinds, enum choices, required functions, the text's placeholders and blocks).
  /// `text` is the template's source; the registry passes the embedded file `def.file`.
  static Result<std::shared_ptr<const Template>> create(TemplateDef def, std::string_view text,
                                                        std::vector<Header> headers);

  const std::string& name() const { return def_.name; }
  const std::string& problem() const { return def_.problem; }
  const std::string& description() const { return def_.description; }
  const TemplateDef& def() const { return def_; }
  const std::vector<ParamSpec>& params() const { return def_.params; }
  const ParamSpec* param(std::string_view name) const;

  /// Checks `given` (every tunable and problem parameter present, none unknown, none derived, each of its
  /// declared kind, enum choices legal), adds the defaults of omitted tunables that declare one
  /// (ParamSpec::default_value) and the derived parameters. kInvalidArgument naming the
  /// parameter otherwise.
  Result<Params> complete(const Params& given) const;
  /// The configuration's stable name (given complete or completable params).
  Result<std::string> config_name(const Params& params) const;
  /// The template's arch requirements (min_cc, needs_arch_specific) alone: whether any configuration can pass
  /// check() on `limits`.
  Status supports(const DeviceLimits& limits) const;
  /// The same for a compile target alone (what choice generation and supersession decide by).
  Status supports(const Target& target) const;
  /// Arch requirements then the template's constraints. Ok or an error saying why the config is pruned.
  Status check(const Params& params, const DeviceLimits& limits) const;
  /// Whether the configuration can run `shape`, then its launch geometry.
  Status check_problem(const Params& params, const Shape& shape) const;
  Result<Launch> geometry(const Params& params, const Shape& shape) const;
  /// TemplateDef::workspace_bytes for complete params, or 0.
  size_t workspace_bytes(const Params& params) const { return def_.workspace_bytes ? def_.workspace_bytes(params) : 0; }
  /// complete() + render the text: the KernelSource (name = configuration name, entry, options, headers).
  /// Memoised per parameter set (see generation_cache_enabled()): the same parameters give the same text.
  Result<Rendered> render(const Params& params) const;

  /// Internal (registry.cpp): what choice generation memoises for this template.
  detail::GenerationMemo& memo() const { return *memo_; }

 private:
  Template() = default;
  Status validate_given(const Params& p) const;
  Result<Rendered> render_uncached(const Params& params) const;
  TemplateDef def_;
  std::shared_ptr<const detail::ParsedText> text_;
  std::shared_ptr<const detail::ParsedText> entry_;
  std::vector<Header> headers_;
  std::shared_ptr<detail::GenerationMemo> memo_;
};

using TemplatePtr = std::shared_ptr<const Template>;

// ------------------------------------------------------------------------------------------------ memo

/// Choice generation memoises what does not depend on a problem's sizes, per template: rendered configurations
/// (by parameter set) and the deterministic samples of a grid (by fixed parameters, device limits and size), so
/// that the second and later problems of a template/dtype/layout render and walk the grid no more (every
/// problem of a workload used to pay ~0.8 s of host time for it). Rendering is pure and sampling deterministic,
/// so a memoised answer is the answer. On by default; KILN_GENERATION_CACHE=0 turns it off for the process.
bool generation_cache_enabled();
/// Turns the memo on or off (benchmarks measure both in one run); turning it off also empties it.
void set_generation_cache(bool on);
/// Empties every template's memo (the next generation renders and samples afresh).
void clear_generation_cache();

/// What choice generation did and saved, process-wide since start (tests prove reuse with deltas of these).
struct GenerationStats {
  uint64_t renders = 0;      // texts rendered (Template::render misses, and every call with the memo off)
  uint64_t render_hits = 0;  // Template::render answered from the memo
  uint64_t samples = 0;      // grid walks by sample()
  uint64_t sample_hits = 0;  // sample() answered from the memo
  uint64_t sample_checks = 0;  // configurations whose constraints those walks checked
};
GenerationStats generation_stats();

// ------------------------------------------------------------------------------------------------ helpers

/// For constraint functions: an error of `code` with `message`, or ok when `cond` holds.
inline Status require(bool cond, ErrorCode code, std::string message) {
  return cond ? Status() : Status(code, std::move(message));
}
/// Reads a parameter of a complete parameter set, asserting its kind (a template reading its own params).
int64_t get_int(const Params& p, std::string_view name);
bool get_bool(const Params& p, std::string_view name);
DType get_dtype(const Params& p, std::string_view name);
Layout get_layout(const Params& p, std::string_view name);
const std::string& get_enum(const Params& p, std::string_view name);

/// Convenience builders for ParamSpecs.
ParamSpec int_param(std::string name, ParamRole role, std::vector<int64_t> values, std::string abbrev, std::string doc);
ParamSpec bool_param(std::string name, ParamRole role, std::string abbrev, std::string doc);
ParamSpec dtype_param(std::string name, ParamRole role, std::vector<DType> values, std::string abbrev, std::string doc);
ParamSpec layout_param(std::string name, ParamRole role, std::string abbrev, std::string doc);
ParamSpec enum_param(std::string name, ParamRole role, std::vector<std::string> choices, std::string abbrev,
                     std::string doc);
ParamSpec code_param(std::string name, ParamRole role, std::vector<Value> samples, std::string abbrev, std::string doc);
ParamSpec derived_param(std::string name, ParamKind kind, std::string doc);

/// Renders a text in the template syntax with `values` on its own (used by tests and for small snippets):
/// kInvalidArgument for a malformed text or a placeholder without a value. `what` names it in errors.
Result<std::string> render_text(std::string_view text, const Params& values, std::string_view what = "text");
/// The distinct parameter names a text refers to (placeholders and ${if}s), sorted; or its syntax error.
Result<std::vector<std::string>> placeholders(std::string_view text, std::string_view what = "text");

}  // namespace kiln::templates
