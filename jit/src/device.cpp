#include "kiln/jit/device.h"

#include <array>
#include <mutex>

#include <fmt/format.h>

#include "kiln/jit/driver.h"

namespace kiln {

std::string DeviceInfo::arch() const { return fmt::format("sm_{}{}", cc_major, cc_minor); }

Result<int> device_count() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  return d->device_count;
}

Result<DeviceInfo> device_info(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (ordinal < 0 || ordinal >= d->device_count) {
    return make_error(ErrorCode::kNoDevice,
                      fmt::format("device {} does not exist: there are {} devices", ordinal, d->device_count));
  }
  CUdevice dev;
  KILN_CHECK(d->cuDeviceGet(&dev, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  std::array<char, 256> name{};
  KILN_CHECK(d->cuDeviceGetName(name.data(), static_cast<int>(name.size()), dev));
  info.name = name.data();
  auto attr = [&](CUdevice_attribute a, int& out) { return to_status(d->cuDeviceGetAttribute(&out, a, dev), "cuDeviceGetAttribute", __FILE__, __LINE__); };
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, info.cc_major));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, info.cc_minor));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, info.sm_count));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, info.max_shared_per_block_optin));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, info.max_shared_per_sm));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, info.l2_bytes));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, info.max_threads_per_block));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, info.clock_khz));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, info.memory_clock_khz));
  KILN_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, info.memory_bus_bits));
  KILN_CHECK(d->cuDeviceTotalMem(&info.total_memory, dev));
  return info;
}

Result<CUcontext> current_context() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUcontext ctx = nullptr;
  KILN_CHECK(d->cuCtxGetCurrent(&ctx));
  return ctx;
}

Result<CUcontext> ensure_context(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUcontext ctx = nullptr;
  KILN_CHECK(d->cuCtxGetCurrent(&ctx));
  if (ctx != nullptr) return ctx;
  if (ordinal < 0 || ordinal >= d->device_count) {
    return make_error(ErrorCode::kNoDevice,
                      fmt::format("device {} does not exist: there are {} devices", ordinal, d->device_count));
  }
  // Primary contexts are retained once per device and kept for the life of the process, the way the CUDA
  // runtime does: releasing them while kernels or modules still live in them would pull the ground away.
  static std::mutex mu;
  static std::array<CUcontext, 64> retained{};
  CUcontext primary = nullptr;
  {
    std::lock_guard lock(mu);
    if (ordinal >= static_cast<int>(retained.size())) {
      return make_error(ErrorCode::kOutOfRange, fmt::format("device ordinal {} is above kiln's limit", ordinal));
    }
    if (retained[ordinal] == nullptr) {
      CUdevice dev;
      KILN_CHECK(d->cuDeviceGet(&dev, ordinal));
      KILN_CHECK(d->cuDevicePrimaryCtxRetain(&retained[ordinal], dev));
    }
    primary = retained[ordinal];
  }
  KILN_CHECK(d->cuCtxSetCurrent(primary));
  return primary;
}

Result<int> current_device() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUdevice dev;
  KILN_CHECK(d->cuCtxGetDevice(&dev));
  return static_cast<int>(dev);
}

// ---- owned handles: released quietly where the driver is already gone (at process exit)

void detail::destroy_stream(CUstream s) {
  if (auto d = driver(); d.ok()) (void)(*d)->cuStreamDestroy(s);
}
void detail::destroy_event(CUevent e) {
  if (auto d = driver(); d.ok()) (void)(*d)->cuEventDestroy(e);
}

// ---- Stream ----

Result<Stream> Stream::create() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUstream s = nullptr;
  KILN_CHECK(d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return Stream(s);
}

Status Stream::synchronize() const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuStreamSynchronize(get()));
  return Status();
}

// ---- Event ----

Result<Event> Event::create() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUevent e = nullptr;
  KILN_CHECK(d->cuEventCreate(&e, CU_EVENT_DEFAULT));
  return Event(e);
}

Status Event::record(CUstream stream) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuEventRecord(get(), stream));
  return Status();
}

Status Event::synchronize() const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuEventSynchronize(get()));
  return Status();
}

Result<float> Event::elapsed_ms_since(const Event& start) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  float ms = 0;
  KILN_CHECK(d->cuEventElapsedTime(&ms, start.get(), get()));
  return ms;
}

// ---- DeviceBuffer ----

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUdeviceptr p = 0;
  if (bytes > 0) KILN_CHECK(d->cuMemAlloc(&p, bytes));
  return DeviceBuffer(p, bytes);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = 0;
    other.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() {
  if (ptr_ == 0) return;
  if (auto d = driver(); d.ok()) (void)(*d)->cuMemFree(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

namespace {
Status check_size(size_t want, size_t have, const char* what) {
  if (want <= have) return Status();
  return make_error(ErrorCode::kOutOfRange,
                    fmt::format("{} of {} bytes does not fit a {}-byte device buffer", what, want, have));
}
}  // namespace

Status DeviceBuffer::copy_from_host(const void* src, size_t bytes) const {
  KILN_RETURN_IF_ERROR(check_size(bytes, bytes_, "copy to device"));
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (bytes) KILN_CHECK(d->cuMemcpyHtoD(ptr_, src, bytes));
  return Status();
}

Status DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  KILN_RETURN_IF_ERROR(check_size(bytes, bytes_, "copy to host"));
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (bytes) KILN_CHECK(d->cuMemcpyDtoH(dst, ptr_, bytes));
  return Status();
}

Status DeviceBuffer::fill_bytes(uint8_t value, CUstream stream) const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (bytes_) KILN_CHECK(d->cuMemsetD8Async(ptr_, value, bytes_, stream));
  return Status();
}

}  // namespace kiln
