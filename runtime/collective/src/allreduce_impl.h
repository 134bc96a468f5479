// What the all-reduce's files share (private to the collective library): AllReduce::Impl, the state one
// AllReduce holds, and the names and check data its files must agree on. Impl's methods are defined in the
// file named above each group:
//   allreduce.cpp          creation, the size dispatcher and the run path
//   allreduce_choices.cpp  the choice catalogue: which configurations exist, rank agreement on what loaded,
//                          launching one choice
//   allreduce_measure.cpp  measuring a list of choices alike on every rank (checked, timed, reduced over ranks)
//   allreduce_tune.cpp     tune(): the decisions every rank finds in the cache, else measured ones; the table
//   allreduce_fused.cpp    the fused all-reduce + residual + RMSNorm step
#pragma once

#include <cuda.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/jit/module.h"
#include "kiln/jit/target.h"
#include "kiln/pool/future.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/collective.h"
#include "kiln/runtime/tuner.h"
#include "kiln/templates/kernel_args.h"
#include "kiln/templates/template.h"
#include "symmetric_heap.h"
#include "symmetric_window.h"

namespace kiln::runtime {

namespace detail {

inline constexpr double kFailed = 1e30;  // a failed choice's figure: larger than any time, survives the max-reduce
inline constexpr char kNccl[] = "nccl";
inline constexpr char kNcclSymmetric[] = "nccl_symmetric";
inline constexpr char kDispatch[] = "dispatch";  // benchmark()'s name for what run() picks
inline constexpr char kUnfused[] = "unfused:";   // the prefix of the fused step's unfused pairs

// One compiled template configuration.
struct TemplateChoice {
  std::string name;
  bool push = false;  // algo=push: reads the input where it is, writes into the peers' push areas
  bool push2 = false;  // algo=push2: like push, a chunk per slot; in-place calls on peer-mapped tensors only
  bool in_place = true;  // can reduce the staging buffer in place (not the read one-shot: its peers read it)
  int64_t vec = 1;       // elements per access: a count must be a multiple (checked per call without the template)
  templates::Params params;
  templates::Launch launch;
  templates::TemplatePtr tmpl;
  Future<Binary> binary;
  std::optional<Kernel> kernel;
  Status status;  // why it cannot run (compile or load), agreed over ranks before any launch
  bool agreed = false;
};

// One entry of a dispatch table, resolved once when the table is installed so that run() compares no strings.
struct Pick {
  enum Kind { kNcclPick, kNcclSymmetricPick, kTemplatePick } kind = kNcclPick;
  std::string name = kNccl;
  const TemplateChoice* choice = nullptr;  // kTemplatePick
};

// One kind of call's table: bounds[i] (bytes, ascending) -> picks[i].
struct Table {
  std::vector<size_t> bounds;
  std::vector<Pick> picks;
};

// Where a call's input is read: inside a peer-mapped region (the heap or the staging buffer) at `offset`, the
// same on every rank, or (region null) anywhere else: copied into the staging buffer.
struct Operand {
  const PeerBuffers* region = nullptr;
  size_t offset = 0;
  size_t allocation = SymmetricHeap::npos;  // the heap allocation holding it, for free()'s tracking
};

// What the fused dispatch runs for one row bucket.
struct FusedPick {
  std::string name;
  int fused = -1;                          // index into fused_choices, or -1: the unfused pair below
  std::string allreduce;                   // the pair's all-reduce choice
  std::shared_ptr<Selection> norm;         // the pair's RMSNorm
};

// The sampled configurations of template `name` ("allreduce" or "allreduce_rmsnorm") for this world size and
// dtype, each rendered and handed to `gate` to compile (allreduce_choices.cpp).
Result<std::vector<TemplateChoice>> render_choices(const std::string& name, const AllReduceOptions& o, int world,
                                                   const templates::DeviceLimits& limits, const Target& target,
                                                   PrecompileGate& gate);

// The check data (allreduce_measure.cpp): elements of `dtype` as bytes on the host, from and to floats, and
// rank r's check input: small integers, exact in every dtype and in any sum of up to 8 ranks.
std::vector<char> encode_elements(templates::DType dtype, const std::vector<float>& v);
float decode_element(templates::DType dtype, const char* p);
float round_to(templates::DType dtype, float f);
float check_pattern(int rank, int64_t i);

// The figures pick_collective() decides on: a failed choice's is kFailed (allreduce_measure.cpp).
std::vector<double> figures(const std::vector<CollectiveTiming>& timings);

}  // namespace detail

struct AllReduce::Impl {
  using TemplateChoice = detail::TemplateChoice;

