#include "kiln/jit/driver.h"

#include "kiln/jit/shared_library.h"


#include <cstdlib>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

namespace kiln {
namespace {

const DriverApi* g_loaded = nullptr;  // set once by driver(); read by cuda_error_name

std::string_view basename_of(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Result<DriverApi> load_driver(const std::string& library) {
  KILN_ASSIGN_OR_RETURN(SharedLibrary lib,
                        SharedLibrary::open(library, library, "GPU work needs the NVIDIA driver, compiling does not"));
  // Each entry point is looked up by the name cuda.h maps it to (cuMemAlloc -> cuMemAlloc_v2), exactly as a
  // program linked against libcuda would bind it, so the pointer always has the signature the header
  // declares. cuGetProcAddress(name, CUDA_VERSION) does not give that guarantee: CUDA 13 added
  // cuCtxSynchronize_v2(CUcontext) while cuda.h still declares cuCtxSynchronize(void).
  DriverApi api;
  api.library = library;
#define KILN_STRINGIFY_INNER(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER(x)
#define KILN_RESOLVE(name) lib.resolve(api.name, KILN_STRINGIFY(name));
  KILN_DRIVER_FUNCTIONS(KILN_RESOLVE)
#undef KILN_RESOLVE
  if (api.cuGetErrorName == nullptr || api.cuInit == nullptr) {
    return make_error(ErrorCode::kNoDriver,
                      fmt::format("{} is not a CUDA driver library (it has no cuInit)", library));
  }
  if (!lib.missing().empty()) {
    return make_error(ErrorCode::kNoDriver, fmt::format("{} lacks entry points kiln needs ({}); update the driver",
                                                        library, lib.missing()));
  }
  if (api.cuDriverGetVersion(&api.driver_version) != CUDA_SUCCESS) api.driver_version = 0;
  CUresult init = api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    api.cuGetErrorName(init, &name);
    return make_error(ErrorCode::kNoDevice,
                      fmt::format("cuInit failed with {} (driver {})",
                                  name ? name : std::to_string(static_cast<int>(init)), basename_of(library)));
  }
  if (api.cuDeviceGetCount(&api.device_count) != CUDA_SUCCESS || api.device_count == 0) {
    return make_error(ErrorCode::kNoDevice, "the driver loaded but reports no devices");
  }
  return api;
}

Result<const DriverApi*> driver() {
  static std::once_flag once;
  static Result<DriverApi>* loaded = nullptr;
  std::call_once(once, [] {
    const char* env = std::getenv("KILN_CUDA_DRIVER");
    std::string library = (env != nullptr && *env != '\0') ? env : "libcuda.so.1";
    loaded = new Result<DriverApi>(load_driver(library));  // lives for the process: entry points must too
    if (loaded->ok()) g_loaded = &loaded->value();
  });
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

std::string cuda_error_name(CUresult result) {
  const char* name = nullptr;
  if (g_loaded != nullptr && g_loaded->cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return fmt::format("CUresult {}", static_cast<int>(result));
}

Status to_status(CUresult result, const char* expr, const char* file, int line) {
  if (result == CUDA_SUCCESS) return Status();
  std::string description;
  const char* text = nullptr;
  if (g_loaded != nullptr && g_loaded->cuGetErrorString(result, &text) == CUDA_SUCCESS && text != nullptr) {
    description = text;
  }
  return make_error(ErrorCode::kCudaError,
                    fmt::format("{} failed: {}{}{}{} [{}:{}]", expr, cuda_error_name(result),
                                description.empty() ? "" : " (", description, description.empty() ? "" : ")",
                                basename_of(file), line));
}

}  // namespace kiln
