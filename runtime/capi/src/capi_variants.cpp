// The C API's variant ops: a DSL's N sources of one operation, registered with C callbacks, tuned on a problem
// key, launched, size-dispatched and precompiled (kiln/runtime/variants.h underneath).
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

#include "capi_args.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/variants.h"

struct kiln_op {
  kiln_context* ctx = nullptr;
  kiln::runtime::VariantSet set;
};

struct kiln_selection {
  std::shared_ptr<kiln::runtime::Selection> selection;
};

struct kiln_dispatcher {
  std::shared_ptr<kiln::runtime::Dispatcher> dispatcher;
};

using namespace kiln;

namespace {

Result<std::vector<std::pair<std::string, std::string>>> pairs_of(const kiln_define* d, size_t n, const char* what) {
  std::vector<std::pair<std::string, std::string>> out;
  if (n > 0 && d == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} is NULL with a count of {}", what, n));
  for (size_t i = 0; i < n; ++i) {
    if (d[i].name == nullptr || *d[i].name == '\0') {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}[{}] has no name", what, i));
    }
    out.emplace_back(d[i].name, capi::str(d[i].value));
  }
  return out;
}

Result<std::vector<int64_t>> sizes_of(const int64_t* sizes, size_t n) {
  if (n == 0 || sizes == nullptr) return make_error(ErrorCode::kInvalidArgument, "sizes is empty (give at least one size)");
  return std::vector<int64_t>(sizes, sizes + n);
}

Result<std::map<std::string, std::string>> attributes_of(const kiln_define* a, size_t n) {
  KILN_ASSIGN_OR_RETURN(auto pairs, pairs_of(a, n, "attributes"));
  std::map<std::string, std::string> out;
  for (auto& [k, v] : pairs) {
    if (k.rfind("kiln.", 0) == 0) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("attribute '{}': names starting with 'kiln.' are kiln's", k));
    }
    out[k] = v;
  }
  return out;
}

runtime::LaunchDims dims_of(const kiln_launch_dims& d) {
  runtime::LaunchDims out;
  out.grid = Dim3{d.grid.x, d.grid.y, d.grid.z};
  out.block = Dim3{d.block.x, d.block.y, d.block.z};
  out.shared_bytes = d.shared_bytes;
  return out;
}

// The C variant as kiln's: its source through kiln_source's rules, its geometry through its callback.
Result<runtime::Variant> variant_of(const kiln_variant& given, size_t index) {
  KILN_ASSIGN_OR_RETURN(kiln_variant v, capi::read_struct(&given, kiln_variant_init,
                                                             fmt::format("variants[{}]", index).c_str()));
  runtime::Variant out;
  out.name = capi::str(v.name);
  kiln_source s;
  kiln_source_init(&s);
  s.name = v.name;
  s.source = v.source;
  s.kernel = v.kernel;
  s.defines = v.defines;
  s.num_defines = v.num_defines;
  s.options = v.options;
  s.num_options = v.num_options;
  s.include_dirs = v.include_dirs;
  s.num_include_dirs = v.num_include_dirs;
  s.headers = v.headers;
  s.num_headers = v.num_headers;
  auto k = capi::kernel_source_of(s);
  if (!k.ok()) return std::move(k).status().with_context(fmt::format("variant {} ('{}')", index, out.name));
  out.source = k->source;
  out.kernel = k->entry;
  out.options = k->options;  // the defines, already as -D options
  out.include_dirs = k->include_dirs;
  out.headers = k->headers;
  out.dims = dims_of(v.dims);
  if (v.geometry != nullptr) {
    kiln_geometry_fn fn = v.geometry;
    void* user = v.geometry_user;
    std::string name = out.name;
    out.geometry = [fn, user, name](std::span<const int64_t> sizes) -> Result<runtime::LaunchDims> {
      kiln_launch_dims d{{1, 1, 1}, {1, 1, 1}, 0};
      const int64_t st = capi::raw_enum(fn(user, sizes.data(), sizes.size(), &d));
      if (st != KILN_OK) return capi::from_callback(st, fmt::format("the geometry callback of variant '{}'", name));
      return dims_of(d);
    };
  }
  KILN_ASSIGN_OR_RETURN(auto params, pairs_of(v.parameters, v.num_parameters, "parameters"));
  for (auto& [pk, pv] : params) out.parameters[pk] = pv;
  return out;
}

