// The C API's core: versions and errors, contexts (cache, executor, logging, the tuner), compiles and
// launches of one kernel.
#include <cstddef>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include "capi_internal.h"
#include "kiln/cache/store.h"
#include "kiln/jit/device.h"
#include "kiln/runtime/builtin.h"
#include "kiln/version.h"

namespace kiln::capi {
namespace {

thread_local std::string t_error;
thread_local std::string t_detail;
thread_local std::string t_callback_error;

static_assert(static_cast<int>(ErrorCode::kWrongResult) == KILN_ERROR_WRONG_RESULT,
              "kiln_status codes 1..20 are kiln::ErrorCode's");

// Forwards spdlog's messages to a context's log callback.
class CallbackSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  CallbackSink(kiln_log_fn fn, void* user) : fn_(fn), user_(user) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    kiln_log_level level = KILN_LOG_INFO;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: level = KILN_LOG_DEBUG; break;
      case spdlog::level::info: level = KILN_LOG_INFO; break;
      case spdlog::level::warn: level = KILN_LOG_WARN; break;
      default: level = KILN_LOG_ERROR; break;
    }
    std::string text(msg.payload.data(), msg.payload.size());
    fn_(user_, level, text.c_str());
  }
  void flush_() override {}

 private:
  kiln_log_fn fn_;
  void* user_;
};

spdlog::level::level_enum spdlog_level(kiln_log_level l) {
  switch (l) {
    case KILN_LOG_DEBUG: return spdlog::level::debug;
    case KILN_LOG_INFO: return spdlog::level::info;
    case KILN_LOG_ERROR: return spdlog::level::err;
    default: return spdlog::level::warn;
  }
}

// kiln_status_name's text for any integer a caller or callback passed as a kiln_status.
const char* status_name(int64_t code) {
  switch (code) {
    case KILN_OK: return "ok";
    case KILN_ERROR_NOT_READY: return "not ready";
    case KILN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case KILN_ERROR_BUFFER_TOO_SMALL: return "buffer too small";
    default: break;
  }
  if (code >= 1 && code <= KILN_ERROR_WRONG_RESULT) return code_name(static_cast<ErrorCode>(code)).data();
  return "unknown status";
}

}  // namespace

kiln_status set_status(const Status& s) {
  if (s.ok()) return KILN_OK;
  t_error = s.to_string();
  t_detail = s.detail();
  return static_cast<kiln_status>(static_cast<int>(s.code()));
}

Status bad_argument(const char* fn, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", fn, what));
}

Status from_callback(int64_t status, const std::string& what) {
  std::string message = t_callback_error.empty()
                            ? fmt::format("{} returned {} ({})", what, status, status_name(status))
                            : fmt::format("{}: {}", what, t_callback_error);
  t_callback_error.clear();
  const ErrorCode ec =
      status >= 1 && status <= KILN_ERROR_WRONG_RESULT ? static_cast<ErrorCode>(status) : ErrorCode::kInternal;
  return make_error(ec, std::move(message));
}

Result<templates::DType> dtype_of(const kiln_dtype& d, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(kiln_dtype checked, checked_enum(d, KILN_F16, KILN_F32, "kiln_dtype", what));
  switch (checked) {
    case KILN_F16: return templates::DType::kF16;
    case KILN_BF16: return templates::DType::kBF16;
    case KILN_F32: break;
  }
  return templates::DType::kF32;
}

Result<KernelSource> kernel_source_of(const kiln_source& s) {
  if (s.source == nullptr || *s.source == '\0') return make_error(ErrorCode::kInvalidArgument, "source.source is empty");
  if (s.kernel == nullptr || *s.kernel == '\0') return make_error(ErrorCode::kInvalidArgument, "source.kernel is empty");
  auto strings = [](const char* const* v, size_t n, const char* what) -> Result<std::vector<std::string>> {
    std::vector<std::string> out;
    if (n > 0 && v == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} is NULL with a count of {}", what, n));
    for (size_t i = 0; i < n; ++i) {
      if (v[i] == nullptr) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}[{}] is NULL", what, i));
      out.emplace_back(v[i]);
    }
    return out;
  };
  KernelSource k;
  k.entry = s.kernel;
  k.name = s.name && *s.name ? s.name : s.kernel;
  k.source = s.source;
  KILN_ASSIGN_OR_RETURN(k.name_expressions, strings(s.name_expressions, s.num_name_expressions, "source.name_expressions"));
  if (k.entry.find('<') != std::string::npos &&
      std::find(k.name_expressions.begin(), k.name_expressions.end(), k.entry) == k.name_expressions.end()) {
    k.name_expressions.push_back(k.entry);
  }
  if (s.num_defines > 0 && s.defines == nullptr) return make_error(ErrorCode::kInvalidArgument, "source.defines is NULL");
  for (size_t i = 0; i < s.num_defines; ++i) {
    if (s.defines[i].name == nullptr || *s.defines[i].name == '\0') {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("source.defines[{}] has no name", i));
    }
    const std::string v = str(s.defines[i].value);
    k.options.push_back(v.empty() ? fmt::format("-D{}", s.defines[i].name) : fmt::format("-D{}={}", s.defines[i].name, v));
  }
  KILN_ASSIGN_OR_RETURN(auto options, strings(s.options, s.num_options, "source.options"));
  k.options.insert(k.options.end(), options.begin(), options.end());
  KILN_ASSIGN_OR_RETURN(k.include_dirs, strings(s.include_dirs, s.num_include_dirs, "source.include_dirs"));
  if (s.num_headers > 0 && s.headers == nullptr) return make_error(ErrorCode::kInvalidArgument, "source.headers is NULL");
  for (size_t i = 0; i < s.num_headers; ++i) {
    if (s.headers[i].name == nullptr || s.headers[i].content == nullptr) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("source.headers[{}] has a NULL name or content", i));
    }
    k.headers.push_back(Header{s.headers[i].name, s.headers[i].content});
  }
  return k;
}

}  // namespace kiln::capi

using namespace kiln;
using kiln::capi::guarded;

kiln::Result<kiln::runtime::Tuner*> kiln_context::get_tuner() {
  std::lock_guard lock(mu);
  if (!tuner) {
    runtime::TuneOptions o;
    o.cache = cache;
    o.executor = executor;
    o.device = options.device;
    KILN_ASSIGN_OR_RETURN(tuner, runtime::make_tuner(std::move(o)));
  }
  return tuner.get();
}

kiln::Result<kiln::Target> kiln_context::target(const char* arch) const {
  if (arch != nullptr && *arch != '\0') return Target::parse(arch);
  auto t = Target::from_device(options.device);
  if (!t.ok()) {
    return std::move(t).status().with_context("no arch given, and the device's cannot be read (pass one, e.g. \"sm_90\")");
  }
  return t;
}

extern "C" {

KILN_API const char* kiln_version(void) { return kiln::kKilnVersion; }

KILN_API int kiln_version_number(void) {
  return KILN_VERSION_MAJOR * 10000 + KILN_VERSION_MINOR * 100 + KILN_VERSION_PATCH;
}

KILN_API const char* kiln_status_name(kiln_status status) { return capi::status_name(capi::raw_enum(status)); }

KILN_API const char* kiln_last_error(void) { return kiln::capi::t_error.c_str(); }
KILN_API const char* kiln_last_error_detail(void) { return kiln::capi::t_detail.c_str(); }

KILN_API void kiln_set_callback_error(const char* message) {
  try {
    kiln::capi::t_callback_error = message ? message : "";
  } catch (...) {
  }
}

KILN_API kiln_status kiln_device_count(int* count) {
  return guarded("kiln_device_count", [&]() -> Status {
    if (count == nullptr) return capi::bad_argument("kiln_device_count", "count is NULL");
    *count = 0;
    KILN_ASSIGN_OR_RETURN(*count, device_count());
    return Status();
  });
}

KILN_API void kiln_context_options_init(kiln_context_options* o) {
  if (o == nullptr) return;
  *o = kiln_context_options{};
  o->size = sizeof(*o);
  o->log_level = KILN_LOG_WARN;
}

KILN_API kiln_status kiln_context_create(const kiln_context_options* options, kiln_context** out) {
  return guarded("kiln_context_create", [&]() -> Status {
    if (out == nullptr) return capi::bad_argument("kiln_context_create", "out is NULL");
    *out = nullptr;
    kiln_context_options defaults;
    kiln_context_options_init(&defaults);
    kiln_context_options o = defaults;
    if (options != nullptr) {
      // The first version ended before the remote fields.
      KILN_ASSIGN_OR_RETURN(o, capi::read_struct(options, defaults, offsetof(kiln_context_options, remote_cache), "options"));
    }
    if (o.device < 0) return capi::bad_argument("kiln_context_create", fmt::format("device {} is negative", o.device));
    if (o.compile_workers < 0) {
      return capi::bad_argument("kiln_context_create", fmt::format("compile_workers {} is negative", o.compile_workers));
    }
    auto ctx = std::make_unique<kiln_context>();
    ctx->options = o;
    ctx->cache_dir = capi::str(o.cache_dir);
    ctx->options.cache_dir = nullptr;  // the copy in cache_dir is what lives on
    ctx->options.remote_cache = ctx->options.cache_key_file = nullptr;  // read below, not kept
    auto check = [&](const auto& field, auto first, auto last, const char* type, const char* name) {
      return capi::checked_enum(field, first, last, type, std::string("options.") + name);
    };
    KILN_ASSIGN_OR_RETURN(kiln_tune_mode tune_mode,
                          check(o.tune_mode, KILN_TUNE_MODE_DEFAULT, KILN_TUNE_MODE_OFF, "kiln_tune_mode", "tune_mode"));
    KILN_ASSIGN_OR_RETURN(kiln_executor_kind executor,
                          check(o.executor, KILN_EXECUTOR_DEFAULT, KILN_EXECUTOR_PROCESS, "kiln_executor_kind", "executor"));
    KILN_RETURN_IF_ERROR(check(o.log_level, KILN_LOG_DEBUG, KILN_LOG_ERROR, "kiln_log_level", "log_level").status());
    cache::TuneMode mode = cache::TuneMode::kTune;
    switch (tune_mode) {
      case KILN_TUNE_MODE_DEFAULT: {
        KILN_ASSIGN_OR_RETURN(mode, cache::tune_mode_from_env());
        break;
      }
      case KILN_TUNE_MODE_TUNE: mode = cache::TuneMode::kTune; break;
      case KILN_TUNE_MODE_USE: mode = cache::TuneMode::kUse; break;
      case KILN_TUNE_MODE_STRICT: mode = cache::TuneMode::kStrict; break;
      case KILN_TUNE_MODE_OFF: mode = cache::TuneMode::kOff; break;
    }
    ExecutorOptions eo;
    switch (executor) {
      case KILN_EXECUTOR_DEFAULT: break;
      case KILN_EXECUTOR_INLINE: eo.kind = ExecutorKind::kInline; break;
      case KILN_EXECUTOR_ARENA: eo.kind = ExecutorKind::kArena; break;
      case KILN_EXECUTOR_PROCESS: eo.kind = ExecutorKind::kProcess; break;
    }
    eo.workers = o.compile_workers;
    // The remote tier connects lazily: an unreachable remote is not an error here, only bounded misses later.
    KILN_ASSIGN_OR_RETURN(auto remote, capi::remote_options(o.remote_cache, o.cache_key_file, o.remote_allow_unsigned,
                                                            o.remote_connect_timeout_ms, o.remote_read_timeout_ms,
                                                            "options.remote_"));
    if (remote && mode != cache::TuneMode::kOff) {
      KILN_ASSIGN_OR_RETURN(ctx->remote, cache::RedisTier::open(std::move(*remote)));
    }
    cache::StoreOptions store;
    store.dir = ctx->cache_dir;
    KILN_ASSIGN_OR_RETURN(auto opened, cache::TuningCache::open(mode, store, ctx->remote));
    ctx->cache = std::move(opened);
    // Unless configured, started at the first compile (or by the tuner when compiles are coming): a warm start
    // that finds every kernel cached starts no compile workers.
    KILN_ASSIGN_OR_RETURN(ctx->executor, make_executor_on_demand(eo));
    KILN_ASSIGN_OR_RETURN(ctx->gate, runtime::make_cached_gate(ctx->cache, ctx->executor));
    if (o.log != nullptr) {
      auto sink = std::make_shared<capi::CallbackSink>(o.log, o.log_user);
      sink->set_level(capi::spdlog_level(o.log_level));
      auto logger = spdlog::default_logger();
      logger->sinks().push_back(sink);
      if (logger->level() > capi::spdlog_level(o.log_level)) logger->set_level(capi::spdlog_level(o.log_level));
      ctx->log_sink = sink;
    }
    *out = ctx.release();
    return Status();
  });
}

KILN_API void kiln_context_destroy(kiln_context* ctx) {
  if (ctx == nullptr) return;
  try {
    if (ctx->log_sink) {
      auto& sinks = spdlog::default_logger()->sinks();
      sinks.erase(std::remove(sinks.begin(), sinks.end(), std::static_pointer_cast<spdlog::sinks::sink>(ctx->log_sink)),
                  sinks.end());
    }
  } catch (...) {
  }
  delete ctx;
}

KILN_API void kiln_source_init(kiln_source* s) {
  if (s == nullptr) return;
  *s = kiln_source{};
  s->size = sizeof(*s);
}

}  // extern "C": C++ helpers below have C++ linkage

