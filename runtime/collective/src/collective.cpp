// AllReduce: the choices, rank-consistent benchmarking, the size dispatch and the fused step
// (kiln/runtime/collective.h).
#include "kiln/runtime/collective.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/module.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/builtin.h"
#include "kiln/templates/kernel_args.h"
#include "kiln/templates/registry.h"
#include "nccl_api.h"
#include "symmetric_window.h"

namespace kiln::runtime {

namespace {

constexpr double kFailed = 1e30;  // a failed choice's figure: larger than any time, survives the max-reduce
constexpr char kNccl[] = "nccl";
constexpr char kNcclSymmetric[] = "nccl_symmetric";

// Elements of `dtype` as bytes on the host, from and to floats.
std::vector<char> encode(templates::DType dtype, const std::vector<float>& v) {
  const int b = templates::dtype_bytes(dtype);
  std::vector<char> out(v.size() * b);
  for (size_t i = 0; i < v.size(); ++i) templates::store_element(dtype, v[i], &out[i * b]);
  return out;
}
float decode_one(templates::DType dtype, const char* p) { return templates::load_element(dtype, p); }
float round_to(templates::DType dtype, float f) {
  char bytes[4];
  templates::store_element(dtype, f, bytes);
  return templates::load_element(dtype, bytes);
}

// Rank r's check input: small integers, exact in every dtype and in any sum of up to 8 ranks.
float pattern(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13 + 3) % 17) - 8.f; }

// The positions a check compares: all of a small message, else a strided sample plus the last elements
// (a full host comparison of 128 M elements per choice would take longer than the tuning).
std::vector<int64_t> check_positions(int64_t count) {
  std::vector<int64_t> pos;
  if (count <= (int64_t{1} << 20)) {
    pos.resize(count);
    for (int64_t i = 0; i < count; ++i) pos[i] = i;
    return pos;
  }
  const int64_t step = count / (int64_t{1} << 18) + 1;
  for (int64_t i = 0; i < count; i += step) pos.push_back(i);
  for (int64_t i = std::max<int64_t>(0, count - 4096); i < count; ++i) pos.push_back(i);
  return pos;
}

// The figures pick_collective() decides on: a failed choice's is kFailed.
std::vector<double> figures(const std::vector<CollectiveTiming>& timings) {
  std::vector<double> us;
  for (const auto& t : timings) us.push_back(t.ok ? t.us : kFailed);
  return us;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

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

}  // namespace

std::string CollectiveReport::json() const {
  nlohmann::json j{{"bytes", bytes}, {"chosen", chosen}, {"from_cache", from_cache}};
  if (rows) j["rows"] = rows;
  j["choices"] = nlohmann::json::array();
  for (const auto& c : choices) {
    nlohmann::json cj{{"name", c.name}, {"ok", c.ok}};
    if (c.ok) {
      cj["us"] = c.us;
      cj["busbw_gbs"] = c.busbw_gbs;
    } else {
      cj["error"] = c.error;
    }
    j["choices"].push_back(std::move(cj));
  }
  return j.dump();
}

int collective_iterations(size_t bytes) {
  // About 2 ms of NCCL-speed traffic per timed run, between 5 and 100 launches.
  const double per_call_us = 8.0 + static_cast<double>(bytes) / 300e3;  // ~300 GB/s bus bandwidth
  return static_cast<int>(std::clamp(2000.0 / per_call_us, 5.0, 100.0));
}

int pick_collective(const std::vector<double>& us) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(us.size()); ++i) {
    if (us[i] > 0 && us[i] < kFailed && (best < 0 || us[i] < us[best])) best = i;
  }
  if (best < 0) return -1;
  for (int i = 0; i < best; ++i) {
    if (us[i] > 0 && us[i] <= us[best] * 1.01) return i;
  }
  return best;
}

struct AllReduce::Impl {
  Communicator* comm = nullptr;
  AllReduceOptions options;
  int elem_bytes = 2;
  std::unique_ptr<PeerBuffers> staging, signals;
  // algo=push's areas: 2 (launch parity) x world slots of push_slot_bytes on every rank. Push serves messages up
  // to one slot; larger ones are bandwidth-bound, where the other algorithms win anyway.
  std::unique_ptr<PeerBuffers> push;
  size_t push_slot_bytes = 0;
  std::unique_ptr<detail::SymmetricWindow> window;  // "nccl_symmetric"'s; null: no such choice
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
  std::vector<FusedPick> fused_picks;
  std::unique_ptr<Tuner> norm_tuner;
  DeviceBuffer fused_tmp;                     // the unfused pair's all-reduce output
  const std::string nccl_name = kNccl;

  std::string cache_key(size_t bytes, std::string_view what) const {
    auto info = device_info(comm->device());
    return fmt::format("{}{} {} w{} {} {}B", what, options.in_place ? " in-place" : "",
                       templates::dtype_name(options.dtype), comm->world(), info.ok() ? info->name : std::string("?"),
                       bytes);
  }

  KilnAllReduceArgs base_args() const {
    KilnAllReduceArgs a{};
    for (int r = 0; r < comm->world(); ++r) {
      a.data[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(staging->ptr(r)));
      a.signals[r] = reinterpret_cast<unsigned*>(static_cast<uintptr_t>(signals->ptr(r)));
    }
    for (int r = 0; r < comm->world() && push; ++r) a.push[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(push->ptr(r)));
    a.slot = static_cast<long long>(push_slot_bytes / elem_bytes);
    a.rank = comm->rank();
    return a;
  }

