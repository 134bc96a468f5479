#include "kiln/runtime/variants.h"

#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "kiln/jit/key.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/tuner.h"

namespace kiln::runtime {

namespace {

Status check_dims(const LaunchDims& d, const std::string& what) {
  if (d.grid.x == 0 || d.grid.y == 0 || d.grid.z == 0 || d.block.x == 0 || d.block.y == 0 || d.block.z == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: launch geometry grid ({}, {}, {}) block ({}, {}, {}) has a zero dimension", what,
                                  d.grid.x, d.grid.y, d.grid.z, d.block.x, d.block.y, d.block.z));
  }
  return Status();
}

class VariantChoice final : public Choice {
 public:
  VariantChoice(const std::string& op, Variant v, Target target)
      : variant_(std::move(v)), source_(variant_source(op, variant_)), target_(std::move(target)) {}

  const std::string& name() const override { return variant_.name; }
  ChoiceKind kind() const override { return ChoiceKind::kUser; }
  std::vector<CompileRequest> kernels() const override { return {{source_, target_}}; }
  std::map<std::string, std::string> parameters() const override { return variant_.parameters; }

  Status prepare(const Binaries& binaries) override { return prepare_one(binaries, false); }
  Status prepare_deferred(const Binaries& binaries) override { return prepare_one(binaries, true); }

  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    if (!kernel_) return make_error(ErrorCode::kFailedPrecondition, fmt::format("variant {} was not prepared", name()));
    auto kernel = kernel_->get();
    if (!kernel.ok()) return kernel.status().with_context(fmt::format("loading variant {}", name()));
    const auto* call = std::get_if<CustomArgs>(&args);
    if (call == nullptr || call->params == nullptr) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("variant {} needs a call's kernel parameters (CustomArgs::params)", name()));
    }
    LaunchDims dims = variant_.dims;
    if (variant_.geometry) {
      KILN_ASSIGN_OR_RETURN(dims, variant_.geometry(call->sizes));
      KILN_RETURN_IF_ERROR(check_dims(dims, fmt::format("variant {}", name())));
    }
    LaunchConfig cfg;
    cfg.grid = dims.grid;
    cfg.block = dims.block;
    cfg.shared_bytes = dims.shared_bytes;
    cfg.stream = stream;
    return (*kernel)->launch(cfg, call->params);
  }

 private:
  Status prepare_one(const Binaries& binaries, bool defer) {
    if (binaries.size() != 1) return make_error(ErrorCode::kInternal, fmt::format("{}: expected one binary", name()));
    KILN_ASSIGN_OR_RETURN(LazyKernel k, prepare_kernel(binaries[0], defer));
    kernel_.emplace(std::move(k));
    return Status();
  }

  Variant variant_;
  KernelSource source_;
  Target target_;
  std::optional<LazyKernel> kernel_;
};

// The ops registered through register_variants, by registry: the only ones it may replace.
std::mutex g_mu;
std::set<std::pair<const OpRegistry*, std::string>> g_variant_ops;

std::string fingerprint_of(const VariantOp& op) {
  // The key of each variant's program (any fixed target: what matters is that it changes with the source,
  // options, headers and entry), and its fixed geometry.
  std::string all;
  for (const auto& v : op.variants) {
    all += fmt::format("{}:{}:{}:{},{},{}/{},{},{}/{};", v.name, make_key(variant_source(op.name, v), Target{"sm_80"}).hex(),
                       v.geometry ? "f" : "d", v.dims.grid.x, v.dims.grid.y, v.dims.grid.z, v.dims.block.x,
                       v.dims.block.y, v.dims.block.z, v.dims.shared_bytes);
  }
  all += "ref:" + (op.reference.empty() ? op.variants.front().name : op.reference);
  KernelSource carrier;
  carrier.name = "variants";
  carrier.source = all;
  return make_key(carrier, Target{"sm_80"}).hex().substr(0, 16);
}

}  // namespace

Problem VariantSet::problem(std::vector<int64_t> sizes, std::map<std::string, std::string> attributes) const {
  attributes["kiln.variants"] = fingerprint_;
  return Problem::custom(op_, CustomProblem{std::move(sizes), std::move(attributes)});
}

