// NCCL's symmetric memory (NCCL 2.27+): one buffer per rank from ncclMemAlloc, registered collectively as a
// window with NCCL_WIN_COLL_SYMMETRIC. An ncclAllReduce whose send and receive buffers lie in such a window at
// the same offset on every rank may run NCCL's symmetric kernels (peer loads and stores over NVLink instead of
// its channel protocol), which is what the all-reduce's "nccl_symmetric" choice measures. Private to the
// runtime library.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <memory>

#include "kiln/runtime/comm.h"
#include "kiln/status.h"

namespace kiln::runtime::detail {

class SymmetricWindow {
 public:
  /// Collective: every rank calls it with the same `bytes`, with the communicator's context current. Every rank
  /// gets the same outcome: a window on all of them, or an error on all of them (kUnavailable when the loaded
  /// NCCL has no symmetric memory, else the failing rank's reason).
  static Result<std::unique_ptr<SymmetricWindow>> create(Communicator& comm, size_t bytes);
  /// Collective (the deregistration is): every rank destroys its window alike, before the communicator.
  ~SymmetricWindow();
  SymmetricWindow(const SymmetricWindow&) = delete;
  SymmetricWindow& operator=(const SymmetricWindow&) = delete;

  CUdeviceptr ptr() const { return reinterpret_cast<CUdeviceptr>(buffer_); }
  size_t bytes() const { return bytes_; }

 private:
  SymmetricWindow(Communicator& comm, void* buffer, size_t bytes, ncclWindow_t window)
      : comm_(comm), buffer_(buffer), bytes_(bytes), window_(window) {}
  Communicator& comm_;
  void* buffer_;
  size_t bytes_;
  ncclWindow_t window_;
};

}  // namespace kiln::runtime::detail