  // Every rank learns which templates compiled and loaded everywhere; a failure anywhere fails the choice on
  // every rank. Must be called alike on every rank, before any of the choices is launched.
  Status agree(std::vector<TemplateChoice>& list) {
    std::vector<double> failed(list.size(), 0);
    for (size_t i = 0; i < list.size(); ++i) {
      TemplateChoice& c = list[i];
      if (c.agreed) {
        failed[i] = c.kernel ? 0 : 1;
        continue;
      }
      const Result<Binary>& b = c.binary.get();
      if (!b.ok()) {
        c.status = b.status();
      } else {
        auto k = load_kernel(*b);
        if (k.ok()) c.kernel.emplace(std::move(k).value());
        else c.status = k.status();
      }
      failed[i] = c.kernel ? 0 : 1;
      if (!c.kernel) spdlog::warn("kiln: all-reduce choice {} is unavailable: {}", c.name, c.status.to_string());
    }
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(failed));
    for (size_t i = 0; i < list.size(); ++i) {
      TemplateChoice& c = list[i];
      if (failed[i] > 0 && c.kernel) {
        c.kernel.reset();
        c.status = make_error(ErrorCode::kFailedPrecondition, "failed to compile or load on another rank");
      }
      c.agreed = true;
    }
    return Status();
  }

  const TemplateChoice* find(const std::vector<TemplateChoice>& list, const std::string& name) const {
    for (const auto& c : list) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }

  Status launch_template(const TemplateChoice& c, CUdeviceptr in, CUdeviceptr out, int64_t count,
                         CUstream stream) const {
    if (!c.kernel) return c.status.ok() ? make_error(ErrorCode::kFailedPrecondition, c.name + " is not loaded") : c.status;
    const size_t bytes = static_cast<size_t>(count) * elem_bytes;
    if (bytes > staging->bytes()) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{} bytes exceed the {} the staging buffers hold", bytes, staging->bytes()));
    }
    KILN_RETURN_IF_ERROR(c.tmpl->check_problem(c.params, templates::Shape{.m = count}));
    KilnAllReduceArgs a = base_args();
    KILN_RETURN_IF_ERROR(check_output(in, out));
    if (out == staging->local() && !c.in_place) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{} cannot reduce in place (its peers read the staging buffer while it writes "
                                    "it); tune with AllReduceOptions::in_place for in-place calls", c.name));
    }
    if (c.push) {
      if (bytes > push_slot_bytes) {
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("{}: {} bytes exceed its {}-byte slots", c.name, bytes, push_slot_bytes));
      }
      a.in = reinterpret_cast<const void*>(static_cast<uintptr_t>(in));
    } else {
      KILN_RETURN_IF_ERROR(copy_in(in, bytes, stream));
    }
    a.out = reinterpret_cast<void*>(static_cast<uintptr_t>(out));
    a.count = static_cast<int>(count);
    return (*c.kernel)(c.launch.config(stream), a);
  }

  // Outputs must not be in the staging buffer, where the peers read while the kernel writes: except an in-place
  // call's, which is the whole buffer and the input too.
  Status not_in_staging(CUdeviceptr p, const char* what) const {
    const CUdeviceptr lo = staging->local(), hi = lo + staging->bytes();
    if (p >= lo && p < hi) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("the {} is inside the staging buffer (input_buffer())", what));
    }
    return Status();
  }
  Status check_output(CUdeviceptr in, CUdeviceptr out) const {
    if (out == staging->local() && in == out) return Status();
    return not_in_staging(out, "output");
  }
  // The input goes to this rank's staging buffer unless it is there already (zero-copy, in place).
  Status copy_in(CUdeviceptr in, size_t bytes, CUstream stream) const {
    const CUdeviceptr lo = staging->local();
    if (in == lo) return Status();
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuMemcpyDtoDAsync(lo, in, bytes, stream));
    return Status();
  }

  // NCCL's symmetric kernels need both buffers in the registered window: the input is copied in and the result
  // out (a caller's tensor is not in kiln's window), and the all-reduce runs in place there.
  Status run_symmetric(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
    if (!window) return make_error(ErrorCode::kNotFound, "no nccl_symmetric choice (no symmetric window)");
    const size_t bytes = static_cast<size_t>(count) * elem_bytes;
    if (bytes > window->bytes()) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("nccl_symmetric: {} bytes exceed its {}-byte window",
                                                                 bytes, window->bytes()));
    }
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_ASSIGN_OR_RETURN(const detail::NcclApi* n, detail::nccl());
    KILN_ASSIGN_OR_RETURN(ncclDataType_t t, detail::nccl_dtype(options.dtype));
    void* w = reinterpret_cast<void*>(static_cast<uintptr_t>(window->ptr()));
    KILN_CHECK(d->cuMemcpyDtoDAsync(window->ptr(), in, bytes, stream));
    KILN_CHECK(n->ncclAllReduce(w, w, static_cast<size_t>(count), t, ncclSum, comm->nccl(), stream));
    KILN_CHECK(d->cuMemcpyDtoDAsync(out, window->ptr(), bytes, stream));
    return Status();
  }

  // The input a measurement uses: the check pattern itself, or (zero-copy, in place) a copy of it in the staging
  // buffer, refreshed before every check since two-shot reduces in place. In place, the output is that buffer.
  CUdeviceptr bench_input() const { return options.zero_copy || options.in_place ? staging->local() : check_in.ptr(); }
  CUdeviceptr bench_output() const { return options.in_place ? staging->local() : check_out.ptr(); }
  Status refresh_input(size_t bytes) {
    if (!options.zero_copy && !options.in_place) return Status();
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuMemcpyDtoDAsync(staging->local(), check_in.ptr(), bytes, work.get()));
    return work.synchronize();
  }

  Status run_named(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
    if (count <= 0 || count > std::numeric_limits<int>::max()) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("all-reduce of {} elements", count));
    }
    if (name == kNccl) {
      KILN_ASSIGN_OR_RETURN(const detail::NcclApi* n, detail::nccl());
      KILN_ASSIGN_OR_RETURN(ncclDataType_t t, detail::nccl_dtype(options.dtype));
      KILN_CHECK(n->ncclAllReduce(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
                                  static_cast<size_t>(count), t, ncclSum, comm->nccl(), stream));
      return Status();
    }
    if (name == kNcclSymmetric) return run_symmetric(in, out, count, stream);
    const TemplateChoice* c = find(choices, name);
    if (!c) return make_error(ErrorCode::kNotFound, fmt::format("no all-reduce choice '{}'", name));
    return launch_template(*c, in, out, count, stream);
  }

  // Enqueues a one-element NCCL all-reduce on the timing stream, so that the ranks' GPUs start a timed run
  // together: the host barrier alone lets one rank's GPU start up to tens of microseconds before the other's, and
  // the first timed call then waits for the late rank inside the timed region, a skew the fixed iteration count
  // spreads over as few as 2 calls at the largest sizes.
  Status align_start() const {
    KILN_ASSIGN_OR_RETURN(const detail::NcclApi* n, detail::nccl());
    void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(sync_word.ptr()));
    KILN_CHECK(n->ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm->nccl(), work.get()));
    return Status();
  }

  // The rank's median time per call of `launch` over options.runs timed runs of a fixed iteration count, each
  // after a barrier (on the host, then on the GPUs). Returns the error of a launch that failed; the barriers are taken either way, so that the
  // ranks stay in step.
  Result<double> time_local(const std::function<Status(CUstream)>& launch, size_t bytes) {
    const int iters = collective_iterations(bytes);
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    Status st;
    for (int i = 0; i < 3 && st.ok(); ++i) st = launch(work.get());
    if (st.ok()) st = work.synchronize();
    CUgraphExec exec = nullptr;
    if (st.ok() && options.graph) {
      CUgraph graph = nullptr;
      st = to_status(d->cuStreamBeginCapture(work.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture",
                     __FILE__, __LINE__);
      if (st.ok()) {
        for (int i = 0; i < iters && st.ok(); ++i) st = launch(work.get());
        Status end = to_status(d->cuStreamEndCapture(work.get(), &graph), "cuStreamEndCapture", __FILE__, __LINE__);
        if (st.ok()) st = end;
      }
      if (st.ok()) st = to_status(d->cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate", __FILE__, __LINE__);
      if (graph) d->cuGraphDestroy(graph);
      if (st.ok()) st = to_status(d->cuGraphLaunch(exec, work.get()), "cuGraphLaunch", __FILE__, __LINE__);  // warm
      if (st.ok()) st = work.synchronize();
    }
    std::vector<double> times;
    for (int run = 0; run < options.runs; ++run) {
      KILN_RETURN_IF_ERROR(comm->barrier());
      if (!st.ok()) continue;
      st = align_start();
      if (st.ok()) st = start.record(work.get());
      if (exec) {
        if (st.ok()) st = to_status(d->cuGraphLaunch(exec, work.get()), "cuGraphLaunch", __FILE__, __LINE__);
      } else {
        for (int i = 0; i < iters && st.ok(); ++i) st = launch(work.get());
      }
      if (st.ok()) st = stop.record(work.get());
      if (st.ok()) st = stop.synchronize();
      if (st.ok()) {
        auto ms = stop.elapsed_ms_since(start);
        if (ms.ok()) times.push_back(*ms * 1000.0 / iters);
        else st = ms.status();
      }
    }
    if (exec) d->cuGraphExecDestroy(exec);
    if (!st.ok()) return st;
    return median(times);
  }

  // Fills the check input with this rank's pattern and poisons the output.
  Status prepare_check(int64_t count) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = pattern(comm->rank(), i);
    auto bytes = encode(options.dtype, v);
    KILN_RETURN_IF_ERROR(check_in.copy_from_host(bytes.data(), bytes.size()));
    KILN_RETURN_IF_ERROR(check_out.fill_bytes(0xff, work.get()));
    return work.synchronize();
  }

  Status verify_allreduce(int64_t count) {
    std::vector<char> host(static_cast<size_t>(count) * elem_bytes);
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_CHECK(d->cuMemcpyDtoH(host.data(), bench_output(), host.size()));
    for (int64_t i : check_positions(count)) {
      float want = 0;
      for (int r = 0; r < comm->world(); ++r) want += pattern(r, i);
      const float got = decode_one(options.dtype, &host[static_cast<size_t>(i) * elem_bytes]);
      if (got != want) {
        return make_error(ErrorCode::kInternal, fmt::format("wrong result: element {} is {}, the sum is {}", i, got, want));
      }
    }
    return Status();
  }

  // Measures `names` at one size, all ranks alike: check (own result), then time; then the max over ranks.
  Result<std::vector<CollectiveTiming>> measure(const std::vector<std::string>& names, size_t bytes,
                                                const std::function<Status(const std::string&, CUstream)>& launch,
                                                const std::function<Status(const std::string&)>& check) {
    std::vector<double> us(names.size(), kFailed);
    std::vector<std::string> errors(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      Status ok = check(names[i]);
      // Agree on correctness before timing: a rank whose check failed must not leave its peers' kernels waiting.
      std::vector<double> bad{ok.ok() ? 0.0 : 1.0};
      KILN_RETURN_IF_ERROR(comm->all_reduce_max(bad));
      if (!ok.ok() || bad[0] > 0) {
        errors[i] = ok.ok() ? "failed on another rank" : ok.to_string();
        continue;
      }
      auto t = time_local([&](CUstream s) { return launch(names[i], s); }, bytes);
      if (!t.ok()) {
        errors[i] = t.status().to_string();
        continue;
      }
      us[i] = options.distort ? options.distort(comm->rank(), names[i], *t) : *t;
    }
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(us));
    std::vector<CollectiveTiming> out(names.size());
    const int w = comm->world();
    for (size_t i = 0; i < names.size(); ++i) {
      out[i].name = names[i];
      out[i].ok = us[i] < kFailed;
      if (out[i].ok) {
        out[i].us = us[i];
        out[i].busbw_gbs = static_cast<double>(bytes) * 2.0 * (w - 1) / w / (us[i] * 1e3);
      } else {
        out[i].error = errors[i].empty() ? "failed on another rank" : errors[i];
      }
    }
    return out;
  }

  std::vector<std::string> names_for(int64_t count) const {
    std::vector<std::string> out{kNccl};
    const size_t bytes = static_cast<size_t>(count) * elem_bytes;
    if (window && bytes <= window->bytes()) out.push_back(kNcclSymmetric);
    for (const auto& c : choices) {
      if (!c.kernel || (c.push && bytes > push_slot_bytes) || (options.in_place && !c.in_place)) continue;
      if (c.tmpl->check_problem(c.params, templates::Shape{.m = count}).ok()) out.push_back(c.name);
    }
    return out;
  }

  // Every rank holds the same stored decisions for `keys`: returns them, else nullopt (tune).
  Result<std::optional<std::vector<std::string>>> agreed_cached(const std::vector<std::string>& keys) {
    std::string mine;
    bool all = options.cache != nullptr;
    std::vector<std::string> names;
    for (const auto& k : keys) {
      if (!all) break;
      auto d = options.cache->lookup_decision(k);
      if (!d.ok() || !*d) {
        all = false;
        break;
      }
      names.push_back((*d)->choice);
      mine += (*d)->choice + ";";
    }
    if (!all) mine.clear();
    // all_gather needs one size on every rank: exchange a fixed-size digest of the list.
    std::string digest(64, '\0');
    const std::string h = fmt::format("{:016x}{:08x}", std::hash<std::string>{}(mine), mine.size());
    std::copy(h.begin(), h.end(), digest.begin());
    if (mine.empty()) digest.assign(64, '\0');
    KILN_ASSIGN_OR_RETURN(auto all_digests, comm->all_gather(digest));
    for (const auto& g : all_digests) {
      if (g != digest || mine.empty()) return std::optional<std::vector<std::string>>();
    }
    return std::optional<std::vector<std::string>>(std::move(names));
  }
};

