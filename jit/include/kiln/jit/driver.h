// The CUDA Driver API, loaded with dlopen("libcuda.so.1") on first use.
//
// Nothing in kiln links libcuda: the library, its tests and the CLI start and compile on a machine without a
// GPU or a driver. The first GPU call loads the driver; when it cannot, every GPU call returns a clear
// kNoDriver / kNoDevice error instead of crashing.
#pragma once

#include <cuda.h>

#include <string>

#include "kiln/status.h"

// Every driver entry point kiln uses, by API name. cuda.h maps some names to versioned symbols
// (cuMemAlloc -> cuMemAlloc_v2); each member is resolved by that mapped name and typed by its declaration.
#define KILN_DRIVER_FUNCTIONS(X)                                                                      \
  X(cuGetErrorName) X(cuGetErrorString) X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount)          \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDeviceGetUuid)   \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent) X(cuCtxSetCurrent)     \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                       \
  X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction)                 \
  X(cuModuleGetGlobal) X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel)                 \
  X(cuLaunchKernelEx) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuMemAlloc) X(cuMemFree)      \
  X(cuMemGetInfo) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync)               \
  X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemsetD32Async)     \
  X(cuMemAllocHost) X(cuMemFreeHost) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)     \
  X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture)                \
  X(cuStreamIsCapturing) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphDestroy)           \
  X(cuGraphExecDestroy) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)    \
  X(cuEventQuery) X(cuEventElapsedTime) X(cuTensorMapEncodeTiled) X(cuPointerGetAttribute)           \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuDeviceCanAccessPeer)         \
  X(cuCtxEnablePeerAccess) X(cuLaunchHostFunc) X(cuCtxCreate) X(cuCtxDestroy) X(cuLibraryLoadData) X(cuLibraryUnload) \
  X(cuLibraryGetKernel) X(cuKernelGetFunction)                      \
  X(cuThreadExchangeStreamCaptureMode)

namespace kiln {

/// The resolved driver entry points. Every member is non-null once `driver()` has returned it.
struct DriverApi {
#define KILN_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_DRIVER_FUNCTIONS(KILN_DRIVER_MEMBER)
#undef KILN_DRIVER_MEMBER
  int driver_version = 0;  // e.g. 13000
  int device_count = 0;    // > 0
  std::string library;     // the path that was dlopen'ed
};

/// The process's driver: loads `$KILN_CUDA_DRIVER` (default "libcuda.so.1") on the first call, resolves every
/// entry point and runs cuInit. Decided once per process; thread-safe.
/// Errors: kNoDriver (library missing or too old), kNoDevice (cuInit failed or no device).
Result<const DriverApi*> driver();

/// Loads a driver library from `library` without touching the process-wide one (tests use this to prove the
/// no-driver path). The library stays loaded for the life of the process.
Result<DriverApi> load_driver(const std::string& library);

/// "CUDA_ERROR_INVALID_IMAGE" for a driver result, from the loaded driver (the number when none is loaded).
std::string cuda_error_name(CUresult result);

/// Converts a driver result into a Status naming the call, the error and where it happened.
Status to_status(CUresult result, const char* expr, const char* file, int line);

}  // namespace kiln
