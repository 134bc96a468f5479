// Tuned all-reduce across the GPUs of a communicator (docs/collectives.md).
//
//   auto ar = AllReduce::create(comm, {.dtype = DType::kBF16});       // collective: every rank calls it
//   auto reports = (*ar)->tune();                                    // 1 KiB .. 256 MiB, powers of two
//   (*ar)->run(in, out, count, stream);                              // the bucket's winner; graph-capturable
//
// Symmetric tensors (as PyTorch's symm_mem.empty): every rank allocates the tensors it will all-reduce from the
// AllReduce's peer-mapped heap, in the same order and sizes, so a tensor sits at the same offset on every rank and
// the kernels read (and write) the peers' copies where they are: no copy into the staging buffer.
//
//   CUdeviceptr x = *(*ar)->allocate(bytes);                         // collective, checked across ranks
//   (*ar)->run(x, x, count, stream);                                 // zero-copy, in place
//   (*ar)->free(x);                                                  // local; reused once the calls complete
//
// run() tells the three kinds of call apart (AllReduceCall) and dispatches each from its own tuned table.
//
// The choices: NCCL's all-reduce and its symmetric-memory all-reduce on a registered window (extern), and kiln's
// one-shot (read or push) and two-shot templates (templates/collectives/), rendered with the world size, dtype,
// vector width, threads and blocks. Every rank measures every choice with
// the same fixed number of iterations after a barrier; a choice's time is the maximum over ranks of the ranks'
// medians, and a choice that fails (compile, load, wrong result) on any rank fails on all. The winner per size
// bucket is computed from those all-reduced figures with a deterministic rule, so every rank holds the same
// dispatch table; it is stored in the cache under the world size, device and bucket, and a later process
// whose ranks all find the same stored decisions uses them without measuring.
//
// The fused variant (all-reduce + residual add + RMSNorm, the step after every attention and MLP block in
// tensor-parallel inference) is tuned per token count against the unfused pairs: the best all-reduce followed
// by kiln's tuned RMSNorm (with the residual add), and NCCL followed by the same.
#pragma once

#include <cuda.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cache/tuning.h"
#include "kiln/pool/executor.h"
#include "kiln/runtime/comm.h"
#include "kiln/status.h"
#include "kiln/templates/template.h"

