// The argument checks the C API's op, workload, cache and variant entry points share, each naming its entry
// point in the error the way capi::bad_argument does ("kiln_gemm: ctx is NULL"), so that every entry point
// says the same thing about the same mistake.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "capi_internal.h"

namespace kiln::capi {

/// One entry point's argument checks.
class Args {
 public:
  explicit Args(const char* fn) : fn_(fn) {}

  const char* fn() const { return fn_; }
  /// kInvalidArgument "<fn>: <what>".
  Status bad(const std::string& what) const { return bad_argument(fn_, what); }
  /// "<name> is NULL" when `p` is.
  Status given(const void* p, const char* name) const {
    return p != nullptr ? Status() : bad(fmt::format("{} is NULL", name));
  }
  /// A handle's out-pointer: "out is NULL" when it is, else cleared so that a failed call leaves no stale handle.
  template <class T>
  Status out(T** out) const {
    KILN_RETURN_IF_ERROR(given(out, "out"));
    *out = nullptr;
    return Status();
  }
  /// "<name> is <v>: sizes must be positive" for the first size that is not.
  Status positive(std::initializer_list<std::pair<const char*, int64_t>> sizes) const {
    for (const auto& [name, v] : sizes) {
      if (v <= 0) return bad(fmt::format("{} is {}: sizes must be positive", name, v));
    }
    return Status();
  }
  /// "sizes is empty" unless there is at least one size.
  Status sizes(const int64_t* sizes, size_t n) const {
    return n > 0 && sizes != nullptr ? Status() : bad("sizes is empty");
  }

 private:
  const char* fn_;
};

/// A caller's struct as this library's version (read_struct), over the defaults its *_init function writes.
/// `first_version_size`: the size of the struct's first version (offsetof its first added field), which older
/// callers pass; default: the struct never grew.
template <class T>
Result<T> read_struct(const T* given, void (*init)(T*), const char* what, size_t first_version_size = sizeof(T)) {
  T defaults;
  init(&defaults);
  return read_struct(given, defaults, first_version_size, what);
}

/// guarded(), with the entry point's argument checks handed to `f`.
template <class F>
kiln_status entry(const char* fn, F&& f) noexcept {
  return guarded(fn, [&]() -> Status { return f(Args(fn)); });
}

/// The start of every *_init function: zeros and the struct's size. False for a null pointer.
template <class T>
bool init_struct(T* p) {
  if (p == nullptr) return false;
  *p = T{};
  p->size = sizeof(T);
  return true;
}

}  // namespace kiln::capi
