// Warm-cache preloading: at start-up, load every cached decision's kernel for this device so that the first
// request launches at once instead of compiling or even reading the cache.
//
// "Ready" means: the cubin was read from the cache and verified, cuModuleLoadData loaded it into the
// context, and cuModuleGetFunction resolved the entry point, so the kernel can be launched with no further
// cache, file or compiler work. Under CUDA's lazy module loading (CUDA_MODULE_LOADING=LAZY, the driver's
// default) the driver could still defer work to the first launch; measured on the H200 machine, the first
// launch of a preloaded kernel cost the same as the second (10.8 us with the sync), so nothing visible is
// left for it. With load_modules false, "ready" is weaker: verified bytes in memory, loaded at first use.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/records.h"
#include "kiln/cache/store.h"
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
  /// Load each module and resolve its kernel (the default). False: only read and verify the binaries and
  /// keep them in the store's memory layer (get_binary then costs ~100 ns), leaving cuModuleLoadData to the
  /// kernel's first use: much faster for many kernels, because the driver's load serialises and slows as a
  /// context holds more modules (docs/cache.md), but the first launch of each kernel pays its load.
  bool load_modules = true;
};

struct PreloadReport {
  size_t decisions = 0;       // decisions selected
  size_t loaded = 0;          // kernels loaded and resolved
  size_t verified = 0;        // binaries read and verified but not loaded (load_modules false)
  size_t without_kernel = 0;  // decisions for library choices (no compiled kernel to load)
  size_t missing = 0;         // decisions whose binary is absent, invalid or for another arch (compiled later)
  size_t failed = 0;          // binaries the driver refused (reason in errors)
  std::vector<std::string> errors;  // the first few reasons for missing and failed
  int threads = 0;
  double select_seconds = 0;  // choosing the decisions
  double load_seconds = 0;    // reading, verifying, loading and resolving
  double total_seconds = 0;
};

/// Kernels loaded by preload(), by canonical problem key. Move-only; each Kernel keeps its module loaded.
class Preloaded {
 public:
  Preloaded() = default;
  Preloaded(Preloaded&&) noexcept = default;
  Preloaded& operator=(Preloaded&&) noexcept = default;

  /// The loaded kernel for `problem`, or null. Not synchronised with concurrent moves of this object.
  const Kernel* find(std::string_view problem) const;
  /// The decision the kernel came from, or null.
  std::shared_ptr<const Decision> decision(std::string_view problem) const;
  size_t size() const { return kernels_.size(); }
  const PreloadReport& report() const { return report_; }

 private:
  friend Result<Preloaded> preload(Store& store, const PreloadOptions& options);
  struct Entry {
    std::shared_ptr<const Decision> decision;
    Kernel kernel;
  };
  std::map<std::string, Entry, std::less<>> kernels_;
  PreloadReport report_;
};

/// Loads the kernels of the selected decisions (see PreloadOptions) in parallel. A decision whose binary is
/// missing or refused is counted in the report, not an error. Errors: kNoDriver / kNoDevice when there is
/// no GPU, kInvalidArgument for a problem key that does not parse.
Result<Preloaded> preload(Store& store, const PreloadOptions& options = {});

/// The thread count preload() uses for `kernels` kernels when PreloadOptions::threads is 0 (chosen from
/// bench/cache's measurements on the H200 machine).
int default_preload_threads(size_t kernels, bool load_modules = true);

}  // namespace kiln::cache
