// Family launch helpers and subgraphs (see kiln/templates/launch.h).
#include "kiln/templates/launch.h"

#include <array>
#include <atomic>
#include <initializer_list>

#include <fmt/format.h>

#include "env.h"
#include "families.h"
#include "kiln/enum_names.h"
#include "kiln/templates/registry.h"

namespace kiln::templates {

namespace {
std::atomic<bool> g_programmatic{detail::env_switch_on("KILN_PDL")};
}  // namespace

bool programmatic_launch_enabled() { return g_programmatic.load(std::memory_order_relaxed); }
void set_programmatic_launch(bool on) { g_programmatic.store(on, std::memory_order_relaxed); }

EpilogueArgs default_epilogue_args() {
  EpilogueArgs e{};
  e.alpha = 1.f;
  e.beta = 1.f;
  return e;
}

namespace {
Status bad(std::string msg) { return make_error(ErrorCode::kInvalidArgument, std::move(msg)); }

// Launch::align_bytes / align_elems: what the configuration's vector accesses need (see template.h). An
// operand's pointer must be aligned to align_bytes (a null one is not checked) and each leading dimension that
// is used a multiple of align_elems; errors name the operand as "<op>: <name>".
struct Pointer {
  const void* p;
  const char* name;
};
struct Stride {
  long long ld;
  const char* name;
  bool used = true;
};
Status check_alignment(const Launch& g, const char* op, std::initializer_list<Pointer> pointers,
                       std::initializer_list<Stride> strides) {
  for (const Pointer& o : pointers) {
    if (o.p && g.align_bytes > 1 && reinterpret_cast<uintptr_t>(o.p) % g.align_bytes) {
      return bad(fmt::format("{}: {} ({}) is not aligned to the {} bytes this configuration's vector accesses need",
                             op, o.name, o.p, g.align_bytes));
    }
  }
  for (const Stride& o : strides) {
    if (o.used && g.align_elems > 1 && o.ld % g.align_elems) {
      return bad(fmt::format("{}: {} = {} is not a multiple of {} (this configuration's vector width)", op, o.name,
                             o.ld, g.align_elems));
    }
  }
  return Status();
}

template <class Args>
Status launch_struct(const Kernel& kernel, const Launch& g, const Args& args, CUstream stream) {
  if (g.grid.x == 0 || g.grid.y == 0 || g.grid.z == 0) return Status();  // an empty problem: nothing to do
  return kernel(g.config(stream), args);
}
}  // namespace

Status launch(const Kernel& kernel, const Launch& g, const GemmArgs& a, CUstream stream) {
  if (a.m < 0 || a.n < 0 || a.k < 0) return bad("gemm: negative size");
  if (a.split_k < 1 || a.k_per_split < 0) return bad("gemm: split_k must be >= 1 and k_per_split >= 0");
  if ((a.m && a.n && a.k) && (!a.a || !a.b)) return bad("gemm: null A or B");
  if (a.split_k > 1 && !a.workspace) return bad("gemm: split-K partials need a workspace");
  KILN_RETURN_IF_ERROR(check_alignment(g, "gemm", {{a.a, "a"}, {a.b, "b"}, {a.d, "d"}},
                                       {{a.lda, "lda"}, {a.ldb, "ldb"}, {a.ldd, "ldd", a.d != nullptr}}));
  return launch_struct(kernel, g, a, stream);
}

Status launch(const Kernel& kernel, const Launch& g, const NormArgs& a, CUstream stream) {
  if (a.rows < 0 || a.cols < 0) return bad("norm: negative size");
  if (a.rows && a.cols && (!a.x || !a.y || !a.weight)) return bad("norm: null x, y or weight");
  KILN_RETURN_IF_ERROR(check_alignment(g, "norm",
                                       {{a.x, "x"},
                                        {a.residual, "residual"},
                                        {a.residual_out, "residual_out"},
                                        {a.weight, "weight"},
                                        {a.bias, "bias"},
                                        {a.y, "y"}},
                                       {{a.ld_x, "ld_x"},
                                        {a.ld_residual, "ld_residual", a.residual != nullptr},
                                        {a.ld_residual_out, "ld_residual_out", a.residual_out != nullptr},
                                        {a.ld_y, "ld_y"}}));
  return launch_struct(kernel, g, a, stream);
}

Status launch(const Kernel& kernel, const Launch& g, const SoftmaxArgs& a, CUstream stream) {
  if (a.rows < 0 || a.cols < 0) return bad("softmax: negative size");
  if (a.rows && a.cols && (!a.x || !a.y)) return bad("softmax: null x or y");
  KILN_RETURN_IF_ERROR(check_alignment(g, "softmax", {{a.x, "x"}, {a.y, "y"}}, {{a.ld_x, "ld_x"}, {a.ld_y, "ld_y"}}));
  return launch_struct(kernel, g, a, stream);
}

Status launch(const Kernel& kernel, const Launch& g, const SplitKReduceArgs& a, CUstream stream) {
  if (a.m < 0 || a.n < 0 || a.slices < 1) return bad("splitk_reduce: negative size or slices < 1");
  if (a.m && a.n && (!a.workspace || !a.d)) return bad("splitk_reduce: null workspace or d");
  return launch_struct(kernel, g, a, stream);
}

// ------------------------------------------------------------------------------------------------ subgraphs

std::string_view binding_name(Binding b) {
  static constexpr std::array<EnumName<Binding>, 3> kNames{
      {{Binding::kGemm, "gemm"}, {Binding::kGemmPartials, "gemm_partials"}, {Binding::kSplitKReduce, "splitk_reduce"}}};
  return name_in(kNames, b, "?");
}

Result<Subgraph> make_splitk_gemm(const TemplatePtr& gemm, const Params& gemm_params, const Params& reduce_params,
                                  const EpilogueSpec& epilogue, const Shape& shape, int slices) {
  if (!gemm) return bad("split-K: no GEMM template");
  if (slices < 1) return bad(fmt::format("split-K: slices must be >= 1, got {}", slices));
  if (shape.m < 1 || shape.n < 1 || shape.k < 1) return bad("split-K: m, n and k must be >= 1");
  const ParamSpec* partials = gemm->param("partials");
  if (!partials || partials->kind != ParamKind::kBool || partials->role != ParamRole::kProblem) {
    return bad(fmt::format("split-K: template '{}' has no bool problem parameter 'partials'", gemm->name()));
  }
  int64_t kps = (shape.k + slices - 1) / slices;
  kps = (kps + 127) / 128 * 128;
  int real_slices = static_cast<int>((shape.k + kps - 1) / kps);

  Subgraph g;
  SubgraphStep s0;
  s0.tmpl = gemm;
  Params gp = gemm_params;
  gp.insert_or_assign("partials", Value::boolean(true));
  KILN_ASSIGN_OR_RETURN(s0.kernel, gemm->render(gp));
  Shape gs = shape;
  gs.splits = real_slices;
  KILN_ASSIGN_OR_RETURN(s0.geometry, gemm->geometry(gp, gs));
  s0.binding = Binding::kGemmPartials;
  s0.split_k = real_slices;
  s0.k_per_split = static_cast<int>(kps);

  KILN_ASSIGN_OR_RETURN(TemplatePtr reduce, find_template("splitk_reduce"));
  SubgraphStep s1;
  s1.tmpl = reduce;
  Params rp = reduce_params;
  rp.insert_or_assign("epilogue", epilogue_value(epilogue));
  KILN_ASSIGN_OR_RETURN(s1.kernel, reduce->render(rp));
  Shape rs{shape.m, shape.n, 1, 1, real_slices};
  KILN_ASSIGN_OR_RETURN(s1.geometry, reduce->geometry(rp, rs));
  s1.binding = Binding::kSplitKReduce;
  s1.split_k = real_slices;

  g.name = fmt::format("splitk{}_{}_{}", real_slices, s0.kernel.config_name, s1.kernel.config_name);
  g.workspace_bytes = static_cast<size_t>(real_slices) * shape.m * shape.n * sizeof(float);
  g.steps.push_back(std::move(s0));
  g.steps.push_back(std::move(s1));
  return g;
}

Status run(const Subgraph& graph, const std::vector<const Kernel*>& kernels, const GemmArgs& args,
           CUdeviceptr workspace, CUstream stream) {
  if (kernels.size() != graph.steps.size()) {
    return bad(fmt::format("subgraph '{}': {} kernels for {} steps", graph.name, kernels.size(), graph.steps.size()));
  }
  if (graph.workspace_bytes && !workspace) return bad(fmt::format("subgraph '{}' needs a workspace", graph.name));
  float* ws = reinterpret_cast<float*>(static_cast<uintptr_t>(workspace));
  for (size_t i = 0; i < graph.steps.size(); ++i) {
    const SubgraphStep& s = graph.steps[i];
    if (!kernels[i]) return bad(fmt::format("subgraph '{}': no kernel for step {}", graph.name, i));
    Status st;
    switch (s.binding) {
      case Binding::kGemm:
        st = s.tmpl->def().gemm_launch ? s.tmpl->def().gemm_launch(*kernels[i], s.kernel.params, s.geometry, args, stream, 0)
                                       : launch(*kernels[i], s.geometry, args, stream);
        break;
      case Binding::kGemmPartials: {
        GemmArgs a = args;
        a.d = nullptr;
        a.workspace = ws;
        a.split_k = s.split_k;
        a.k_per_split = s.k_per_split;
        st = s.tmpl->def().gemm_launch ? s.tmpl->def().gemm_launch(*kernels[i], s.kernel.params, s.geometry, a, stream, 0)
                                       : launch(*kernels[i], s.geometry, a, stream);
        break;
      }
      case Binding::kSplitKReduce: {
        SplitKReduceArgs r{};
        r.workspace = ws;
        r.d = args.d;
        r.m = args.m;
        r.n = args.n;
        r.slices = s.split_k;
        r.slice_stride = static_cast<long long>(args.m) * args.n;
        r.ldd = args.ldd;
        r.ep = args.ep;
        st = launch(*kernels[i], s.geometry, r, stream);
        break;
      }
    }
    if (!st.ok()) return std::move(st).with_context(fmt::format("step {} ({}) of subgraph '{}'", i, s.kernel.config_name, graph.name));
  }
  return Status();
}

}  // namespace kiln::templates