// The op's inouts, checked: given where counted, each named, none twice.
Result<std::vector<std::string>> inouts_of(const capi::Args& arg, const kiln_variant_op& op) {
  std::vector<std::string> out;
  if (op.num_inouts > 0 && op.inouts == nullptr) return arg.bad(fmt::format("op.inouts is NULL with a count of {}", op.num_inouts));
  for (size_t i = 0; i < op.num_inouts; ++i) {
    if (op.inouts[i] == nullptr || *op.inouts[i] == '\0') return arg.bad(fmt::format("op.inouts[{}] is NULL or empty", i));
    if (std::find(out.begin(), out.end(), op.inouts[i]) != out.end()) {
      return arg.bad(fmt::format("op.inouts names '{}' twice", op.inouts[i]));
    }
    out.emplace_back(op.inouts[i]);
  }
  return out;
}

// Marks the outputs the op names as inouts to be restored (not poisoned) before each checked run. A name no
// output has is the caller's mistake, said rather than ignored: ignored, the region would be poisoned and every
// variant fail on it.
Status mark_inouts(const std::string& op, const std::vector<std::string>& inouts,
                   std::vector<runtime::OutputRegion>& outputs) {
  for (size_t i = 0; i < inouts.size(); ++i) {
    auto it = std::find_if(outputs.begin(), outputs.end(),
                           [&](const runtime::OutputRegion& o) { return o.name == inouts[i]; });
    if (it == outputs.end()) {
      std::string names;
      for (const auto& o : outputs) names += (names.empty() ? "" : ", ") + o.name;
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("op '{}': inouts[{}] '{}' names no output of the buffers callback (its outputs: {})",
                                    op, i, inouts[i], names.empty() ? "none" : names));
    }
    it->restore = true;
  }
  return Status();
}

}  // namespace

extern "C" {

KILN_API void kiln_variant_init(kiln_variant* v) {
  if (!capi::init_struct(v)) return;
  v->dims = kiln_launch_dims{{1, 1, 1}, {1, 1, 1}, 0};
}

KILN_API void kiln_variant_op_init(kiln_variant_op* op) {
  if (!capi::init_struct(op)) return;
  op->tolerance = 1e-2;
}

KILN_API kiln_status kiln_variants_register(kiln_context* ctx, const kiln_variant_op* given, kiln_op** out) {
  return capi::entry("kiln_variants_register", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.out(out));
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    // The first version ended before `inouts`.
    KILN_ASSIGN_OR_RETURN(kiln_variant_op c,
                          capi::read_struct(given, kiln_variant_op_init, "op", offsetof(kiln_variant_op, inouts)));
    runtime::VariantOp op;
    op.name = capi::str(c.name);
    op.reference = capi::str(c.reference);
    op.tolerance = c.tolerance;
    if (c.num_variants > 0 && c.variants == nullptr) return arg.bad("op.variants is NULL");
    for (size_t i = 0; i < c.num_variants; ++i) {
      KILN_ASSIGN_OR_RETURN(runtime::Variant v, variant_of(c.variants[i], i));
      op.variants.push_back(std::move(v));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> inouts, inouts_of(arg, c));
    if (c.buffers != nullptr) {
      kiln_buffers_fn fn = c.buffers;
      kiln_release_fn release = c.release;
      void* user = c.user;
      std::string name = op.name;
      op.buffers = [fn, release, user, name, inouts](std::span<const int64_t> sizes,
                                                      uint32_t seed) -> Result<runtime::VariantBuffers> {
        kiln_tune_buffers tb{};
        const int64_t st = capi::raw_enum(fn(user, sizes.data(), sizes.size(), seed, &tb));
        // Released whatever happens next, once, by whoever drops the last reference.
        std::shared_ptr<void> owner(tb.owner, [release, user](void* p) {
          if (release != nullptr) release(user, p);
        });
        if (st != KILN_OK) return capi::from_callback(st, fmt::format("the buffers callback of op '{}'", name));
        if (tb.num_params == 0 || tb.params == nullptr) {
          return make_error(ErrorCode::kInvalidArgument, fmt::format("the buffers callback of op '{}' gave no params", name));
        }
        if (tb.num_outputs > 0 && tb.outputs == nullptr) {
          return make_error(ErrorCode::kInvalidArgument, fmt::format("the buffers callback of op '{}' gave NULL outputs", name));
        }
        runtime::VariantBuffers vb;
        vb.params.assign(tb.params, tb.params + tb.num_params);
        for (size_t i = 0; i < tb.num_outputs; ++i) {
          const kiln_output& o = tb.outputs[i];
          KILN_ASSIGN_OR_RETURN(templates::DType dt, capi::dtype_of(o.dtype, fmt::format("output {} dtype", i)));
          if (o.ptr == 0 || o.rows <= 0 || o.cols <= 0 || (o.ld != 0 && o.ld < o.cols)) {
            return make_error(ErrorCode::kInvalidArgument,
                              fmt::format("op '{}': output {} needs a pointer, positive rows and cols, and ld 0 or >= cols",
                                          name, i));
          }
          vb.outputs.push_back(runtime::OutputRegion{o.ptr, dt, o.rows, o.cols, o.ld == 0 ? o.cols : o.ld,
                                                     o.name ? o.name : fmt::format("output{}", i)});
        }
        KILN_RETURN_IF_ERROR(mark_inouts(name, inouts, vb.outputs));
        vb.owner = std::move(owner);
        return vb;
      };
    }
    if (c.check != nullptr) {
      kiln_check_fn fn = c.check;
      void* user = c.user;
      std::string name = op.name;
      op.check = [fn, user, name](std::span<const int64_t> sizes, void** params, CUstream stream) -> Status {
        const int64_t st = capi::raw_enum(fn(user, sizes.data(), sizes.size(), params, stream));
        if (st != KILN_OK) return capi::from_callback(st, fmt::format("the check of op '{}'", name));
        return Status();
      };
    }
    KILN_ASSIGN_OR_RETURN(runtime::VariantSet set, runtime::register_variants(runtime::default_ops(), std::move(op)));
    auto h = std::make_unique<kiln_op>();
    h->ctx = ctx;
    h->set = std::move(set);
    *out = h.release();
    return Status();
  });
}

