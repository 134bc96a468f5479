// The C API's built-in ops on raw device pointers (GEMM with epilogues, RMSNorm, softmax; the all-reduce is in
// capi_collective.cpp), workloads (precompile, warm-up) and the cache (stats, export, import).
#include <fmt/format.h>

#include "capi_args.h"
#include "kiln/cache/bundle.h"
#include "kiln/cache/signing.h"
#include "kiln/cache/store.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/workload.h"
#include "kiln/templates/gemm.h"

using namespace kiln;

namespace {

template <class T>
T* ptr(uint64_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

Status run_tuned(kiln_context* ctx, const runtime::Problem& problem, const runtime::OpArgs& args, void* stream) {
  KILN_ASSIGN_OR_RETURN(runtime::Tuner * tuner, ctx->get_tuner());
  KILN_ASSIGN_OR_RETURN(auto sel, tuner->tune(problem));
  return sel->run(args, static_cast<CUstream>(stream));
}

}  // namespace

extern "C" {

KILN_API void kiln_gemm_args_init(kiln_gemm_args* a) {
  if (!capi::init_struct(a)) return;
  a->a_dtype = a->b_dtype = a->d_dtype = KILN_BF16;
  a->alpha = a->beta = 1.0f;
}

KILN_API kiln_status kiln_gemm(kiln_context* ctx, const kiln_gemm_args* given, void* stream) {
  return capi::entry("kiln_gemm", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    KILN_ASSIGN_OR_RETURN(kiln_gemm_args g,
                          capi::read_struct(given, kiln_gemm_args_init, "args", offsetof(kiln_gemm_args, b_constant)));
    KILN_RETURN_IF_ERROR(arg.positive({{"m", g.m}, {"n", g.n}, {"k", g.k}}));
    if (g.a == 0 || g.b == 0 || g.d == 0) return arg.bad("a, b and d must be device pointers");
    KILN_ASSIGN_OR_RETURN(kiln_layout a_layout, capi::checked_enum(g.a_layout, KILN_ROW_MAJOR, KILN_COL_MAJOR, "kiln_layout", "args.a_layout"));
    KILN_ASSIGN_OR_RETURN(kiln_layout b_layout, capi::checked_enum(g.b_layout, KILN_ROW_MAJOR, KILN_COL_MAJOR, "kiln_layout", "args.b_layout"));
    runtime::GemmProblem p;
    p.m = g.m;
    p.n = g.n;
    p.k = g.k;
    KILN_ASSIGN_OR_RETURN(p.a, capi::dtype_of(g.a_dtype, "args.a_dtype"));
    KILN_ASSIGN_OR_RETURN(p.b, capi::dtype_of(g.b_dtype, "args.b_dtype"));
    KILN_ASSIGN_OR_RETURN(templates::DType out, capi::dtype_of(g.d_dtype, "args.d_dtype"));
    p.a_layout = a_layout == KILN_ROW_MAJOR ? templates::Layout::kRowMajor : templates::Layout::kColMajor;
    p.b_layout = b_layout == KILN_ROW_MAJOR ? templates::Layout::kRowMajor : templates::Layout::kColMajor;
    KILN_ASSIGN_OR_RETURN(p.epilogue, templates::parse_epilogue(capi::str(g.epilogue), out));
    if (g.b_constant != 0 && g.b_constant != 1) return arg.bad("b_constant must be 0 or 1");
    p.b_constant = g.b_constant == 1;
    if (p.epilogue.has(templates::EpilogueOp::kBias) && g.bias == 0) {
      return arg.bad("the epilogue adds a bias, and bias is 0");
    }
    if (p.epilogue.has(templates::EpilogueOp::kResidual) && g.residual == 0) {
      return arg.bad("the epilogue adds a residual, and residual is 0");
    }
    const runtime::Problem problem = runtime::Problem::gemm(p);
    KILN_RETURN_IF_ERROR(problem.validate());
    KilnGemmArgs a{};
    a.a = ptr<const void>(g.a);
    a.b = ptr<const void>(g.b);
    a.d = ptr<void>(g.d);
    a.m = static_cast<int>(g.m);
    a.n = static_cast<int>(g.n);
    a.k = static_cast<int>(g.k);
    a.split_k = 1;
    a.k_per_split = a.k;
    a.lda = templates::dense_lda(p.a_layout, problem.shape());
    a.ldb = templates::dense_ldb(p.b_layout, problem.shape());
    a.ldd = g.n;
    a.ep.bias = ptr<const void>(g.bias);
    a.ep.residual = ptr<const void>(g.residual);
    a.ep.ld_residual = g.ld_residual == 0 ? g.n : g.ld_residual;
    a.ep.alpha = g.alpha;
    a.ep.beta = g.beta;
    if (p.b_constant) a.flags |= KILN_GEMM_B_CONSTANT;
    return run_tuned(ctx, problem, a, stream);
  });
}

KILN_API void kiln_rmsnorm_args_init(kiln_rmsnorm_args* a) {
  if (!capi::init_struct(a)) return;
  a->dtype = KILN_BF16;
  a->eps = 1e-6f;
}

KILN_API kiln_status kiln_rmsnorm(kiln_context* ctx, const kiln_rmsnorm_args* given, void* stream) {
  return capi::entry("kiln_rmsnorm", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    KILN_ASSIGN_OR_RETURN(kiln_rmsnorm_args g, capi::read_struct(given, kiln_rmsnorm_args_init, "args"));
    KILN_RETURN_IF_ERROR(arg.positive({{"rows", g.rows}, {"cols", g.cols}}));
    if (g.x == 0 || g.weight == 0 || g.y == 0) return arg.bad("x, weight and y must be device pointers");
    if ((g.residual == 0) != (g.residual_out == 0)) {
      return arg.bad("residual and residual_out must be both set or both 0");
    }
    runtime::NormProblem p;
    p.rows = g.rows;
    p.cols = g.cols;
    KILN_ASSIGN_OR_RETURN(p.dtype, capi::dtype_of(g.dtype, "args.dtype"));
    p.residual = g.residual != 0;
    p.eps = g.eps;
    KilnNormArgs a{};
    a.x = ptr<const void>(g.x);
    a.residual = ptr<const void>(g.residual);
    a.residual_out = ptr<void>(g.residual_out);
    a.weight = ptr<const void>(g.weight);
    a.y = ptr<void>(g.y);
    a.rows = static_cast<int>(g.rows);
    a.cols = static_cast<int>(g.cols);
    a.ld_x = a.ld_residual = a.ld_residual_out = a.ld_y = g.cols;
    a.eps = g.eps;
    const runtime::Problem problem = runtime::Problem::norm(p);
    KILN_RETURN_IF_ERROR(problem.validate());
    return run_tuned(ctx, problem, a, stream);
  });
}

