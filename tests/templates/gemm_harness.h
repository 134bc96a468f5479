// Runs one GEMM template configuration on one problem and checks it against the float64 reference: used by
// the GEMM GPU tests (and usable by any test that launches GEMM configurations). Needs a current context.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/templates.h"
#include "reference.h"

namespace kiln::testing {

using templates::GemmArgs;
using templates::Params;
using templates::Rendered;
using templates::Shape;
using templates::TemplatePtr;

/// One GEMM problem: sizes, dtypes, layouts and the epilogue. lda/ldb are dense (see dense_lda/dense_ldb).
struct GemmProblem {
  int64_t m = 1, n = 1, k = 1;
  DType in = DType::kBF16;
  Layout la = Layout::kRowMajor, lb = Layout::kRowMajor;
  EpilogueSpec ep;
  int splits = 1;  // > 1: partials into a workspace (the kernel alone, no reduction)
  std::string str() const {
    std::string s = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                    std::string(templates::dtype_name(in)) + " " + (la == Layout::kRowMajor ? "r" : "c") +
                    (lb == Layout::kRowMajor ? "r" : "c") + " " + ep.tag();
    if (splits > 1) s += " splitk" + std::to_string(splits);
    return s;
  }
};

/// Host data and the float64 reference of a problem (inputs random, never zeros).
struct GemmData {
  HostTensor a, b, bias, residual;
  HostEpilogue ep;
  std::vector<double> acc;  // A.B, float64, [m][n]
  std::vector<double> out;  // epilogue(A.B), float64, [m][n]
};

inline GemmData make_gemm_data(const GemmProblem& p, uint64_t seed) {
  GemmData d;
  const Shape s{p.m, p.n, p.k};
  const int64_t lda = templates::dense_lda(p.la, s), ldb = templates::dense_ldb(p.lb, s);
  d.a = random_tensor(p.in, static_cast<size_t>(p.m * p.k), seed * 4 + 1);
  d.b = random_tensor(p.in, static_cast<size_t>(p.k * p.n), seed * 4 + 2);
  d.bias = random_tensor(p.ep.bias_dtype, static_cast<size_t>(p.n), seed * 4 + 3, -2.f, 2.f);
  d.residual = random_tensor(p.ep.residual_dtype, static_cast<size_t>(p.m * p.n), seed * 4 + 4);
  d.ep.spec = p.ep;
  d.ep.bias = d.bias.values;
  d.ep.residual = d.residual.values;
  d.ep.ld_residual = p.n;
  d.ep.alpha = 0.5;
  d.ep.beta = 0.75;
  d.acc = reference_gemm(d.a.values, p.la, lda, d.b.values, p.lb, ldb, p.m, p.n, p.k);
  d.out.resize(d.acc.size());
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) d.out[i * p.n + j] = apply_epilogue(d.ep, d.acc[i * p.n + j], i, j);
  return d;
}

/// The bound on ||out - ref|| / ||ref|| for an output dtype (METHOD.md: bf16 <= 1e-2; fp32 accumulate ~1e-3).
inline double gemm_tolerance(DType out) {
  switch (out) {
    case DType::kBF16: return 1e-2;
    case DType::kF16: return 5e-3;
    case DType::kF32: return 1e-3;
  }
  return 1e-3;
}

/// A compiled configuration.
struct CompiledGemm {
  TemplatePtr tmpl;
  Rendered rendered;
  std::unique_ptr<Kernel> kernel;
  KernelAttributes attr;
};

/// Compiles (in parallel, on every core) and loads rendered configurations. Errors come back per entry.
inline std::vector<Result<CompiledGemm>> compile_rendered(
    const std::vector<std::pair<TemplatePtr, Result<Rendered>>>& rendered, const std::vector<Target>& targets) {
  std::vector<Result<Binary>> bins(rendered.size(), make_error(ErrorCode::kCancelled, "not compiled"));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < rendered.size();) {
      if (rendered[i].second.ok()) bins[i] = compile(rendered[i].second->source, targets[i]);
    }
  };
  std::vector<std::thread> threads;
  unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 32));
  for (unsigned t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  std::vector<Result<CompiledGemm>> out;
  for (size_t i = 0; i < rendered.size(); ++i) {
    if (!rendered[i].second.ok()) {
      out.push_back(rendered[i].second.status());
      continue;
    }
    const Rendered& r = *rendered[i].second;
    if (!bins[i].ok()) {
      out.push_back(bins[i].status().with_context("compiling " + r.config_name));
      continue;
    }
    auto k = load_kernel(*bins[i]);
    if (!k.ok()) {
      out.push_back(k.status().with_context("loading " + r.config_name));
      continue;
    }
    CompiledGemm c;
    c.tmpl = rendered[i].first;
    c.rendered = r;
    c.kernel = std::make_unique<Kernel>(std::move(*k));
    auto attr = c.kernel->attributes();
    if (attr.ok()) c.attr = *attr;
    out.push_back(std::move(c));
  }
  return out;
}

/// Renders `configs` (tunable and problem parameters), then compile_rendered().
inline std::vector<Result<CompiledGemm>> compile_all(const std::vector<std::pair<TemplatePtr, Params>>& configs,
                                                     const std::vector<Target>& targets) {
  std::vector<std::pair<TemplatePtr, Result<Rendered>>> rendered;
  for (const auto& [t, p] : configs) rendered.emplace_back(t, t->render(p));
  return compile_rendered(rendered, targets);
}

