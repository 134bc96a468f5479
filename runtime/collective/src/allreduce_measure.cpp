// Measuring collective choices alike on every rank: each choice is checked against the exact sum of the ranks'
// check inputs, the check's outcome is agreed over ranks, then every rank times the same fixed number of calls
// after a barrier, and a choice's figure is the maximum over ranks of the ranks' medians; the rule that picks the
// winner from those figures (pick_collective), the reports' JSON, and AllReduce::benchmark().
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "allreduce_impl.h"
#include "kiln/jit/driver.h"
#include "nccl_api.h"

namespace kiln::runtime {

using namespace detail;

std::vector<char> detail::encode_elements(templates::DType dtype, const std::vector<float>& v) {
  const int b = templates::dtype_bytes(dtype);
  std::vector<char> out(v.size() * b);
  for (size_t i = 0; i < v.size(); ++i) templates::store_element(dtype, v[i], &out[i * b]);
  return out;
}
float detail::decode_element(templates::DType dtype, const char* p) { return templates::load_element(dtype, p); }
float detail::round_to(templates::DType dtype, float f) {
  char bytes[4];
  templates::store_element(dtype, f, bytes);
  return templates::load_element(dtype, bytes);
}

float detail::check_pattern(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13 + 3) % 17) - 8.f; }

std::vector<double> detail::figures(const std::vector<CollectiveTiming>& timings) {
  std::vector<double> us;
  for (const auto& t : timings) us.push_back(t.ok ? t.us : kFailed);
  return us;
}

namespace {

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::string CollectiveReport::json() const {
  nlohmann::json j{{"bytes", bytes}, {"chosen", chosen}, {"from_cache", from_cache}};
  if (!call.empty()) j["call"] = call;
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

// The input a measurement uses: the check pattern itself (staged), or (symmetric) a copy of it in a heap tensor or
// the staging buffer, refreshed before every check since the two-shot reduces in place. In place, the output is
// that input.
CUdeviceptr AllReduce::Impl::bench_input() const {
  return measuring == AllReduceCall::kStaged ? check_in.ptr() : (sym_in ? sym_in : staging->local());
}
CUdeviceptr AllReduce::Impl::bench_output() const {
  return measuring == AllReduceCall::kSymmetricInPlace ? bench_input() : check_out.ptr();
}

Status AllReduce::Impl::refresh_input(size_t bytes) {
  if (measuring == AllReduceCall::kStaged) return Status();
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuMemcpyDtoDAsync(bench_input(), check_in.ptr(), bytes, work.get()));
  return work.synchronize();
}

// Symmetric calls are measured on a heap tensor when every rank's heap has room (allocate() is collective and
// agrees, so all ranks measure the same way), else on the staging buffer: the kernels do the same work on both.
Result<std::vector<CollectiveTiming>> AllReduce::Impl::measure_call(AllReduceCall call,
                                                                   const std::vector<std::string>& names,
                                                                   int64_t count) {
  const AllReduceCall saved = measuring;
  measuring = call;
  sym_in = 0;
  if (call != AllReduceCall::kStaged && heap) {
    auto t = heap_allocate(static_cast<size_t>(count) * elem_bytes);
    if (t.ok()) sym_in = *t;
    else if (t.status().code() != ErrorCode::kOutOfRange) {
      measuring = saved;
      return t.status();
    }
  }
  auto out = measure_allreduce(names, count);
  if (sym_in) {
    Status st = work.synchronize();
    {
      std::lock_guard<std::mutex> lock(heap_mu);
      uses.erase(static_cast<size_t>(sym_in - heap->local()));  // its calls are complete (synchronised above)
      Status f = heap_map.free(static_cast<size_t>(sym_in - heap->local()), {}, "the measuring tensor");
      if (st.ok()) st = f;
    }
    sym_in = 0;
    if (out.ok() && !st.ok()) out = st;
  }
  measuring = saved;
  return out;
}

Status AllReduce::Impl::ensure_check_buffers(size_t bytes) {
  if (check_in.size() >= bytes) return Status();
  KILN_ASSIGN_OR_RETURN(check_in, DeviceBuffer::allocate(bytes));
  KILN_ASSIGN_OR_RETURN(check_out, DeviceBuffer::allocate(bytes));
  return Status();
}

Status AllReduce::Impl::prepare_check(int64_t count) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = check_pattern(comm->rank(), i);
  auto bytes = encode_elements(options.dtype, v);
  KILN_RETURN_IF_ERROR(check_in.copy_from_host(bytes.data(), bytes.size()));
  KILN_RETURN_IF_ERROR(check_out.fill_bytes(0xff, work.get()));
  return work.synchronize();
}