AllReduce::AllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AllReduce::~AllReduce() = default;
const AllReduceOptions& AllReduce::options() const { return impl_->options; }
Communicator& AllReduce::comm() const { return *impl_->comm; }

namespace {

Result<std::vector<TemplateChoice>> render_choices(const std::string& name, const AllReduceOptions& o, int world,
                                                   const templates::DeviceLimits& limits, const Target& target,
                                                   PrecompileGate& gate) {
  KILN_ASSIGN_OR_RETURN(templates::TemplatePtr t, templates::find_template(name));
  const templates::ParamSpec* algo = t->param("algo");
  if (!algo) return make_error(ErrorCode::kInternal, name + " has no algo parameter");
  // A sample per algorithm: one sample over all of them gave the two-shot only a third of the configurations,
  // and none of its bandwidth-bound corner (vec 8, 128-256 blocks) at some seeds.
  std::vector<templates::Params> sampled;
  for (const templates::Value& a : algo->values) {
    templates::Params fixed{{"dtype", templates::Value::dtype(o.dtype)}, {"world", templates::Value::integer(world)},
                            {"algo", a}};
    KILN_ASSIGN_OR_RETURN(templates::Grid grid, templates::Grid::create(t, fixed));
    for (auto& p : templates::sample(grid, limits, static_cast<size_t>(std::max(1, o.max_configs)))) {
      sampled.push_back(std::move(p));
    }
  }
  std::vector<TemplateChoice> out;
  for (auto& p : sampled) {
    TemplateChoice c;
    c.tmpl = t;
    auto r = t->render(p);
    if (!r.ok()) {  // the sample is pruned already: a render error is a template bug the tests catch
      spdlog::warn("kiln: {} configuration not rendered: {}", name, r.status().to_string());
      continue;
    }
    c.name = r->config_name;
    c.params = r->params;
    c.push = templates::get_enum(c.params, "algo") == "push";
    c.in_place = name != "allreduce" || templates::get_enum(c.params, "algo") != "oneshot";
    // The launch geometry does not depend on the sizes; ask with a shape every configuration can serve.
    const int64_t vec = templates::get_int(c.params, "vec");
    auto l = t->geometry(c.params, name == "allreduce" ? templates::Shape{.m = 64 * vec} : templates::Shape{.m = 1, .n = vec});
    if (!l.ok()) {
      spdlog::warn("kiln: {} has no launch geometry: {}", c.name, l.status().to_string());
      continue;
    }
    c.launch = *l;
    c.binary = gate.precompile(r->source, target, Priority::kNormal);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<AllReduce>> AllReduce::create(Communicator& comm, AllReduceOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->comm = &comm;
  impl->options = std::move(options);
  impl->elem_bytes = templates::dtype_bytes(impl->options.dtype);
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSetCurrent(comm.context()));
  KILN_ASSIGN_OR_RETURN(impl->staging, PeerBuffers::create(comm, impl->options.max_bytes));
  KILN_ASSIGN_OR_RETURN(impl->signals, PeerBuffers::create(comm, KILN_AR_SIGNAL_WORDS * sizeof(unsigned)));
  impl->push_slot_bytes = std::min<size_t>(impl->options.max_bytes, size_t{4} << 20) / 256 * 256;
  KILN_ASSIGN_OR_RETURN(impl->push, PeerBuffers::create(comm, 2 * comm.world() * impl->push_slot_bytes));
  if (const size_t w = std::min(impl->options.symmetric_bytes, impl->options.max_bytes); w > 0) {
    auto window = detail::SymmetricWindow::create(comm, w);  // every rank gets the same outcome
    if (window.ok()) impl->window = std::move(window).value();
    else spdlog::info("kiln: no nccl_symmetric all-reduce choice: {}", window.status().to_string());
  }
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(comm.device()));
  KILN_ASSIGN_OR_RETURN(impl->target, Target::parse(info.arch()));
  impl->limits = templates::DeviceLimits::from_device(info, impl->target);
  std::shared_ptr<Executor> executor = impl->options.executor;
  if (!executor) {
    KILN_ASSIGN_OR_RETURN(executor, make_executor());
    impl->options.executor = executor;
  }
  if (impl->options.cache) {
    KILN_ASSIGN_OR_RETURN(impl->gate, make_cached_gate(impl->options.cache, executor));
  } else {
    GateOptions g;
    g.executor = executor;
    KILN_ASSIGN_OR_RETURN(impl->gate, PrecompileGate::create(std::move(g)));
  }
  KILN_ASSIGN_OR_RETURN(impl->choices, render_choices("allreduce", impl->options, comm.world(), impl->limits,
                                                      impl->target, *impl->gate));
  KILN_ASSIGN_OR_RETURN(impl->fused_choices, render_choices("allreduce_rmsnorm", impl->options, comm.world(),
                                                            impl->limits, impl->target, *impl->gate));
  KILN_ASSIGN_OR_RETURN(impl->work, Stream::create());
  KILN_ASSIGN_OR_RETURN(impl->start, Event::create());
  KILN_ASSIGN_OR_RETURN(impl->stop, Event::create());
  KILN_ASSIGN_OR_RETURN(impl->sync_word, DeviceBuffer::allocate(sizeof(float)));
  KILN_RETURN_IF_ERROR(impl->agree(impl->choices));
  return std::unique_ptr<AllReduce>(new AllReduce(std::move(impl)));
}

Result<std::vector<CollectiveReport>> AllReduce::tune(std::vector<size_t> bucket_bytes) {
  Impl& s = *impl_;
  if (bucket_bytes.empty()) {
    for (size_t b = 1024; b <= s.options.max_bytes; b *= 2) bucket_bytes.push_back(b);
  }
  std::sort(bucket_bytes.begin(), bucket_bytes.end());
  bucket_bytes.erase(std::unique(bucket_bytes.begin(), bucket_bytes.end()), bucket_bytes.end());
  for (size_t b : bucket_bytes) {
    if (b == 0 || b % s.elem_bytes || b > s.options.max_bytes) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("bucket of {} bytes: must be a positive multiple of {} up to {}", b, s.elem_bytes,
                                    s.options.max_bytes));
    }
  }
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSetCurrent(s.comm->context()));

  std::vector<std::string> keys;
  for (size_t b : bucket_bytes) keys.push_back(s.cache_key(b, "allreduce"));
  KILN_ASSIGN_OR_RETURN(auto cached, s.agreed_cached(keys));
  std::vector<CollectiveReport> reports;
  std::vector<std::string> picks;
  if (cached) {
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      const std::string& name = (*cached)[i];
      if (name != kNccl && !(name == kNcclSymmetric && s.window) && !s.find(s.choices, name)) {
        cached.reset();  // a stored choice that is not among this build's: every rank sees the same, so all tune
        break;
      }
      CollectiveReport r;
      r.bytes = bucket_bytes[i];
      r.chosen = name;
      r.from_cache = true;
      reports.push_back(std::move(r));
      picks.push_back(name);
    }
  }
  if (!cached) {
    reports.clear();
    picks.clear();
    const size_t largest = bucket_bytes.back();
    if (s.check_in.size() < largest) {
      KILN_ASSIGN_OR_RETURN(s.check_in, DeviceBuffer::allocate(largest));
      KILN_ASSIGN_OR_RETURN(s.check_out, DeviceBuffer::allocate(largest));
    }
    for (size_t bytes : bucket_bytes) {
      const int64_t count = static_cast<int64_t>(bytes / s.elem_bytes);
      KILN_RETURN_IF_ERROR(s.prepare_check(count));
      const std::vector<std::string> names = s.names_for(count);
      auto launch = [&](const std::string& n, CUstream st) {
        return s.run_named(n, s.bench_input(), s.bench_output(), count, st);
      };
      auto check = [&](const std::string& n) -> Status {
        KILN_RETURN_IF_ERROR(s.refresh_input(bytes));
        KILN_RETURN_IF_ERROR(s.check_out.fill_bytes(0xff, s.work.get()));
        KILN_RETURN_IF_ERROR(s.run_named(n, s.bench_input(), s.bench_output(), count, s.work.get()));
        KILN_RETURN_IF_ERROR(s.work.synchronize());
        return s.verify_allreduce(count);
      };
      KILN_ASSIGN_OR_RETURN(auto timings, s.measure(names, bytes, launch, check));
      const std::vector<double> us = figures(timings);
      const int w = pick_collective(us);
      CollectiveReport r;
      r.bytes = bytes;
      r.chosen = w >= 0 ? names[w] : kNccl;
      r.choices = std::move(timings);
      if (s.options.cache && w >= 0) {
        cache::Decision dec;
        dec.problem = s.cache_key(bytes, "allreduce");
        dec.choice = r.chosen;
        dec.median_us = us[w];
        if (Status st = s.options.cache->record_decision(std::move(dec)); !st.ok()) spdlog::warn("kiln: {}", st.to_string());
      }
      picks.push_back(r.chosen);
      reports.push_back(std::move(r));
    }
  }
  s.bounds = bucket_bytes;
  s.picks = std::move(picks);
  return reports;
}

