// Extern choices: cuBLAS's default GEMM, cuBLASLt's algorithms, and unfused extern GEMM + epilogue pairs.
#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include "cublas_gemm.h"
#include "kiln/runtime/extern_choices.h"
#include "kiln/templates/registry.h"

namespace kiln::runtime {

using detail::cublas_default_gemm;
using detail::LtAlgo;
using detail::LtGemm;

namespace {

class CublasDefaultChoice final : public Choice {
 public:
  explicit CublasDefaultChoice(const GemmProblem& p, DType out) : p_(p), out_(out) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kExtern; }
  // Like cuBLASLt's below: a warm start does not wait for the handles (cuBLAS's needs cuBLASLt's); they are
  // made on a background thread and the first run() waits for them if they are not ready by then.
  Status prepare(const Binaries&) override {
    detail::start_lt_context(/*with_cublas=*/true);
    return Status();
  }
  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    const auto* a = std::get_if<KilnGemmArgs>(&args);
    if (a == nullptr) return make_error(ErrorCode::kInvalidArgument, "cublas_default runs GEMMs only");
    return cublas_default_gemm(p_, out_, *a, stream);
  }
  std::map<std::string, std::string> parameters() const override {
    return {{"library", "cublas"}, {"algo", "CUBLAS_GEMM_DEFAULT"}, {"version", cublas_version()}};
  }

 private:
  GemmProblem p_;
  DType out_;
  std::string name_ = "cublas_default";
};

class CublasLtChoice final : public Choice, public std::enable_shared_from_this<CublasLtChoice> {
 public:
  CublasLtChoice(const GemmProblem& p, bool fuse, DType plain_out, std::string algo)
      : p_(p), fuse_(fuse), plain_out_(plain_out), name_(std::move(algo)) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kExtern; }
  // A warm start must not wait for cuBLASLt's first handle in the context (~70 ms): while there is none,
  // prepare() starts making it on a background thread and the choice finishes preparing at its first run
  // (host work only: descriptors and the named algorithm), which waits for the handle if it is not ready yet.
  Status prepare(const Binaries&) override {
    prepared_ = true;
    if (!detail::lt_context_ready()) {
      detail::start_lt_context();
      return Status();
    }
    return build();
  }
  // A cached decision: even with the handle made, building waits for cuBLASLt's first descriptor and
  // algorithm calls in the process (~70 ms on an H200): that happens on the start-up thread after the handle,
  // and the first run() builds itself (or waits for that build) if it comes first.
  Status prepare_deferred(const Binaries&) override {
    prepared_ = true;
    detail::start_lt_context();
    detail::run_in_lt_start([weak = weak_from_this()] {
      if (auto self = weak.lock()) (void)self->build();  // a failure is the first run's to report
    });
    return Status();
  }
  Status run(const OpArgs& args, CUdeviceptr, CUstream stream) const override {
    const auto* a = std::get_if<KilnGemmArgs>(&args);
    if (a == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} runs GEMMs only", name_));
    if (!built_.load(std::memory_order_acquire)) {
      if (!prepared_) return make_error(ErrorCode::kFailedPrecondition, fmt::format("{} was not prepared", name_));
      KILN_RETURN_IF_ERROR(build());
    }
    return gemm_->run(&algo_, *a, stream);
  }
  std::map<std::string, std::string> parameters() const override {
    return {{"library", "cublasLt"}, {"fused_epilogue", fuse_ ? "true" : "false"}, {"version", cublas_version()}};
  }

 private:
  Status build() const {
    std::lock_guard lock(build_mu_);
    if (built_.load(std::memory_order_relaxed)) return Status();
    KILN_ASSIGN_OR_RETURN(gemm_, LtGemm::create(p_, fuse_, plain_out_));
    KILN_ASSIGN_OR_RETURN(LtAlgo a, gemm_->algorithm(name_));
    algo_ = std::move(a);
    built_.store(true, std::memory_order_release);
    return Status();
  }

  GemmProblem p_;
  bool fuse_;
  DType plain_out_;
  std::string name_;
  bool prepared_ = false;
  mutable std::mutex build_mu_;
  mutable std::atomic<bool> built_{false};
  mutable std::unique_ptr<LtGemm> gemm_;
  mutable LtAlgo algo_;
};

