// NCCL, loaded with dlopen on first use (kiln/runtime/comm.h says why), and the conversions kiln needs around
// it. Private to runtime/collective: nothing outside its src/ includes nccl.h through kiln.
#pragma once

#include <nccl.h>

#include <string>

#include "kiln/status.h"
#include "kiln/templates/template.h"

// Every NCCL entry point kiln requires, by API name; each member is typed by nccl.h's declaration.
#define KILN_NCCL_FUNCTIONS(X)                                                                            \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort)             \
  X(ncclCommGetAsyncError) X(ncclCommCount) X(ncclCommUserRank) X(ncclCommCuDevice) X(ncclGetErrorString) \
  X(ncclGetLastError) X(ncclAllReduce) X(ncclAllGather) X(ncclBroadcast) X(ncclGroupStart) X(ncclGroupEnd)

// Entry points used when the library has them (symmetric memory, NCCL 2.27+); null otherwise.
#define KILN_NCCL_OPTIONAL_FUNCTIONS(X) \
  X(ncclMemAlloc) X(ncclMemFree) X(ncclCommWindowRegister) X(ncclCommWindowDeregister)

namespace kiln {
/// KILN_CHECK support for NCCL results: names the call, NCCL's description of the result and its last error
/// message (which says what actually went wrong).
Status to_status(ncclResult_t result, const char* expr, const char* file, int line);
}  // namespace kiln

namespace kiln::runtime::detail {

/// The resolved NCCL entry points: every required one is non-null, optional ones may be null.
struct NcclApi {
#define KILN_NCCL_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_NCCL_FUNCTIONS(KILN_NCCL_MEMBER)
  KILN_NCCL_OPTIONAL_FUNCTIONS(KILN_NCCL_MEMBER)
#undef KILN_NCCL_MEMBER
  int version = 0;       // NCCL_VERSION_CODE of the loaded library, e.g. 22809
  std::string library;   // the path that was dlopen'ed

  bool has_symmetric_memory() const {
    return ncclMemAlloc && ncclMemFree && ncclCommWindowRegister && ncclCommWindowDeregister;
  }
};

/// The process's NCCL: on the first call sets NCCL_NVLS_ENABLE=0 unless the environment already has it, then
/// loads `$KILN_NCCL_LIBRARY` (default "libnccl.so.2"). Decided once per process; thread-safe.
/// Errors: kNoDriver naming the library (missing, not NCCL, or lacking an entry point kiln requires).
Result<const NcclApi*> nccl();

/// Loads NCCL from `library` without touching the process-wide one (tests prove the failure paths with it).
/// The library stays loaded for the life of the process. Does not touch the environment.
Result<NcclApi> load_nccl(const std::string& library);

/// NCCL's element type for a kiln dtype.
Result<ncclDataType_t> nccl_dtype(templates::DType dtype);

}  // namespace kiln::runtime::detail