Status validate_variants(const VariantOp& op) {
  auto bad = [&](std::string why) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("variant op '{}': {}", op.name.empty() ? std::string("(unnamed)") : op.name, why));
  };
  if (op.name.empty()) return bad("needs a name");
  if (op.variants.empty()) return bad("has no variants");
  if (!op.buffers) return bad("needs a buffers function (it makes the inputs and outputs a tune runs on)");
  if (!(op.tolerance > 0)) return bad(fmt::format("tolerance {} is not positive", op.tolerance));
  std::set<std::string> names;
  for (size_t i = 0; i < op.variants.size(); ++i) {
    const Variant& v = op.variants[i];
    if (v.name.empty()) return bad(fmt::format("variant {} has no name", i));
    if (v.source.empty()) return bad(fmt::format("variant '{}' has no source", v.name));
    if (v.kernel.empty()) return bad(fmt::format("variant '{}' names no kernel", v.name));
    if (!names.insert(v.name).second) return bad(fmt::format("two variants are named '{}'", v.name));
    for (const auto& [k, _] : v.defines) {
      if (k.empty()) return bad(fmt::format("variant '{}' has a define with no name", v.name));
    }
    if (!v.geometry) KILN_RETURN_IF_ERROR(check_dims(v.dims, fmt::format("variant op '{}', variant '{}'", op.name, v.name)));
  }
  if (!op.reference.empty() && !names.count(op.reference)) {
    return bad(fmt::format("reference '{}' is not one of its variants", op.reference));
  }
  return Status();
}

KernelSource variant_source(const std::string& op, const Variant& v) {
  KernelSource s;
  s.name = fmt::format("{}.{}", op, v.name);
  s.entry = v.kernel;
  s.source = v.source;
  for (const auto& [k, val] : v.defines) s.options.push_back(val.empty() ? "-D" + k : fmt::format("-D{}={}", k, val));
  for (const auto& o : v.options) s.options.push_back(o);
  s.include_dirs = v.include_dirs;
  s.headers = v.headers;
  if (v.kernel.find('<') != std::string::npos) s.name_expressions.push_back(v.kernel);
  return s;
}

Result<VariantSet> register_variants(OpRegistry& ops, VariantOp op) {
  KILN_RETURN_IF_ERROR(validate_variants(op));
  {
    std::lock_guard lock(g_mu);
    if (ops.find(op.name).ok() && !g_variant_ops.count({&ops, op.name})) {
      return make_error(ErrorCode::kAlreadyExists,
                        fmt::format("variant op '{}': an op of that name exists and is not a variant op", op.name));
    }
  }
  VariantSet set(op.name, fingerprint_of(op));
  auto shared = std::make_shared<const VariantOp>(std::move(op));
  OpDef def;
  def.name = shared->name;
  def.choices = [shared](const Problem&, const ChoiceContext& ctx) -> Result<std::vector<ChoicePtr>> {
    std::vector<ChoicePtr> out;
    for (const auto& v : shared->variants) out.push_back(std::make_shared<VariantChoice>(shared->name, v, ctx.target));
    return out;
  };
  const std::string reference = shared->reference.empty() ? shared->variants.front().name : shared->reference;
  def.reference = [reference](const Problem&) { return reference; };
  def.buffers = [shared](const Problem& p, uint32_t seed) -> Result<OpBuffers> {
    const auto* custom = std::get_if<CustomProblem>(&p.desc);
    if (!custom) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} is not a variant op's problem", p.describe()));
    KILN_ASSIGN_OR_RETURN(VariantBuffers vb, shared->buffers(custom->sizes, seed));
    if (vb.params.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("variant op '{}': its buffers function gave no kernel parameters", shared->name));
    }
    // The parameter array itself lives beside what it points to.
    struct Owned {
      std::vector<void*> params;
      std::shared_ptr<void> owner;
    };
    auto owned = std::make_shared<Owned>(Owned{std::move(vb.params), std::move(vb.owner)});
    OpBuffers b;
    b.args = CustomArgs{{}, custom->sizes, owned->params.data()};
    b.outputs = std::move(vb.outputs);
    b.owner = owned;
    return b;
  };
  def.tolerance = [tol = shared->tolerance](DType) { return tol; };
  if (shared->check) {
    def.verify = [shared](const Problem&, const OpArgs& args, CUstream stream) -> Status {
      const auto& call = std::get<CustomArgs>(args);
      return shared->check(call.sizes, call.params, stream);
    };
  }
  KILN_RETURN_IF_ERROR(ops.add(std::move(def)));
  std::lock_guard lock(g_mu);
  g_variant_ops.insert({&ops, set.op()});
  return set;
}

Status run_variant(const Selection& selection, std::span<const int64_t> sizes, void** params, CUstream stream) {
  if (params == nullptr) return make_error(ErrorCode::kInvalidArgument, "run_variant: no kernel parameters");
  // (Copying the sizes touches host memory only: still capture-safe.)
  return selection.run(CustomArgs{{}, std::vector<int64_t>(sizes.begin(), sizes.end()), params}, stream);
}

}  // namespace kiln::runtime