namespace kiln::runtime {

/// The kinds of all-reduce call, each tuned and dispatched from its own table: a staged call copies its input into
/// the staging buffer first (any tensor); a symmetric call's input is on the heap (allocate()) or in the staging
/// buffer and is read where it is, out of place or in place (in == out).
enum class AllReduceCall : int { kStaged = 0, kSymmetric = 1, kSymmetricInPlace = 2 };
inline constexpr int kAllReduceCalls = 3;
/// "staged", "symmetric", "symmetric in-place".
const char* call_name(AllReduceCall call);

struct AllReduceOptions {
  templates::DType dtype = templates::DType::kBF16;
  /// The largest message (bytes) run() and tune() accept: the peer-mapped staging buffer of each rank is this
  /// big. Default 256 MiB.
  size_t max_bytes = size_t{256} << 20;
  /// The symmetric heap of each rank (allocate()), peer-mapped at create(). 0: no heap (allocate() fails).
  /// Default 256 MiB.
  size_t heap_bytes = size_t{256} << 20;
  /// Where decisions are stored and found (null: none; every process tunes). Compiled kernels go there too.
  std::shared_ptr<cache::TuningCache> cache;
  /// Where the templates compile; null: kiln::make_executor().
  std::shared_ptr<Executor> executor;
  /// Template configurations per algorithm, a deterministic sample covering every parameter value. Default 24.
  int max_configs = 24;
  /// Timed runs per choice (each after a barrier); the rank's figure is their median. Default 5.
  int runs = 5;
  /// Time with the launches captured in a CUDA graph and replayed (what a graph-captured decode step sees).
  bool graph = false;
  /// The kind of call tune() without an AllReduceCall and benchmark() without one measure: false/false staged,
  /// zero_copy symmetric out of place, in_place symmetric in place. (tune(call, ...) names the kind instead.)
  /// Symmetric calls are measured on heap tensors when the heap has room, else on the staging buffer.
  bool zero_copy = false;
  /// See zero_copy. The read one-shot cannot run in place (its peers read the buffer it would write), so in-place
  /// tables leave it out; the two-shot skips its copy-out.
  bool in_place = false;
  /// NCCL's symmetric-memory all-reduce ("nccl_symmetric") serves messages up to this many bytes (and at most
  /// max_bytes) from a window of that size registered with NCCL_WIN_COLL_SYMMETRIC; it copies the input into
  /// the window and the result out of it. 0, or an NCCL older than 2.27: no such choice. Default 32 MiB.
  size_t symmetric_bytes = size_t{32} << 20;
  /// The push one-shot's area on each rank: two sets (by launch parity) of world slots, so it serves messages up
  /// to push_area_bytes / (2 world) bytes (and at most max_bytes): 32 MiB on 2 ranks, 16 MiB on 4, 8 MiB on 8
  /// with the default 128 MiB. On 2 ranks the push (remote writes only, one barrier) beats the read-based
  /// two-shot up to tens of MiB. 0: no push choice.
  size_t push_area_bytes = size_t{128} << 20;
  /// Launch the templates with programmatic dependent launch (sm_90+; ignored before): a call's kernel is
  /// scheduled while the previous kernel of the stream still runs and waits on the device for it, so back-to-back
  /// eager calls do not pay the launch latency between them. Default true.
  bool programmatic_launch = true;
  /// Tests only: rewrites this rank's measured microseconds for a choice before they are exchanged.
  std::function<double(int rank, const std::string& choice, double us)> distort;
};

/// One choice at one size: its figure (the maximum over ranks of the ranks' medians), or why it failed.
struct CollectiveTiming {
  std::string name;
  bool ok = false;
  double us = 0;         // per call
  double busbw_gbs = 0;  // bus bandwidth: bytes * 2 (world - 1) / world / time
  std::string error;
};

/// The outcome of tuning one size bucket.
struct CollectiveReport {
  size_t bytes = 0;        // all-reduce: the message; fused: rows * cols * dtype bytes
  std::string call;        // all-reduce: the kind of call tuned (call_name())
  int64_t rows = 0;        // fused only
  std::string chosen;
  bool from_cache = false;
  std::vector<CollectiveTiming> choices;  // in the order measured (the same on every rank)
  std::string json() const;
};

/// The iteration count every rank uses for one timed run of a `bytes` message: fixed by the size alone (never
/// by a local time estimate), so that ranks run alike.
int collective_iterations(size_t bytes);

/// The winner among `us` (figures already reduced over ranks; failed choices are negative or infinite): the
/// fastest; a choice within 1% of it that comes earlier in the list (NCCL first, then the templates in their
/// fixed order) wins instead, so that equal inputs give equal decisions on every rank. -1 if all failed.
int pick_collective(const std::vector<double>& us);

class AllReduce {
 public:
  /// Collective. Allocates and exchanges the staging and signal buffers, renders the choices and starts
  /// compiling them. `comm` must outlive the object.
  static Result<std::unique_ptr<AllReduce>> create(Communicator& comm, AllReduceOptions options = {});
  ~AllReduce();

