#include "kiln/jit/module.h"

#include <fmt/format.h>

#include "kiln/jit/driver.h"

namespace kiln {
namespace detail {

struct LoadedModule {
  CUmodule module = nullptr;
  CUlibrary library = nullptr;  // set instead of module for Module::load_library
  CUcontext context = nullptr;
  ~LoadedModule() {
    if (module == nullptr && library == nullptr) return;
    if (auto d = driver(); d.ok()) {
      if (module != nullptr) (void)(*d)->cuModuleUnload(module);
      if (library != nullptr) (void)(*d)->cuLibraryUnload(library);
    }
  }
};

}  // namespace detail

namespace {

Result<std::shared_ptr<detail::LoadedModule>> load_into_current(std::string_view image, bool library) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUcontext ctx = nullptr;
  KILN_CHECK(d->cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "no current CUDA context on this thread: make one current, or call kiln::ensure_context()");
  }
  // A cubin is an ELF image; nvcc's fatbins (several cubins plus PTX) start with 0xBA55ED50.
  const bool elf = image.size() >= 4 && image.substr(0, 4) == "\x7f" "ELF";
  const bool fatbin = image.size() >= 4 && image.substr(0, 4) == std::string_view("\x50\xed\x55\xba", 4);
  if (!elf && !fatbin) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("not a cubin or fatbin: {} bytes without an ELF or fatbin header", image.size()));
  }
  auto m = std::make_shared<detail::LoadedModule>();
  m->context = ctx;
  if (library) {
    KILN_CHECK(d->cuLibraryLoadData(&m->library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  } else {
    KILN_CHECK(d->cuModuleLoadData(&m->module, image.data()));
  }
  return m;
}

}  // namespace

Result<Module> Module::load(const Binary& binary) {
  auto m = load_into_current(binary.cubin, false);
  if (!m.ok()) return std::move(m).status().with_context(fmt::format("loading '{}' ({})", binary.name, binary.key.hex()));
  return Module(std::move(m).value(), binary.lowered_names);
}

Result<Module> Module::load_library(const Binary& binary) {
  auto m = load_into_current(binary.cubin, true);
  if (!m.ok()) {
    return std::move(m).status().with_context(fmt::format("loading '{}' ({}) as a library", binary.name, binary.key.hex()));
  }
  return Module(std::move(m).value(), binary.lowered_names);
}

Result<Module> Module::load_image(std::string_view cubin) {
  KILN_ASSIGN_OR_RETURN(auto m, load_into_current(cubin, false));
  return Module(std::move(m), {});
}

CUmodule Module::get() const { return module_->module; }
CUcontext Module::context() const { return module_->context; }

Result<Kernel> Module::kernel(const std::string& entry) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  std::string symbol = entry;
  for (const auto& [expr, lowered] : lowered_names_) {
    if (expr == entry) symbol = lowered;
  }
  CUfunction f = nullptr;
  CUresult rc;
  if (module_->library != nullptr) {
    // The library's kernel, put into the current context (where launches of this Kernel go).
    CUkernel k = nullptr;
    rc = d->cuLibraryGetKernel(&k, module_->library, symbol.c_str());
    if (rc == CUDA_SUCCESS) rc = d->cuKernelGetFunction(&f, k);
  } else {
    rc = d->cuModuleGetFunction(&f, module_->module, symbol.c_str());
  }
  if (rc == CUDA_ERROR_NOT_FOUND) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("kernel '{}' is not in the module (looked up as '{}'); is it extern \"C\" or a "
                                  "name expression of the source?",
                                  entry, symbol));
  }
  KILN_CHECK(rc);
  return Kernel(module_, f, entry);
}

Result<Kernel> load_kernel(const Binary& binary) {
  KILN_ASSIGN_OR_RETURN(Module m, Module::load(binary));
  return m.kernel(binary.entry);
}

Result<KernelAttributes> Kernel::attributes() const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KernelAttributes a;
  std::pair<CUfunction_attribute, int*> table[] = {
      {CU_FUNC_ATTRIBUTE_NUM_REGS, &a.registers},
      {CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &a.static_shared_bytes},
      {CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &a.max_dynamic_shared_bytes},
      {CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, &a.const_bytes},
      {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &a.local_bytes},
      {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &a.max_threads_per_block},
      {CU_FUNC_ATTRIBUTE_PTX_VERSION, &a.ptx_version},
      {CU_FUNC_ATTRIBUTE_BINARY_VERSION, &a.binary_version},
  };
  for (auto [attr, out] : table) KILN_CHECK(d->cuFuncGetAttribute(out, attr, function_));
  return a;
}

Status Kernel::set_max_dynamic_shared_bytes(int bytes) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
  dynamic_limit_->store(bytes, std::memory_order_relaxed);
  return Status();
}

Status Kernel::launch(const LaunchConfig& c, void** args) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (static_cast<int>(c.shared_bytes) > dynamic_limit_->load(std::memory_order_relaxed)) {
    KILN_RETURN_IF_ERROR(set_max_dynamic_shared_bytes(static_cast<int>(c.shared_bytes)).with_context(
        fmt::format("raising the dynamic shared memory of '{}' to {} bytes", name_, c.shared_bytes)));
  }
  CUresult rc;
  const bool clustered = c.cluster.x * c.cluster.y * c.cluster.z != 1;
  if (!clustered && !c.programmatic) {
    rc = d->cuLaunchKernel(function_, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.shared_bytes,
                           c.stream, args, nullptr);
  } else {
    CUlaunchAttribute attrs[2]{};
    unsigned n = 0;
    if (clustered) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = c.cluster.x;
      attrs[n].value.clusterDim.y = c.cluster.y;
      attrs[n].value.clusterDim.z = c.cluster.z;
      ++n;
    }
    if (c.programmatic) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n].value.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    CUlaunchConfig lc{};
    lc.gridDimX = c.grid.x;
    lc.gridDimY = c.grid.y;
    lc.gridDimZ = c.grid.z;
    lc.blockDimX = c.block.x;
    lc.blockDimY = c.block.y;
    lc.blockDimZ = c.block.z;
    lc.sharedMemBytes = c.shared_bytes;
    lc.hStream = c.stream;
    lc.attrs = attrs;
    lc.numAttrs = n;
    rc = d->cuLaunchKernelEx(&lc, function_, args, nullptr);
  }
  if (rc != CUDA_SUCCESS) {
    return to_status(rc, "cuLaunchKernel", __FILE__, __LINE__)
        .with_context(fmt::format("launching '{}' grid ({},{},{}) block ({},{},{}) smem {}", name_, c.grid.x, c.grid.y,
                                  c.grid.z, c.block.x, c.block.y, c.block.z, c.shared_bytes));
  }
  return Status();
}

}  // namespace kiln