KILN_API void kiln_softmax_args_init(kiln_softmax_args* a) {
  if (!capi::init_struct(a)) return;
  a->dtype = KILN_BF16;
  a->scale = 1.0f;
}

KILN_API kiln_status kiln_softmax(kiln_context* ctx, const kiln_softmax_args* given, void* stream) {
  return capi::entry("kiln_softmax", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    KILN_ASSIGN_OR_RETURN(kiln_softmax_args g, capi::read_struct(given, kiln_softmax_args_init, "args"));
    KILN_RETURN_IF_ERROR(arg.positive({{"rows", g.rows}, {"cols", g.cols}}));
    if (g.x == 0 || g.y == 0) return arg.bad("x and y must be device pointers");
    runtime::SoftmaxProblem p;
    p.rows = g.rows;
    p.cols = g.cols;
    KILN_ASSIGN_OR_RETURN(p.dtype, capi::dtype_of(g.dtype, "args.dtype"));
    p.scale = g.scale;
    KilnSoftmaxArgs a{};
    a.x = ptr<const void>(g.x);
    a.y = ptr<void>(g.y);
    a.rows = static_cast<int>(g.rows);
    a.cols = static_cast<int>(g.cols);
    a.ld_x = a.ld_y = g.cols;
    a.scale = g.scale;
    const runtime::Problem problem = runtime::Problem::softmax(p);
    KILN_RETURN_IF_ERROR(problem.validate());
    return run_tuned(ctx, problem, a, stream);
  });
}

// ---- workloads

KILN_API kiln_status kiln_precompile_workload(kiln_context* ctx, const char* workload_json, const char* arch,
                                              kiln_workload_report* report) {
  return capi::entry("kiln_precompile_workload", [&](const capi::Args& arg) -> Status {
    if (ctx == nullptr || workload_json == nullptr) return arg.bad("ctx and workload_json must not be NULL");
    if (report != nullptr) KILN_RETURN_IF_ERROR(capi::check_out_struct(report, arg.fn(), "report"));
    KILN_ASSIGN_OR_RETURN(runtime::Workload w, runtime::parse_workload(workload_json));
    KILN_ASSIGN_OR_RETURN(Target t, ctx->target(arch));
    kiln_workload_report r{};
    for (const auto& p : w.problems) {
      KILN_ASSIGN_OR_RETURN(runtime::PrecompileReport pr,
                            runtime::precompile_problem(runtime::default_ops(), p, t, *ctx->gate, runtime::TuneOptions{}));
      ++r.problems;
      r.kernels += pr.kernels;
      r.cached += pr.cached;
      r.failed += pr.failed;
      r.seconds += pr.seconds;
    }
    if (report != nullptr) capi::write_struct(report, r);
    return Status();
  });
}

KILN_API kiln_status kiln_warmup_workload(kiln_context* ctx, const char* workload_json, kiln_workload_report* report) {
  return capi::entry("kiln_warmup_workload", [&](const capi::Args& arg) -> Status {
    if (ctx == nullptr || workload_json == nullptr) return arg.bad("ctx and workload_json must not be NULL");
    if (report != nullptr) KILN_RETURN_IF_ERROR(capi::check_out_struct(report, arg.fn(), "report"));
    KILN_ASSIGN_OR_RETURN(runtime::Workload w, runtime::parse_workload(workload_json));
    KILN_ASSIGN_OR_RETURN(runtime::Tuner * tuner, ctx->get_tuner());
    kiln_workload_report r{};
    for (const auto& p : w.problems) {
      KILN_ASSIGN_OR_RETURN(auto sel, tuner->tune(p));
      ++r.problems;
      ++r.decisions;
      r.seconds += sel->report().total_seconds;
    }
    if (report != nullptr) capi::write_struct(report, r);
    return Status();
  });
}