/// Device copies of a problem's inputs, and its output (or workspace) buffer.
struct GemmDevice {
  DeviceBuffer a, b, bias, residual, d, workspace;
};

inline Result<GemmDevice> upload_gemm(const GemmProblem& p, const GemmData& data) {
  GemmDevice g;
  KILN_ASSIGN_OR_RETURN(g.a, upload(data.a));
  KILN_ASSIGN_OR_RETURN(g.b, upload(data.b));
  KILN_ASSIGN_OR_RETURN(g.bias, upload(data.bias));
  KILN_ASSIGN_OR_RETURN(g.residual, upload(data.residual));
  KILN_ASSIGN_OR_RETURN(g.d, DeviceBuffer::allocate(static_cast<size_t>(p.m * p.n) * 4 + 16));
  KILN_ASSIGN_OR_RETURN(g.workspace, DeviceBuffer::allocate(static_cast<size_t>(std::max(p.splits, 3)) * p.m * p.n * 4 + 16));
  return g;
}

inline GemmArgs gemm_args(const GemmProblem& p, const GemmDevice& g) {
  GemmArgs a = templates::dense_gemm_args({p.m, p.n, p.k}, p.la, p.lb);
  a.a = g.a.as<void>();
  a.b = g.b.as<void>();
  a.d = g.d.as<void>();
  a.ep.bias = g.bias.as<void>();
  a.ep.residual = g.residual.as<void>();
  a.ep.ld_residual = p.n;
  a.ep.alpha = 0.5f;
  a.ep.beta = 0.75f;
  return a;
}

/// The K per slice kiln's split-K subgraph uses (make_splitk_gemm): ceil(K / slices) rounded up to 128.
inline int k_per_split(int64_t k, int slices) {
  int64_t kps = (k + slices - 1) / slices;
  return static_cast<int>((kps + 127) / 128 * 128);
}

/// Runs `c` on problem `p` (data uploaded in `g`), poisoning the output first, and returns the relative norm
/// error against the reference (NaN when an element was left unwritten). With p.splits > 1 the kernel writes
/// partials, which are summed on the host and compared with A.B. `lowered_flags`: launch_gemm()'s (stream-K);
/// `flags`: KilnGemmArgs::flags (KILN_GEMM_B_CONSTANT).
inline Result<double> run_and_check(const CompiledGemm& c, const GemmProblem& p, const GemmData& data,
                                    const GemmDevice& g, CUdeviceptr lowered_flags = 0, int flags = 0) {
  const Shape s{p.m, p.n, p.k, 1, 1};
  GemmArgs args = gemm_args(p, g);
  args.flags = flags;
  Shape gs = s;
  if (p.splits > 1) {
    args.split_k = static_cast<int>((p.k + k_per_split(p.k, p.splits) - 1) / k_per_split(p.k, p.splits));
    args.k_per_split = k_per_split(p.k, p.splits);
    args.workspace = g.workspace.as<float>();
    args.d = nullptr;
    gs.splits = args.split_k;
  }
  // A configuration's own workspace (stream-K), poisoned: its flags must start lowered whatever it held.
  DeviceBuffer own;
  if (const size_t bytes = c.tmpl->workspace_bytes(c.rendered.params); bytes > 0 && p.splits <= 1) {
    KILN_ASSIGN_OR_RETURN(own, DeviceBuffer::allocate(bytes));
    KILN_RETURN_IF_ERROR(poison(own));
    args.workspace = own.as<float>();
  }
  KILN_RETURN_IF_ERROR(c.tmpl->check_problem(c.rendered.params, gs));
  KILN_ASSIGN_OR_RETURN(templates::Launch geo, c.tmpl->geometry(c.rendered.params, gs));
  KILN_RETURN_IF_ERROR(poison(g.d));
  KILN_RETURN_IF_ERROR(poison(g.workspace));
  KILN_RETURN_IF_ERROR(templates::launch_gemm(*c.kernel, c.rendered.params, geo, args, nullptr, lowered_flags));
  KILN_ASSIGN_OR_RETURN(const DriverApi* api, driver());
  KILN_CHECK(api->cuCtxSynchronize());
  if (p.splits > 1) {
    const size_t n = static_cast<size_t>(args.split_k) * p.m * p.n;
    std::vector<uint8_t> bytes(n * 4);
    KILN_RETURN_IF_ERROR(g.workspace.copy_to_host(bytes.data(), bytes.size()));
    std::vector<double> parts = to_doubles(DType::kF32, bytes, n), sum(static_cast<size_t>(p.m * p.n), 0.0);
    for (int z = 0; z < args.split_k; ++z)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += parts[z * sum.size() + i];
    return rel_norm_error(sum, p.n, data.acc, p.m, p.n);
  }
  const size_t n = static_cast<size_t>(p.m * p.n);
  std::vector<uint8_t> bytes(n * dtype_size(p.ep.out));
  KILN_RETURN_IF_ERROR(g.d.copy_to_host(bytes.data(), bytes.size()));
  return rel_norm_error(to_doubles(p.ep.out, bytes, n), p.n, data.out, p.m, p.n);
}

}  // namespace kiln::testing
