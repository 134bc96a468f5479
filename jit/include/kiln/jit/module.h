// Module and Kernel: a loaded cubin and a launchable function in it, as move-only owners.
//
// A Module is loaded into the calling thread's current context (see ensure_context); a Kernel keeps its
// module loaded for as long as the Kernel lives, so kernels may outlive the Module object they came from.
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/status.h"

namespace kiln {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned shared_bytes = 0;  // dynamic shared memory; above 48 KiB the kernel's limit is raised automatically
  CUstream stream = nullptr;  // the caller's stream; nullptr is the legacy default stream
  Dim3 cluster;               // thread-block cluster shape (sm_90+); {1,1,1} launches without clusters
  // Programmatic dependent launch (sm_90+): the kernel may be scheduled while the previous kernel in the stream
  // still runs, so its launch latency hides behind that kernel's tail. Only for kernels that execute
  // griddepcontrol.wait before touching memory the previous work writes.
  bool programmatic = false;
};

/// What the compiler gave a kernel, as the driver reports it.
struct KernelAttributes {
  int registers = 0;              // per thread
  int static_shared_bytes = 0;
  int max_dynamic_shared_bytes = 0;
  int const_bytes = 0;
  int local_bytes = 0;            // per thread: spills and local arrays
  int max_threads_per_block = 0;
  int ptx_version = 0;            // e.g. 90
  int binary_version = 0;         // e.g. 90
};

namespace detail {
struct LoadedModule;  // the CUmodule and the context it lives in; unloaded when the last owner goes
}

class Kernel {
 public:
  Kernel(Kernel&&) noexcept = default;
  Kernel& operator=(Kernel&&) noexcept = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;
  ~Kernel() = default;

  const std::string& name() const { return name_; }
  CUfunction get() const { return function_; }

  Result<KernelAttributes> attributes() const;
  /// Allows launches with up to `bytes` of dynamic shared memory (needed above 48 KiB).
  Status set_max_dynamic_shared_bytes(int bytes) const;

  /// Launches with `args`: an array of pointers to each argument, as cuLaunchKernel takes them.
  /// Launch errors are returned; faults inside the kernel show up at the next synchronisation.
  Status launch(const LaunchConfig& config, void** args) const;

  /// Launches with the arguments by value: kernel(config, a_ptr, b_ptr, n).
  template <class... Args>
  Status operator()(const LaunchConfig& config, const Args&... args) const {
    void* ptrs[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
    return launch(config, ptrs);
  }

 private:
  friend class Module;
  Kernel(std::shared_ptr<detail::LoadedModule> module, CUfunction f, std::string name)
      : module_(std::move(module)), function_(f), name_(std::move(name)), dynamic_limit_(std::make_unique<std::atomic<int>>(48 * 1024)) {}

  std::shared_ptr<detail::LoadedModule> module_;
  CUfunction function_ = nullptr;
  std::string name_;
  std::unique_ptr<std::atomic<int>> dynamic_limit_;  // the dynamic shared memory the kernel is set up for
};

class Module {
 public:
  /// Loads `binary`'s cubin into the current context (kFailedPrecondition when the thread has none).
  static Result<Module> load(const Binary& binary);
  /// Loads a cubin or fatbin image with no lowered-name table.
  static Result<Module> load_image(std::string_view cubin);
  /// Loads `binary`'s cubin with cuLibraryLoadData: context-independent (CUDA 12+); kernel() then puts the
  /// kernel into the current context. get() is null for such a module.
  static Result<Module> load_library(const Binary& binary);

  Module(Module&&) noexcept = default;
  Module& operator=(Module&&) noexcept = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module() = default;

  /// The kernel `entry`: an extern "C" name, or a name expression compiled into the binary.
  Result<Kernel> kernel(const std::string& entry) const;
  CUmodule get() const;
  CUcontext context() const;

 private:
  explicit Module(std::shared_ptr<detail::LoadedModule> m, std::vector<std::pair<std::string, std::string>> names)
      : module_(std::move(m)), lowered_names_(std::move(names)) {}
  std::shared_ptr<detail::LoadedModule> module_;
  std::vector<std::pair<std::string, std::string>> lowered_names_;
};

/// Loads `binary` and returns its entry kernel: the common case in one call.
Result<Kernel> load_kernel(const Binary& binary);

}  // namespace kiln
