#include "kiln/runtime/helper_kernels.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "kiln/embedded.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"

namespace kiln::runtime::kernels {
std::span<const kiln::EmbeddedFile> embedded_files();
}

namespace kiln::runtime {

Result<const HelperKernels*> helper_kernels() {
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, current_context());
  if (ctx == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition, "no current CUDA context (kiln::ensure_context)");
  }
  static std::mutex mu;
  static auto* loaded = new std::map<CUcontext, HelperKernels>();  // process lifetime, like the contexts
  std::lock_guard lock(mu);
  if (auto it = loaded->find(ctx); it != loaded->end()) return &it->second;
  std::string_view image;
  for (const auto& f : kernels::embedded_files()) {
    if (f.name == "helpers.fatbin") image = f.contents;
  }
  if (image.empty()) return make_error(ErrorCode::kInternal, "kiln was built without its helper kernels");
  KILN_ASSIGN_OR_RETURN(Module m, Module::load_image(image));
  KILN_ASSIGN_OR_RETURN(Kernel fill, m.kernel("kiln_fill_uniform"));
  KILN_ASSIGN_OR_RETURN(Kernel cmp, m.kernel("kiln_compare"));
  KILN_ASSIGN_OR_RETURN(Kernel norm, m.kernel("kiln_reference_norm"));
  KILN_ASSIGN_OR_RETURN(Kernel softmax, m.kernel("kiln_reference_softmax"));
  KILN_ASSIGN_OR_RETURN(Kernel flush, m.kernel("kiln_flush_l2"));
  KILN_ASSIGN_OR_RETURN(Kernel hold, m.kernel("kiln_hold"));
  auto [it, _] = loaded->emplace(ctx, HelperKernels{std::move(fill), std::move(cmp), std::move(norm), std::move(softmax),
                                                    std::move(flush), std::move(hold)});
  return &it->second;
}

Status fill_uniform(CUdeviceptr ptr, int64_t count, DType dtype, uint32_t seed, float lo, float hi, CUstream stream) {
  if (count <= 0) return Status();
  KILN_ASSIGN_OR_RETURN(const HelperKernels* h, helper_kernels());
  LaunchConfig cfg;
  cfg.block = {256};
  cfg.grid = {static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4096))};
  cfg.stream = stream;
  long long n = count;
  int dt = static_cast<int>(dtype);
  return h->fill_uniform(cfg, ptr, n, dt, seed, lo, hi);
}

Status read_through_l2(CUdeviceptr buffer, size_t bytes, CUstream stream) {
  if (bytes < 16) return Status();
  if (buffer % 16 || bytes % 16) {
    return make_error(ErrorCode::kInvalidArgument, "read_through_l2: the buffer must be 16-byte aligned and sized");
  }
  KILN_ASSIGN_OR_RETURN(const HelperKernels* h, helper_kernels());
  long long words = static_cast<long long>(bytes / 16);
  LaunchConfig cfg;
  cfg.block = {256};
  // 2048 blocks of 256 threads keep ~8 MB of loads in flight: DRAM's full rate on the devices kiln targets.
  cfg.grid = {static_cast<unsigned>(std::min<long long>((words + 255) / 256, 2048))};
  cfg.stream = stream;
  CUdeviceptr sink = buffer;
  return h->flush_l2(cfg, buffer, words, sink);
}

Status hold_stream(CUdeviceptr released, uint64_t ticket, uint64_t timeout_ns, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(const HelperKernels* h, helper_kernels());
  LaunchConfig cfg;
  cfg.block = {1};
  cfg.grid = {1};
  cfg.stream = stream;
  unsigned long long t = ticket, timeout = timeout_ns;
  return h->hold(cfg, released, t, timeout);
}

Result<Comparison> compare(CUdeviceptr out, DType out_dtype, int64_t ld_out, CUdeviceptr ref, DType ref_dtype,
                           int64_t ld_ref, int64_t rows, int64_t cols, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(const HelperKernels* h, helper_kernels());
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_ASSIGN_OR_RETURN(DeviceBuffer acc, DeviceBuffer::allocate(3 * sizeof(double)));
  KILN_RETURN_IF_ERROR(acc.fill_bytes(0, stream));
  LaunchConfig cfg;
  cfg.block = {256};
  cfg.grid = {static_cast<unsigned>(std::clamp<int64_t>((rows * cols + 255) / 256, 1, 1024))};
  cfg.stream = stream;
  int od = static_cast<int>(out_dtype), rd = static_cast<int>(ref_dtype);
  long long lo = ld_out, lr = ld_ref, r = rows, c = cols;
  KILN_RETURN_IF_ERROR(h->compare(cfg, out, od, lo, ref, rd, lr, r, c, acc.ptr()));
  double host[3];
  KILN_CHECK(d->cuMemcpyDtoHAsync(host, acc.ptr(), sizeof host, stream));
  KILN_CHECK(d->cuStreamSynchronize(stream));
  Comparison out_cmp;
  out_cmp.non_finite = static_cast<int64_t>(host[2]);
  out_cmp.relative_error = host[1] > 0 ? std::sqrt(host[0] / host[1]) : std::sqrt(host[0]);
  return out_cmp;
}

}  // namespace kiln::runtime
