// NCCL's symmetric memory (NCCL 2.27+): one buffer per rank from ncclMemAlloc, registered collectively as a
// window with NCCL_WIN_COLL_SYMMETRIC. An ncclAllReduce whose send and receive buffers lie in such a window at
// the same offset on every rank may run NCCL's symmetric kernels (peer loads and stores over NVLink instead of
// its channel protocol), which is what the all-reduce's "nccl_symmetric" choice measures. Private to the
// collective library.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <memory>

#include "kiln/runtime/comm.h"
#include "kiln/status.h"

namespace kiln::runtime::detail {

/// This rank's part of a window: NCCL handles, owned by the SymmetricWindowPtr that holds them.
struct SymmetricWindow {
  Communicator* comm = nullptr;
  void* buffer = nullptr;
  size_t bytes = 0;
  ncclWindow_t window = nullptr;

  CUdeviceptr ptr() const { return reinterpret_cast<CUdeviceptr>(buffer); }
};

/// Deregisters the window and frees its buffer. Collective (the deregistration is): every rank releases its
/// window alike, before the communicator.
struct ReleaseSymmetricWindow {
  void operator()(SymmetricWindow* w) const;
};
using SymmetricWindowPtr = std::unique_ptr<SymmetricWindow, ReleaseSymmetricWindow>;

/// Collective: every rank calls it with the same `bytes`, with the communicator's context current. Every rank
/// gets the same outcome: a window on all of them, or an error on all of them (kUnavailable when the loaded
/// NCCL has no symmetric memory, else the failing rank's reason).
Result<SymmetricWindowPtr> create_symmetric_window(Communicator& comm, size_t bytes);

}  // namespace kiln::runtime::detail
