#include "kiln/runtime/measure.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "kiln/runtime/helper_kernels.h"
#include "kiln/jit/driver.h"

namespace kiln::runtime {
namespace detail {
// A CUDA graph of one run of a choice, and its executable instance.
struct Graph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ~Graph() {
    auto d = driver();
    if (!d.ok()) return;
    if (exec) (void)(*d)->cuGraphExecDestroy(exec);
    if (graph) (void)(*d)->cuGraphDestroy(graph);
  }
};
}  // namespace detail

ReplayGraphs::ReplayGraphs() = default;
ReplayGraphs::~ReplayGraphs() = default;

namespace {

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double pos = q * (sorted.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

// Holds a stream until released: the GPU starts a batch of timed runs only once the whole batch is queued, so
// the host work of a launch (a template's tensor-map encoding, cuBLAS's launch path, this thread preempted by the
// compile workers on every core) never falls between a start event and its kernel. Timed without it on the H200
// (27 Nov), a wgmma template measured 0.5-1.5% from cuBLAS during a tune and 2.9-5.1% faster in a quiet re-time
// of the same two kernels. A host function on the stream waits for the release (10 s at most, so a lost
// release can only delay the batch); it touches no CUDA API, as host functions must not.
class StreamHold {
 public:
  static Result<StreamHold> hold(CUstream stream) {
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    auto state = std::make_shared<State>();
    auto* for_callback = new std::shared_ptr<State>(state);
    if (CUresult rc = d->cuLaunchHostFunc(stream, &StreamHold::wait, for_callback); rc != CUDA_SUCCESS) {
      delete for_callback;
      KILN_CHECK(rc);
    }
    return StreamHold(std::move(state));
  }
  StreamHold(StreamHold&&) = default;
  StreamHold& operator=(StreamHold&&) = delete;  // would drop a hold without releasing it
  ~StreamHold() { release(); }
  void release() {
    if (!state_) return;
    {
      std::lock_guard lock(state_->mu);
      state_->released = true;
    }
    state_->cv.notify_all();
    state_.reset();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;
  };
  explicit StreamHold(std::shared_ptr<State> s) : state_(std::move(s)) {}
  static void CUDA_CB wait(void* p) {
    std::unique_ptr<std::shared_ptr<State>> state(static_cast<std::shared_ptr<State>*>(p));
    std::unique_lock lock((*state)->mu);
    (*state)->cv.wait_for(lock, std::chrono::seconds(10), [&] { return (*state)->released; });
  }
  std::shared_ptr<State> state_;
};

// One batch's hold: a StreamHold, or a kiln_hold kernel released by writing its ticket to pinned memory.
// Released when it goes out of scope, so that an error while queuing never leaves the stream waiting.
class BatchHold {
 public:
  static Result<BatchHold> on_host(CUstream stream) {
    KILN_ASSIGN_OR_RETURN(StreamHold h, StreamHold::hold(stream));
    BatchHold b;
    b.host_.emplace(std::move(h));
    return b;
  }
  static Result<BatchHold> on_gpu(uint64_t* word, CUdeviceptr word_device, uint64_t ticket, CUstream stream) {
    KILN_RETURN_IF_ERROR(hold_stream(word_device, ticket, 10'000'000'000ull, stream));
    BatchHold b;
    b.word_ = word;
    b.ticket_ = ticket;
    return b;
  }
  BatchHold(BatchHold&& o) noexcept
      : host_(std::move(o.host_)), word_(std::exchange(o.word_, nullptr)), ticket_(o.ticket_) {
    o.host_.reset();
  }
  BatchHold& operator=(BatchHold&&) = delete;
  ~BatchHold() { release(); }
  void release() {
    if (host_) host_->release();
    host_.reset();
    if (word_) std::atomic_ref<uint64_t>(*word_).store(ticket_, std::memory_order_release);
    word_ = nullptr;
  }

 private:
  BatchHold() = default;
  std::optional<StreamHold> host_;
  uint64_t* word_ = nullptr;
  uint64_t ticket_ = 0;
};

// Timed runs queued behind one hold: few enough that the queue never fills while the stream waits (a full
// launch queue would block this thread before the release).
constexpr int kRunsPerHold = 16;

using detail::Graph;

// Captures one run of `choice` on `stream` (relaxed mode: compile threads may use the driver meanwhile).
Result<std::unique_ptr<Graph>> capture(const Choice& choice, const OpArgs& args, CUdeviceptr ws, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  auto g = std::make_unique<Graph>();
  KILN_CHECK(d->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  Status ran = choice.run(args, ws, stream);
  CUresult end = d->cuStreamEndCapture(stream, &g->graph);
  KILN_RETURN_IF_ERROR(ran);
  KILN_CHECK(end);
  KILN_CHECK(d->cuGraphInstantiateWithFlags(&g->exec, g->graph, 0));
  return g;
}

// Errors after which the context cannot be used again: the process must not go on benchmarking in it.
bool sticky(const Status& s) {
  const std::string& m = s.message();
  for (const char* e : {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                        "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_HARDWARE_STACK_ERROR",
                        "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT"}) {
    if (m.find(e) != std::string::npos) return true;
  }
  return false;
}

constexpr auto kRunTimeout = std::chrono::seconds(20);

}  // namespace

MeasureCosts& MeasureCosts::operator-=(const MeasureCosts& o) {
  warmup_s -= o.warmup_s;
  capture_s -= o.capture_s;
  queue_s -= o.queue_s;
  wait_s -= o.wait_s;
  gpu_span_s -= o.gpu_span_s;
  timed_s -= o.timed_s;
  runs -= o.runs;
  batches -= o.batches;
  return *this;
}

Summary summarize(std::vector<double> us) {
  Summary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.min = us.front();
  s.median = percentile(us, 0.5);
  s.p10 = percentile(us, 0.1);
  s.p90 = percentile(us, 0.9);
  return s;
}

void Samples::append(const Samples& more) {
  // A side without placements (or with ones that do not match its runs) counts as all on set 0, so that the
  // placements stay aligned with `us`.
  const bool mine = placement.size() == us.size() && !placement.empty();
  const bool theirs = more.placement.size() == more.us.size() && !more.placement.empty();
  if (!mine) placement.assign(theirs ? us.size() : 0, 0);
  us.insert(us.end(), more.us.begin(), more.us.end());
  if (theirs) placement.insert(placement.end(), more.placement.begin(), more.placement.end());
  else if (!placement.empty()) placement.resize(us.size(), 0);
  graph = more.graph;
}

double placed_median(const std::vector<double>& us, const std::vector<uint32_t>& placement) {
  if (us.empty()) return 0;
  std::map<uint32_t, std::vector<double>> by_set;
  if (placement.size() != us.size()) by_set[0] = us;
  else for (size_t i = 0; i < us.size(); ++i) by_set[placement[i]].push_back(us[i]);
  double sum = 0;
  for (auto& [set, runs] : by_set) {
    std::sort(runs.begin(), runs.end());
    sum += percentile(runs, 0.5);
  }
  return sum / static_cast<double>(by_set.size());
}

Summary summarize(const Samples& samples) {
  Summary s = summarize(samples.us);
  if (!samples.us.empty()) s.median = placed_median(samples.us, samples.placement);
  return s;
}

Result<std::unique_ptr<BenchRunner>> BenchRunner::create(const BenchmarkOptions& options, const DeviceInfo& device) {
  std::unique_ptr<BenchRunner> r(new BenchRunner());
  r->options_ = options;
  KILN_ASSIGN_OR_RETURN(r->stream_, Stream::create());
  if (options.flush_l2) {
    const size_t l2 = static_cast<size_t>(std::max(device.l2_bytes, 0));
    const size_t bytes = (std::max<size_t>(2 * l2, 8 << 20) + 15) / 16 * 16;
    KILN_ASSIGN_OR_RETURN(r->flush_buffer_, DeviceBuffer::allocate(bytes));
    // One repeated word: the read flush's loads never make it store (helpers.cu).
    KILN_RETURN_IF_ERROR(r->flush_buffer_.fill_bytes(0x5a, r->stream_.get()));
  }
  const int events = 2 * std::max({options.max_reps, options.fixed_reps, options.min_reps, 8});
  for (int i = 0; i < events; ++i) {
    KILN_ASSIGN_OR_RETURN(Event e, Event::create());
    r->events_.push_back(std::move(e));
  }
  KILN_ASSIGN_OR_RETURN(r->batch_start_, Event::create());
  if (!options.hold_on_host) {
    // The GPU hold's release word; where it cannot be had, batches are held by host functions.
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    void* word = nullptr;
    if (d->cuMemAllocHost(&word, 64) == CUDA_SUCCESS) {
      *static_cast<uint64_t*>(word) = 0;
      CUdeviceptr device = 0;
      if (d->cuPointerGetAttribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                   reinterpret_cast<CUdeviceptr>(word)) == CUDA_SUCCESS) {
        r->released_ = static_cast<uint64_t*>(word);
        r->released_device_ = device;
      } else {
        (void)d->cuMemFreeHost(word);
      }
    }
  }
  return r;
}

BenchRunner::~BenchRunner() {
  if (!released_) return;
  auto d = driver();
  if (!d.ok()) return;
  // No hold may still read the word (each was released; a lost context has nothing running).
  (void)(*d)->cuStreamSynchronize(stream_.get());
  (void)(*d)->cuMemFreeHost(released_);
}

// Waits for the stream with a deadline, so a hung kernel is reported instead of blocking forever. Polling
// is deliberate here: the driver has no timed wait. The first 2 ms poll with a yield, the rest with naps: a
// tune waits here several times per choice for batches of a few milliseconds, and a 50-us nap costs ~100 us
// with the kernel's default timer slack, on every wait.
Status BenchRunner::synchronize() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + kRunTimeout, spin_until = start + std::chrono::milliseconds(2);
  for (;;) {
    CUresult rc = d->cuStreamQuery(stream_.get());
    if (rc == CUDA_SUCCESS) return Status();
    if (rc != CUDA_ERROR_NOT_READY) return to_status(rc, "cuStreamQuery", __FILE__, __LINE__);
    const auto now = std::chrono::steady_clock::now();
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    if (now > deadline) {
      return make_error(ErrorCode::kTimeout,
                        fmt::format("a run did not finish within {} s; the context is no longer usable "
                                    "(run untrusted choices with Isolation::kIsolated)",
                                    kRunTimeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status BenchRunner::flush() {
  if (!options_.flush_l2 || flush_buffer_.size() == 0) return Status();
  if (!options_.flush_l2_by_writing) return read_through_l2(flush_buffer_.ptr(), flush_buffer_.size(), stream_.get());
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuMemsetD32Async(flush_buffer_.ptr(), 0x5a5a5a5a, flush_buffer_.size() / 4, stream_.get()));
  return Status();
}

namespace {
size_t region_bytes(const OutputRegion& o) { return static_cast<size_t>(o.rows) * o.ld * templates::dtype_bytes(o.dtype); }

// Device copies of `outputs` (those `keep` selects; the others get an empty buffer), queued on `stream`.
template <class Keep>
Result<std::vector<DeviceBuffer>> copy_regions(const std::vector<OutputRegion>& outputs, CUstream stream, Keep keep) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  std::vector<DeviceBuffer> out;
  for (const auto& o : outputs) {
    DeviceBuffer b;
    if (keep(o)) {
      KILN_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(region_bytes(o)));
      KILN_CHECK(d->cuMemcpyDtoDAsync(b.ptr(), o.ptr, region_bytes(o), stream));
    }
    out.push_back(std::move(b));
  }
  return out;
}
}  // namespace

Status BenchRunner::capture_initial(const std::vector<OutputRegion>& outputs) {
  initial_.clear();
  if (std::none_of(outputs.begin(), outputs.end(), [](const OutputRegion& o) { return o.restore; })) return Status();
  KILN_ASSIGN_OR_RETURN(initial_, copy_regions(outputs, stream_.get(), [](const OutputRegion& o) { return o.restore; }));
  return synchronize();
}

Status BenchRunner::capture_reference(const std::vector<OutputRegion>& outputs) {
  KILN_ASSIGN_OR_RETURN(reference_, copy_regions(outputs, stream_.get(), [](const OutputRegion&) { return true; }));
  return synchronize();
}

Result<double> BenchRunner::check(const Choice& choice, const OpArgs& args, CUdeviceptr ws,
                                  const std::vector<OutputRegion>& outputs, double tolerance) {
  if (reference_.size() != outputs.size()) return make_error(ErrorCode::kInternal, "no reference outputs captured");
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& o = outputs[i];
    if (o.restore) {
      if (i >= initial_.size() || initial_[i].size() == 0) {
        return make_error(ErrorCode::kInternal, fmt::format("output '{}' is restored, but was not captured", o.name));
      }
      KILN_CHECK(d->cuMemcpyDtoDAsync(o.ptr, initial_[i].ptr(), region_bytes(o), stream_.get()));
    } else {
      KILN_CHECK(d->cuMemsetD8Async(o.ptr, 0xff, region_bytes(o), stream_.get()));  // NaN in every float format
    }
  }
  KILN_RETURN_IF_ERROR(choice.run(args, ws, stream_.get()));
  if (Status s = synchronize(); !s.ok()) {
    if (sticky(s) || s.code() == ErrorCode::kTimeout) {
      context_lost_ = true;
      s.with_context("the CUDA context is now unusable; later choices cannot run in this process");
    }
    return s;
  }
  double worst = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& o = outputs[i];
    KILN_ASSIGN_OR_RETURN(Comparison c, compare(o.ptr, o.dtype, o.ld, reference_[i].ptr(), o.dtype, o.ld, o.rows,
                                                o.cols, stream_.get()));
    if (c.non_finite > 0) {
      return make_error(ErrorCode::kWrongResult,
                        fmt::format("{} of {} elements of output '{}' were not written or are not finite",
                                    c.non_finite, o.rows * o.cols, o.name));
    }
    if (!(c.relative_error <= tolerance)) {
      return make_error(ErrorCode::kWrongResult,
                        fmt::format("output '{}' differs from the reference: relative error {:.3g} > {:.3g}", o.name,
                                    c.relative_error, tolerance));
    }
    worst = std::max(worst, c.relative_error);
  }
  return worst;
}

Result<Samples> BenchRunner::time_runs(const Choice& choice, const OpArgs& args, CUdeviceptr ws, int n, bool graph,
                                       ReplayGraphs* keep) {
  return time_runs(choice, std::vector<const OpArgs*>{&args}, ws, n, graph, keep);
}

Result<Samples> BenchRunner::time_runs(const Choice& choice, const std::vector<const OpArgs*>& sets, CUdeviceptr ws,
                                       int n, bool graph, ReplayGraphs* keep, size_t first_run) {
  if (sets.empty()) return make_error(ErrorCode::kInvalidArgument, "time_runs: no operand set");
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  // One graph per operand set (its pointers are baked in); all or none: a choice that cannot be captured on
  // one set is timed eagerly on all.
  std::vector<std::unique_ptr<Graph>> own(sets.size());
  std::vector<const Graph*> g(sets.size(), nullptr);
  bool graphed = graph;
  const auto t_capture = std::chrono::steady_clock::now();
  for (size_t s = 0; graphed && s < sets.size(); ++s) {
    const std::unique_ptr<Graph>* kept = nullptr;
    if (keep) {
      if (auto it = keep->graphs_.find({&choice, s}); it != keep->graphs_.end()) kept = &it->second;
    }
    if (kept) {
      g[s] = kept->get();
    } else {
      auto captured = capture(choice, *sets[s], ws, stream_.get());
      if (captured.ok()) own[s] = std::move(captured).value();
      g[s] = own[s].get();
      if (keep) keep->graphs_[{&choice, s}] = std::move(own[s]);
    }
    graphed = g[s] != nullptr;
  }
  const auto t_queue = std::chrono::steady_clock::now();
  costs_.capture_s += std::chrono::duration<double>(t_queue - t_capture).count();
  Samples out;
  out.graph = graphed;
  n = std::clamp(n, 1, static_cast<int>(events_.size() / 2));
  for (int first = 0; first < n; first += kRunsPerHold) {
    KILN_ASSIGN_OR_RETURN(BatchHold hold, released_ ? BatchHold::on_gpu(released_, released_device_, ++tickets_, stream_.get())
                                                    : BatchHold::on_host(stream_.get()));
    if (first == 0) KILN_RETURN_IF_ERROR(batch_start_.record(stream_.get()));
    for (int i = first; i < std::min(n, first + kRunsPerHold); ++i) {
      const size_t s = (first_run + static_cast<size_t>(i)) % sets.size();
      KILN_RETURN_IF_ERROR(flush());
      KILN_RETURN_IF_ERROR(events_[2 * i].record(stream_.get()));
      if (graphed) KILN_CHECK(d->cuGraphLaunch(g[s]->exec, stream_.get()));
      else KILN_RETURN_IF_ERROR(choice.run(*sets[s], ws, stream_.get()));
      KILN_RETURN_IF_ERROR(events_[2 * i + 1].record(stream_.get()));
    }
    hold.release();
    ++costs_.batches;
  }
  const auto t_wait = std::chrono::steady_clock::now();
  costs_.queue_s += std::chrono::duration<double>(t_wait - t_queue).count();
  if (Status s = synchronize(); !s.ok()) {
    if (sticky(s) || s.code() == ErrorCode::kTimeout) context_lost_ = true;
    return s;
  }
  costs_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
  for (int i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(float ms, events_[2 * i + 1].elapsed_ms_since(events_[2 * i]));
    out.us.push_back(ms * 1e3);
    out.placement.push_back(static_cast<uint32_t>((first_run + static_cast<size_t>(i)) % sets.size()));
    costs_.timed_s += ms * 1e-3;
  }
  if (auto span = events_[2 * n - 1].elapsed_ms_since(batch_start_); span.ok()) costs_.gpu_span_s += *span * 1e-3;
  costs_.runs += n;
  return out;
}

MedianInterval median_interval(std::vector<double> us) {
  MedianInterval m;
  if (us.empty()) return m;
  std::sort(us.begin(), us.end());
  const double n = static_cast<double>(us.size());
  const double half = 0.98 * std::sqrt(n);
  const auto at = [&](double rank) {
    const long i = std::lround(std::clamp(rank, 0.0, n - 1));
    return us[static_cast<size_t>(i)];
  };
  m.median = percentile(us, 0.5);
  m.low = at(std::floor((n - 1) / 2 - half));
  m.high = at(std::ceil((n - 1) / 2 + half));
  return m;
}

Verdict judge(const std::vector<double>& us, double best_us, int max_reps, const BenchmarkOptions& o) {
  const int n = static_cast<int>(us.size());
  if (n >= max_reps) return Verdict::kEnough;
  if (n < std::max(o.min_reps, 3)) return Verdict::kMore;
  const MedianInterval m = median_interval(us);
  if (best_us > 0 && m.low > best_us * (1 + o.tie_fraction)) return Verdict::kSlower;
  if (best_us > 0 && m.high < best_us * (1 - o.tie_fraction)) return Verdict::kEnough;
  if (m.median > 0 && (m.high - m.low) / 2 <= o.precision * m.median) return Verdict::kEnough;
  return Verdict::kMore;
}

std::vector<const OpArgs*> OperandSets::args() const {
  std::vector<const OpArgs*> out;
  for (const auto& s : sets) out.push_back(&s.args);
  return out;
}

Result<OperandSets> make_operand_sets(const OpDef& def, const Problem& problem, uint32_t seed, int count,
                                      size_t max_bytes) {
  OperandSets out;
  KILN_ASSIGN_OR_RETURN(OpBuffers first, def.buffers(problem, seed));
  out.sets.push_back(std::move(first));
  size_t bytes = 0;  // a set's device memory, as far as kiln owns it (an op's own allocations are not counted)
  for (const auto& b : out.sets.front().storage) bytes += b.size();
  if (count <= 1 || bytes == 0) return out;  // (unknown size: one set)
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  size_t free_bytes = 0, total_bytes = 0;
  if (d->cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return out;
  const size_t room = std::min(max_bytes, free_bytes / 4);
  for (int i = 1; i < count && bytes * static_cast<size_t>(i) <= room; ++i) {
    auto more = def.buffers(problem, seed);
    if (!more.ok()) break;  // (out of memory after all: time on the sets there are)
    out.sets.push_back(std::move(more).value());
  }
  return out;
}

Result<Samples> BenchRunner::measure(const Choice& choice, const OpArgs& args, CUdeviceptr ws, double best_us) {
  return measure(choice, std::vector<const OpArgs*>{&args}, ws, best_us);
}

Result<Samples> BenchRunner::measure(const Choice& choice, const std::vector<const OpArgs*>& args, CUdeviceptr ws,
                                     double best_us) {
  if (args.empty()) return make_error(ErrorCode::kInvalidArgument, "measure: no operand set");
  // Warm-up: caches, clocks and lazily loaded code settle before anything counts (each set once).
  const auto t_warmup = std::chrono::steady_clock::now();
  for (size_t i = 0; i < std::max<size_t>(2, args.size()); ++i) {
    KILN_RETURN_IF_ERROR(choice.run(*args[i % args.size()], ws, stream_.get()));
  }
  costs_.warmup_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_warmup).count();
  KILN_ASSIGN_OR_RETURN(Samples estimate, time_runs(choice, args, ws, 3, false));
  const Summary est_summary = summarize(estimate.us);
  const double est = est_summary.median;
  if (best_us > 0 && options_.fixed_reps == 0 &&
      (est > options_.drop_factor * best_us || est_summary.min > options_.abandon_factor * best_us)) {
    estimate.partial = true;
    return estimate;
  }
  // Every operand set gets a run (a choice timed on some of them only would be compared on other placements).
  const int sets = static_cast<int>(args.size());
  int reps = options_.fixed_reps;
  if (reps <= 0) {
    reps = static_cast<int>(options_.budget_ms * 1e3 / std::max(est, 1.0));
    // (min_reps over max_reps is a caller's mistake: min_reps then wins, as it always could.)
    const int least = std::max(options_.min_reps, std::min(sets, options_.max_reps));
    reps = std::clamp(reps, least, std::max(least, options_.max_reps));
  }
  const bool graph = est < options_.graph_below_us;
  if (options_.fixed_reps > 0 || !options_.adaptive) return time_runs(choice, args, ws, reps, graph);
  // Adaptive: rounds of min_reps until judge() says the median is known well enough or clearly slower, all
  // replaying one captured graph.
  ReplayGraphs graphs;
  Samples all;
  const int round = std::max({options_.min_reps, 3, sets});
  for (;;) {
    const int n = std::min(round, reps - static_cast<int>(all.us.size()));
    KILN_ASSIGN_OR_RETURN(Samples more, time_runs(choice, args, ws, n, graph, &graphs, all.us.size()));
    all.append(more);
    const Verdict v = judge(all.us, best_us, reps, options_);
    if (v == Verdict::kMore) continue;
    all.partial = v == Verdict::kSlower;
    return all;
  }
}

}  // namespace kiln::runtime