CUdeviceptr AllReduce::input_buffer() const { return impl_->staging->local(); }

const std::string& AllReduce::choice_for(int64_t count) const {
  const Impl& s = *impl_;
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  auto it = std::lower_bound(s.bounds.begin(), s.bounds.end(), bytes);
  if (it == s.bounds.end()) return s.nccl_name;
  return s.picks[static_cast<size_t>(it - s.bounds.begin())];
}

Status AllReduce::run(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
  return impl_->run_named(choice_for(count), in, out, count, stream);
}

std::vector<std::string> AllReduce::choice_names(int64_t count) const { return impl_->names_for(count); }

Result<std::vector<CollectiveTiming>> AllReduce::benchmark(const std::vector<std::string>& names, int64_t count,
                                                          bool graph) {
  Impl& s = *impl_;
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  if (count <= 0 || bytes > s.options.max_bytes) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("benchmark of {} elements", count));
  }
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSetCurrent(s.comm->context()));
  if (s.check_in.size() < bytes) {
    KILN_ASSIGN_OR_RETURN(s.check_in, DeviceBuffer::allocate(bytes));
    KILN_ASSIGN_OR_RETURN(s.check_out, DeviceBuffer::allocate(bytes));
  }
  KILN_RETURN_IF_ERROR(s.prepare_check(count));
  auto resolve = [&](const std::string& n) -> const std::string& { return n == "dispatch" ? choice_for(count) : n; };
  auto launch = [&](const std::string& n, CUstream st) -> Status {
    if (n == "dispatch") return run(s.bench_input(), s.bench_output(), count, st);
    return s.run_named(n, s.bench_input(), s.bench_output(), count, st);
  };
  auto check = [&](const std::string& n) -> Status {
    KILN_RETURN_IF_ERROR(s.refresh_input(bytes));
    KILN_RETURN_IF_ERROR(s.check_out.fill_bytes(0xff, s.work.get()));
    KILN_RETURN_IF_ERROR(s.run_named(resolve(n), s.bench_input(), s.bench_output(), count, s.work.get()));
    KILN_RETURN_IF_ERROR(s.work.synchronize());
    return s.verify_allreduce(count);
  };
  const bool saved = s.options.graph;
  s.options.graph = graph;
  auto out = s.measure(names, bytes, launch, check);
  s.options.graph = saved;
  return out;
}