Status AllReduce::Impl::verify_allreduce(int64_t count) {
  std::vector<char> host(static_cast<size_t>(count) * elem_bytes);
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuMemcpyDtoH(host.data(), bench_output(), host.size()));
  for (int64_t i : check_positions(count)) {
    float want = 0;
    for (int r = 0; r < comm->world(); ++r) want += check_pattern(r, i);
    const float got = decode_element(options.dtype, &host[static_cast<size_t>(i) * elem_bytes]);
    if (got != want) {
      return make_error(ErrorCode::kInternal, fmt::format("wrong result: element {} is {}, the sum is {}", i, got, want));
    }
  }
  return Status();
}

// Enqueues a one-element NCCL all-reduce on the timing stream, so that the ranks' GPUs start a timed run
// together: the host barrier alone lets one rank's GPU start up to tens of microseconds before the other's, and
// the first timed call then waits for the late rank inside the timed region, a skew the fixed iteration count
// spreads over as few as 2 calls at the largest sizes.
Status AllReduce::Impl::align_start() const {
  KILN_ASSIGN_OR_RETURN(const NcclApi* n, nccl());
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(sync_word.ptr()));
  KILN_CHECK(n->ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm->nccl(), work.get()));
  return Status();
}

// The rank's median time per call of `launch` over options.runs timed runs of a fixed iteration count, each
// after a barrier (on the host, then on the GPUs). Returns the error of a launch that failed; the barriers are taken either way, so that the
// ranks stay in step.
Result<double> AllReduce::Impl::time_local(const std::function<Status(CUstream)>& launch, size_t bytes) {
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

Result<std::vector<CollectiveTiming>> AllReduce::Impl::measure(
    const std::vector<std::string>& names, size_t bytes,
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

Result<std::vector<CollectiveTiming>> AllReduce::Impl::measure_allreduce(const std::vector<std::string>& names,
                                                                        int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * elem_bytes;
  KILN_RETURN_IF_ERROR(prepare_check(count));
  // "dispatch" is timed through run()'s own path (its host work per call included).
  auto launch = [&](const std::string& n, CUstream st) {
    if (n == kDispatch) return run_call(bench_input(), bench_output(), count, st);
    return run_named(n, bench_input(), bench_output(), count, st);
  };
  auto check = [&](const std::string& n) -> Status {
    KILN_RETURN_IF_ERROR(refresh_input(bytes));
    KILN_RETURN_IF_ERROR(check_out.fill_bytes(0xff, work.get()));
    KILN_RETURN_IF_ERROR(launch(n, work.get()));
    KILN_RETURN_IF_ERROR(work.synchronize());
    return verify_allreduce(count);
  };
  return measure(names, bytes, launch, check);
}

Result<std::vector<CollectiveTiming>> AllReduce::benchmark(const std::vector<std::string>& names, int64_t count,
                                                          bool graph) {
  return benchmark(names, count, graph, impl_->options_call());
}

Result<std::vector<CollectiveTiming>> AllReduce::benchmark(const std::vector<std::string>& names, int64_t count,
                                                          bool graph, AllReduceCall call) {
  Impl& s = *impl_;
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  if (count <= 0 || bytes > s.options.max_bytes) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("benchmark of {} elements", count));
  }
  KILN_RETURN_IF_ERROR(s.make_current());
  KILN_RETURN_IF_ERROR(s.ensure_check_buffers(bytes));
  const bool saved = s.options.graph;
  s.options.graph = graph;
  auto out = s.measure_call(call, names, count);
  s.options.graph = saved;
  return out;
}

}  // namespace kiln::runtime
