#include "kiln/runtime/comm.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "nccl_api.h"

namespace kiln::runtime {

namespace {

constexpr size_t kInitialScratchBytes = 128 << 10;
constexpr size_t kMaxReduceValues = 8192;
constexpr size_t kMaxGatherBytes = 64 << 10;
constexpr size_t kPeerAlignment = 2 << 20;

/// Makes `ctx` current on this thread for the scope's life when it is not already, restoring the caller's
/// context afterwards: kiln's calls run in the communicator's context whatever thread the caller uses.
class ContextScope {
 public:
  explicit ContextScope(const DriverApi* d) : d_(d) {}
  ~ContextScope() {
    if (pushed_) {
      CUcontext popped = nullptr;
      (void)d_->cuCtxPopCurrent(&popped);
    }
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  Status enter(CUcontext ctx) {
    CUcontext current = nullptr;
    KILN_CHECK(d_->cuCtxGetCurrent(&current));
    if (current == ctx) return Status();
    KILN_CHECK(d_->cuCtxPushCurrent(ctx));
    pushed_ = true;
    return Status();
  }

 private:
  const DriverApi* d_;
  bool pushed_ = false;
};

}  // namespace

// ---- Communicator

struct Communicator::Impl {
  const DriverApi* d = nullptr;
  const detail::NcclApi* api = nullptr;
  ncclComm_t comm = nullptr;
  bool owned = false;
  int rank = 0;
  int world = 0;
  int device = 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;  // the device's primary context, retained by this object
  CUstream stream = nullptr;

  std::mutex mu;  // the control collectives share the scratch buffers
  CUdeviceptr dscratch = 0;
  void* hscratch = nullptr;  // pinned, so the copies around a collective are truly asynchronous
  size_t scratch_bytes = 0;
  // NCCL reported an asynchronous error: its kernels may never finish, so an owned communicator is aborted
  // (ncclCommDestroy would wait for them) and nothing waits on the stream again.
  bool broken = false;

  ~Impl();
  /// Everything but the NCCL communicator itself: the device's context, the stream, the scratch buffers.
  static Result<std::unique_ptr<Impl>> create(int rank, int world, int device);
  Status usable() const;
  Status ensure_scratch(size_t bytes);
  Status wait(const char* what);
  /// NCCL's asynchronous error, `when` ("waiting for", "after") `what`; one marks the communicator broken.
  Status async_error(const char* when, const char* what);
  Status reduce_max_locked(double* values, size_t n);
  /// The size every rank passed to `what` (at most `most` `unit`), or the same error on every rank.
  Result<size_t> agree_on_size(size_t mine, size_t most, const char* what, const char* unit);

  /// Runs one control collective: serialised with the others (they share the scratch buffers), on a usable
  /// communicator, with its context current (the caller's is restored afterwards).
  template <typename Body>
  auto run_locked(Body&& body) -> decltype(body()) {
    std::lock_guard lock(mu);
    ContextScope scope(d);
    KILN_RETURN_IF_ERROR(usable());
    KILN_RETURN_IF_ERROR(scope.enter(ctx));
    return body();
  }
};

Communicator::Impl::~Impl() {
  if (d == nullptr) return;
  {
    ContextScope scope(d);
    Status entered = ctx ? scope.enter(ctx) : make_error(ErrorCode::kFailedPrecondition, "no context");
    if (owned && comm != nullptr) {
      Status st = broken ? to_status(api->ncclCommAbort(comm), "ncclCommAbort", __FILE__, __LINE__)
                         : to_status(api->ncclCommDestroy(comm), "ncclCommDestroy", __FILE__, __LINE__);
      if (!st.ok()) spdlog::warn("kiln: destroying rank {}'s communicator: {}", rank, st.to_string());
    }
    if (entered.ok()) {
      // With a broken wrapped communicator NCCL's kernel may still spin on this stream and freeing its
      // buffers would wait for it forever; the few bytes are left to the process instead.
      if (!broken || owned) {
        if (dscratch != 0) (void)d->cuMemFree(dscratch);
        if (hscratch != nullptr) (void)d->cuMemFreeHost(hscratch);
      }
      if (stream != nullptr) (void)d->cuStreamDestroy(stream);
    }
  }
  if (ctx != nullptr) (void)d->cuDevicePrimaryCtxRelease(dev);
}

Status Communicator::Impl::usable() const {
  if (!broken) return Status();
  return make_error(ErrorCode::kFailedPrecondition,
                    fmt::format("rank {}'s communicator had an asynchronous NCCL error; it cannot be used again",
                                rank));
}

Status Communicator::Impl::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_bytes) return Status();
  size_t want = std::max({bytes, kInitialScratchBytes, scratch_bytes * 2});
  if (dscratch != 0) (void)d->cuMemFree(dscratch);
  if (hscratch != nullptr) (void)d->cuMemFreeHost(hscratch);
  dscratch = 0;
  hscratch = nullptr;
  scratch_bytes = 0;
  KILN_CHECK(d->cuMemAlloc(&dscratch, want));
  KILN_CHECK(d->cuMemAllocHost(&hscratch, want));
  scratch_bytes = want;
  return Status();
}

Status Communicator::Impl::wait(const char* what) {
  // The stream and NCCL's asynchronous error are polled together: a failure NCCL detects (a network error, a
  // peer that aborted) becomes an error here instead of a stream that never completes. Spinning first keeps
  // the usual microsecond-scale collective fast; backing off keeps a long wait for a slow peer cheap.
  for (int spins = 0;; ++spins) {
    CUresult q = d->cuStreamQuery(stream);
    if (q == CUDA_SUCCESS) break;
    if (q != CUDA_ERROR_NOT_READY) {
      return to_status(q, "cuStreamQuery", __FILE__, __LINE__).with_context(fmt::format("waiting for {}", what));
    }
    KILN_RETURN_IF_ERROR(async_error("waiting for", what));
    if (spins < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 4096 ? 20 : 200));
    }
  }
  return async_error("after", what);
}

Status Communicator::Impl::async_error(const char* when, const char* what) {
  ncclResult_t async = ncclSuccess;
  KILN_CHECK(api->ncclCommGetAsyncError(comm, &async));
  if (async == ncclSuccess || async == ncclInProgress) return Status();
  broken = true;
  return to_status(async, "ncclCommGetAsyncError", __FILE__, __LINE__)
      .with_context(fmt::format("{} {} on rank {}", when, what, rank));
}

Status Communicator::Impl::reduce_max_locked(double* values, size_t n) {
  const size_t bytes = n * sizeof(double);
  KILN_RETURN_IF_ERROR(ensure_scratch(bytes));
  std::memcpy(hscratch, values, bytes);
  KILN_CHECK(d->cuMemcpyHtoDAsync(dscratch, hscratch, bytes, stream));
  KILN_CHECK(api->ncclAllReduce(reinterpret_cast<const void*>(dscratch), reinterpret_cast<void*>(dscratch), n,
                                ncclFloat64, ncclMax, comm, stream));
  KILN_CHECK(d->cuMemcpyDtoHAsync(hscratch, dscratch, bytes, stream));
  KILN_RETURN_IF_ERROR(wait("all_reduce_max"));
  std::memcpy(values, hscratch, bytes);
  return Status();
}

// NCCL cannot tell that ranks passed different counts: it hangs or reads past a buffer. One small reduction
// first gives every rank the same verdict, so they all fail alike instead.
Result<size_t> Communicator::Impl::agree_on_size(size_t mine, size_t most, const char* what, const char* unit) {
  double extremes[2] = {static_cast<double>(mine), -static_cast<double>(mine)};
  KILN_RETURN_IF_ERROR(reduce_max_locked(extremes, 2));
  if (extremes[0] != -extremes[1]) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: ranks passed different sizes (from {} to {}; this rank {})", what,
                                  -extremes[1], extremes[0], mine));
  }
  if (mine > most) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} of {} {}: at most {}", what, mine, unit, most));
  }
  return mine;
}

Result<std::unique_ptr<Communicator::Impl>> Communicator::Impl::create(int rank, int world, int device) {
  if (world < 1 || rank < 0 || rank >= world) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("rank {} of a world of {}", rank, world));
  }
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_ASSIGN_OR_RETURN(const detail::NcclApi* api, detail::nccl());
  if (device < 0 || device >= d->device_count) {
    return make_error(ErrorCode::kNoDevice,
                      fmt::format("device {} does not exist: there are {} devices", device, d->device_count));
  }
  auto impl = std::make_unique<Impl>();
  impl->d = d;
  impl->api = api;
  impl->rank = rank;
  impl->world = world;
  impl->device = device;
  KILN_CHECK(d->cuDeviceGet(&impl->dev, device));
  KILN_CHECK(d->cuDevicePrimaryCtxRetain(&impl->ctx, impl->dev));
  // A thread without a context gets the device's primary one (what the CUDA runtime, and so NCCL, uses),
  // retained for the process by ensure_context so that the thread's current context outlives this object; a
  // caller's own current context is left alone and kiln's calls push the primary context around themselves.
  KILN_RETURN_IF_ERROR(ensure_context(device));
  ContextScope scope(d);
  KILN_RETURN_IF_ERROR(scope.enter(impl->ctx));
  KILN_CHECK(d->cuStreamCreate(&impl->stream, CU_STREAM_NON_BLOCKING));
  KILN_RETURN_IF_ERROR(impl->ensure_scratch(kInitialScratchBytes));
  return impl;
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

Result<std::unique_ptr<Communicator>> Communicator::wrap(ncclComm_t comm, int rank, int world, int device) {
  if (comm == nullptr) return make_error(ErrorCode::kInvalidArgument, "Communicator::wrap: null ncclComm_t");
  KILN_ASSIGN_OR_RETURN(auto impl, Impl::create(rank, world, device));
  // The caller's numbers are checked against the communicator itself: a mismatch would make every later
  // collective index the wrong rank or run on the wrong device.
  int count = 0, user_rank = 0, cu_device = 0;
  KILN_CHECK(impl->api->ncclCommCount(comm, &count));
  KILN_CHECK(impl->api->ncclCommUserRank(comm, &user_rank));
  KILN_CHECK(impl->api->ncclCommCuDevice(comm, &cu_device));
  if (count != world || user_rank != rank || cu_device != device) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("Communicator::wrap: said rank {} of {} on device {}, but the communicator is "
                                  "rank {} of {} on device {}",
                                  rank, world, device, user_rank, count, cu_device));
  }
  impl->comm = comm;
  impl->owned = false;
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Result<std::unique_ptr<Communicator>> Communicator::init(const NcclId& id, int rank, int world, int device) {
  KILN_ASSIGN_OR_RETURN(auto impl, Impl::create(rank, world, device));
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.data(), sizeof nid.internal);
  {
    // ncclCommInitRank binds the communicator to the current device, hence the primary context around it.
    ContextScope scope(impl->d);
    KILN_RETURN_IF_ERROR(scope.enter(impl->ctx));
    ncclComm_t comm = nullptr;
    Status st = to_status(impl->api->ncclCommInitRank(&comm, world, nid, rank), "ncclCommInitRank", __FILE__,
                          __LINE__);
    if (!st.ok()) return std::move(st).with_context(fmt::format("rank {} of {} on device {}", rank, world, device));
    impl->comm = comm;
    impl->owned = true;
  }
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::world() const { return impl_->world; }
int Communicator::device() const { return impl_->device; }
ncclComm_t Communicator::nccl() const { return impl_->comm; }
CUcontext Communicator::context() const { return impl_->ctx; }
CUstream Communicator::stream() const { return impl_->stream; }

Status Communicator::barrier() {
  Impl& m = *impl_;
  return m.run_locked([&]() -> Status {
    KILN_RETURN_IF_ERROR(m.ensure_scratch(1));
    // A reduction completes on a rank only once every rank has contributed to it; its value is irrelevant.
    KILN_CHECK(m.api->ncclAllReduce(reinterpret_cast<const void*>(m.dscratch), reinterpret_cast<void*>(m.dscratch),
                                    1, ncclUint8, ncclMax, m.comm, m.stream));
    return m.wait("barrier");
  });
}

Status Communicator::all_reduce_max(std::vector<double>& values) {
  Impl& m = *impl_;
  return m.run_locked([&]() -> Status {
    KILN_ASSIGN_OR_RETURN(size_t n, m.agree_on_size(values.size(), kMaxReduceValues, "all_reduce_max", "values"));
    if (n == 0) return Status();
    return m.reduce_max_locked(values.data(), n);
  });
}

Result<std::vector<std::string>> Communicator::all_gather(const std::string& mine) {
  Impl& m = *impl_;
  return m.run_locked([&]() -> Result<std::vector<std::string>> {
    KILN_ASSIGN_OR_RETURN(size_t n, m.agree_on_size(mine.size(), kMaxGatherBytes, "all_gather", "bytes per rank"));
    std::vector<std::string> out(static_cast<size_t>(m.world));
    if (n == 0) return out;
    const size_t total = n * static_cast<size_t>(m.world);
    KILN_RETURN_IF_ERROR(m.ensure_scratch(total));
    // In place: this rank's bytes already sit at its slot of the receive buffer.
    char* host = static_cast<char*>(m.hscratch);
    const size_t slot = n * static_cast<size_t>(m.rank);
    std::memcpy(host + slot, mine.data(), n);
    KILN_CHECK(m.d->cuMemcpyHtoDAsync(m.dscratch + slot, host + slot, n, m.stream));
    KILN_CHECK(m.api->ncclAllGather(reinterpret_cast<const void*>(m.dscratch + slot),
                                    reinterpret_cast<void*>(m.dscratch), n, ncclUint8, m.comm, m.stream));
    KILN_CHECK(m.d->cuMemcpyDtoHAsync(host, m.dscratch, total, m.stream));
    KILN_RETURN_IF_ERROR(m.wait("all_gather"));
    for (int r = 0; r < m.world; ++r) out[static_cast<size_t>(r)].assign(host + n * static_cast<size_t>(r), n);
    return out;
  });
}

