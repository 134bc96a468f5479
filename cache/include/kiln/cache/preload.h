// Warm-cache preloading: at start-up, read and verify every cached decision's kernel for this device, and load
// it into the driver (now, or at the kernel's first use), so that no request compiles or reads the cache.
//
// Where the time goes (bench/cache, H200 machine, 1,000 kernels): reading and verifying the binaries takes a
// few milliseconds on 8 threads; the driver's cuModuleLoadData takes ~150 ms, serialised inside the driver and
// slower per module as the context holds more modules. So the default is lazy: preload reads and verifies
// every binary, and each kernel's module is loaded at its first use (once, shared by concurrent first users),
// which costs one module load (tens to ~150 us) on that first launch. A serving engine starts serving sooner,
// loads only the kernels it actually launches, and can finish the rest off the critical path with
// Preloaded::load_all() (call it before capturing CUDA graphs, where loading a module is best avoided).
// `lazy = false` restores eager loading: every kernel "ready" (loaded and resolved) when preload returns.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/records.h"
#include "kiln/cache/store.h"
#include "kiln/jit/lazy_kernel.h"
#include "kiln/jit/module.h"
#include "kiln/status.h"

namespace kiln::cache {

struct PreloadOptions {
  /// The device whose decisions are loaded (its fingerprint and today's driver, CUDA and kiln versions
  /// select them), in the calling thread's current context, or the device's primary context when the
  /// thread has none. Default 0.
  int device = 0;
  /// Load exactly these problems (canonical keys) instead of every decision for the device. Default empty.
  std::vector<std::string> problems;
  /// Threads that read, verify and load. 0 (the default) picks a number from measurements (see
  /// docs/cache.md); 1 does everything on the calling thread.
  int threads = 0;
  /// Record the loaded binaries as used (for least-recently-used pruning). Default true.
  bool touch = true;
  /// Load the modules at all (the default). False: only read and verify the binaries and keep them in the
  /// store's memory layer (get_binary then costs ~100 ns); the Preloaded result holds no kernels, and the
  /// runtime's own first use loads them.
  bool load_modules = true;
  /// Defer each module's driver load to the kernel's first use through the Preloaded result (the default; see
  /// the top of this file). False: load and resolve every kernel before preload returns.
  bool lazy = true;
  /// The driver API modules go in with (now or at first use): cuModuleLoadData (the default) or
  /// cuLibraryLoadData (context-independent; bench/cache measures both).
  ModuleApi api = ModuleApi::kModule;
};

struct PreloadReport {
  size_t decisions = 0;       // decisions selected
  size_t loaded = 0;          // kernels loaded and resolved during preload (eager)
  size_t deferred = 0;        // kernels read and verified, their module loaded at first use (lazy)
  size_t verified = 0;        // binaries read and verified but not held as kernels (load_modules false)
  size_t without_kernel = 0;  // decisions for library choices (no compiled kernel to load)
  size_t missing = 0;         // decisions whose binary is absent, invalid or for another arch (compiled later)
  size_t failed = 0;          // binaries the driver refused (reason in errors)
  std::vector<std::string> errors;  // the first few reasons for missing and failed
  int threads = 0;
  double select_seconds = 0;  // choosing the decisions
  double load_seconds = 0;    // wall time of reading, verifying and (eager) loading and resolving
  double total_seconds = 0;
  // Where load_seconds went, summed over the threads (so with several threads each may exceed the wall time):
  double read_seconds = 0;    // RocksDB's batched reads of the binaries
  double verify_seconds = 0;  // decoding the values and checking checksums, keys, NVRTC version and arch
  double driver_seconds = 0;  // the driver's module load and kernel lookup (eager only)
};

/// Kernels preloaded by preload(), by canonical problem key: loaded, or (lazy) loaded at first use. Move-only;
/// each Kernel keeps its module loaded. Lookups are thread-safe among themselves.
class Preloaded {
 public:
  Preloaded() = default;
  Preloaded(Preloaded&&) noexcept = default;
  Preloaded& operator=(Preloaded&&) noexcept = default;

  /// The kernel for `problem`, loading its module first if it was deferred; null when `problem` was not
  /// preloaded or its load failed (kernel() says why). Not synchronised with concurrent moves of this object.
  const Kernel* find(std::string_view problem) const;
  /// The same with the reason: kNotFound when `problem` was not preloaded, or the driver's error for a
  /// deferred load that failed (a later call tries again).
  Result<const Kernel*> kernel(std::string_view problem) const;
  /// The decision the kernel came from, or null.
  std::shared_ptr<const Decision> decision(std::string_view problem) const;
  /// Loads every kernel still deferred, on `threads` threads (into the preload's context). The first error
  /// is returned after every other kernel has been tried.
  Status load_all(int threads = 1) const;
  /// Kernels held, loaded or deferred.
  size_t size() const { return kernels_.size(); }
  /// Kernels whose module is loaded now.
  size_t loaded() const;
  const PreloadReport& report() const { return report_; }

 private:
  friend Result<Preloaded> preload(Store& store, const PreloadOptions& options);
  struct Entry {
    std::shared_ptr<const Decision> decision;
    LazyKernel kernel;
  };
  std::map<std::string, Entry, std::less<>> kernels_;
  PreloadReport report_;
};

/// Reads, verifies and (eagerly or at first use) loads the kernels of the selected decisions (see
/// PreloadOptions) in parallel. A decision whose binary is
/// missing or refused is counted in the report, not an error. Errors: kNoDriver / kNoDevice when there is
/// no GPU, kInvalidArgument for a problem key that does not parse.
Result<Preloaded> preload(Store& store, const PreloadOptions& options = {});

/// The thread count preload() uses for `kernels` kernels when PreloadOptions::threads is 0 (chosen from
/// bench/cache's measurements on the H200 machine). `eager_load`: whether the driver loads modules during
/// the preload (load_modules and not lazy).
int default_preload_threads(size_t kernels, bool eager_load = false);

}  // namespace kiln::cache
