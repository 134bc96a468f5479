// The choice kinds of the tuning core: template configurations, subgraphs, user kernels (vendor-library
// choices are in runtime/extern).
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kiln/embedded.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/runtime/choice.h"
#include "kiln/pool/gate.h"
#include "kiln/templates/gemm.h"

namespace kiln::templates_abi {
std::span<const kiln::EmbeddedFile> embedded_files();  // built into kiln::templates
}

namespace kiln::runtime {

Header kernel_abi_header() {
  for (const auto& f : templates_abi::embedded_files()) {
    if (f.name == "kiln/templates/kernel_args.h") return Header{std::string(f.name), std::string(f.contents)};
  }
  return Header{"kiln/templates/kernel_args.h", ""};
}

std::string_view choice_kind_name(ChoiceKind kind) {
  switch (kind) {
    case ChoiceKind::kTemplate: return "template";
    case ChoiceKind::kExtern: return "extern";
    case ChoiceKind::kSubgraph: return "subgraph";
    case ChoiceKind::kUser: return "user";
  }
  return "?";
}

int Choice::tie_rank() const {
  switch (kind()) {
    case ChoiceKind::kTemplate: return kTemplateTieRank;
    case ChoiceKind::kExtern: return kExternTieRank;
    case ChoiceKind::kSubgraph: return 2;
    case ChoiceKind::kUser: return 3;
  }
  return 4;
}

Future<Binaries> Choice::precompile(PrecompileGate& gate, Priority priority, QueueOrder order,
                                    std::vector<KernelKey>* keys) const {
  std::vector<CompileRequest> requests = kernels();
  if (keys != nullptr) {
    for (const auto& r : requests) keys->push_back(make_key(r.source, r.target));
  }
  if (requests.empty()) return make_ready_future<Binaries>(Binaries{});
  std::vector<Future<Binary>> futures;
  futures.reserve(requests.size());
  for (auto& r : requests) {
    futures.push_back(gate.precompile(r.source, r.target, priority, order == QueueOrder::kLongestFirst ? r.cost : 0.0));
  }
  return when_all(std::move(futures));
}

Result<LazyKernel> prepare_kernel(const Binary& binary, bool defer) {
  if (!defer) {
    KILN_ASSIGN_OR_RETURN(Kernel k, load_kernel(binary));
    return LazyKernel(std::move(k));
  }
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, current_context());
  if (ctx == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition, "no current CUDA context to load kernels into (kiln::ensure_context)");
  }
  return LazyKernel(std::make_shared<const Binary>(binary), ctx);
}

namespace detail {

Result<templates::Shape> shape_of(const OpArgs& args) {
  return std::visit(
      [](const auto& a) -> Result<templates::Shape> {
        using T = std::decay_t<decltype(a)>;
        templates::Shape s;
        if constexpr (std::is_same_v<T, KilnGemmArgs>) {
          s.m = a.m, s.n = a.n, s.k = a.k;
        } else if constexpr (std::is_same_v<T, KilnNormArgs> || std::is_same_v<T, KilnSoftmaxArgs>) {
          s.m = a.rows, s.n = a.cols;
        } else {
          return make_error(ErrorCode::kInvalidArgument, "custom arguments have no template shape");
        }
        return s;
      },
      args);
}

}  // namespace detail

namespace {

// Geometry depends only on the sizes of a call: memoise the last one so a dispatcher's steady state does not
// recompute it (a serving engine calls one shape many times in a row).
class GeometryCache {
 public:
  Result<templates::Launch> get(const templates::Template& t, const templates::Params& p, const templates::Shape& s) const {
    {
      std::lock_guard lock(mu_);
      if (valid_ && s.m == shape_.m && s.n == shape_.n && s.k == shape_.k) return launch_;
    }
    KILN_ASSIGN_OR_RETURN(templates::Launch l, t.geometry(p, s));
    std::lock_guard lock(mu_);
    valid_ = true;
    shape_ = s;
    launch_ = l;
    return l;
  }

 private:
  mutable std::mutex mu_;
  mutable bool valid_ = false;
  mutable templates::Shape shape_;
  mutable templates::Launch launch_;
};

// A choice that compiles one kernel: prepare() loads it and run() reaches it through loaded().
class OneKernelChoice : public Choice {
 public:
  Status prepare(const Binaries& binaries) override { return prepare_one(binaries, false); }
  Status prepare_deferred(const Binaries& binaries) override { return prepare_one(binaries, true); }

 protected:
  /// The loaded kernel (loading it first when deferred); kFailedPrecondition before prepare().
  Result<const Kernel*> loaded() const {
    if (!kernel_) return make_error(ErrorCode::kFailedPrecondition, fmt::format("{} was not prepared", name()));
    auto k = kernel_->get();
    if (!k.ok()) return k.status().with_context(fmt::format("loading {}", name()));
    return k;
  }