Status AllReduce::run_choice(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count,
                             CUstream stream) const {
  return impl_->run_named(name, in, out, count, stream);
}

// ------------------------------------------------------------------------------------------------ fused

namespace {
constexpr char kUnfused[] = "unfused:";
}

std::vector<std::string> AllReduce::fused_choice_names(const FusedArgs& a) const {
  std::vector<std::string> out;
  const size_t bytes = static_cast<size_t>(a.rows * a.cols) * impl_->elem_bytes;
  for (const auto& c : impl_->fused_choices) {
    if (!c.kernel || (c.push && bytes > impl_->push_slot_bytes)) continue;
    if (c.tmpl->check_problem(c.params, templates::Shape{.m = a.rows, .n = a.cols}).ok()) out.push_back(c.name);
  }
  return out;
}

Status AllReduce::run_fused_choice(const std::string& name, const FusedArgs& a, CUstream stream) const {
  const Impl& s = *impl_;
  const int64_t count = a.rows * a.cols;
  if (a.rows <= 0 || a.cols <= 0 || count > std::numeric_limits<int>::max()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("fused step of {} x {}", a.rows, a.cols));
  }
  if (name.rfind(kUnfused, 0) == 0) {
    // "unfused:<all-reduce>+<norm>": the norm selection is found among the tuned picks.
    for (auto it = s.fused_picks.rbegin(); it != s.fused_picks.rend(); ++it) {
      const FusedPick& p = *it;
      if (p.name == name && p.norm) {
        if (s.fused_tmp.size() < static_cast<size_t>(count) * s.elem_bytes) {
          return make_error(ErrorCode::kFailedPrecondition, "the unfused pair's buffer is smaller than this call");
        }
        KILN_RETURN_IF_ERROR(s.run_named(p.allreduce, a.x, s.fused_tmp.ptr(), count, stream));
        KilnNormArgs n{};
        n.x = reinterpret_cast<const void*>(static_cast<uintptr_t>(s.fused_tmp.ptr()));
        n.residual = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.residual));
        n.residual_out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.residual_out));
        n.weight = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.weight));
        n.y = reinterpret_cast<void*>(static_cast<uintptr_t>(a.y));
        n.rows = static_cast<int>(a.rows);
        n.cols = static_cast<int>(a.cols);
        n.ld_x = n.ld_residual = n.ld_residual_out = n.ld_y = a.cols;
        n.eps = a.eps;
        return p.norm->run(OpArgs{n}, stream);
      }
    }
    return make_error(ErrorCode::kNotFound, fmt::format("no tuned unfused pair '{}'", name));
  }
  const TemplateChoice* c = s.find(s.fused_choices, name);
  if (!c) return make_error(ErrorCode::kNotFound, fmt::format("no fused choice '{}'", name));
  if (!c->kernel) return c->status;
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  if (bytes > s.staging->bytes()) return make_error(ErrorCode::kInvalidArgument, "the rows exceed the staging buffers");
  KILN_RETURN_IF_ERROR(c->tmpl->check_problem(c->params, templates::Shape{.m = a.rows, .n = a.cols}));
  KILN_RETURN_IF_ERROR(s.not_in_staging(a.residual_out, "residual output"));
  KILN_RETURN_IF_ERROR(s.not_in_staging(a.y, "output"));
  KilnAllReduceArgs k = s.base_args();
  if (c->push) {
    if (bytes > s.push_slot_bytes) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: {} bytes exceed its slots", c->name, bytes));
    }
    k.in = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.x));
  } else {
    KILN_RETURN_IF_ERROR(s.copy_in(a.x, bytes, stream));
  }
  k.out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.y));
  k.residual = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.residual));
  k.residual_out = reinterpret_cast<void*>(static_cast<uintptr_t>(a.residual_out));
  k.weight = reinterpret_cast<const void*>(static_cast<uintptr_t>(a.weight));
  k.count = static_cast<int>(count);
  k.rows = static_cast<int>(a.rows);
  k.cols = static_cast<int>(a.cols);
  k.eps = a.eps;
  return (*c->kernel)(c->launch.config(stream), k);
}