KILN_API void kiln_op_destroy(kiln_op* op) { delete op; }

KILN_API kiln_status kiln_op_tune(kiln_op* op, const int64_t* sizes, size_t num_sizes, const kiln_define* attributes,
                                  size_t num_attributes, kiln_selection** out) {
  return capi::entry("kiln_op_tune", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.out(out));
    KILN_RETURN_IF_ERROR(arg.given(op, "op"));
    KILN_ASSIGN_OR_RETURN(auto s, sizes_of(sizes, num_sizes));
    KILN_ASSIGN_OR_RETURN(auto attrs, attributes_of(attributes, num_attributes));
    KILN_ASSIGN_OR_RETURN(runtime::Tuner * tuner, op->ctx->get_tuner());
    KILN_ASSIGN_OR_RETURN(auto sel, tuner->tune(op->set.problem(std::move(s), std::move(attrs))));
    *out = new kiln_selection{std::move(sel)};
    return Status();
  });
}

KILN_API kiln_status kiln_selection_variant(const kiln_selection* selection, const char** name) {
  return capi::entry("kiln_selection_variant", [&](const capi::Args& arg) -> Status {
    if (selection == nullptr || name == nullptr) return arg.bad("selection and name must not be NULL");
    *name = selection->selection->choice_name().c_str();
    return Status();
  });
}

KILN_API kiln_status kiln_selection_info(const kiln_selection* selection, kiln_tune_info* info) {
  return capi::entry("kiln_selection_info", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(selection, "selection"));
    KILN_RETURN_IF_ERROR(capi::check_out_struct(info, arg.fn(), "info"));
    const runtime::TuneReport& r = selection->selection->report();
    kiln_tune_info out{};
    out.from_cache = r.decision_from_cache ? 1 : 0;
    out.candidates = r.candidates;
    out.failures = r.failures;
    for (const auto& c : r.choices) {
      if (c.name == r.chosen) out.median_us = c.median_us;
    }
    out.total_seconds = r.total_seconds;
    capi::write_struct(info, out);
    return Status();
  });
}

KILN_API kiln_status kiln_selection_report(const kiln_selection* selection, char* buf, size_t cap, size_t* needed) {
  if (selection == nullptr || (buf == nullptr && cap > 0)) {
    return capi::set_status(capi::bad_argument("kiln_selection_report", "selection is NULL, or buf is NULL with a capacity"));
  }
  kiln_status st = capi::guarded("kiln_selection_report", [&]() -> Status {
    const std::string json = selection->selection->report().json();
    if (needed != nullptr) *needed = json.size() + 1;
    if (cap < json.size() + 1) {
      return make_error(ErrorCode::kOutOfRange, fmt::format("the report needs {} bytes, the buffer has {}", json.size() + 1, cap));
    }
    std::memcpy(buf, json.c_str(), json.size() + 1);
    return Status();
  });
  return st == KILN_ERROR_OUT_OF_RANGE ? KILN_ERROR_BUFFER_TOO_SMALL : st;
}

