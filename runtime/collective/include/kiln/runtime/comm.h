// Communicators, process groups and peer buffers for kiln's collectives (docs/collectives.md).
//
// kiln does not launch processes for an application: it wraps the application's ncclComm_t (with its rank,
// world size and device). For its own tests, CLI and benchmarks, run_local_group() starts one process per GPU
// and bootstraps NCCL itself (rank 0's unique id reaches the others through pipes).
//
// NCCL is loaded with dlopen("libnccl.so.2") on first use ($KILN_NCCL_LIBRARY overrides), like the driver:
// nothing links it, and a machine without it gets kNoDriver naming the library, never a start-up failure.
// NVLink multicast (NVLS) is never used: kiln sets NCCL_NVLS_ENABLE=0 unless the caller set it, and never
// calls cuMulticastCreate.
#pragma once

#include <cuda.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"

// The same typedef nccl.h makes, so callers that include nccl.h pass their communicator unchanged.
typedef struct ncclComm* ncclComm_t;

namespace kiln::runtime {

/// NCCL's unique id (NCCL_UNIQUE_ID_BYTES = 128), as plain bytes.
using NcclId = std::array<char, 128>;

/// The NCCL library's version code (e.g. 22803 for 2.28.3), loading it if needed. kNoDriver if it cannot load.
Result<int> nccl_version();

/// A fresh NCCL unique id (rank 0 makes it and hands it to the others). Needs no GPU.
Result<NcclId> nccl_unique_id();

/// A communicator of `world` ranks with this process as `rank` on `device`, plus what kiln's collectives need
/// around it: the device's context, an internal stream and small device/host buffers for control traffic.
class Communicator {
 public:
  /// Wraps the application's communicator; kiln never destroys or aborts it. The device's primary context is
  /// retained and made current on the calling thread if none is.
  static Result<std::unique_ptr<Communicator>> wrap(ncclComm_t comm, int rank, int world, int device);
  /// Creates (and owns) a communicator from `id` (ncclCommInitRank); destroyed with this object.
  static Result<std::unique_ptr<Communicator>> init(const NcclId& id, int rank, int world, int device);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world() const;
  int device() const;
  ncclComm_t nccl() const;
  CUcontext context() const;
  /// kiln's own stream for control traffic (barriers, timing exchange). Never the caller's.
  CUstream stream() const;

  // Host-level collectives for kiln's own decisions: synchronous, on stream(), through NCCL. Every rank must
  // make the same calls in the same order (as with any NCCL collective).
  /// Returns once every rank has entered it.
  Status barrier();
  /// Element-wise maximum over ranks, in place. Every rank passes the same length (at most 8192 values).
  Status all_reduce_max(std::vector<double>& values);
  /// Every rank's `mine` (the same size on every rank, at most 64 KiB), indexed by rank.
  Result<std::vector<std::string>> all_gather(const std::string& mine);

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Device memory of the same size on every rank, each rank's allocation mapped into every other rank's
/// address space with CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle, exchanged once through the
/// communicator), zeroed at creation and reused for the life of the object, so kernels that use it can be
/// captured in CUDA graphs. Destruction (or release()) closes the peers' mappings, waits for every rank to
/// have done so, then frees this rank's memory.
class PeerBuffers {
 public:
  /// Collective: every rank calls it with the same `bytes`.
  static Result<std::unique_ptr<PeerBuffers>> create(Communicator& comm, size_t bytes);
  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  /// Every rank's buffer as seen from this process, indexed by rank; ptr(rank()) is this rank's own. 0 for a
  /// rank out of range, and for every rank once released (all() is then empty).
  CUdeviceptr ptr(int rank) const;
  CUdeviceptr local() const;
  const std::vector<CUdeviceptr>& all() const;
  size_t bytes() const;
  /// Collective: unmaps the peers' buffers, waits for every rank, frees this rank's. Idempotent.
  Status release();

 private:
  struct Impl;
  explicit PeerBuffers(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// How run_local_group() starts its ranks.
struct GroupOptions {
  int world = 2;
  /// devices[rank]; empty: rank r uses device r.
  std::vector<int> devices;
  /// Create an NCCL communicator in each rank (false: the function gets no communicator and the rank does not
  /// touch CUDA or NCCL before it runs: process-level tests, probes that must also work without a GPU).
  bool nccl = true;
  /// A rank still running this long after the group started is killed and reported as timed out.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// Once one rank has failed (error, crash), the others get this long to finish before they are killed (a
  /// rank blocked in a collective with a dead peer never returns by itself).
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
};

/// What one rank of a group ended with.
struct RankOutcome {
  int rank = 0;
  Status status;        // the function's status, or why the rank ended without one (signal, exit, timeout, killed)
  std::string result;   // the function's returned string (e.g. JSON of its measurements), when it succeeded
};

/// The function each rank runs: `comm` is null when GroupOptions::nccl is false.
using RankFunction = std::function<Result<std::string>(int rank, Communicator* comm)>;

/// Forks options.world processes, one per rank; each (when options.nccl) binds its device's primary context and
/// creates the NCCL communicator, then runs `fn`; the parent collects every rank's outcome (its Status and result
/// string, sent back through a pipe) and returns them indexed by rank. The parent must not have used CUDA
/// before calling (a forked child cannot use a CUDA context inherited from its parent). The returned Result is
/// an error only when the group could not be started; each rank's failure is in its outcome.
Result<std::vector<RankOutcome>> run_local_group(const GroupOptions& options, const RankFunction& fn);

/// A diagnostic for crashes in the ranks (the GPU machines have no debugger): with $KILN_CRASH_TRACE set,
/// SIGSEGV, SIGBUS and SIGABRT in this process, and in the ranks run_local_group() forks from it afterwards,
/// print the stack to stderr as "module+offset" lines (resolve them with addr2line against the unstripped build)
/// before the default action. Without the variable it does nothing. For programs' main(), never for a library.
void install_crash_trace();

}  // namespace kiln::runtime