  Communicator* comm = nullptr;
  AllReduceOptions options;
  int elem_bytes = 2;
  std::unique_ptr<PeerBuffers> staging, signals;
  // algo=push's areas: 2 (launch parity) x world slots of push_slot_bytes on every rank (options.push_area_bytes;
  // none when 0). Push serves messages up to one slot.
  std::unique_ptr<PeerBuffers> push;
  size_t push_slot_bytes = 0;
  detail::SymmetricWindowPtr window;  // "nccl_symmetric"'s; null: no such choice
  std::unique_ptr<PrecompileGate> gate;
  templates::DeviceLimits limits;
  Target target;
  bool programmatic = false;  // options.programmatic_launch on an sm_90+ device
  // algo=push2's slot use: one chunk (count / world, rounded up to whole vectors).
  size_t push2_chunk_bytes(const TemplateChoice& c, int64_t count) const {
    const int64_t vectors = count / c.vec, chunk = (vectors + comm->world() - 1) / comm->world();
    return static_cast<size_t>(chunk * c.vec) * elem_bytes;
  }
  // The launch of a template choice on `stream`.
  LaunchConfig launch_config(const templates::Launch& l, CUstream stream) const {
    LaunchConfig c = l.config(stream);
    c.programmatic = programmatic;
    return c;
  }
  std::vector<TemplateChoice> choices;        // all-reduce configurations
  std::vector<TemplateChoice> fused_choices;  // all-reduce + RMSNorm configurations
  Stream work;
  Event start, stop;
  DeviceBuffer check_in, check_out;           // the benchmarks' own buffers
  DeviceBuffer sync_word;                     // the device-side start of a timed run (align_start)
  // The dispatch tables, one per AllReduceCall.
  detail::Table tables[kAllReduceCalls];
  bool tuned = false;                         // some table was installed (tune_fused() needs one)
  KilnAllReduceArgs base{};                   // the arguments every launch shares (peer pointers), made once
  // The symmetric heap: its memory on every rank, the allocations (the same on every rank), and per allocation
  // the streams calls used it on (free() records an event on each and the range's next allocate() waits for them).
  std::unique_ptr<PeerBuffers> heap;
  mutable std::mutex heap_mu;
  detail::SymmetricHeap heap_map{0};
  mutable std::map<size_t, std::vector<CUstream>> uses;
  // What measure_allreduce() measures: the kind of call, and a symmetric call's input (a heap tensor or the
  // staging buffer).
  AllReduceCall measuring = AllReduceCall::kStaged;
  CUdeviceptr sym_in = 0;
  std::vector<int64_t> fused_bounds;          // rows
  std::vector<detail::FusedPick> fused_picks;
  std::unique_ptr<Tuner> norm_tuner;
  DeviceBuffer fused_tmp;                     // the unfused pair's all-reduce output
  const std::string nccl_name = detail::kNccl;