// ---- the cache

KILN_API kiln_status kiln_cache_stats_get(kiln_context* ctx, kiln_cache_stats* stats) {
  return capi::entry("kiln_cache_stats_get", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    KILN_RETURN_IF_ERROR(capi::check_out_struct(stats, arg.fn(), "stats"));
    cache::Store* store = ctx->cache->store();
    if (store == nullptr) return make_error(ErrorCode::kFailedPrecondition, "this context has no cache (tune mode off)");
    KILN_ASSIGN_OR_RETURN(cache::StoreStats s, store->stats());
    kiln_cache_stats out{};
    out.binaries = s.binaries;
    out.binary_bytes = s.binary_bytes;
    out.timings = s.timings;
    out.failures = s.failures;
    out.decisions = s.decisions;
    out.stale = s.stale;
    out.disk_bytes = s.disk_bytes;
    capi::write_struct(stats, out);
    return Status();
  });
}

}  // extern "C": C++ helpers below have C++ linkage

namespace {

cache::Store* store_of(kiln_context* ctx) { return ctx->cache->store(); }

Status export_to(const capi::Args& arg, kiln_context* ctx, const char* path, int binaries, const char* key_file) {
  if (ctx == nullptr || path == nullptr || *path == '\0') return arg.bad("ctx and path must be given");
  cache::Store* store = store_of(ctx);
  if (store == nullptr) return make_error(ErrorCode::kFailedPrecondition, "this context has no cache (tune mode off)");
  cache::ExportOptions o;
  o.binaries = binaries != 0;
  if (key_file != nullptr) {
    KILN_ASSIGN_OR_RETURN(o.sign_with, cache::SigningKey::load(key_file));
  }
  return cache::export_bundle(*store, path, o).status();
}

}  // namespace

extern "C" {

KILN_API kiln_status kiln_cache_export(kiln_context* ctx, const char* path, int binaries) {
  return capi::entry("kiln_cache_export",
                     [&](const capi::Args& arg) { return export_to(arg, ctx, path, binaries, nullptr); });
}

KILN_API kiln_status kiln_cache_export_signed(kiln_context* ctx, const char* path, int binaries, const char* sign_key_file) {
  return capi::entry("kiln_cache_export_signed", [&](const capi::Args& arg) -> Status {
    if (sign_key_file == nullptr || *sign_key_file == '\0') return arg.bad("sign_key_file must be given");
    return export_to(arg, ctx, path, binaries, sign_key_file);
  });
}

KILN_API void kiln_import_trust_init(kiln_import_trust* trust) {
  if (!capi::init_struct(trust)) return;
}

KILN_API kiln_status kiln_cache_import_trusted(kiln_context* ctx, const char* path, const kiln_import_trust* trust,
                                               size_t* imported, size_t* rejected, int* binaries_trusted) {
  return capi::entry("kiln_cache_import_trusted", [&](const capi::Args& arg) -> Status {
    if (ctx == nullptr || path == nullptr || *path == '\0') return arg.bad("ctx and path must be given");
    cache::Store* store = store_of(ctx);
    if (store == nullptr) return make_error(ErrorCode::kFailedPrecondition, "this context has no cache (tune mode off)");
    kiln_import_trust t;
    kiln_import_trust_init(&t);
    if (trust != nullptr) {
      KILN_ASSIGN_OR_RETURN(t, capi::read_struct(trust, kiln_import_trust_init, "trust"));
    }
    if (t.trusted_key_count > 0 && t.trusted_key_files == nullptr) {
      return arg.bad("trusted_key_count > 0 but trusted_key_files is NULL");
    }
    cache::ImportOptions o;
    o.trust_unsigned = t.trust_unsigned != 0;
    for (size_t i = 0; i < t.trusted_key_count; ++i) {
      if (t.trusted_key_files[i] == nullptr) {
        return arg.bad(fmt::format("trusted_key_files[{}] is NULL", i));
      }
      KILN_ASSIGN_OR_RETURN(cache::SigningKey key, cache::SigningKey::load(t.trusted_key_files[i]));
      o.trusted_keys.push_back(std::move(key));
    }
    KILN_ASSIGN_OR_RETURN(cache::ImportReport r, cache::import_bundle(*store, path, o));
    if (imported != nullptr) *imported = r.imported.decisions + r.imported.timings + r.imported.binaries;
    if (rejected != nullptr) *rejected = r.rejected;
    if (binaries_trusted != nullptr) *binaries_trusted = r.binaries_trusted ? 1 : 0;
    return Status();
  });
}

KILN_API kiln_status kiln_cache_import(kiln_context* ctx, const char* path, size_t* imported, size_t* rejected) {
  return kiln_cache_import_trusted(ctx, path, nullptr, imported, rejected, nullptr);
}

}  // extern "C"
