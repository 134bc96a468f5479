// kiln's one error type: Status (a code, a message, context added at each layer) and Result<T>.
//
// Library code never aborts or exits: every failure, from a bad template parameter to a CUDA fault, is a
// value that names what went wrong. Errors from CUDA, NVRTC, cuBLAS, NCCL and RocksDB are converted at the
// boundary by KILN_CHECK, which calls the `to_status` overload for the library's result type.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace kiln {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed (a bad template parameter, an unknown arch)
  kNotFound,            // a named thing does not exist (a kernel symbol, a cache entry, a file)
  kAlreadyExists,
  kFailedPrecondition,  // the call is valid but the state is not (no current CUDA context)
  kOutOfRange,
  kUnimplemented,
  kInternal,            // a bug in kiln
  kUnavailable,         // a resource is temporarily unavailable (a lock held by another process)
  kCancelled,
  kTimeout,
  kCompileError,        // NVRTC rejected the source; the log is in detail()
  kNoDriver,            // libcuda.so.1 could not be loaded
  kNoDevice,            // the driver loaded but there is no usable device
  kCudaError,           // a Driver API call failed
  kLibraryError,        // cuBLAS, NCCL or another library call failed
  kCorrupt,             // stored data failed its checks
  kIoError,
  kShutdown,            // the component was shut down before the work ran
  kWorkerCrashed,       // a compile or benchmark worker process died
  kWrongResult,         // a kernel ran but its output does not match the reference
};

/// The stable lower-case name of a code ("compile error", "no CUDA driver", ...).
std::string_view code_name(ErrorCode code);

/// Ok, or an error with a code, a message, optional long detail (e.g. a full compiler log) and a chain of
/// context strings added by each layer it passed through. Cheap to copy and move; the ok state allocates
/// nothing. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message, std::string detail = {});
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  bool ok() const { return rep_ == nullptr; }
  ErrorCode code() const { return rep_ ? rep_->code : ErrorCode::kOk; }
  /// The one-line message; empty when ok.
  const std::string& message() const;
  /// Long supporting text (the NVRTC log, a worker's stderr tail); may be empty.
  const std::string& detail() const;
  /// Outermost context last: {"loading gemm_..", "tuning gemm 16x4096x4096"}.
  const std::vector<std::string>& context() const;

  /// Adds a line of context ("while compiling gemm_mma_128x128x32_w8_s3"). No-op when ok.
  Status& with_context(std::string context) &;
  Status&& with_context(std::string context) &&;

  /// "compile error: <message> (while A; while B)". Detail is not included; see to_string_with_detail.
  std::string to_string() const;
  std::string to_string_with_detail() const;

 private:
  struct Rep {
    ErrorCode code;
    std::string message;
    std::string detail;
    std::vector<std::string> context;
  };
  std::unique_ptr<Rep> rep_;
};

inline Status ok_status() { return Status(); }
Status make_error(ErrorCode code, std::string message, std::string detail = {});

/// A value or the Status saying why there is none. Never holds an ok Status.
template <class T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> makes no sense");

 public:
  Result(const T& value) : v_(std::in_place_index<1>, value) {}
  Result(T&& value) : v_(std::in_place_index<1>, std::move(value)) {}
  template <class U, class = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                              !std::is_same_v<std::decay_t<U>, Status> &&
                                              !std::is_same_v<std::decay_t<U>, Result<T>>>>
  Result(U&& value) : v_(std::in_place_index<1>, std::forward<U>(value)) {}
  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {
    if (std::get<0>(v_).ok()) {
      std::get<0>(v_) = Status(ErrorCode::kInternal, "Result constructed from an ok Status without a value");
    }
  }

  bool ok() const { return v_.index() == 1; }
  /// The error; an ok Status when there is a value.
  Status status() const& { return ok() ? Status() : std::get<0>(v_); }
  Status status() && { return ok() ? Status() : std::move(std::get<0>(v_)); }

  /// The value. Calling these on an error is a bug in the caller (asserts in debug builds).
  T& value() & { assert(ok()); return std::get<1>(v_); }
  const T& value() const& { assert(ok()); return std::get<1>(v_); }
  T&& value() && { assert(ok()); return std::get<1>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? std::get<1>(v_) : std::move(fallback); }

  Result& with_context(std::string context) & {
    if (!ok()) std::get<0>(v_).with_context(std::move(context));
    return *this;
  }
  Result&& with_context(std::string context) && {
    if (!ok()) std::get<0>(v_).with_context(std::move(context));
    return std::move(*this);
  }

 private:
  std::variant<Status, T> v_;
};

namespace detail {
inline const Status& as_status(const Status& s) { return s; }
inline Status as_status(Status&& s) { return std::move(s); }
template <class T>
Status as_status(const Result<T>& r) { return r.status(); }
template <class T>
Status as_status(Result<T>&& r) { return std::move(r).status(); }
}  // namespace detail

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

/// Returns the Status of `expr` (a Status or Result) from the enclosing function if it is an error.
#define KILN_RETURN_IF_ERROR(expr)                                        \
  do {                                                                    \
    ::kiln::Status kiln_status_ = ::kiln::detail::as_status((expr));      \
    if (!kiln_status_.ok()) return kiln_status_;                          \
  } while (0)

/// `KILN_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_result_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

/// Calls a foreign library function (CUDA driver, NVRTC, cuBLAS, NCCL, RocksDB) and returns its failure as
/// a Status. Works with any result type for which a `kiln::to_status(result, expr, file, line)` overload is
/// declared (see kiln/jit/cuda_status.h and the cache/runtime internals).
#define KILN_CHECK(call) \
  KILN_RETURN_IF_ERROR(::kiln::to_status((call), #call, __FILE__, __LINE__))