  /// Collective. Tunes the all-reduce of the kind of call options() name (zero_copy, in_place) for every size in
  /// `bucket_bytes` (ascending; empty: powers of two from 1 KiB to max_bytes) and installs that kind's table.
  Result<std::vector<CollectiveReport>> tune(std::vector<size_t> bucket_bytes = {});
  /// Collective. The same for the kind `call`. Each kind has its own table (and its own cached decisions).
  Result<std::vector<CollectiveReport>> tune(AllReduceCall call, std::vector<size_t> bucket_bytes = {});
  /// Runs the winner of the bucket of `count` elements (the smallest bucket holding the message) from `in` to
  /// `out` on `stream`, from the table of the call's kind (call_kind()). A kind not tuned uses the staged table's
  /// pick when that choice can serve it, else NCCL; above the last bucket, NCCL. Allocates device memory and
  /// synchronises nothing, so it can be captured in a CUDA graph; every rank must call it alike: the same count,
  /// and inputs (and outputs) that are heap tensors at the same offsets on every rank, or on none.
  /// A heap tensor's use is recorded (an event on `stream`, not under capture) so that free() keeps its range
  /// from being reused before the call completes.
  Status run(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;
  /// The kind of call run(in, out, count) is: symmetric when [in, in + bytes) lies inside one heap allocation or
  /// inside the staging buffer (in place when out == in), else staged.
  AllReduceCall call_kind(CUdeviceptr in, CUdeviceptr out, int64_t count) const;
  /// This rank's staging buffer (options().max_bytes, peer-mapped). A call whose input is inside it is a symmetric
  /// call and skips the copy-in: the templates read it where it is. A call whose input and output are both this
  /// buffer reduces it in place (every choice but the read one-shot can); other outputs must not be inside it.
  /// It is overwritten by the next call (out-of-place two-shot calls overwrite the input with the sum).
  CUdeviceptr input_buffer() const;

  /// Collective: every rank calls it with the same `bytes`, in the same order. `bytes` of this rank's symmetric
  /// heap (aligned to 256 bytes; first fit), at the same offset on every rank. The ranks' requests are compared
  /// through the communicator (an all_gather): a rank that asked another size, or whose heap holds other
  /// allocations (the ranks did not free the same tensors), gets kInvalidArgument naming both, on every rank
  /// (none allocates). kOutOfRange when the heap has no room (naming its size, what is in use and what was
  /// asked); kFailedPrecondition without a heap (heap_bytes = 0). Not capture-safe (it exchanges data).
  /// The memory is not zeroed.
  Result<CUdeviceptr> allocate(size_t bytes);
  /// Local (not collective): returns an allocation to the heap. Its range is handed out again only after the
  /// last run()/run_fused() that used it has completed on the GPU (allocate() waits for it). For offsets to keep
  /// matching, every rank must have freed the same tensors by its next allocate() (an order that differs between
  /// two allocates is fine); a divergence is reported by that allocate(). kInvalidArgument naming the pointer for
  /// one that is not a live allocation (freed twice, or not from allocate()). Thread-safe against run().
  Status free(CUdeviceptr ptr);
  /// Whether [p, p + bytes) lies inside one live heap allocation.
  bool is_symmetric(CUdeviceptr p, size_t bytes) const;
  /// The heap's size and the bytes in use (allocations rounded up to 256 bytes).
  size_t heap_bytes() const;
  size_t heap_used() const;

  /// The name of the choice run() uses for `count` elements in a call of the kind options() name, or of `call`.
  const std::string& choice_for(int64_t count) const;
  const std::string& choice_for(int64_t count, AllReduceCall call) const;

  /// Every choice's name for `count` elements in calls of the kind options() name, in measuring order.
  std::vector<std::string> choice_names(int64_t count) const;
  /// Runs one named choice (benchmarks and tests). Every rank must call it alike.
  Status run_choice(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;
  /// Collective. Measures the named choices at `count` elements the way tune() does (checked, then timed on
  /// every rank, the maximum over ranks), eagerly or as CUDA-graph replays, in calls of the kind options() name;
  /// the name "dispatch" measures run().
  Result<std::vector<CollectiveTiming>> benchmark(const std::vector<std::string>& names, int64_t count, bool graph);
  /// The same in calls of kind `call` (symmetric: on heap tensors when the heap has room).
  Result<std::vector<CollectiveTiming>> benchmark(const std::vector<std::string>& names, int64_t count, bool graph,
                                                  AllReduceCall call);

  /// The fused step: h = allreduce(x) + residual -> residual_out; y = rmsnorm(h) * weight.
  struct FusedArgs {
    CUdeviceptr x = 0, residual = 0, residual_out = 0, weight = 0, y = 0;
    int64_t rows = 0, cols = 0;
    float eps = 1e-5f;
  };
  /// Collective. Tunes the fused step for `cols` at every token count in `rows` (ascending) against the
  /// unfused pairs; needs tune() first (the unfused pairs use its all-reduce winners).
  Result<std::vector<CollectiveReport>> tune_fused(int64_t cols, std::vector<int64_t> rows);
  /// Runs the fused step's winner for args.rows (the smallest tuned row count holding it). Capture-safe. An x
  /// that is a heap tensor (or in the staging buffer) is read where it is, as in run().
  Status run_fused(const FusedArgs& args, CUstream stream) const;
  Status run_fused_choice(const std::string& name, const FusedArgs& args, CUstream stream) const;
  std::vector<std::string> fused_choice_names(const FusedArgs& args) const;
  const std::string& fused_choice_for(int64_t rows) const;

  const AllReduceOptions& options() const;
  Communicator& comm() const;

 private:
  struct Impl;
  explicit AllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime
