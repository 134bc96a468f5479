// What the C API's entry points share: the handles' C++ bodies, the thread-local last error, and guarded(),
// which turns every Status, exception and bad argument into a kiln_status with a message.
#pragma once

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/cache/remote.h"
#include "kiln/cache/tuning.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/module.h"
#include "kiln/kiln.h"
#include "kiln/pool/executor.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/tuner.h"
#include "kiln/status.h"

struct kiln_context {
  kiln_context_options options{};
  std::string cache_dir;
  std::shared_ptr<kiln::cache::TuningCache> cache;
  std::shared_ptr<kiln::cache::RedisTier> remote;  // the fleet's remote behind `cache`; null when none
  std::shared_ptr<kiln::Executor> executor;
  std::unique_ptr<kiln::PrecompileGate> gate;
  std::shared_ptr<void> log_sink;  // the spdlog sink forwarding to options.log, while the context lives

  std::mutex mu;
  std::unique_ptr<kiln::runtime::Tuner> tuner;  // made on first use of the GPU

  /// The tuner of the context's device (made now if needed).
  kiln::Result<kiln::runtime::Tuner*> get_tuner();
  /// The arch to compile for: `arch`, else the device's.
  kiln::Result<kiln::Target> target(const char* arch) const;
};

struct kiln_kernel {
  kiln::Binary binary;
  int device = 0;
  std::mutex mu;
  std::optional<kiln::Kernel> loaded;  // in the device's context, on first launch
};

struct kiln_compile_job {
  kiln::Future<kiln::Binary> future;
  int device = 0;
};

namespace kiln::capi {

/// Records `s` as this thread's last error (when it is one) and returns its code.
kiln_status set_status(const Status& s);
/// kInvalidArgument error for a bad argument of `fn`.
Status bad_argument(const char* fn, const std::string& what);
/// The code a callback's status (its raw_enum) stands for, with the message it set (kiln_set_callback_error) or
/// a default.
Status from_callback(int64_t status, const std::string& what);

/// Runs `f` (returning a Status) so that nothing escapes: errors become a kiln_status with a message.
template <class F>
kiln_status guarded(const char* fn, F&& f) noexcept {
  try {
    Status s = f();
    if (!s.ok()) s.with_context(fn);
    return set_status(s);
  } catch (const std::bad_alloc&) {
    set_status(make_error(ErrorCode::kInternal, std::string(fn) + ": out of host memory"));
    return KILN_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    return set_status(make_error(ErrorCode::kInternal, std::string(fn) + ": unexpected exception: " + e.what()));
  } catch (...) {
    return set_status(make_error(ErrorCode::kInternal, std::string(fn) + ": unexpected non-standard exception"));
  }
}

/// The struct a caller passed, as this library's version of it: the fields the caller's (maybe older, smaller)
/// struct has are copied over `defaults`; the rest keep their defaults. kInvalidArgument for a size smaller than
/// the struct's first version or a null pointer.
template <class T>
Result<T> read_struct(const T* given, T defaults, size_t first_version_size, const char* what) {
  if (given == nullptr) return make_error(ErrorCode::kInvalidArgument, std::string(what) + " is NULL");
  const size_t size = given->size;  // (a local: `given->size <` reads as a template to g++)
  if (size < first_version_size || size > (size_t{1} << 20)) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(what) + ".size is " + std::to_string(size) +
                          ": set it to sizeof(the struct) (its *_init function does)");
  }
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  std::memcpy(static_cast<void*>(&defaults), given, n);
  defaults.size = sizeof(T);
  return defaults;
}

/// kInvalidArgument unless `out` (a caller's struct that kiln fills) is given with a size of at least this
/// version's struct.
template <class T>
Status check_out_struct(const T* out, const char* fn, const char* what) {
  if (out == nullptr || out->size < sizeof(T)) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(fn) + ": " + what + " must be given with its size set to sizeof(the struct)");
  }
  return Status();
}

/// Fills a caller's struct (checked by check_out_struct) with `value`, keeping the caller's size: a newer
/// caller's larger struct keeps its newer fields.
template <class T>
void write_struct(T* out, T value) {
  value.size = out->size;
  std::memcpy(static_cast<void*>(out), &value, sizeof(T));
}

/// A C string that may be null.
inline std::string str(const char* s) { return s ? std::string(s) : std::string(); }

/// The integer a caller stored in an enum-typed field, argument or callback result, read as bytes. To a C caller
/// an enum is an int that may hold anything, and loading a value outside the C++ enum's range as the enum type is
/// undefined (UBSan's -fsanitize=enum reports it): such values are read through here, or checked_enum, only.
/// Take them by reference: passing one by value loads it.
template <class E>
int64_t raw_enum(const E& e) {
  static_assert(std::is_enum_v<E>);
  std::make_signed_t<std::underlying_type_t<E>> v;
  static_assert(sizeof(v) == sizeof(E));
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

/// `e` when it holds one of `first`..`last` (the enum's values, consecutive); else kInvalidArgument saying
/// "<what> <value> is not a <type> (<first> to <last>)".
template <class E>
Result<E> checked_enum(const E& e, E first, E last, const char* type, const std::string& what) {
  const int64_t v = raw_enum(e);
  if (v < raw_enum(first) || v > raw_enum(last)) {
    return make_error(ErrorCode::kInvalidArgument, what + " " + std::to_string(v) + " is not a " + type + " (" +
                                                       std::to_string(raw_enum(first)) + " to " +
                                                       std::to_string(raw_enum(last)) + ")");
  }
  return static_cast<E>(v);
}

/// The C dtype as kiln's; kInvalidArgument naming `what` for a value that is not a kiln_dtype.
Result<templates::DType> dtype_of(const kiln_dtype& d, const std::string& what);

/// Copies a kiln_source's pieces into a KernelSource (arrays with null entries are errors).
Result<KernelSource> kernel_source_of(const kiln_source& s);

/// The remote options a caller's fields name over the environment's (RemoteOptions::from_env): `url` NULL is
/// $KILN_REMOTE_CACHE and "" none (nullopt then); `key_file` NULL is $KILN_CACHE_KEY_FILE and "" none;
/// `allow_unsigned` 1 allows, 0 keeps the environment's; timeouts 0 keep the environment's (else the defaults).
/// `what` prefixes the field names in errors ("options.remote_": "options.remote_allow_unsigned is 2"). Errors: kInvalidArgument naming the field.
Result<std::optional<cache::RemoteOptions>> remote_options(const char* url, const char* key_file, int allow_unsigned,
                                                           int connect_timeout_ms, int read_timeout_ms,
                                                           const std::string& what);

}  // namespace kiln::capi
