// LazyKernel: a kernel whose verified binary is in memory and whose driver load happens at first use, once.
//
// Preloading many kernels eagerly is bounded by the driver: cuModuleLoadData serialises inside it and slows
// as a context holds more modules (bench/cache). A LazyKernel lets start-up stop at "read and verified" and
// moves one module load to the kernel's first use, which concurrent first users share.
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "kiln/jit/compiler.h"
#include "kiln/jit/module.h"
#include "kiln/status.h"

namespace kiln {

/// A value made at first use by whichever thread asks first. Concurrent callers wait for that one make and
/// share its value; `make` runs once per success. A failed make is returned to its caller (and to those who
/// waited on it, each of whom then tries once more in turn), so a transient failure is not remembered forever.
/// Movable while no get() is in progress.
template <class T>
class LoadOnce {
 public:
  LoadOnce() : state_(std::make_unique<State>()) {}
  /// Already made: get() returns it without calling make.
  explicit LoadOnce(T value) : LoadOnce() {
    state_->value.emplace(std::move(value));
    state_->ready.store(&*state_->value, std::memory_order_release);
  }

  /// The value, making it with `make()` (returning Result<T>) when no call has succeeded yet.
  template <class Make>
  Result<const T*> get(Make&& make) const {
    if (const T* v = state_->ready.load(std::memory_order_acquire)) return v;
    std::lock_guard lock(state_->mu);
    if (const T* v = state_->ready.load(std::memory_order_acquire)) return v;
    Result<T> made = make();
    if (!made.ok()) return made.status();
    state_->value.emplace(std::move(made).value());
    const T* v = &*state_->value;
    state_->ready.store(v, std::memory_order_release);
    return v;
  }
  /// Whether a value has been made (it may be, by another thread, right after this returns false).
  bool ready() const { return state_->ready.load(std::memory_order_acquire) != nullptr; }

 private:
  struct State {
    std::mutex mu;
    std::optional<T> value;
    std::atomic<const T*> ready{nullptr};
  };
  std::unique_ptr<State> state_;  // stable address for waiters; makes the object movable
};

/// How a module is put into the driver.
enum class ModuleApi {
  kModule,   // cuModuleLoadData into a context, then cuModuleGetFunction
  kLibrary,  // cuLibraryLoadData (context-independent, CUDA 12+), then cuLibraryGetKernel + cuKernelGetFunction
};

/// Loads `binary` with `api` into the current context and resolves its entry kernel.
Result<Kernel> load_kernel(const Binary& binary, ModuleApi api);

/// A kernel loaded at its first get(). Thread-safe; move-only (not while a get() is in progress).
class LazyKernel {
 public:
  /// Deferred: the module is loaded into `context` at the first get(), whichever thread calls it.
  LazyKernel(std::shared_ptr<const Binary> binary, CUcontext context, ModuleApi api = ModuleApi::kModule)
      : binary_(std::move(binary)), context_(context), api_(api) {}
  /// Already loaded.
  explicit LazyKernel(Kernel kernel) : kernel_(std::move(kernel)) {}

  /// The kernel, loading its module first if no call has yet. Errors: what the driver said, with the kernel's
  /// name; a later call tries again.
  Result<const Kernel*> get() const;
  /// Whether the module is loaded.
  bool loaded() const { return kernel_.ready(); }
  /// The binary it loads from (null when constructed loaded).
  const std::shared_ptr<const Binary>& binary() const { return binary_; }

 private:
  std::shared_ptr<const Binary> binary_;
  CUcontext context_ = nullptr;
  ModuleApi api_ = ModuleApi::kModule;
  LoadOnce<Kernel> kernel_;
};

}  // namespace kiln