Result<std::vector<CollectiveReport>> AllReduce::tune_fused(int64_t cols, std::vector<int64_t> rows) {
  Impl& s = *impl_;
  if (s.bounds.empty()) return make_error(ErrorCode::kFailedPrecondition, "tune_fused() needs tune() first");
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  if (rows.empty() || rows.front() <= 0 || cols <= 0) return make_error(ErrorCode::kInvalidArgument, "fused: rows and cols must be positive");
  const int64_t max_count = rows.back() * cols;
  const size_t max_bytes = static_cast<size_t>(max_count) * s.elem_bytes;
  if (max_bytes > s.staging->bytes()) return make_error(ErrorCode::kInvalidArgument, "fused: rows x cols exceed the staging buffers");
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSetCurrent(s.comm->context()));
  KILN_RETURN_IF_ERROR(s.agree(s.fused_choices));
  if (!s.norm_tuner) {
    TuneOptions o;
    o.cache = s.options.cache;
    if (!o.cache) {
      KILN_ASSIGN_OR_RETURN(auto off, cache::TuningCache::open(cache::TuneMode::kOff));
      o.cache = std::move(off);
    }
    o.executor = s.options.executor;
    o.device = s.comm->device();
    KILN_ASSIGN_OR_RETURN(s.norm_tuner, make_tuner(std::move(o)));
  }
  KILN_ASSIGN_OR_RETURN(s.fused_tmp, DeviceBuffer::allocate(max_bytes));
  // Buffers for the checks: x (the check input), residual, residual_out, weight, y.
  KILN_ASSIGN_OR_RETURN(DeviceBuffer residual, DeviceBuffer::allocate(max_bytes));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer residual_out, DeviceBuffer::allocate(max_bytes));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer weight, DeviceBuffer::allocate(static_cast<size_t>(cols) * s.elem_bytes));
  if (s.check_in.size() < max_bytes) {
    KILN_ASSIGN_OR_RETURN(s.check_in, DeviceBuffer::allocate(max_bytes));
    KILN_ASSIGN_OR_RETURN(s.check_out, DeviceBuffer::allocate(max_bytes));
  }
  {
    std::vector<float> w(cols), r(max_count);
    for (int64_t c = 0; c < cols; ++c) w[c] = 0.5f + 0.25f * static_cast<float>(c % 5);
    for (int64_t i = 0; i < max_count; ++i) r[i] = static_cast<float>(i % 9) - 4.f;
    auto wb = encode(s.options.dtype, w), rb = encode(s.options.dtype, r);
    KILN_RETURN_IF_ERROR(weight.copy_from_host(wb.data(), wb.size()));
    KILN_RETURN_IF_ERROR(residual.copy_from_host(rb.data(), rb.size()));
  }

  std::vector<CollectiveReport> reports;
  s.fused_bounds.clear();
  s.fused_picks.clear();
  for (int64_t nrows : rows) {
    const int64_t count = nrows * cols;
    const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
    KILN_RETURN_IF_ERROR(s.prepare_check(count));
    FusedArgs a;
    a.x = s.bench_input();
    a.residual = residual.ptr();
    a.residual_out = residual_out.ptr();
    a.weight = weight.ptr();
    a.y = s.check_out.ptr();
    a.rows = nrows;
    a.cols = cols;
    // The unfused pairs: NCCL and this size's all-reduce winner, each followed by kiln's tuned RMSNorm.
    NormProblem np;
    np.rows = nrows;
    np.cols = cols;
    np.dtype = s.options.dtype;
    np.residual = true;
    np.eps = a.eps;
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<Selection> norm, s.norm_tuner->tune(Problem::norm(np)));
    std::vector<std::string> names;
    const std::string& ar = choice_for(count);
    for (const std::string& pair_ar : {s.nccl_name, ar}) {
      FusedPick p;
      p.allreduce = pair_ar;
      p.norm = norm;
      p.name = fmt::format("{}{}+{}", kUnfused, pair_ar, norm->choice_name());
      if (std::find(names.begin(), names.end(), p.name) == names.end()) {
        names.push_back(p.name);
        s.fused_picks.push_back(std::move(p));  // findable by run_fused_choice while measuring (the latest wins)
      }
    }
    for (auto& n : fused_choice_names(a)) names.push_back(n);
    auto launch = [&](const std::string& n, CUstream st) { return run_fused_choice(n, a, st); };
    auto check = [&](const std::string& n) -> Status {
      KILN_RETURN_IF_ERROR(s.refresh_input(bytes));
      KILN_RETURN_IF_ERROR(s.check_out.fill_bytes(0xff, s.work.get()));
      KILN_RETURN_IF_ERROR(residual_out.fill_bytes(0xff, s.work.get()));
      KILN_RETURN_IF_ERROR(run_fused_choice(n, a, s.work.get()));
      KILN_RETURN_IF_ERROR(s.work.synchronize());
      std::vector<char> y(bytes), h(bytes), res(bytes), wt(static_cast<size_t>(cols) * s.elem_bytes);
      KILN_RETURN_IF_ERROR(s.check_out.copy_to_host(y.data(), bytes));
      KILN_RETURN_IF_ERROR(residual_out.copy_to_host(h.data(), bytes));
      KILN_RETURN_IF_ERROR(residual.copy_to_host(res.data(), bytes));
      KILN_RETURN_IF_ERROR(weight.copy_to_host(wt.data(), wt.size()));
      for (int64_t row = 0; row < nrows; ++row) {
        double sq = 0;
        std::vector<float> hr(cols);
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = row * cols + c;
          float sum = 0;
          for (int r = 0; r < s.comm->world(); ++r) sum += pattern(r, i);
          hr[c] = round_to(s.options.dtype, sum + decode_one(s.options.dtype, &res[i * s.elem_bytes]));
          const float got = decode_one(s.options.dtype, &h[i * s.elem_bytes]);
          if (got != hr[c]) {
            return make_error(ErrorCode::kInternal, fmt::format("wrong residual sum at row {} col {}: {} vs {}", row, c, got, hr[c]));
          }
          sq += double(hr[c]) * hr[c];
        }
        const double inv = 1.0 / std::sqrt(sq / cols + a.eps);
        for (int64_t c = 0; c < cols; ++c) {
          const double want = hr[c] * inv * decode_one(s.options.dtype, &wt[c * s.elem_bytes]);
          const float got = decode_one(s.options.dtype, &y[(row * cols + c) * s.elem_bytes]);
          if (!(std::abs(got - want) <= 0.02 * std::abs(want) + 0.02)) {
            return make_error(ErrorCode::kInternal, fmt::format("wrong norm at row {} col {}: {} vs {}", row, c, got, want));
          }
        }
      }
      return Status();
    };
    KILN_ASSIGN_OR_RETURN(auto timings, s.measure(names, bytes, launch, check));
    const int w = pick_collective(figures(timings));
    CollectiveReport r;
    r.bytes = bytes;
    r.rows = nrows;
    r.chosen = w >= 0 ? names[w] : names.front();
    r.choices = std::move(timings);
    FusedPick pick;
    pick.name = r.chosen;
    if (r.chosen.rfind(kUnfused, 0) == 0) {
      for (const auto& p : s.fused_picks) {
        if (p.name == r.chosen) pick = p;
      }
    } else {
      for (size_t i = 0; i < s.fused_choices.size(); ++i) {
        if (s.fused_choices[i].name == r.chosen) pick.fused = static_cast<int>(i);
      }
    }
    s.fused_bounds.push_back(nrows);
    s.fused_picks.push_back(pick);
    reports.push_back(std::move(r));
  }
  // Keep the per-bucket picks at the end in bucket order (the pairs measured along the way stay findable).
  std::vector<FusedPick> table(s.fused_picks.end() - static_cast<std::ptrdiff_t>(rows.size()), s.fused_picks.end());
  std::vector<FusedPick> pairs(s.fused_picks.begin(), s.fused_picks.end() - static_cast<std::ptrdiff_t>(rows.size()));
  s.fused_picks = std::move(pairs);
  s.fused_picks.insert(s.fused_picks.end(), table.begin(), table.end());
  return reports;
}

const std::string& AllReduce::fused_choice_for(int64_t rows) const {
  const Impl& s = *impl_;
  auto it = std::lower_bound(s.fused_bounds.begin(), s.fused_bounds.end(), rows);
  if (s.fused_bounds.empty()) return s.nccl_name;
  const size_t i = it == s.fused_bounds.end() ? s.fused_bounds.size() - 1 : static_cast<size_t>(it - s.fused_bounds.begin());
  return s.fused_picks[s.fused_picks.size() - s.fused_bounds.size() + i].name;
}

Status AllReduce::run_fused(const FusedArgs& a, CUstream stream) const {
  if (impl_->fused_bounds.empty()) return make_error(ErrorCode::kFailedPrecondition, "run_fused() needs tune_fused() first");
  return run_fused_choice(fused_choice_for(a.rows), a, stream);
}

}  // namespace kiln::runtime
