#include "kiln/jit/shared_library.h"

#include <dlfcn.h>

#include <fmt/format.h>

namespace kiln {

Result<SharedLibrary> SharedLibrary::open(const std::string& path, std::string_view what, std::string_view hint) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    return make_error(ErrorCode::kNoDriver,
                      fmt::format("cannot load {} ({}); {}", what, why ? why : "unknown reason", hint));
  }
  return SharedLibrary(handle);
}

void* SharedLibrary::symbol(const char* name) const { return dlsym(handle_, name); }

}  // namespace kiln
