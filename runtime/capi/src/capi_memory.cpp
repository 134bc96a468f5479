// The C API's device memory and synchronisation helpers, in the context's device (its primary context, the
// one the CUDA runtime and frameworks use).
#include <fmt/format.h>

#include "capi_internal.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"

using namespace kiln;
using kiln::capi::guarded;

namespace {

Result<const DriverApi*> in_device(const char* fn, kiln_context* ctx) {
  if (ctx == nullptr) return capi::bad_argument(fn, "ctx is NULL");
  KILN_RETURN_IF_ERROR(ensure_context(ctx->options.device).status());
  return driver();
}

}  // namespace

extern "C" {

KILN_API kiln_status kiln_device_alloc(kiln_context* ctx, size_t bytes, uint64_t* ptr) {
  return guarded("kiln_device_alloc", [&]() -> Status {
    if (ptr == nullptr) return capi::bad_argument("kiln_device_alloc", "ptr is NULL");
    *ptr = 0;
    if (bytes == 0) return capi::bad_argument("kiln_device_alloc", "bytes is 0");
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, in_device("kiln_device_alloc", ctx));
    CUdeviceptr p = 0;
    KILN_CHECK(d->cuMemAlloc(&p, bytes));
    *ptr = p;
    return Status();
  });
}

KILN_API kiln_status kiln_device_free(kiln_context* ctx, uint64_t ptr) {
  return guarded("kiln_device_free", [&]() -> Status {
    if (ptr == 0) return Status();
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, in_device("kiln_device_free", ctx));
    KILN_CHECK(d->cuMemFree(ptr));
    return Status();
  });
}

KILN_API kiln_status kiln_copy_to_device(kiln_context* ctx, uint64_t dst, const void* src, size_t bytes) {
  return guarded("kiln_copy_to_device", [&]() -> Status {
    if (bytes == 0) return Status();
    if (dst == 0 || src == nullptr) return capi::bad_argument("kiln_copy_to_device", "dst and src must not be 0/NULL");
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, in_device("kiln_copy_to_device", ctx));
    KILN_CHECK(d->cuMemcpyHtoD(dst, src, bytes));
    return Status();
  });
}

KILN_API kiln_status kiln_copy_to_host(kiln_context* ctx, void* dst, uint64_t src, size_t bytes) {
  return guarded("kiln_copy_to_host", [&]() -> Status {
    if (bytes == 0) return Status();
    if (dst == nullptr || src == 0) return capi::bad_argument("kiln_copy_to_host", "dst and src must not be NULL/0");
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, in_device("kiln_copy_to_host", ctx));
    KILN_CHECK(d->cuMemcpyDtoH(dst, src, bytes));
    return Status();
  });
}

KILN_API kiln_status kiln_synchronize(kiln_context* ctx, void* stream) {
  return guarded("kiln_synchronize", [&]() -> Status {
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, in_device("kiln_synchronize", ctx));
    if (stream == nullptr) {
      KILN_CHECK(d->cuCtxSynchronize());
    } else {
      KILN_CHECK(d->cuStreamSynchronize(static_cast<CUstream>(stream)));
    }
    return Status();
  });
}

}  // extern "C"