namespace {

Status start_compile(const char* fn, kiln_context* ctx, const kiln_source* source, Future<Binary>* out) {
  if (ctx == nullptr) return capi::bad_argument(fn, "ctx is NULL");
  kiln_source defaults;
  kiln_source_init(&defaults);
  KILN_ASSIGN_OR_RETURN(kiln_source s, capi::read_struct(source, defaults, sizeof(kiln_source), "source"));
  KILN_ASSIGN_OR_RETURN(KernelSource k, capi::kernel_source_of(s));
  KILN_ASSIGN_OR_RETURN(Target t, ctx->target(s.arch));
  *out = ctx->gate->precompile(k, t, Priority::kOnDemand);
  return Status();
}

kiln_kernel* new_kernel(const Binary& b, int device) {
  auto* k = new kiln_kernel;
  k->binary = b;
  k->device = device;
  return k;
}

}  // namespace

extern "C" {

KILN_API kiln_status kiln_compile(kiln_context* ctx, const kiln_source* source, kiln_kernel** out) {
  return guarded("kiln_compile", [&]() -> Status {
    if (out == nullptr) return capi::bad_argument("kiln_compile", "out is NULL");
    *out = nullptr;
    Future<Binary> f;
    KILN_RETURN_IF_ERROR(start_compile("kiln_compile", ctx, source, &f));
    const Result<Binary>& r = f.get();
    if (!r.ok()) return r.status();
    *out = new_kernel(*r, ctx->options.device);
    return Status();
  });
}

KILN_API kiln_status kiln_compile_async(kiln_context* ctx, const kiln_source* source, kiln_compile_job** out) {
  return guarded("kiln_compile_async", [&]() -> Status {
    if (out == nullptr) return capi::bad_argument("kiln_compile_async", "out is NULL");
    *out = nullptr;
    auto c = std::make_unique<kiln_compile_job>();
    KILN_RETURN_IF_ERROR(start_compile("kiln_compile_async", ctx, source, &c->future));
    c->device = ctx->options.device;
    *out = c.release();
    return Status();
  });
}

KILN_API kiln_status kiln_compile_job_poll(const kiln_compile_job* compile) {
  if (compile == nullptr) {
    return capi::set_status(capi::bad_argument("kiln_compile_job_poll", "compile is NULL"));
  }
  return compile->future.ready() ? KILN_OK : KILN_ERROR_NOT_READY;
}

KILN_API kiln_status kiln_compile_job_wait(kiln_compile_job* compile, kiln_kernel** out) {
  return guarded("kiln_compile_job_wait", [&]() -> Status {
    if (compile == nullptr) return capi::bad_argument("kiln_compile_job_wait", "compile is NULL");
    if (out != nullptr) *out = nullptr;
    const Result<Binary>& r = compile->future.get();
    if (!r.ok()) return r.status();
    if (out != nullptr) *out = new_kernel(*r, compile->device);
    return Status();
  });
}

KILN_API void kiln_compile_job_destroy(kiln_compile_job* compile) {
  if (compile == nullptr) return;
  try {
    if (!compile->future.ready()) compile->future.cancel();
  } catch (...) {
  }
  delete compile;
}

KILN_API kiln_status kiln_kernel_launch(kiln_kernel* kernel, kiln_dim3 grid, kiln_dim3 block, unsigned shared_bytes,
                                        void* stream, void** args) {
  return guarded("kiln_kernel_launch", [&]() -> Status {
    if (kernel == nullptr) return capi::bad_argument("kiln_kernel_launch", "kernel is NULL");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
      return capi::bad_argument("kiln_kernel_launch",
                                fmt::format("grid ({}, {}, {}) block ({}, {}, {}) has a zero dimension", grid.x, grid.y,
                                            grid.z, block.x, block.y, block.z));
    }
    std::lock_guard lock(kernel->mu);
    if (!kernel->loaded) {
      KILN_RETURN_IF_ERROR(ensure_context(kernel->device).status());
      KILN_ASSIGN_OR_RETURN(Kernel k, load_kernel(kernel->binary));
      kernel->loaded.emplace(std::move(k));
    }
    LaunchConfig cfg;
    cfg.grid = Dim3{grid.x, grid.y, grid.z};
    cfg.block = Dim3{block.x, block.y, block.z};
    cfg.shared_bytes = shared_bytes;
    cfg.stream = static_cast<CUstream>(stream);
    return kernel->loaded->launch(cfg, args);
  });
}

KILN_API kiln_status kiln_kernel_cubin(const kiln_kernel* kernel, const void** data, size_t* size) {
  return guarded("kiln_kernel_cubin", [&]() -> Status {
    if (kernel == nullptr || data == nullptr || size == nullptr) {
      return capi::bad_argument("kiln_kernel_cubin", "kernel, data and size must not be NULL");
    }
    *data = kernel->binary.cubin.data();
    *size = kernel->binary.cubin.size();
    return Status();
  });
}

KILN_API kiln_status kiln_kernel_key(const kiln_kernel* kernel, char key[33]) {
  return guarded("kiln_kernel_key", [&]() -> Status {
    if (kernel == nullptr || key == nullptr) return capi::bad_argument("kiln_kernel_key", "kernel and key must not be NULL");
    const std::string hex = kernel->binary.key.hex();
    std::memcpy(key, hex.c_str(), std::min<size_t>(hex.size(), 32) + 1);
    key[32] = '\0';
    return Status();
  });
}

KILN_API void kiln_kernel_destroy(kiln_kernel* kernel) { delete kernel; }

}  // extern "C"