  // ---- allreduce.cpp: the size dispatcher
  // Makes the communicator's context current on the calling thread (every collective entry point runs there).
  Status make_current() const;
  // The pick of the smallest bucket holding `bytes` in the table of `call` (see AllReduce::run for the fallbacks).
  const detail::Pick& pick_for(AllReduceCall call, size_t bytes) const;
  Result<detail::Pick> resolve(const std::string& name) const;
  // AllReduce::run(): the call's kind, its table's pick, the launch, the heap tensors' tracking.
  Status run_call(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;
  // Where [p, p + bytes) is read from (heap, staging or neither), and the heap allocation holding [p, p + bytes).
  detail::Operand locate(CUdeviceptr p, size_t bytes) const;
  size_t heap_allocation(CUdeviceptr p, size_t bytes) const;
  // Records the use of heap allocations by a call just enqueued on `stream` (nothing under capture).
  Status track(size_t allocation_a, size_t allocation_b, CUstream stream) const;
  // The options' kind of call (zero_copy, in_place).
  AllReduceCall options_call() const;
  // The allocate() logic (collective) and free() logic.
  Result<CUdeviceptr> heap_allocate(size_t bytes);

  // ---- allreduce_choices.cpp: the catalogue and launching one choice
  // Every rank learns which templates compiled and loaded everywhere; a failure anywhere fails the choice on
  // every rank. Must be called alike on every rank, before any of the choices is launched.
  Status agree(std::vector<TemplateChoice>& list);
  const TemplateChoice* find(const std::vector<TemplateChoice>& list, const std::string& name) const;
  // Every all-reduce choice that serves `count` elements, in measuring order (NCCL first).
  std::vector<std::string> names_for(int64_t count, AllReduceCall call) const;
  Status run_named(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;
  Status run_pick(const detail::Pick& p, const detail::Operand& where, CUdeviceptr in, CUdeviceptr out,
                  int64_t count, CUstream stream) const;
  KilnAllReduceArgs base_args() const;
  // Points `a` at the input: algo=push reads it where it is (up to one slot); the other algorithms read every
  // rank's copy where it is (a symmetric input), else from the staging buffers, where it is copied first. The
  // two-shot's all-gather writes go to the input in place (in-place calls, staging inputs), else to the staging
  // buffers (a heap input out of place is not overwritten).
  Status stage_input(const TemplateChoice& c, const detail::Operand& where, bool in_place, CUdeviceptr in,
                     size_t bytes, CUstream stream, KilnAllReduceArgs& a) const;
  Status not_in_staging(CUdeviceptr p, const char* what) const;
  Status launch_template(const TemplateChoice& c, const detail::Operand& where, CUdeviceptr in, CUdeviceptr out,
                         int64_t count, CUstream stream) const;
  Status run_symmetric(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;

  // ---- allreduce_measure.cpp: measuring, alike on every rank
  // The input and output a measurement uses (zero-copy or in place: the staging buffer).
  CUdeviceptr bench_input() const;
  CUdeviceptr bench_output() const;
  Status refresh_input(size_t bytes);
  // Measures in calls of kind `call` (symmetric: on a heap tensor of `bytes` when the heap has room, freed after).
  Result<std::vector<CollectiveTiming>> measure_call(AllReduceCall call, const std::vector<std::string>& names,
                                                     int64_t count);
  Status ensure_check_buffers(size_t bytes);
  // Fills the check input with this rank's pattern and poisons the output.
  Status prepare_check(int64_t count);
  Status verify_allreduce(int64_t count);
  Status align_start() const;
  Result<double> time_local(const std::function<Status(CUstream)>& launch, size_t bytes);
  // Measures `names` at one size, all ranks alike: check (own result), then time; then the max over ranks.
  Result<std::vector<CollectiveTiming>> measure(const std::vector<std::string>& names, size_t bytes,
                                                const std::function<Status(const std::string&, CUstream)>& launch,
                                                const std::function<Status(const std::string&)>& check);
  // measure() of all-reduce choices at `count` elements on the check data; kDispatch measures run()'s pick.
  Result<std::vector<CollectiveTiming>> measure_allreduce(const std::vector<std::string>& names, int64_t count);

  // ---- allreduce_tune.cpp: the decisions stored in the cache
  std::string cache_key(size_t bytes, std::string_view what, AllReduceCall call) const;
  // Every rank holds the same stored decisions for `keys`: returns them, else nullopt (tune).
  Result<std::optional<std::vector<std::string>>> agreed_cached(const std::vector<std::string>& keys);
};

}  // namespace kiln::runtime
