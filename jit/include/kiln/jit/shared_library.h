// A library kiln loads with dlopen instead of linking (the CUDA driver, NCCL; kiln/jit/driver.h and
// kiln/runtime/comm.h say why), and its entry points looked up by name.
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

class SharedLibrary {
 public:
  /// dlopen with RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE: the entry points handed out stay valid for the life of
  /// the process, and an application that links its own copy keeps its symbols. The library is never closed.
  /// Errors: kNoDriver "cannot load <what> (<dlerror>); <hint>".
  static Result<SharedLibrary> open(const std::string& path, std::string_view what, std::string_view hint);

  /// Sets `fn` to the entry point `name`, or null; a required one that is missing is listed by missing().
  template <class Fn>
  void resolve(Fn& fn, const char* name, bool required = true) {
    fn = reinterpret_cast<Fn>(symbol(name));
    if (fn == nullptr && required) {
      missing_ += missing_.empty() ? "" : ", ";
      missing_ += name;
    }
  }
  /// The required entry points not found so far, comma-separated ("" when none).
  const std::string& missing() const { return missing_; }

 private:
  explicit SharedLibrary(void* handle) : handle_(handle) {}
  void* symbol(const char* name) const;
  void* handle_;
  std::string missing_;
};

}  // namespace kiln
