#include "nccl_api.h"

#include "kiln/jit/shared_library.h"


#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "kiln/runtime/comm.h"

namespace kiln {
namespace {

// Set once by nccl() so that to_status can describe results without a way to fail itself.
std::atomic<const runtime::detail::NcclApi*> g_nccl{nullptr};

std::string_view basename_of(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Status to_status(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess) return Status();
  const runtime::detail::NcclApi* api = g_nccl.load(std::memory_order_acquire);
  std::string description = fmt::format("ncclResult_t {}", static_cast<int>(result));
  std::string last;
  if (api != nullptr) {
    if (const char* s = api->ncclGetErrorString(result); s != nullptr) description = s;
    // NCCL keeps one last-error text per process (the comm argument is unused), set where the failure was
    // detected: it says what went wrong where the result code only gives the category.
    if (const char* s = api->ncclGetLastError(nullptr); s != nullptr) last = s;
  }
  return make_error(ErrorCode::kLibraryError,
                    fmt::format("{} failed: {}{}{} [{}:{}]", expr, description, last.empty() ? "" : ": ", last,
                                basename_of(file), line));
}

}  // namespace kiln

namespace kiln::runtime::detail {

Result<NcclApi> load_nccl(const std::string& library) {
  KILN_ASSIGN_OR_RETURN(SharedLibrary lib,
                        SharedLibrary::open(library, "NCCL from " + library,
                                            "kiln's collectives need it (set KILN_NCCL_LIBRARY to its path), "
                                            "nothing else does"));
  NcclApi api;
  api.library = library;
#define KILN_NCCL_STRINGIFY_INNER(x) #x
#define KILN_NCCL_STRINGIFY(x) KILN_NCCL_STRINGIFY_INNER(x)
#define KILN_NCCL_RESOLVE(name) lib.resolve(api.name, KILN_NCCL_STRINGIFY(name), false);
#define KILN_NCCL_RESOLVE_REQUIRED(name) lib.resolve(api.name, KILN_NCCL_STRINGIFY(name));
  KILN_NCCL_FUNCTIONS(KILN_NCCL_RESOLVE_REQUIRED)
  KILN_NCCL_OPTIONAL_FUNCTIONS(KILN_NCCL_RESOLVE)
#undef KILN_NCCL_RESOLVE_REQUIRED
#undef KILN_NCCL_RESOLVE
  if (api.ncclGetVersion == nullptr || api.ncclCommInitRank == nullptr) {
    return make_error(ErrorCode::kNoDriver, fmt::format("{} is not an NCCL library (it has no ncclCommInitRank)",
                                                        library));
  }
  if (!lib.missing().empty()) {
    return make_error(ErrorCode::kNoDriver,
                      fmt::format("{} lacks NCCL entry points kiln needs ({}); install a newer NCCL", library,
                                  lib.missing()));
  }
  if (ncclResult_t r = api.ncclGetVersion(&api.version); r != ncclSuccess) {
    return make_error(ErrorCode::kNoDriver, fmt::format("ncclGetVersion failed in {} (result {})", library,
                                                        static_cast<int>(r)));
  }
  return api;
}

Result<const NcclApi*> nccl() {
  static std::once_flag once;
  static Result<NcclApi>* loaded = nullptr;
  std::call_once(once, [] {
    // NCCL reads its environment when it first initialises, which cannot happen before this point: every NCCL
    // call in kiln goes through the api returned here. overwrite=0 keeps a caller's explicit choice.
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char* env = std::getenv("KILN_NCCL_LIBRARY");
    std::string library = (env != nullptr && *env != '\0') ? env : "libnccl.so.2";
    loaded = new Result<NcclApi>(load_nccl(library));  // lives for the process: the entry points must too
    if (loaded->ok()) g_nccl.store(&loaded->value(), std::memory_order_release);
  });
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

Result<ncclDataType_t> nccl_dtype(templates::DType dtype) {
  switch (dtype) {
    case templates::DType::kF16: return ncclFloat16;
    case templates::DType::kBF16: return ncclBfloat16;
    case templates::DType::kF32: return ncclFloat32;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("no NCCL type for dtype {}", static_cast<int>(dtype)));
}

}  // namespace kiln::runtime::detail

namespace kiln::runtime {

Result<int> nccl_version() {
  KILN_ASSIGN_OR_RETURN(const detail::NcclApi* api, detail::nccl());
  return api->version;
}

Result<NcclId> nccl_unique_id() {
  KILN_ASSIGN_OR_RETURN(const detail::NcclApi* api, detail::nccl());
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold NCCL's unique id exactly");
  ncclUniqueId id;
  KILN_CHECK(api->ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

}  // namespace kiln::runtime