class UnfusedChoice final : public Choice {
 public:
  UnfusedChoice(const GemmProblem& p, ChoicePtr gemm, templates::TemplatePtr reduce, templates::Rendered r, Target t)
      : p_(p), gemm_(std::move(gemm)), reduce_(std::move(reduce)), rendered_(std::move(r)), target_(std::move(t)) {
    name_ = fmt::format("unfused_{}_{}", gemm_->name(), rendered_.config_name);
  }
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return ChoiceKind::kSubgraph; }
  std::vector<CompileRequest> kernels() const override {
    auto out = gemm_->kernels();
    out.push_back({rendered_.source, target_, rendered_.compile_cost});
    return out;
  }
  Status prepare(const Binaries& binaries) override { return prepare_both(binaries, false); }
  Status prepare_deferred(const Binaries& binaries) override { return prepare_both(binaries, true); }
  size_t workspace_bytes() const override { return static_cast<size_t>(p_.m * p_.n) * sizeof(float); }
  Status run(const OpArgs& args, CUdeviceptr workspace, CUstream stream) const override {
    const auto* a = std::get_if<KilnGemmArgs>(&args);
    if (a == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} runs GEMMs only", name_));
    if (!reduce_kernel_) return make_error(ErrorCode::kFailedPrecondition, fmt::format("{} was not prepared", name_));
    if (workspace == 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} needs a workspace", name_));
    KilnGemmArgs plain = *a;
    plain.d = reinterpret_cast<void*>(workspace);
    plain.ldd = a->n;
    KILN_RETURN_IF_ERROR(gemm_->run(plain, 0, stream));
    KilnSplitKReduceArgs r{};
    r.workspace = reinterpret_cast<const float*>(workspace);
    r.d = a->d;
    r.m = a->m;
    r.n = a->n;
    r.slices = 1;
    r.slice_stride = static_cast<long long>(a->m) * a->n;
    r.ldd = a->ldd;
    r.ep = a->ep;
    templates::Shape s{a->m, a->n, 1, 1, 1};
    KILN_ASSIGN_OR_RETURN(templates::Launch g, reduce_->geometry(rendered_.params, s));
    auto reduce = reduce_kernel_->get();
    if (!reduce.ok()) return reduce.status().with_context(fmt::format("loading {}'s epilogue kernel", name_));
    return templates::launch(**reduce, g, r, stream);
  }
  std::map<std::string, std::string> parameters() const override {
    return {{"gemm", gemm_->name()}, {"epilogue_kernel", rendered_.config_name}};
  }

 private:
  GemmProblem p_;
  ChoicePtr gemm_;
  templates::TemplatePtr reduce_;
  templates::Rendered rendered_;
  Target target_;
  Status prepare_both(const Binaries& binaries, bool defer) {
    if (binaries.empty()) return make_error(ErrorCode::kInternal, fmt::format("{}: no binaries", name_));
    Binaries inner(binaries.begin(), binaries.end() - 1);
    KILN_RETURN_IF_ERROR(defer ? gemm_->prepare_deferred(inner) : gemm_->prepare(inner));
    KILN_ASSIGN_OR_RETURN(LazyKernel k, prepare_kernel(binaries.back(), defer));
    reduce_kernel_.emplace(std::move(k));
    return Status();
  }

  std::string name_;
  std::optional<LazyKernel> reduce_kernel_;
};

}  // namespace

ChoicePtr make_cublas_default_choice(const GemmProblem& p) {
  return std::make_shared<CublasDefaultChoice>(p, p.epilogue.out);
}

ChoicePtr make_cublaslt_choice(const GemmProblem& p, bool fuse, DType plain_out, std::string algo_name) {
  return std::make_shared<CublasLtChoice>(p, fuse, plain_out, std::move(algo_name));
}

Result<ChoicePtr> make_unfused_choice(const GemmProblem& p, ChoicePtr plain_gemm, const Target& target) {
  KILN_ASSIGN_OR_RETURN(templates::TemplatePtr reduce, templates::find_template("splitk_reduce"));
  templates::Params params{{"dtype", templates::Value::dtype(p.epilogue.out)},
                           {"epilogue", templates::epilogue_value(p.epilogue)},
                           {"threads", templates::Value::integer(256)},
                           {"vec", templates::Value::integer(4)}};
  // Only the tunables this template declares go in; any other problem parameter it has keeps its grid default.
  templates::Params given;
  for (const auto& spec : reduce->params()) {
    if (spec.role == templates::ParamRole::kDerived) continue;
    if (auto it = params.find(spec.name); it != params.end()) given.emplace(spec.name, it->second);
    else if (!spec.values.empty()) given.emplace(spec.name, spec.values.front());
  }
  KILN_ASSIGN_OR_RETURN(templates::Rendered r, reduce->render(given));
  return ChoicePtr(std::make_shared<UnfusedChoice>(p, std::move(plain_gemm), std::move(reduce), std::move(r), target));
}

ChoicePtr make_cublas_default_choice_f32(const GemmProblem& p) {
  GemmProblem plain = p;
  plain.epilogue = EpilogueSpec{};
  plain.epilogue.out = DType::kF32;
  return make_cublas_default_choice(plain);
}

Result<std::vector<std::string>> cublaslt_algorithms(const GemmProblem& p, bool fuse, DType plain_out, int max_algos) {
  KILN_ASSIGN_OR_RETURN(auto gemm, LtGemm::create(p, fuse, plain_out));
  KILN_ASSIGN_OR_RETURN(std::vector<LtAlgo> algos, gemm->algorithms(max_algos));
  std::vector<std::string> names;
  for (const auto& a : algos) names.push_back(a.name);
  return names;
}

bool cublaslt_can_fuse(const GemmProblem& p, std::string* why_not) {
  detail::LtEpilogue e = detail::lt_epilogue(p);
  if (why_not != nullptr) *why_not = e.why_not;
  return e.fusable;
}

std::string cublas_version() { return detail::cublas_version(); }

}  // namespace kiln::runtime
