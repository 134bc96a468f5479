#include "kiln/cache/preload.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "kiln/cache/problem_key.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/target.h"

namespace kiln::cache {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const Kernel* Preloaded::find(std::string_view problem) const {
  auto it = kernels_.find(problem);
  return it == kernels_.end() ? nullptr : &it->second.kernel;
}

std::shared_ptr<const Decision> Preloaded::decision(std::string_view problem) const {
  auto it = kernels_.find(problem);
  return it == kernels_.end() ? nullptr : it->second.decision;
}

int default_preload_threads(size_t kernels, bool load_modules) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  // Reading and verifying scale with threads (H200 machine, 1,000 cubins: 19.8 ms on 1 thread, 3.5 ms on 8).
  if (!load_modules) return kernels < 64 ? 1 : static_cast<int>(std::min<unsigned>(8, hw));
  // cuModuleLoadData serialises inside the driver (raw loads took as long on 8 threads as on 1), so a second
  // thread only overlaps reading with loading; more contend (1,000 kernels: 164 ms on 1 thread, 143 on 2,
  // 158 on 4, 188 on 8). bench/results/cache-nvidia-h200-*.md.
  return kernels < 64 ? 1 : static_cast<int>(std::min<unsigned>(2, hw));
}

Result<Preloaded> preload(Store& store, const PreloadOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, ensure_context(options.device));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(options.device));
  const int cc = info.cc_major * 10 + info.cc_minor;

  std::vector<std::shared_ptr<const Decision>> selected;
  if (options.problems.empty()) {
    selected = store.decisions(environment_prefix(DeviceFingerprint::from(info), VersionStamp::current()));
  } else {
    for (const auto& p : options.problems) {
      KILN_RETURN_IF_ERROR(ProblemKey::parse(p).status().with_context("reading the problems to preload"));
      if (auto dec = store.decision(p)) selected.push_back(std::move(dec));
    }
  }
  Preloaded out;
  PreloadReport& r = out.report_;
  r.decisions = selected.size();
  r.select_seconds = seconds_since(t0);

  std::vector<std::shared_ptr<const Decision>> work;
  for (auto& dec : selected) {
    if (dec->kernel) {
      work.push_back(std::move(dec));
    } else {
      r.without_kernel++;
    }
  }
  r.threads = options.threads > 0 ? options.threads : default_preload_threads(work.size(), options.load_modules);
  r.threads = std::max(1, std::min<int>(r.threads, static_cast<int>(std::max<size_t>(1, work.size()))));

  struct Slot {
    std::optional<Kernel> kernel;
    Status error;
    bool missing = false;
    bool verified = false;  // read and verified, not loaded (load_modules false)
  };
  std::vector<Slot> slots(work.size());
  std::atomic<size_t> next{0};
  auto t1 = std::chrono::steady_clock::now();
  auto worker = [&](bool own_thread) {
    // Module loads go into the caller's context, whichever thread does them.
    if (own_thread && d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
    for (size_t i = next++; i < work.size(); i = next++) {
      const Decision& dec = *work[i];
      auto bin = store.get_binary(*dec.kernel, {}, /*remember=*/false);
      if (!bin.ok()) {
        slots[i].missing = true;
        slots[i].error = bin.status();
        continue;
      }
      // A binary for another arch is missing for this device, whether modules are loaded now or at first use
      // (the verify-only path used to count it as verified).
      auto target = Target::parse((*bin)->arch);
      if (!target.ok() || target->compute_capability() != cc) {
        slots[i].missing = true;
        slots[i].error = make_error(ErrorCode::kNotFound, fmt::format("binary {} is for {}, the device is {}",
                                                                      dec.kernel->hex(), (*bin)->arch, info.arch()));
        continue;
      }
      if (!options.load_modules) {
        // Keep the verified binary where the runtime's first use will find it without reading the database.
        (void)store.get_binary(*dec.kernel, {}, /*remember=*/true);
        slots[i].verified = true;
        continue;
      }
      auto module = Module::load(**bin);
      if (!module.ok()) {
        slots[i].error = module.status();
        continue;
      }
      auto kernel = module->kernel((*bin)->entry);
      if (!kernel.ok()) {
        slots[i].error = kernel.status();
        continue;
      }
      slots[i].kernel.emplace(std::move(kernel).value());
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int t = 1; t < r.threads; ++t) threads.emplace_back(worker, true);
    worker(false);
  }
  r.load_seconds = seconds_since(t1);

  std::vector<KernelKey> used;
  for (size_t i = 0; i < work.size(); ++i) {
    Slot& s = slots[i];
    if (s.verified) {
      r.verified++;
      used.push_back(*work[i]->kernel);
      continue;
    }
    if (s.kernel) {
      r.loaded++;
      used.push_back(*work[i]->kernel);
      out.kernels_.emplace(work[i]->problem, Preloaded::Entry{work[i], std::move(*s.kernel)});
      continue;
    }
    (s.missing ? r.missing : r.failed)++;
    if (r.errors.size() < 8) r.errors.push_back(fmt::format("{}: {}", work[i]->problem, s.error.to_string()));
  }
  r.total_seconds = seconds_since(t0);
  if (options.touch && !used.empty()) {
    // Bookkeeping for pruning; a failure here must not fail the preload.
    (void)store.touch(used);
  }
  return out;
}

}  // namespace kiln::cache
