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
  auto k = kernel(problem);
  return k.ok() ? *k : nullptr;
}

Result<const Kernel*> Preloaded::kernel(std::string_view problem) const {
  auto it = kernels_.find(problem);
  if (it == kernels_.end()) return make_error(ErrorCode::kNotFound, fmt::format("'{}' was not preloaded", problem));
  return it->second.kernel.get();
}

std::shared_ptr<const Decision> Preloaded::decision(std::string_view problem) const {
  auto it = kernels_.find(problem);
  return it == kernels_.end() ? nullptr : it->second.decision;
}

size_t Preloaded::loaded() const {
  size_t n = 0;
  for (const auto& [problem, e] : kernels_) n += e.kernel.loaded();
  return n;
}

Status Preloaded::load_all(int threads) const {
  std::vector<const Entry*> todo;
  for (const auto& [problem, e] : kernels_) {
    if (!e.kernel.loaded()) todo.push_back(&e);
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  auto worker = [&] {
    for (size_t i = next++; i < todo.size(); i = next++) {
      auto k = todo[i]->kernel.get();
      if (!k.ok()) {
        std::lock_guard lock(mu);
        if (first.ok()) first = k.status().with_context(fmt::format("loading the kernel of '{}'", todo[i]->decision->problem));
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < std::min<int>(threads, static_cast<int>(todo.size())); ++t) pool.emplace_back(worker);
    worker();
  }
  return first;
}

int default_preload_threads(size_t kernels, bool eager_load) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  // Reading and verifying scale with threads (H200 machine, 1,000 cubins: 19.8 ms on 1 thread, 3.5 ms on 8).
  if (!eager_load) return kernels < 64 ? 1 : static_cast<int>(std::min<unsigned>(8, hw));
  // cuModuleLoadData serialises inside the driver (raw loads took as long on 8 threads as on 1), so a second
  // thread only overlaps reading with loading; more contend (1,000 kernels: 164 ms on 1 thread, 143 on 2,
  // 158 on 4, 188 on 8). bench/results/cache-nvidia-h200-*.md.
  return kernels < 64 ? 1 : static_cast<int>(std::min<unsigned>(2, hw));
}

Result<Preloaded> preload(Store& store, const PreloadOptions& options) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, ensure_context(options.device));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(options.device));
  const int cc = info.cc_major * 10 + info.cc_minor;
  const bool eager = options.load_modules && !options.lazy;

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
  r.threads = options.threads > 0 ? options.threads : default_preload_threads(work.size(), eager);
  r.threads = std::max(1, std::min<int>(r.threads, static_cast<int>(std::max<size_t>(1, work.size()))));

  struct Slot {
    std::optional<Kernel> kernel;            // eager
    std::shared_ptr<const Binary> binary;    // lazy: verified, loaded at first use
    Status error;
    bool missing = false;
    bool verified = false;  // read and verified, kept in the store (load_modules false)
  };
  std::vector<Slot> slots(work.size());
  // Work goes out in batches: each is one MultiGet, then decoded, verified and (eager) loaded by its thread.
  // Small enough that threads share the tail evenly, large enough that a MultiGet amortises its setup.
  const size_t batch = std::clamp<size_t>(work.size() / (size_t(r.threads) * 4), 1, 64);
  std::atomic<size_t> next{0};
  struct PhaseTimes {
    double read = 0, verify = 0, driver = 0;
  };
  std::vector<PhaseTimes> times(r.threads);
  auto t1 = Clock::now();
  auto worker = [&](int index) {
    PhaseTimes& pt = times[index];
    // Module loads go into the caller's context, whichever thread does them.
    if (index > 0 && eager && d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
    std::vector<KernelKey> keys;
    for (size_t begin = next.fetch_add(batch); begin < work.size(); begin = next.fetch_add(batch)) {
      size_t end = std::min(work.size(), begin + batch);
      keys.clear();
      for (size_t i = begin; i < end; ++i) keys.push_back(*work[i]->kernel);
      Store::BinaryReadTimes rt;
      // Verify-only keeps the binaries in the store's memory, where the runtime's first use finds them.
      auto bins = store.get_binaries(keys, {}, /*remember=*/!options.load_modules, &rt);
      pt.read += rt.read_seconds;
      pt.verify += rt.decode_seconds;
      for (size_t i = begin; i < end; ++i) {
        Slot& slot = slots[i];
        auto& bin = bins[i - begin];
        const Decision& dec = *work[i];
        if (!bin.ok()) {
          slot.missing = true;
          slot.error = bin.status();
          continue;
        }
        // A binary for another arch is missing for this device, whether modules are loaded now or at first use.
        auto tv = Clock::now();
        auto target = Target::parse((*bin)->arch);
        pt.verify += seconds_since(tv);
        if (!target.ok() || target->compute_capability() != cc) {
          slot.missing = true;
          slot.error = make_error(ErrorCode::kNotFound, fmt::format("binary {} is for {}, the device is {}",
                                                                    dec.kernel->hex(), (*bin)->arch, info.arch()));
          continue;
        }
        if (!options.load_modules) {
          slot.verified = true;
          continue;
        }
        if (!eager) {
          slot.binary = std::move(bin).value();
          continue;
        }
        auto tl = Clock::now();
        auto kernel = load_kernel(**bin, options.api);
        pt.driver += seconds_since(tl);
        if (!kernel.ok()) {
          slot.error = kernel.status();
          continue;
        }
        slot.kernel.emplace(std::move(kernel).value());
      }
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int t = 1; t < r.threads; ++t) threads.emplace_back(worker, t);
    worker(0);
  }
  r.load_seconds = seconds_since(t1);
  for (const PhaseTimes& pt : times) {
    r.read_seconds += pt.read;
    r.verify_seconds += pt.verify;
    r.driver_seconds += pt.driver;
  }

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
      out.kernels_.emplace(work[i]->problem, Preloaded::Entry{work[i], LazyKernel(std::move(*s.kernel))});
      continue;
    }
    if (s.binary) {
      r.deferred++;
      used.push_back(*work[i]->kernel);
      out.kernels_.emplace(work[i]->problem, Preloaded::Entry{work[i], LazyKernel(std::move(s.binary), ctx, options.api)});
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
