#include "kiln/jit/lazy_kernel.h"

#include <fmt/format.h>

#include "kiln/jit/driver.h"

namespace kiln {

Result<Kernel> load_kernel(const Binary& binary, ModuleApi api) {
  KILN_ASSIGN_OR_RETURN(Module m, api == ModuleApi::kLibrary ? Module::load_library(binary) : Module::load(binary));
  return m.kernel(binary.entry);
}

Result<const Kernel*> LazyKernel::get() const {
  return kernel_.get([&]() -> Result<Kernel> {
    if (!binary_) return make_error(ErrorCode::kInternal, "a lazy kernel without a binary");
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    // The module goes into the context preloading was asked for, whichever thread uses the kernel first.
    CUcontext current = nullptr;
    KILN_CHECK(d->cuCtxGetCurrent(&current));
    const bool push = context_ != nullptr && current != context_;
    if (push) KILN_CHECK(d->cuCtxPushCurrent(context_));
    // A first use may come inside a graph capture (a serving engine captures the sizes it never ran eagerly).
    // Loading a module is no stream work, but global capture mode forbids it as potentially unsafe: this
    // thread relaxes its mode for the load and restores it.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool relaxed = d->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    auto k = load_kernel(*binary_, api_);
    if (relaxed) (void)d->cuThreadExchangeStreamCaptureMode(&mode);
    if (push) {
      CUcontext popped = nullptr;
      (void)d->cuCtxPopCurrent(&popped);
    }
    return k;
  });
}

}  // namespace kiln
