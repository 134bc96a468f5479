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
#include <memory>
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
  bool in_place = true;  // can reduce the staging buffer in place (not the read one-shot: its peers read it)
  templates::Params params;
  templates::Launch launch;
  templates::TemplatePtr tmpl;
  Future<Binary> binary;
  std::optional<Kernel> kernel;
  Status status;  // why it cannot run (compile or load), agreed over ranks before any launch
  bool agreed = false;
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
  // algo=push's areas: 2 (launch parity) x world slots of push_slot_bytes on every rank. Push serves messages up
  // to one slot; larger ones are bandwidth-bound, where the other algorithms win anyway.
  std::unique_ptr<PeerBuffers> push;
  size_t push_slot_bytes = 0;
  detail::SymmetricWindowPtr window;  // "nccl_symmetric"'s; null: no such choice
  std::unique_ptr<PrecompileGate> gate;
  templates::DeviceLimits limits;
  Target target;
  std::vector<TemplateChoice> choices;        // all-reduce configurations
  std::vector<TemplateChoice> fused_choices;  // all-reduce + RMSNorm configurations
  Stream work;
  Event start, stop;
  DeviceBuffer check_in, check_out;           // the benchmarks' own buffers
  DeviceBuffer sync_word;                     // the device-side start of a timed run (align_start)
  // The dispatch table: bounds[i] (bytes, ascending) -> choice name.
  std::vector<size_t> bounds;
  std::vector<std::string> picks;
  std::vector<int64_t> fused_bounds;          // rows
  std::vector<detail::FusedPick> fused_picks;
  std::unique_ptr<Tuner> norm_tuner;
  DeviceBuffer fused_tmp;                     // the unfused pair's all-reduce output
  const std::string nccl_name = detail::kNccl;

  // ---- allreduce.cpp: the size dispatcher
  // Makes the communicator's context current on the calling thread (every collective entry point runs there).
  Status make_current() const;
  // The choice of the smallest bucket holding `count` elements; NCCL before tune() or above the last bucket.
  const std::string& pick_for(int64_t count) const;

  // ---- allreduce_choices.cpp: the catalogue and launching one choice
  // Every rank learns which templates compiled and loaded everywhere; a failure anywhere fails the choice on
  // every rank. Must be called alike on every rank, before any of the choices is launched.
  Status agree(std::vector<TemplateChoice>& list);
  const TemplateChoice* find(const std::vector<TemplateChoice>& list, const std::string& name) const;
  // Every all-reduce choice that serves `count` elements, in measuring order (NCCL first).
  std::vector<std::string> names_for(int64_t count) const;
  Status run_named(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;
  KilnAllReduceArgs base_args() const;
  // Points `a` at the input: algo=push reads it where it is (up to one slot), the other algorithms from this
  // rank's staging buffer, where it is copied unless it is there already.
  Status stage_input(const TemplateChoice& c, CUdeviceptr in, size_t bytes, CUstream stream,
                     KilnAllReduceArgs& a) const;
  Status not_in_staging(CUdeviceptr p, const char* what) const;
  Status launch_template(const TemplateChoice& c, CUdeviceptr in, CUdeviceptr out, int64_t count,
                         CUstream stream) const;
  Status run_symmetric(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const;

  // ---- allreduce_measure.cpp: measuring, alike on every rank
  // The input and output a measurement uses (zero-copy or in place: the staging buffer).
  CUdeviceptr bench_input() const;
  CUdeviceptr bench_output() const;
  Status refresh_input(size_t bytes);
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
  std::string cache_key(size_t bytes, std::string_view what) const;
  // Every rank holds the same stored decisions for `keys`: returns them, else nullopt (tune).
  Result<std::optional<std::vector<std::string>>> agreed_cached(const std::vector<std::string>& keys);
};

}  // namespace kiln::runtime
