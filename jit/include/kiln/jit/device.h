// Devices, contexts, streams, events and device memory: move-only owners over the Driver API.
//
// kiln works inside the caller's CUDA context and on the caller's stream (a serving engine owns both);
// when the calling thread has no current context, ensure_context() makes the device's primary context
// current, which is the context the CUDA runtime and PyTorch use too.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kiln/status.h"

namespace kiln {

/// What kiln needs to know about a device: for naming problems, pruning configurations and picking arches.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;                   // "NVIDIA H200"
  int cc_major = 0;                   // 9
  int cc_minor = 0;                   // 0
  int sm_count = 0;                   // 132
  size_t total_memory = 0;            // bytes
  int max_shared_per_block_optin = 0; // bytes a block may use after opting in (227 KiB on Hopper)
  int max_shared_per_sm = 0;
  int l2_bytes = 0;
  int max_threads_per_block = 0;
  int clock_khz = 0;
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;

  /// "sm_90": the real architecture NVRTC targets for this device.
  std::string arch() const;
};

/// Number of CUDA devices; kNoDriver / kNoDevice without one.
Result<int> device_count();
Result<DeviceInfo> device_info(int ordinal);

/// The calling thread's current context, or nullptr when it has none.
Result<CUcontext> current_context();

/// Makes sure the calling thread has a current context: keeps the caller's own if it has one, otherwise makes
/// device `ordinal`'s primary context current (retained once for the life of the process). Returns it.
Result<CUcontext> ensure_context(int ordinal = 0);

/// The device of the calling thread's current context.
Result<int> current_device();

namespace detail {
void destroy_stream(CUstream s);
void destroy_event(CUevent e);

/// Move-only ownership of a driver handle, released with `Destroy` (which ignores a driver already gone).
template <class H, void (*Destroy)(H)>
class OwnedHandle {
 public:
  OwnedHandle() = default;
  explicit OwnedHandle(H h) : h_(h) {}
  OwnedHandle(OwnedHandle&& other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  OwnedHandle& operator=(OwnedHandle&& other) noexcept {
    if (this != &other) {
      reset();
      h_ = std::exchange(other.h_, nullptr);
    }
    return *this;
  }
  ~OwnedHandle() { reset(); }

  H get() const { return h_; }

 private:
  void reset() {
    if (h_ != nullptr) Destroy(std::exchange(h_, nullptr));
  }
  H h_ = nullptr;
};
}  // namespace detail

/// An owned CUDA stream (non-blocking with respect to the legacy default stream). Move-only.
class Stream {
 public:
  static Result<Stream> create();
  Stream() = default;

  CUstream get() const { return stream_.get(); }
  Status synchronize() const;

 private:
  explicit Stream(CUstream s) : stream_(s) {}
  detail::OwnedHandle<CUstream, detail::destroy_stream> stream_;
};

/// An owned CUDA event for timing. Move-only.
class Event {
 public:
  static Result<Event> create();
  Event() = default;

  CUevent get() const { return event_.get(); }
  Status record(CUstream stream) const;
  Status synchronize() const;
  /// Milliseconds from `start` to this event; both must have completed.
  Result<float> elapsed_ms_since(const Event& start) const;

 private:
  explicit Event(CUevent e) : event_(e) {}
  detail::OwnedHandle<CUevent, detail::destroy_event> event_;
};

/// An owned device allocation in the current context.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) { other.ptr_ = 0; other.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr ptr() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(static_cast<uintptr_t>(ptr_)); }

  /// Synchronous copies of `bytes` (at most size()).
  Status copy_from_host(const void* src, size_t bytes) const;
  Status copy_to_host(void* dst, size_t bytes) const;
  /// Sets every byte to `value` (used to poison outputs before a run).
  Status fill_bytes(uint8_t value, CUstream stream = nullptr) const;

 private:
  DeviceBuffer(CUdeviceptr p, size_t n) : ptr_(p), bytes_(n) {}
  void reset();
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

}  // namespace kiln