// ---- PeerBuffers

struct PeerBuffers::Impl {
  Communicator* comm = nullptr;  // outlives this object (the caller's contract)
  const DriverApi* d = nullptr;
  size_t bytes = 0;
  CUdeviceptr own = 0;
  std::vector<CUdeviceptr> ptrs;  // ptrs[rank] == own; the others are IPC mappings while not released
  bool released = false;

  /// Closes the mappings this rank opened and frees its own memory without waiting for the others: only for
  /// when no peer can have mapped it, or the communicator can no longer tell.
  Status close_local();
  Status close_mappings();
};

Status PeerBuffers::Impl::close_mappings() {
  Status first;
  for (size_t r = 0; r < ptrs.size(); ++r) {
    if (static_cast<int>(r) == comm->rank() || ptrs[r] == 0) continue;
    Status st = to_status(d->cuIpcCloseMemHandle(ptrs[r]), "cuIpcCloseMemHandle", __FILE__, __LINE__);
    if (!st.ok() && first.ok()) first = std::move(st).with_context(fmt::format("rank {}'s buffer", r));
    ptrs[r] = 0;
  }
  return first;
}

Status PeerBuffers::Impl::close_local() {
  Status first = close_mappings();
  if (own != 0) {
    Status st = to_status(d->cuMemFree(own), "cuMemFree", __FILE__, __LINE__);
    if (!st.ok() && first.ok()) first = std::move(st);
    own = 0;
  }
  ptrs.clear();
  released = true;
  return first;
}

namespace {

// What each rank tells the others at creation: whether it has a buffer, its size, and its IPC handle.
struct PeerRecord {
  uint8_t ok = 0;
  uint64_t bytes = 0;
  CUipcMemHandle handle{};
};
constexpr size_t kPeerRecordBytes = 1 + sizeof(uint64_t) + sizeof(CUipcMemHandle);

std::string encode(const PeerRecord& r) {
  std::string s(kPeerRecordBytes, '\0');
  s[0] = static_cast<char>(r.ok);
  std::memcpy(s.data() + 1, &r.bytes, sizeof r.bytes);
  std::memcpy(s.data() + 1 + sizeof r.bytes, &r.handle, sizeof r.handle);
  return s;
}

PeerRecord decode(const std::string& s) {
  PeerRecord r;
  if (s.size() != kPeerRecordBytes) return r;
  r.ok = static_cast<uint8_t>(s[0]);
  std::memcpy(&r.bytes, s.data() + 1, sizeof r.bytes);
  std::memcpy(&r.handle, s.data() + 1 + sizeof r.bytes, sizeof r.handle);
  return r;
}

}  // namespace

PeerBuffers::PeerBuffers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PeerBuffers::~PeerBuffers() {
  if (!impl_) return;
  if (Status st = release(); !st.ok()) {
    spdlog::warn("kiln: releasing rank {}'s peer buffers: {}", impl_->comm->rank(), st.to_string());
  }
}