 private:
  Status prepare_one(const Binaries& binaries, bool defer) {
    if (binaries.size() != 1) return make_error(ErrorCode::kInternal, fmt::format("{}: expected one binary", name()));
    KILN_ASSIGN_OR_RETURN(LazyKernel k, prepare_kernel(binaries[0], defer));
    kernel_.emplace(std::move(k));
    return Status();
  }

  std::optional<LazyKernel> kernel_;
};

class TemplateChoice final : public OneKernelChoice {
 public:
  TemplateChoice(templates::TemplatePtr t, templates::Rendered r, Target target)
      : tmpl_(std::move(t)),
        rendered_(std::move(r)),
        target_(std::move(target)),
        takes_flags_(templates::gemm_takes_flags(rendered_.params)) {}

  const std::string& name() const override { return rendered_.config_name; }
  ChoiceKind kind() const override { return ChoiceKind::kTemplate; }
  std::vector<CompileRequest> kernels() const override { return {{rendered_.source, target_, rendered_.compile_cost}}; }

  Status run(const OpArgs& args, CUdeviceptr workspace, CUstream stream) const override {
    KILN_ASSIGN_OR_RETURN(const Kernel* kernel, loaded());
    KILN_ASSIGN_OR_RETURN(templates::Shape shape, detail::shape_of(args));
    KILN_ASSIGN_OR_RETURN(templates::Launch geometry, geometry_.get(*tmpl_, rendered_.params, shape));
    return std::visit(
        [&](const auto& a) -> Status {
          using T = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<T, KilnGemmArgs>) {
            CUdeviceptr flags = 0;
            if (takes_flags_) {
              KILN_ASSIGN_OR_RETURN(flags, lowered_flags(stream));
            }
            if (workspace == 0) return templates::launch_gemm(*kernel, rendered_.params, geometry, a, stream, flags);
            KilnGemmArgs with = a;  // the configuration's own workspace (stream-K); others ignore it
            with.workspace = reinterpret_cast<float*>(static_cast<uintptr_t>(workspace));
            return templates::launch_gemm(*kernel, rendered_.params, geometry, with, stream, flags);
          } else if constexpr (std::is_same_v<T, CustomArgs>) {
            return make_error(ErrorCode::kInvalidArgument, "a template choice cannot run custom arguments");
          } else {
            return templates::launch(*kernel, geometry, a, stream);
          }
        },
        args);
  }

  // Asked when the choice is about to run, in its device's context (stream-K sizes it by the SM count).
  size_t workspace_bytes() const override { return tmpl_->workspace_bytes(rendered_.params); }
  bool workspace_scales() const override { return false; }  // Template::workspace_bytes bounds every size

  std::map<std::string, std::string> parameters() const override {
    std::map<std::string, std::string> out{{"template", tmpl_->name()}, {"arch", target_.arch}};
    for (const auto& [k, v] : rendered_.params) {
      if (v.kind() != templates::ParamKind::kCode) out[k] = v.short_text();
    }
    return out;
  }

 private:
  // Stream-K's flags, kept lowered for this choice's launches on `stream` (each launch leaves them lowered), so a
  // launch queues no memset (2-4 us of a 10-20 us decode GEMM in a graph). Per stream: one choice may serve several
  // problems' selections on concurrent streams. Made on a stream's first launch outside a graph capture; a launch
  // captured before that lowers the workspace's flags with a memset node instead (launch_gemm()'s default).
  Result<CUdeviceptr> lowered_flags(CUstream stream) const {
    std::lock_guard<std::mutex> lock(flags_mu_);
    for (const auto& [s, b] : flags_) {
      if (s == stream) return b.ptr();
    }
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d->cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE) {
      return CUdeviceptr{0};
    }
    // Out of memory, or another stream of this thread captured in global mode (which forbids allocations): the
    // launch lowers the workspace's flags itself, as before there were flags of the choice's own.
    auto b = DeviceBuffer::allocate(templates::kGemmFlagBytes);
    if (!b.ok()) return CUdeviceptr{0};
    KILN_RETURN_IF_ERROR(b->fill_bytes(0, stream));  // queued before the launch that first uses them
    flags_.emplace_back(stream, std::move(*b));
    return flags_.back().second.ptr();
  }

  templates::TemplatePtr tmpl_;
  templates::Rendered rendered_;
  Target target_;
  GeometryCache geometry_;
  bool takes_flags_ = false;
  mutable std::mutex flags_mu_;
  mutable std::vector<std::pair<CUstream, DeviceBuffer>> flags_;
};

class SubgraphChoice final : public Choice {
 public:
  SubgraphChoice(templates::Subgraph g, Target target, templates::Shape shape)
      : graph_(std::move(g)), target_(std::move(target)), shape_(shape) {}