KILN_API kiln_status kiln_selection_launch(const kiln_selection* selection, const int64_t* sizes, size_t num_sizes,
                                           void** params, void* stream) {
  return capi::entry("kiln_selection_launch", [&](const capi::Args& arg) -> Status {
    if (selection == nullptr || params == nullptr) return arg.bad("selection and params must not be NULL");
    KILN_RETURN_IF_ERROR(arg.sizes(sizes, num_sizes));
    return runtime::run_variant(*selection->selection, std::span<const int64_t>(sizes, num_sizes), params,
                                static_cast<CUstream>(stream));
  });
}

KILN_API void kiln_selection_destroy(kiln_selection* selection) { delete selection; }

KILN_API kiln_status kiln_op_dispatcher(kiln_op* op, const int64_t* sizes, size_t num_sizes,
                                        const kiln_define* attributes, size_t num_attributes, const int64_t* buckets,
                                        size_t num_buckets, kiln_dispatcher** out) {
  return capi::entry("kiln_op_dispatcher", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.out(out));
    KILN_RETURN_IF_ERROR(arg.given(op, "op"));
    if (num_buckets == 0 || buckets == nullptr) return arg.bad("buckets is empty");
    KILN_ASSIGN_OR_RETURN(auto s, sizes_of(sizes, num_sizes));
    KILN_ASSIGN_OR_RETURN(auto attrs, attributes_of(attributes, num_attributes));
    std::vector<int64_t> hints(buckets, buckets + num_buckets);
    for (size_t i = 0; i < hints.size(); ++i) {
      if (hints[i] <= 0 || (i > 0 && hints[i] <= hints[i - 1])) {
        return arg.bad("buckets must be positive and strictly ascending");
      }
    }
    KILN_ASSIGN_OR_RETURN(runtime::Tuner * tuner, op->ctx->get_tuner());
    KILN_ASSIGN_OR_RETURN(auto deferred, tuner->defer(op->set.problem(std::move(s), std::move(attrs))));
    KILN_ASSIGN_OR_RETURN(auto d, deferred->finalize(std::move(hints)));
    *out = new kiln_dispatcher{std::move(d)};
    return Status();
  });
}

KILN_API kiln_status kiln_dispatcher_launch(const kiln_dispatcher* dispatcher, const int64_t* sizes, size_t num_sizes,
                                            void** params, void* stream) {
  return capi::entry("kiln_dispatcher_launch", [&](const capi::Args& arg) -> Status {
    if (dispatcher == nullptr || params == nullptr) return arg.bad("dispatcher and params must not be NULL");
    KILN_RETURN_IF_ERROR(arg.sizes(sizes, num_sizes));
    return dispatcher->dispatcher->run(runtime::CustomArgs{{}, std::vector<int64_t>(sizes, sizes + num_sizes), params},
                                       static_cast<CUstream>(stream));
  });
}

KILN_API kiln_status kiln_dispatcher_variant(const kiln_dispatcher* dispatcher, int64_t size, const char** name) {
  return capi::entry("kiln_dispatcher_variant", [&](const capi::Args& arg) -> Status {
    if (dispatcher == nullptr || name == nullptr) return arg.bad("dispatcher and name must not be NULL");
    *name = dispatcher->dispatcher->select(size).choice_name().c_str();
    return Status();
  });
}

KILN_API void kiln_dispatcher_destroy(kiln_dispatcher* dispatcher) { delete dispatcher; }

KILN_API kiln_status kiln_op_precompile(kiln_op* op, const int64_t* sizes, size_t num_sizes, const char* arch,
                                        int* compiled, int* failed) {
  return capi::entry("kiln_op_precompile", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(op, "op"));
    KILN_ASSIGN_OR_RETURN(auto s, sizes_of(sizes, num_sizes));
    KILN_ASSIGN_OR_RETURN(Target t, op->ctx->target(arch));
    KILN_ASSIGN_OR_RETURN(runtime::PrecompileReport r,
                          runtime::precompile_problem(runtime::default_ops(), op->set.problem(std::move(s)), t,
                                                      *op->ctx->gate, runtime::TuneOptions{}));
    if (compiled != nullptr) *compiled = r.kernels - r.failed;
    if (failed != nullptr) *failed = r.failed;
    return Status();
  });
}

}  // extern "C"