Result<std::unique_ptr<PeerBuffers>> PeerBuffers::create(Communicator& comm, size_t bytes) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  auto impl = std::make_unique<Impl>();
  impl->comm = &comm;
  impl->d = d;
  impl->bytes = bytes;
  const int rank = comm.rank();
  const int world = comm.world();

  // Every step up to the exchange records a local failure instead of returning: the other ranks are about to
  // wait for this rank's record, and a rank that left early would hang them.
  ContextScope scope(d);
  Status local = scope.enter(comm.context());
  if (local.ok() && bytes == 0) local = make_error(ErrorCode::kInvalidArgument, "PeerBuffers of 0 bytes");
  const size_t alloc = (std::max<size_t>(bytes, 1) + kPeerAlignment - 1) / kPeerAlignment * kPeerAlignment;
  PeerRecord mine;
  mine.bytes = bytes;
  if (local.ok()) local = to_status(d->cuMemAlloc(&impl->own, alloc), "cuMemAlloc", __FILE__, __LINE__);
  if (local.ok()) local = to_status(d->cuMemsetD8(impl->own, 0, alloc), "cuMemsetD8", __FILE__, __LINE__);
  // cuMemsetD8 may return before the memory is zero, and nothing orders it with a peer's first read.
  if (local.ok()) local = to_status(d->cuCtxSynchronize(), "cuCtxSynchronize", __FILE__, __LINE__);
  if (local.ok()) {
    local = to_status(d->cuIpcGetMemHandle(&mine.handle, impl->own), "cuIpcGetMemHandle", __FILE__, __LINE__);
  }
  mine.ok = local.ok() ? 1 : 0;

  auto gathered = comm.all_gather(encode(mine));
  if (!gathered.ok()) {
    (void)impl->close_local();
    return std::move(gathered).status().with_context("exchanging peer buffer handles");
  }
  // Every rank sees the same records, so every rank takes the same branch below.
  std::vector<PeerRecord> records;
  for (const std::string& s : *gathered) records.push_back(decode(s));
  for (int r = 0; r < world; ++r) {
    const PeerRecord& rec = records[static_cast<size_t>(r)];
    Status problem;
    if (!rec.ok) {
      problem = make_error(ErrorCode::kUnavailable, fmt::format("rank {} could not create its peer buffer", r));
    } else if (rec.bytes != bytes) {
      problem = make_error(ErrorCode::kInvalidArgument,
                           fmt::format("PeerBuffers::create: rank {} asked for {} bytes, rank {} for {}", r,
                                       rec.bytes, rank, bytes));
    }
    if (!problem.ok()) {
      (void)impl->close_local();
      return local.ok() ? problem : local;
    }
  }

  impl->ptrs.assign(static_cast<size_t>(world), 0);
  impl->ptrs[static_cast<size_t>(rank)] = impl->own;
  for (int r = 0; r < world && local.ok(); ++r) {
    if (r == rank) continue;
    local = to_status(d->cuIpcOpenMemHandle(&impl->ptrs[static_cast<size_t>(r)], records[static_cast<size_t>(r)].handle,
                                            CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                      "cuIpcOpenMemHandle", __FILE__, __LINE__);
    if (!local.ok()) local.with_context(fmt::format("mapping rank {}'s buffer", r));
  }
  // Whether every rank mapped every buffer decides, for all of them alike, whether to keep or undo.
  std::vector<double> failed = {local.ok() ? 0.0 : 1.0};
  if (Status st = comm.all_reduce_max(failed); !st.ok()) {
    (void)impl->close_local();
    return std::move(st).with_context("agreeing on the peer buffer mappings");
  }
  if (failed[0] != 0.0) {
    (void)impl->close_mappings();
    // A peer may have mapped this rank's memory: it is freed only once every rank has closed its mappings.
    Status waited = comm.barrier();
    (void)impl->close_local();
    if (!local.ok()) return local;
    if (!waited.ok()) return waited;
    return make_error(ErrorCode::kUnavailable, "another rank could not map the peer buffers");
  }
  return std::unique_ptr<PeerBuffers>(new PeerBuffers(std::move(impl)));
}

CUdeviceptr PeerBuffers::ptr(int rank) const {
  if (rank < 0 || static_cast<size_t>(rank) >= impl_->ptrs.size()) return 0;
  return impl_->ptrs[static_cast<size_t>(rank)];
}
CUdeviceptr PeerBuffers::local() const { return impl_->released ? 0 : impl_->own; }
const std::vector<CUdeviceptr>& PeerBuffers::all() const { return impl_->ptrs; }
size_t PeerBuffers::bytes() const { return impl_->bytes; }

Status PeerBuffers::release() {
  Impl& m = *impl_;
  if (m.released) return Status();
  m.released = true;
  ContextScope scope(m.d);
  Status first = scope.enter(m.comm->context());
  auto keep = [&first](Status st) {
    if (!st.ok() && first.ok()) first = std::move(st);
  };
  // Kernels of this rank that still read or write a peer's buffer must be done before its mapping goes.
  keep(to_status(m.d->cuCtxSynchronize(), "cuCtxSynchronize", __FILE__, __LINE__));
  keep(m.close_mappings());
  // This rank's memory is freed only once no peer maps it any more. If the barrier fails the communicator is
  // broken and cannot tell; the memory is freed anyway, since nothing would ever free it otherwise.
  keep(m.comm->barrier().with_context("waiting for the peers to unmap this rank's buffer"));
  keep(m.close_local());
  return first;
}

}  // namespace kiln::runtime