  const std::string& name() const override { return graph_.name; }
  ChoiceKind kind() const override { return ChoiceKind::kSubgraph; }
  std::vector<CompileRequest> kernels() const override {
    std::vector<CompileRequest> out;
    for (const auto& s : graph_.steps) out.push_back({s.kernel.source, target_, s.kernel.compile_cost});
    return out;
  }
  Status prepare(const Binaries& binaries) override { return prepare_all(binaries, false); }
  Status prepare_deferred(const Binaries& binaries) override { return prepare_all(binaries, true); }
  Status run(const OpArgs& args, CUdeviceptr workspace, CUstream stream) const override {
    const auto* gemm = std::get_if<KilnGemmArgs>(&args);
    if (gemm == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} runs GEMMs only", name()));
    if (kernels_.size() != graph_.steps.size()) {
      return make_error(ErrorCode::kFailedPrecondition, fmt::format("{} was not prepared", name()));
    }
    std::vector<const Kernel*> ks;
    for (size_t i = 0; i < kernels_.size(); ++i) {
      auto k = kernels_[i].get();
      if (!k.ok()) return k.status().with_context(fmt::format("loading step {} of {}", i, name()));
      ks.push_back(*k);
    }
    if (gemm->m == shape_.m && gemm->n == shape_.n && gemm->k == shape_.k) {
      return templates::run(graph_, ks, *gemm, workspace, stream);
    }
    // Another size (a dispatcher bucket's neighbour): the same kernels with geometry for these sizes.
    templates::Subgraph resized = graph_;
    for (auto& step : resized.steps) {
      templates::Shape s{gemm->m, gemm->n, gemm->k, 1, step.split_k};
      KILN_ASSIGN_OR_RETURN(step.geometry, step.tmpl->geometry(step.kernel.params, s));
    }
    return templates::run(resized, ks, *gemm, workspace, stream);
  }
  size_t workspace_bytes() const override { return graph_.workspace_bytes; }
  /// Everything needed to rebuild the subgraph from a cached decision: the slice count and, per step, its
  /// template and parameters as "step<i>.<name>" (code parameters are the problem's epilogue).
  std::map<std::string, std::string> parameters() const override {
    std::map<std::string, std::string> out{{"arch", target_.arch}, {"subgraph", "splitk"}};
    for (size_t i = 0; i < graph_.steps.size(); ++i) {
      const auto& step = graph_.steps[i];
      const std::string prefix = fmt::format("step{}.", i);
      out[prefix + "template"] = step.tmpl->name();
      out[prefix + "config"] = step.kernel.config_name;
      for (const auto& [k, v] : step.kernel.params) {
        if (v.kind() != templates::ParamKind::kCode) out[prefix + k] = v.short_text();
      }
      if (step.binding != templates::Binding::kGemm) out["slices"] = std::to_string(step.split_k);
    }
    return out;
  }

 private:
  templates::Subgraph graph_;
  Target target_;
  templates::Shape shape_;
  Status prepare_all(const Binaries& binaries, bool defer) {
    if (binaries.size() != graph_.steps.size()) {
      return make_error(ErrorCode::kInternal, fmt::format("{}: expected {} binaries", name(), graph_.steps.size()));
    }
    std::vector<LazyKernel> kernels;
    for (const auto& b : binaries) {
      KILN_ASSIGN_OR_RETURN(LazyKernel k, prepare_kernel(b, defer));
      kernels.push_back(std::move(k));
    }
    kernels_ = std::move(kernels);
    return Status();
  }

  std::vector<LazyKernel> kernels_;
};

class UserChoice final : public OneKernelChoice {
 public:
  UserChoice(std::string name, KernelSource source, Target target, UserLaunch launch)
      : name_(std::move(name)), source_(std::move(source)), target_(std::move(target)), launch_(std::move(launch)) {}

  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kUser; }
  std::vector<CompileRequest> kernels() const override { return {{source_, target_}}; }
  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    KILN_ASSIGN_OR_RETURN(const Kernel* kernel, loaded());
    return launch_(*kernel, args, stream);
  }

 private:
  std::string name_;
  KernelSource source_;
  Target target_;
  UserLaunch launch_;
};

}  // namespace

ChoicePtr make_template_choice(templates::TemplatePtr tmpl, templates::Rendered rendered, Target target,
                               templates::Shape) {
  return std::make_shared<TemplateChoice>(std::move(tmpl), std::move(rendered), std::move(target));
}

ChoicePtr make_subgraph_choice(templates::Subgraph graph, Target target, templates::Shape shape) {
  return std::make_shared<SubgraphChoice>(std::move(graph), std::move(target), shape);
}

ChoicePtr make_user_choice(std::string name, KernelSource source, Target target, UserLaunch launch) {
  return std::make_shared<UserChoice>(std::move(name), std::move(source), std::move(target), std::move(launch));
}

}  // namespace kiln::runtime
